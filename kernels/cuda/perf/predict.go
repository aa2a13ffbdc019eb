package perf

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// Hardware is what the performance model knows of a GPU and its host:
// datasheet figures and the achieved fractions the model applies to them.
// docs/PERFMODEL.md gives the source of every constant.
type Hardware struct {
	Name string
	// Datasheet (dense, no sparsity).
	BF16TFLOPS float64 // tensor-core bf16 peak
	FP32TFLOPS float64 // CUDA-core fp32 peak (no TF32): fp32 GEMMs and SIMT kernels
	HBMTBs     float64 // HBM bandwidth, TB/s
	SMs        int
	ClockGHz   float64 // boost clock the peaks are quoted at
	BusGBs     float64 // achieved host↔device bandwidth per direction, GB/s
	Bus        string
	HostCores  int     // host cores beside one GPU
	MemGiB     float64 // device memory
}

// Achieved fractions and latencies (docs/PERFMODEL.md).
const (
	// gemmAligned: cuBLASLt bf16 on Hopper with 16-byte-aligned leading
	// dimensions reaches ~80% of the dense peak at its best shapes (the
	// maximum achievable matmul FLOPS, 792 of 989 TFLOP/s on H100 SXM).
	gemmAligned = 0.80
	// gemmFallback: a bf16 GEMM whose dims are not all multiples of 8, or
	// whose operands' rows are not 16-byte aligned, runs on cuBLASLt's
	// older CUTLASS kernels (cutlass_80_tensorop_s16816gemm_*_align2 in the
	// sixth run), which levelled off at 255–265 TFLOP/s on an H200
	// (2026-11-27) however deep K was (4096x510x50264, 4080x510x24576:TN,
	// 50257x510x4096:TN): 0.27 of the peak.
	gemmFallback = 0.27
	// gemmAlign1: an odd N or K (the operands' contiguous dims) takes
	// cuBLASLt's kernel for alignment 1 (cutlass_75_tensorop_s1688gemm_*_align1):
	// the LM head's logits (N 50,257) and its dx (K 50,257) ran at 0.46 and
	// 0.50 of the fallback's predicted rate in the sixth run; its dW, whose
	// odd dim is M, at the fallback's own.
	gemmAlign1 = 0.48
	// gemmF32: SIMT SGEMM (CUBLAS_COMPUTE_32F without TF32) at ~75% of the
	// fp32 peak.
	gemmF32 = 0.75
	// gemmTile: the output tile of the Hopper bf16 kernels (128×128); a
	// GEMM with fewer tiles than SMs, or a last partial wave, leaves SMs idle.
	gemmTile = 128
	// gemmKOverheadHopper: prologue and epilogue of each tile in units of
	// K (efficiency K / (K + overhead)) on cuBLASLt's Hopper kernels
	// (nvjet_sm90_*, dims all multiples of 8): fitted to the sixth run's
	// five such shapes (H200, 2026-11-27; 267–726 TFLOP/s), each within
	// 0.7–1.3× of this model.
	gemmKOverheadHopper = 500
	// gemmKOverheadFallback: the same on the fallback kernels, fitted with
	// gemmFallback to the sixth run: 24576x1020x510 at 184 TFLOP/s,
	// 24576x510x1020 at 196 and 24576x510x510 at 155 (the model gives
	// 0.84–1.0× their times). The fifth run's fit, 1,500 at the aligned
	// rate, had taken these for the Hopper kernels.
	gemmKOverheadFallback = 200
	// hbmStream: streaming kernels reach ~85% of the HBM bandwidth.
	hbmStream = 0.85
	// viewStream: kernels over strided views and broadcasts (ClassView)
	// reach about a third of that: measured on an H200 (2026-11-25, paper
	// preset, less the launch floor), binary_f32, fused_ew_f32 and
	// gather_view_f32 took 2.7–4.0× the time predicted at hbmStream, while
	// plain streaming kernels (unary, dropout, copies, the bf16 conversion)
	// took 1.0–1.4×.
	viewStream = 0.28
	// memLatency: the latency of one dependent global load, seconds.
	memLatency = 600e-9
	// inflightStream / inflightSerial: bytes in flight per thread for
	// grid-stride kernels (independent loads) and for serial loops.
	inflightStream = 32.0
	inflightSerial = 4.0
	// residentThreads: threads an SM holds at once (Hopper: 2,048).
	residentThreads = 2048
	// mmaEfficiency: the fraction of the bf16 tensor-core peak rpac's own
	// WMMA kernels (flash.cu) reach. Measured on an H200 (2026-11-25,
	// paper preset, T = 768): the forward, dq and dk/dv kernels took 80.3,
	// 39.0 and 43.9 ms per step, 7.6–9.7× what 0.15 (the estimate before
	// any GPU ran them) predicted; with their scalar work (below) that is
	// 1.1–1.3% of the peak on the tensor side.
	mmaEfficiency = 0.012
	// simtLoadBound: one L1 load (128 B/clock/SM: 32 floats) per FMA caps
	// coalesced scalar loops at a quarter of the FMA rate (128/clock/SM).
	simtLoadBound = 0.25
	// kernelMin: the shortest a kernel occupies the GPU (launch, ramp-up
	// and drain), seconds.
	kernelMin = 2.5e-6
	// hostLaunch / hostGEMM: CPU time to issue one launch (cuLaunchKernel
	// through purego) and one GEMM (one cublasLtMatmul on a cached plan:
	// descriptor, layouts and algorithm made once per program), seconds.
	hostLaunch = 4e-6
	hostGEMM   = 5e-6
	// hostAdamWCoreNs: host clipping + AdamW per parameter, in core-
	// nanoseconds (measured: 0.69 s + 0.15 s for 91.7M parameters on 2
	// cores), divided by the host's cores.
	hostAdamWCoreNs = 18.3
	// copyLatency: a synchronous cuMemcpy's fixed cost, seconds.
	copyLatency = 10e-6
)

// measuredStream: the fraction of the HBM bandwidth each memory-bound
// kernel of the paper step reached in the sixth run (H200, 2026-11-27,
// paper preset at T = 768, each call timed between two synchronizations
// less the launch floor: 0.85 over the ratio of measured to predicted),
// for the kernels above 0.5 ms a step that ran slower than the streaming
// rate; the generated chains by their report class. The others keep
// hbmStream.
var measuredStream = map[string]float64{
	"fused_gen_sum_f32":                       0.45, // 10.6 ms, 1.91× the streaming rate's time
	"fused_gen_f32":                           0.41, // 4.2 ms, 2.09×
	"fused_gen_bcast_f32":                     0.59, // 3.4 ms, 1.43×
	"softmax_ce_fused_f32":                    0.55, // 4.7 ms, 1.55×
	"attn_softmax_bwd_f32":                    0.47, // 4.9 ms, 1.80×
	"attn_softmax_fwd_f32":                    0.27, // 4.2 ms, 3.10× (Nsight Compute: bound by its instructions)
	"reduce_rows_f32":                         0.59, // 2.0 ms, 1.44×
	"attn_pack_bf16":                          0.59, // 1.9 ms, 1.43×
	"dropout_f32":                             0.54, // 1.9 ms, 1.58×
	"layernorm_bwd_dx_f32":                    0.45, // 1.8 ms, 1.90×
	"attn_unpack_bf16":                        0.34, // 1.6 ms, 2.47×
	"layernorm_bwd_params_f32":                0.47, // 1.1 ms, 1.81×
	"layernorm_fwd_bf16pad":                   0.41, // 0.9 ms, 2.08×
	"gaussian_membership_bwd_rows_f32":        0.21, // 1.2 ms, 4.12×
	"gaussian_membership_bwd_params_part_f32": 0.15, // 0.9 ms, 5.77×
	"gaussian_membership_f32":                 0.22, // 0.6 ms, 3.81×
	"attn_unpack_f32":                         0.44, // 0.7 ms, 1.94×
	"attn_pack_do_bf16":                       0.49, // 0.6 ms, 1.72×
	"f32_to_bf16_pad_kernel":                  0.49, // 0.6 ms, 1.73×
}

// estimatedStream: kernels written after the sixth run that run the code
// of a kernel it measured with fewer DRAM bytes, charged that kernel's
// measured rate until a GPU measures them (estimates).
var estimatedStream = map[string]float64{
	"softmax_ce_smem_f32": measuredStream["softmax_ce_fused_f32"], // the row kept in shared memory
	"layernorm_bwd_f32":   measuredStream["layernorm_bwd_dx_f32"], // dx and the parameters' partials in one pass
}

// streamRate is the fraction of the HBM bandwidth a memory-bound kernel
// reaches: measuredStream's where the sixth run measured it,
// estimatedStream's for its successors, else hbmStream.
func streamRate(kernel string) float64 {
	if r, ok := measuredStream[kernel]; ok {
		return r
	}
	if r, ok := estimatedStream[kernel]; ok {
		return r
	}
	return hbmStream
}

// Machines the model knows (`--predict`).
var Machines = map[string]Hardware{
	"h100": {Name: "h100", BF16TFLOPS: 989.4, FP32TFLOPS: 66.9, HBMTBs: 3.35, SMs: 132, ClockGHz: 1.98,
		BusGBs: 25, Bus: "PCIe Gen5 x16, pageable", HostCores: 16, MemGiB: 80},
	"h200": {Name: "h200", BF16TFLOPS: 989.4, FP32TFLOPS: 66.9, HBMTBs: 4.8, SMs: 132, ClockGHz: 1.98,
		BusGBs: 25, Bus: "PCIe Gen5 x16, pageable", HostCores: 16, MemGiB: 141},
	"gh200": {Name: "gh200", BF16TFLOPS: 989.4, FP32TFLOPS: 66.9, HBMTBs: 4.0, SMs: 132, ClockGHz: 1.98,
		BusGBs: 200, Bus: "NVLink-C2C", HostCores: 72, MemGiB: 96},
}

// LookupMachine returns a machine of Machines by name.
func LookupMachine(name string) (Hardware, error) {
	h, ok := Machines[strings.ToLower(name)]
	if !ok {
		var names []string
		for n := range Machines {
			names = append(names, n)
		}
		sort.Strings(names)
		return Hardware{}, fmt.Errorf("--predict %q: want one of %s", name, strings.Join(names, ", "))
	}
	return h, nil
}

// KernelTime is one kernel's (or GEMM group's) share of a predicted step.
type KernelTime struct {
	Name     string
	Calls    int
	Seconds  float64 // GPU time
	Flops    float64 // FLOPs the roofline counted (GEMM: tensor-core work)
	Bytes    float64
	Bound    string  // what limits it: compute, memory, latency, launch, strided
	Measured float64 // measured time on the device (a measured trace; else 0)
}

// Prediction is a step's predicted time on a machine.
type Prediction struct {
	Machine   Hardware
	GPU       float64 // Σ kernel times
	HostIssue float64 // CPU time to issue the launches and GEMMs
	Copies    float64 // host↔device copies (synchronous)
	HostOptim float64 // host-side optimizer
	Step      float64 // the predicted step time
	H2D, D2H  float64 // bytes
	Launches  int
	GEMMs     int
	GEMMFlops float64
	Kernels   []KernelTime // by GPU time, largest first
	// GEMMShapes: the GEMMs again, grouped by shape (gemmShapeName), by GPU
	// time, largest first.
	GEMMShapes []KernelTime
	HostParams int // parameters updated on the host
	// Measured is the sum of the kernels' and GEMMs' measured times (a
	// measured trace: each synchronized on its own, less MeasureFloor; 0
	// otherwise).
	Measured float64
	// MeasureFloor is what was taken off each measured call: the time of a
	// synchronized empty launch (seconds).
	MeasureFloor float64
}

// eventTime is the roofline time of one event and what bounds it.
func (h Hardware) eventTime(e Event) (float64, string) {
	bw := streamRate(e.Name) * h.HBMTBs * 1e12
	switch e.Class {
	case ClassView:
		bw = viewStream * h.HBMTBs * 1e12
	}
	switch e.Kind {
	case EvH2D, EvD2H:
		return copyLatency + e.Bytes/(h.BusGBs*1e9), "bus"
	case EvGEMM:
		return h.gemmTime(e)
	}
	threads := math.Min(float64(e.Threads), float64(h.SMs*residentThreads))
	inflight := inflightStream
	if e.Class == ClassSerial {
		inflight = inflightSerial
	}
	memBW := math.Min(bw, threads*inflight/memLatency)
	tMem := e.Bytes / memBW
	bound := "memory"
	if memBW < bw {
		bound = "latency"
	}
	t := tMem
	if e.Class == ClassMMA {
		if tc := h.mmaTime(e); tc > t {
			t, bound = tc, "tensor"
		}
	} else if e.Scalar > 0 {
		// a memory-bound kernel's own instructions, at one per CUDA core
		// per clock (kernelCost sets them where a GPU measured the floor)
		if tc := e.Scalar / (h.FP32TFLOPS / 2 * 1e12); tc > t {
			t, bound = tc, "instructions"
		}
	} else if e.Flops > 0 || e.Strided > 0 {
		// fp32 FMAs: coalesced ones at a quarter of the FMA rate, strided
		// ones at one FMA per SM per clock
		tc := e.Flops/(simtLoadBound*h.FP32TFLOPS*1e12) + e.Strided/(2*float64(h.SMs)*h.ClockGHz*1e9)
		if tc > t {
			t, bound = tc, "compute"
			if e.Strided > e.Flops {
				bound = "strided"
			}
		}
	}
	if t < kernelMin {
		return kernelMin, "launch"
	}
	return t, bound
}

// mmaTime: a tensor-core kernel's FLOPs at mmaEfficiency of the bf16 peak
// plus its scalar instructions at the CUDA cores' issue rate (one per core
// per clock), on the SMs its blocks occupy.
func (h Hardware) mmaTime(e Event) float64 {
	share := 1.0
	if e.Blocks > 0 && e.Blocks < int64(h.SMs) {
		share = float64(e.Blocks) / float64(h.SMs)
	}
	tensor := e.Flops / (mmaEfficiency * h.BF16TFLOPS * 1e12)
	scalar := e.Scalar / (h.FP32TFLOPS / 2 * 1e12)
	return (tensor + scalar) / share
}

// gemmEfficiency is the fraction of the peak a GEMM reaches: the aligned
// rate on cuBLASLt's Hopper kernels where the dims are all multiples of 8
// (and the bf16 operands' rows 16-byte aligned), the fallbacks' otherwise
// (less again for an odd N or K),
// times the share of the SMs its tiles' waves fill and its depth K
// against the tile's fixed cost.
func (h Hardware) gemmEfficiency(s driver.GemmShape, dt driver.DType) float64 {
	if dt != driver.BF16 {
		return gemmF32
	}
	eff, overhead := gemmAligned, float64(gemmKOverheadHopper)
	if !s.OperandsAligned() || gemmDimAlign(s) < 8 {
		eff, overhead = gemmFallback, gemmKOverheadFallback
		if s.N%2 != 0 || s.K%2 != 0 {
			eff *= gemmAlign1
		}
	}
	tiles := math.Ceil(float64(s.M)/gemmTile) * math.Ceil(float64(s.N)/gemmTile) * float64(max(1, s.Batch))
	split := gemmLibSplit(tiles, s.K, h.SMs)
	tiles *= float64(split)
	waves := math.Ceil(tiles / float64(h.SMs))
	eff *= tiles / (waves * float64(h.SMs))
	k := float64(s.K) / float64(split)
	eff *= k / (k + overhead)
	return eff
}

// gemmLibSplit is the slices of K cuBLASLt's heuristic splits a GEMM into
// where its output tiles leave SMs idle: the sixth run's weight gradients
// (510×1,020 over 24,576 rows: 32 tiles) took a 16 MB workspace and 0.97
// waves, and ran at 210–225 TFLOP/s, the fallback kernels' rate. Modelled
// as the largest power of two that keeps the tiles of all slices within
// the SMs and each slice at least splitKMinDepth deep.
func gemmLibSplit(tiles float64, K, sms int) int {
	const splitKMinDepth = 1024 // the shallowest slice of K modelled
	n := 1
	for tiles*float64(2*n) <= float64(sms) && K/(2*n) >= splitKMinDepth {
		n *= 2
	}
	return n
}

// gemmDimAlign is the largest of 8, 4, 2 and 1 that divides M, N and K:
// cuBLASLt's Hopper kernels take 8 only (the sixth run: 4,096 × 50,257
// over 510 ran a CUTLASS kernel for alignment 1 at 86 TFLOP/s, 4,096 ×
// 50,264 over 512 nvjet_sm90 at 517).
func gemmDimAlign(s driver.GemmShape) int {
	for _, a := range []int{8, 4, 2} {
		if s.M%a == 0 && s.N%a == 0 && s.K%a == 0 {
			return a
		}
	}
	return 1
}

func (h Hardware) gemmTime(e Event) (float64, string) {
	peak := h.FP32TFLOPS
	if e.DType == driver.BF16 {
		peak = h.BF16TFLOPS
	}
	tc := e.Flops / (peak * 1e12 * h.gemmEfficiency(e.Shape, e.DType))
	tm := e.Bytes / (hbmStream * h.HBMTBs * 1e12)
	switch {
	case tc >= tm && tc >= kernelMin:
		return tc, "compute"
	case tm >= kernelMin:
		return tm, "memory"
	}
	return kernelMin, "launch"
}

// Predict turns a step's trace into a predicted step time on h. The GPU
// runs the kernels back to back while the host issues them; the host
// cannot run ahead of a synchronous copy, so a step costs the larger of
// the GPU time and the host's issue time, plus the copies and the host
// optimizer (hostParams parameters clipped and updated on the host).
func Predict(events []Event, h Hardware, hostParams int) *Prediction {
	p := &Prediction{Machine: h, HostParams: hostParams}
	byName := map[string]*KernelTime{}
	bounds := map[string]map[string]float64{}
	byShape := map[string]*KernelTime{}
	for _, e := range events {
		t, bound := h.eventTime(e)
		switch e.Kind {
		case EvH2D:
			p.H2D += e.Bytes
			p.Copies += t
			continue
		case EvD2H:
			p.D2H += e.Bytes
			p.Copies += t
			continue
		case EvGEMM:
			p.GEMMs++
			p.GEMMFlops += e.Flops
			p.HostIssue += hostGEMM
			addShape(byShape, e, t, bound)
		default:
			p.Launches++
			p.HostIssue += hostLaunch
		}
		p.GPU += t
		k := byName[e.Name]
		if k == nil {
			k = &KernelTime{Name: e.Name}
			byName[e.Name] = k
			bounds[e.Name] = map[string]float64{}
		}
		k.Calls++
		k.Seconds += t
		k.Measured += e.Measured
		p.Measured += e.Measured
		k.Flops += e.Flops + e.Strided
		k.Bytes += e.Bytes
		bounds[e.Name][bound] += t
	}
	for name, k := range byName {
		best := 0.0
		for b, t := range bounds[name] {
			if t > best || (t == best && b < k.Bound) {
				best, k.Bound = t, b
			}
		}
		p.Kernels = append(p.Kernels, *k)
	}
	for _, k := range byShape {
		p.GEMMShapes = append(p.GEMMShapes, *k)
	}
	sortKernels(p.Kernels)
	sortKernels(p.GEMMShapes)
	p.HostOptim = float64(hostParams) * hostAdamWCoreNs * 1e-9 / float64(max(1, h.HostCores))
	p.Step = math.Max(p.GPU, p.HostIssue) + p.Copies + p.HostOptim
	return p
}

// addShape adds GEMM event e (predicted t, bound) to its shape's group.
func addShape(byShape map[string]*KernelTime, e Event, t float64, bound string) {
	name := gemmShapeName(e.Shape, e.DType)
	k := byShape[name]
	if k == nil {
		k = &KernelTime{Name: name, Bound: bound}
		byShape[name] = k
	}
	k.Calls++
	k.Seconds += t
	k.Measured += e.Measured
	k.Flops += e.Flops
	k.Bytes += e.Bytes
}

// gemmShapeName names a GEMM by precision, transposes and shape
// ("gemm bf16 NT 24576x1536x510", batched: "... x8").
func gemmShapeName(s driver.GemmShape, dt driver.DType) string {
	name := fmt.Sprintf("%s %dx%dx%d", s.Name(dt), s.M, s.N, s.K)
	if s.Batch > 1 {
		name += fmt.Sprintf(" x%d", s.Batch)
	}
	return name
}

// sortKernels orders ks by GPU time, largest first (then by name).
func sortKernels(ks []KernelTime) {
	sort.Slice(ks, func(i, j int) bool {
		if ks[i].Seconds != ks[j].Seconds {
			return ks[i].Seconds > ks[j].Seconds
		}
		return ks[i].Name < ks[j].Name
	})
}

// MFU is the model FLOPs utilisation of a step of modelFlops FLOPs against
// the bf16 dense peak.
func (p *Prediction) MFU(modelFlops float64) float64 {
	return modelFlops / p.Step / (p.Machine.BF16TFLOPS * 1e12)
}

// FormatBusBytes prints bytes per step as KiB below 1 MiB, else MiB.
func FormatBusBytes(b float64) string {
	if b < 1<<20 {
		return fmt.Sprintf("%.0f KiB", b/1024)
	}
	return fmt.Sprintf("%.1f MiB", b/(1<<20))
}
