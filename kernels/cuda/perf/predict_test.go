package perf

import (
	"math"
	"testing"

	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// ceInstrPerLogit is the instructions per logit the backend's trace
// charges the fused softmax cross-entropy (kernels/cuda's trace.go).
const ceInstrPerLogit = 100

// paddedShape is s, a dense GEMM of one matrix, with its operands' rows
// padded to multiples of 8 elements, as the backend stages bf16 operands.
func paddedShape(s driver.GemmShape) driver.GemmShape {
	_, ca := s.StoredA()
	_, cb := s.StoredB()
	s.LDA, s.LDB = (ca+7)/8*8, (cb+7)/8*8
	return s
}

// TestPredictRoofline: the model's times for hand-made events follow the
// constants: a large aligned bf16 GEMM runs at the aligned GEMM rate, an
// unaligned one slower, a streaming kernel at 85% of HBM, a tiny kernel
// costs the minimum, copies go over the bus, and the machines differ where
// their datasheets do.
func TestPredictRoofline(t *testing.T) {
	h100, h200, gh200 := Machines["h100"], Machines["h200"], Machines["gh200"]
	big := driver.GemmShape{M: 8448, N: 8192, K: 8192, Batch: 1} // 66×64 tiles: 32 full waves of 132
	ev := Event{Kind: EvGEMM, Shape: big, DType: driver.BF16, Flops: 2 * 8448 * 8192 * 8192}
	got, bound := h100.eventTime(ev)
	want := ev.Flops / (989.4e12 * gemmAligned * 8192 / (8192 + gemmKOverheadHopper))
	if math.Abs(got/want-1) > 1e-9 || bound != "compute" {
		t.Errorf("aligned GEMM: %.6g s (%s), want %.6g s (compute)", got, bound, want)
	}
	// operands' rows not 16-byte aligned (K = 8,190 unpadded), or dims not
	// all multiples of 8 (the padded copies of the same GEMM): cuBLASLt's
	// fallback kernels, at their own rate and overhead
	odd := big
	odd.K = 8190
	padded := paddedShape(odd)
	wantFallback := gemmFallback * 8190 / (8190 + gemmKOverheadFallback)
	for _, s := range []driver.GemmShape{odd, padded} {
		if e := h100.gemmEfficiency(s, driver.BF16); math.Abs(e/wantFallback-1) > 1e-9 {
			t.Errorf("%+v: efficiency %.4f, want the fallback's %.4f", s, e, wantFallback)
		}
	}
	evOdd := ev
	evOdd.Shape = padded
	if tOdd, _ := h100.eventTime(evOdd); tOdd < 2.5*got {
		t.Errorf("GEMM with K 8,190: %.3g s, aligned %.3g s: want the fallback's (about 3× slower)", tOdd, got)
	}
	// an odd N or K: the alignment-1 kernel, slower again; an odd M is not
	for _, c := range []struct {
		s    driver.GemmShape
		want float64
	}{
		{driver.GemmShape{M: 8448, N: 8191, K: 8192, Batch: 1}, gemmAlign1},
		{driver.GemmShape{M: 8448, N: 8190, K: 8191, Batch: 1}, gemmAlign1},
		{driver.GemmShape{M: 8447, N: 8190, K: 8192, Batch: 1}, 1},
	} {
		p := paddedShape(c.s)
		even := c.s
		even.M, even.N, even.K = 8448, 8190, 8192
		pe := paddedShape(even)
		r := h100.gemmEfficiency(p, driver.BF16) / h100.gemmEfficiency(pe, driver.BF16) * float64(8192+gemmKOverheadFallback) / float64(c.s.K+gemmKOverheadFallback) * float64(c.s.K) / 8192
		if math.Abs(r-c.want) > 1e-3 {
			t.Errorf("%dx%dx%d: efficiency %.4f of the even shape's, want %.2f", c.s.M, c.s.N, c.s.K, r, c.want)
		}
	}
	// one output tile: too shallow to split, it fills one SM; deep, the
	// library's split fills more (slices of at least 1,024, the tiles of
	// all slices within the SMs)
	if eff := h100.gemmEfficiency(driver.GemmShape{M: 128, N: 128, K: 1024, Batch: 1}, driver.BF16); eff > gemmAligned/132 {
		t.Errorf("one 128×128 tile over K 1,024 on 132 SMs: efficiency %.4f, want at most 1/132 of the aligned rate", eff)
	}
	for _, c := range []struct {
		tiles     float64
		K, splits int
	}{{1, 8192, 8}, {16, 24576, 8}, {32, 24576, 4}, {48, 24576, 2}, {128, 24576, 1}, {1, 1024, 1}, {1, 1 << 20, 128}} {
		if got := gemmLibSplit(c.tiles, c.K, 132); got != c.splits {
			t.Errorf("%v tiles over K %d: %d slices, want %d", c.tiles, c.K, got, c.splits)
		}
	}
	stream := Event{Kind: EvLaunch, Name: "copy_words", Class: ClassStream, Threads: 1 << 21, Bytes: 1e9}
	if got, bound := h100.eventTime(stream); math.Abs(got-1e9/(0.85*3.35e12)) > 1e-12 || bound != "memory" {
		t.Errorf("1 GB stream on h100: %.4g s (%s)", got, bound)
	}
	if a, b := h100.eventTime(stream); true {
		if c, _ := h200.eventTime(stream); !(c < a) {
			t.Errorf("h200 streams %.4g s, h100 %.4g s (%s): want h200 faster", c, a, b)
		}
	}
	// a stream kernel with an instruction floor: bytes on the h100, its
	// instructions (one per CUDA core per clock) where the memory is faster
	logits := 24576.0 * 50257
	ce := Event{Kind: EvLaunch, Name: "softmax_ce_smem_f32", Class: ClassStream, Threads: 1 << 21,
		Bytes: 6 * logits, Scalar: ceInstrPerLogit * logits}
	floor := ceInstrPerLogit * logits / (66.9e12 / 2)
	if got, bound := h100.eventTime(ce); bound != "memory" || !(got > floor) {
		t.Errorf("cross-entropy on h100: %.4g s (%s), want memory-bound above %.4g s", got, bound, floor)
	}
	if got, bound := h200.eventTime(ce); bound != "instructions" || math.Abs(got-floor) > 1e-12 {
		t.Errorf("cross-entropy on h200: %.4g s (%s), want its instructions' %.4g s", got, bound, floor)
	}
	serial := Event{Kind: EvLaunch, Name: "reduce_view_f32", Class: ClassSerial, Threads: 512, Bytes: 50e6}
	if got, bound := h100.eventTime(serial); bound != "latency" || math.Abs(got-50e6/(512*inflightSerial/memLatency)) > 1e-9 {
		t.Errorf("512-thread serial reduction: %.4g s (%s), want latency-bound", got, bound)
	}
	tiny := Event{Kind: EvLaunch, Name: "sum_part_f64", Class: ClassSerial, Threads: 1024, Bytes: 64}
	if got, bound := h100.eventTime(tiny); got != kernelMin || bound != "launch" {
		t.Errorf("tiny kernel: %.3g s (%s), want the minimum %.3g s", got, bound, kernelMin)
	}
	cp := Event{Kind: EvH2D, Bytes: 1 << 30}
	pc, _ := h100.eventTime(cp)
	nv, _ := gh200.eventTime(cp)
	if !(nv < pc/5) {
		t.Errorf("1 GiB copy: PCIe %.3g s, NVLink-C2C %.3g s", pc, nv)
	}
	p := Predict([]Event{ev, stream, cp, {Kind: EvD2H, Bytes: 4096}}, h100, 1000)
	if p.Launches != 1 || p.GEMMs != 1 || p.H2D != 1<<30 || p.D2H != 4096 || len(p.Kernels) != 2 || p.Kernels[0].Calls != 1 {
		t.Errorf("prediction bookkeeping: %+v", p)
	}
	if math.Abs(p.Step-(math.Max(p.GPU, p.HostIssue)+p.Copies+p.HostOptim)) > 1e-12 || p.HostOptim <= 0 {
		t.Errorf("step %.4g s from GPU %.4g, issue %.4g, copies %.4g, host optimizer %.4g", p.Step, p.GPU, p.HostIssue, p.Copies, p.HostOptim)
	}
}

// TestPredictGroupsGEMMShapes: GEMMs are listed once per kernel name and
// again per shape, each group's calls, times and measured times summing its
// events'.
func TestPredictGroupsGEMMShapes(t *testing.T) {
	h := Machines["h100"]
	a := driver.GemmShape{M: 1024, N: 512, K: 512, Batch: 1, TransB: true}
	b := driver.GemmShape{M: 512, N: 512, K: 64, Batch: 8, TransB: true}
	var events []Event
	for i, s := range []driver.GemmShape{a, b, a} {
		events = append(events, Event{Kind: EvGEMM, Name: s.Name(driver.BF16), Shape: s, DType: driver.BF16,
			Flops: 2 * float64(s.M*s.N*s.K*s.Batch), Bytes: 1e6, Measured: float64(i+1) * 1e-3})
	}
	p := Predict(events, h, 0)
	if len(p.Kernels) != 1 || p.Kernels[0].Calls != 3 || p.Kernels[0].Name != "gemm bf16 NT" {
		t.Fatalf("kernels %+v: want one group of 3 (gemm bf16 NT)", p.Kernels)
	}
	got := map[string]KernelTime{}
	for _, k := range p.GEMMShapes {
		got[k.Name] = k
	}
	ka, kb := got["gemm bf16 NT 1024x512x512"], got["gemm bf16 NT 512x512x64 x8"]
	if len(got) != 2 || ka.Calls != 2 || kb.Calls != 1 {
		t.Fatalf("shapes %+v: want 2 calls of 1024x512x512 and 1 of 512x512x64 x8", p.GEMMShapes)
	}
	ta, _ := h.eventTime(events[0])
	if math.Abs(ka.Seconds-2*ta) > 1e-15 || math.Abs(ka.Measured-4e-3) > 1e-15 || math.Abs(kb.Measured-2e-3) > 1e-15 {
		t.Errorf("1024x512x512: %g s predicted (want %g), measured %g and %g (want 4e-3 and 2e-3)", ka.Seconds, 2*ta, ka.Measured, kb.Measured)
	}
	if p.GEMMShapes[0].Seconds < p.GEMMShapes[1].Seconds {
		t.Errorf("shapes not ordered by time: %+v", p.GEMMShapes)
	}
}

// TestClusterAllReduce: the ring all-reduce follows 2(n−1)/n·S over the
// bus bandwidth (NVLink within a node, the NICs across nodes), the
// all-reduce hides behind the backward but for its last bucket, and one
// GPU scales perfectly.
func TestClusterAllReduce(t *testing.T) {
	c8, ok, err := LookupCluster("h100x8")
	if !ok || err != nil || c8.GPUs != 8 || c8.Nodes() != 1 || c8.GPU.Name != "h100" {
		t.Fatalf("h100x8: %+v %v %v", c8, ok, err)
	}
	c64, _, _ := LookupCluster("H100x64")
	if c64.Nodes() != 8 {
		t.Fatalf("h100x64: %d nodes", c64.Nodes())
	}
	if _, ok, _ := LookupCluster("h100"); ok {
		t.Error("h100 is not a cluster")
	}
	for _, bad := range []string{"h100x0", "h100xx", "v100x8"} {
		if _, _, err := LookupCluster(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	const gb = 1e9
	want8 := 2*7.0/8*gb/(450*nvlinkAchieved*1e9) + 14*nvlinkHop
	if got := c8.AllReduce(gb); math.Abs(got/want8-1) > 1e-12 {
		t.Errorf("8 GPUs, 1 GB: %.6g s, want %.6g", got, want8)
	}
	if c64.BusGBs() != math.Min(450*nvlinkAchieved, 8*50*nicAchieved) {
		t.Errorf("64 GPUs: bus %.1f GB/s", c64.BusGBs())
	}
	if c64.AllReduce(gb) <= c8.AllReduce(gb) {
		t.Error("64 GPUs all-reduce faster than 8")
	}
	p := &Prediction{GPU: 0.3, Step: 0.31}
	s := c8.Scale(p, gb, 25e6)
	if s.Buckets != 40 || s.Exposed < s.Comm/40 || s.Exposed > s.Comm || s.Efficiency >= 1 || s.Step != p.Step+s.Exposed ||
		s.StepAfter != p.Step+s.Comm || s.EfficiencyAfter > s.Efficiency {
		t.Errorf("scaling: %+v", s)
	}
	long := c8.Scale(&Prediction{GPU: 30, Step: 30}, gb, 25e6) // a backward far longer than the all-reduce
	if math.Abs(long.Exposed-long.Comm/40) > 1e-12 {
		t.Errorf("a long backward exposes %.6g s, want the last bucket's %.6g", long.Exposed, long.Comm/40)
	}
	one, _, _ := LookupCluster("h100x1")
	if e := one.Scale(p, gb, 25e6).Efficiency; e != 1 {
		t.Errorf("one GPU: efficiency %v", e)
	}
}
