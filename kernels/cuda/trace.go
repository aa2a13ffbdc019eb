package cuda

import (
	"errors"
	"math"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/rpac-dev/rpac/kernels/cuda/perf"
)

// Trace records the device calls of a backend (Backend.StartTrace).
type Trace struct {
	mu     sync.Mutex
	events []perf.Event
	// floor is the wall time of a synchronized empty launch, measured
	// before the first timed call and subtracted from every measured time
	// (0 for a trace that is not measured).
	floor float64
}

// Floor is the time subtracted from each measured call: a synchronized
// empty launch's (seconds; 0 when the trace is not measured).
func (t *Trace) Floor() float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.floor
}

// Reset drops the recorded events.
func (t *Trace) Reset() {
	t.mu.Lock()
	t.events = t.events[:0]
	t.mu.Unlock()
}

// Events returns a copy of the recorded events.
func (t *Trace) Events() []perf.Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]perf.Event(nil), t.events...)
}

func (t *Trace) add(e perf.Event) {
	t.mu.Lock()
	t.events = append(t.events, e)
	t.mu.Unlock()
}

// HostDeviceBytes is the bus traffic of the recorded events.
func (t *Trace) HostDeviceBytes() (h2d, d2h float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.events {
		switch e.Kind {
		case perf.EvH2D:
			h2d += e.Bytes
		case perf.EvD2H:
			d2h += e.Bytes
		}
	}
	return h2d, d2h
}

// StartTrace makes the backend record every launch, GEMM, copy and
// memset from now on (on a GPU, the simulator or the dry-run device) and
// returns the trace. A second call returns the same trace.
func (b *Backend) StartTrace() (*Trace, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if td, ok := b.dev.(*tracedDevice); ok {
		return td.t, nil
	}
	sigs, err := kernelSignatures()
	if err != nil {
		return nil, err
	}
	td := &tracedDevice{device: b.dev, t: &Trace{}, sigs: sigs}
	b.dev = td
	return td.t, nil
}

// StartMeasuredTrace is StartTrace that also times each launch and GEMM
// on the device: the device is synchronized before and after every call,
// so a kernel's time is its own (plus the launch's latency, a few µs), at
// the cost of the overlap between the host and the device. It needs a
// device that runs the kernels (a GPU, or the simulator, whose times are
// the CPU's); the dry-run device computes nothing and is refused.
func (b *Backend) StartMeasuredTrace() (*Trace, error) {
	if _, fake := b.dev.(*fakeDevice); fake {
		return nil, errors.New("measuring kernel times needs a GPU (or --device cuda-sim): the dry-run device computes nothing")
	}
	t, err := b.StartTrace()
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.dev.(*tracedDevice).measure = true
	b.mu.Unlock()
	return t, nil
}

// tracedDevice records each call of the device it wraps.
type tracedDevice struct {
	device
	t       *Trace
	sigs    map[string][]param
	measure bool // time each launch and GEMM (StartMeasuredTrace)
	floored bool // the launch floor is measured
	// bytes: the DRAM traffic the next launch's caller stated (costHinter),
	// where the kernel's arguments do not tell it; 0: none. flops: its
	// FLOPs (workHinter), likewise.
	bytes, flops float64
}

// costHinter is a device that records costs: the backend states the DRAM
// bytes of its next launch when the kernel's arguments cannot say them
// (a generated chain's inputs, broadcast or half).
type costHinter interface{ hintBytes(bytes float64) }

func (d *tracedDevice) hintBytes(bytes float64) { d.bytes = bytes }

// workHinter is a device that records the DRAM bytes and FLOPs of its
// next launch as its caller expects them: a kernel whose work depends on
// data on the device (the routed rows of an expert, src/expert.cu).
type workHinter interface{ hintWork(bytes, flops float64) }

func (d *tracedDevice) hintWork(bytes, flops float64) { d.bytes, d.flops = bytes, flops }

// timed runs call and, when measuring, sets e.Measured to its wall time
// between two synchronizations of the device, less the launch floor; then
// it records e.
func (d *tracedDevice) timed(e perf.Event, call func() error) error {
	if !d.measure {
		d.t.add(e)
		return call()
	}
	if !d.floored {
		f, err := d.launchFloor()
		if err != nil {
			return err
		}
		d.t.mu.Lock()
		d.t.floor = f
		d.t.mu.Unlock()
		d.floored = true
	}
	if err := d.device.sync(); err != nil {
		return err
	}
	t0 := time.Now()
	err := call()
	if err == nil {
		err = d.device.sync()
	}
	e.Measured = max(0, time.Since(t0).Seconds()-d.t.Floor())
	d.t.add(e)
	return err
}

// launchFloor is the median wall time of a synchronized launch that does
// no work (copy_words of 0 words): the share of every measured call that
// is not the kernel's own.
func (d *tracedDevice) launchFloor() (float64, error) {
	ts := make([]float64, 31)
	for i := range ts {
		if err := d.device.sync(); err != nil {
			return 0, err
		}
		t0 := time.Now()
		if err := d.device.launch("copy_words", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, uint64(0), uint64(0), int64(0)); err != nil {
			return 0, err
		}
		if err := d.device.sync(); err != nil {
			return 0, err
		}
		ts[i] = time.Since(t0).Seconds()
	}
	slices.Sort(ts)
	return ts[len(ts)/2], nil
}

func (d *tracedDevice) upload(b Buffer, src unsafe.Pointer, bytes uint64) error {
	d.t.add(perf.Event{Kind: perf.EvH2D, Name: "memcpy HtoD", Class: perf.ClassCopy, Bytes: float64(bytes)})
	return d.device.upload(b, src, bytes)
}

func (d *tracedDevice) download(dst unsafe.Pointer, b Buffer, bytes uint64) error {
	d.t.add(perf.Event{Kind: perf.EvD2H, Name: "memcpy DtoH", Class: perf.ClassCopy, Bytes: float64(bytes)})
	return d.device.download(dst, b, bytes)
}

func (d *tracedDevice) zero(b Buffer, bytes uint64) error {
	d.t.add(perf.Event{Kind: perf.EvMemset, Name: "memset", Class: perf.ClassStream, Threads: 1 << 20, Bytes: float64(bytes)})
	return d.device.zero(b, bytes)
}

// loadModule takes the generated kernels' signatures, which their costs
// read, and loads them.
func (d *tracedDevice) loadModule(name, src string, kernels []string) error {
	if err := parseSignatures(src, d.sigs); err != nil {
		return err
	}
	return d.device.loadModule(name, src, kernels)
}

func (d *tracedDevice) launch(name string, grid, block [3]uint32, shared uint32, args ...any) error {
	e := perf.Event{Kind: perf.EvLaunch, Name: reportName(name),
		Threads: int64(grid[0]) * int64(grid[1]) * int64(grid[2]) * int64(block[0]) * int64(block[1]) * int64(block[2])}
	e.Blocks = int64(grid[0]) * int64(grid[1]) * int64(grid[2])
	kernelCost(&e, kargs{d.sigs[name], args}, grid)
	if d.bytes > 0 {
		e.Bytes, d.bytes = d.bytes, 0
	}
	if d.flops > 0 {
		e.Flops, d.flops = d.flops, 0
	}
	return d.timed(e, func() error { return d.device.launch(name, grid, block, shared, args...) })
}

func (d *tracedDevice) gemm(pl gemmPlan, call GemmCall) error {
	k := pl.key()
	s, ab := k.Shape, k.AB
	size := 4.0
	if ab == BF16 {
		size = 2
	}
	batch := float64(max(1, s.Batch))
	m, n, kk := float64(s.M), float64(s.N), float64(s.K)
	c, bias := float64(k.C.Size()), 0.0
	if call.Beta != 0 {
		c *= 2
	}
	if k.BiasAlign != 0 {
		bias = 4 * n
	}
	e := perf.Event{Kind: perf.EvGEMM, Name: s.Name(ab), Class: perf.ClassGEMM, Shape: s, DType: ab,
		Flops: 2 * m * n * kk * batch, Bytes: batch*((m*kk+kk*n)*size+m*n*c) + bias}
	return d.timed(e, func() error { return d.device.gemm(pl, call) })
}

// kargs reads a launch's arguments by the kernel's parameter names.
type kargs struct {
	sig  []param
	args []any
}

func (a kargs) i(name string) float64 {
	for j, p := range a.sig {
		if p.name == name && j < len(a.args) {
			switch v := a.args[j].(type) {
			case int32:
				return float64(v)
			case int64:
				return float64(v)
			case uint64:
				return float64(v)
			}
		}
	}
	return 0
}

func (a kargs) ptr(name string) uint64 {
	for j, p := range a.sig {
		if p.name == name && j < len(a.args) {
			if v, ok := a.args[j].(uint64); ok {
				return v
			}
		}
	}
	return 0
}

// kernelCost fills in an event's class, FLOPs and DRAM bytes from the
// kernel's arguments. The figures are estimates of each kernel's traffic
// as written (src/*.cu): compulsory reads and writes of fp32 words, with
// re-reads that stay in L2 not counted. A kernel missing here is costed
// as a launch with no work (the table test keeps it complete).
// ceInstrPerLogit: the instructions the fused softmax cross-entropy spends
// per logit (the online maximum and sum, the gradient, its bf16 rounding;
// the CUDA cores' issue rate, one per core per clock, as the tensor-core
// kernels' scalar work is charged), fitted to the sixth run: on the H200
// softmax_ce_fused_f32 took 4.69 ms a paper step over 24,576 × 50,257
// logits at 79% of the SMs' throughput (Nsight Compute), 3.7 ms of
// instructions. Keeping a row in shared memory saves the second DRAM read,
// not this.
const ceInstrPerLogit = 100

func kernelCost(e *perf.Event, a kargs, grid [3]uint32) {
	const w = 4.0 // bytes per fp32 word
	n := a.i("n")
	e.Class = perf.ClassStream
	switch e.Name {
	case "binary_f32", "gather_view_f32", "scatter_view_f32", fusedGenView:
		e.Class = perf.ClassView
	}
	switch e.Name {
	case "copy_words", "unary_f32", "dropout_f32", "gather_view_f32", "scatter_view_f32", "scale_ptr_f32", "compact_rows_f32", "add_rows_f32",
		"causal_mask_f32", "gumbel_f32", "clamp_f32", "nan_to_num_f32", "scale_inplace_f32", "zscore_fwd_f32", "pad_f32", "pad_grad_f32",
		"pad_multi_f32": // (pad_multi_f32: at most n read; the backend states its entries' bytes, costHinter)
		e.Bytes = 2 * w * n
	case "f32_to_bf16_kernel", "bf16_to_f32_kernel", "pad_bf16": // pad_bf16 reads at most its n fp32
		e.Bytes = 6 * n
	case "f32_to_bf16_pad_kernel", "f32_cat_to_bf16_pad_kernel": // fp32 rows×cols read, bf16 rows×ld written
		e.Bytes = 4*a.i("rows")*a.i("cols") + 2*a.i("rows")*a.i("ld")
	case "grad_unary_f32", "binary_f32", "binary_dense_f32", "zscore_bwd_f32", "axpy_acc_f32", "ema_f32":
		e.Bytes = 3 * w * n
	case fusedGenDense, fusedGenBcast, fusedGenView, fusedGenSum:
		// the backend states the inputs' sizes (costHinter); without
		// that, one input and the output
		e.Bytes = 2 * w * n
	case "sat_count_f32":
		e.Bytes = w * a.i("rows") * a.i("R")
	case "adamw_f32":
		e.Bytes = 7 * w * n // p, g, m, v read; p, m, v written
	case "adamw_f64_f32", "adamw_multi_f64_f32":
		e.Bytes = 7 * w * a.i("n")
	case "scale_multi_f32":
		e.Bytes = 2 * w * a.i("n")
	case "sumsq_f32", "sumsq_parts_f32":
		e.Bytes = w * n
	case "sum_part_f64":
		e.Class, e.Bytes = perf.ClassSerial, 8*a.i("n")
	case "reduce_view_f32":
		e.Class, e.Bytes = perf.ClassSerial, w*a.i("nout")*(a.i("nred")*reduceInputs(a)+1)
	case "reduce_rows_f32", "reduce_cols_f32":
		reduceCost(e, a)
	case "reduce_parts_f32":
		e.Bytes = (8*a.i("parts") + w) * a.i("nout")
	case "sum_parts_f64":
		e.Bytes = (8*a.i("parts") + 8) * a.i("nout")
	case "zscore_sq_part_f32":
		e.Bytes = w*n + 8*math.Ceil(n/max(1, a.i("chunk")))
	case "zscore_grad_part_f32":
		e.Bytes = 2*w*n + 16*math.Ceil(n/max(1, a.i("chunk")))
	case "layernorm_fwd_bf16pad": // fp32 rows×D read, bf16 rows×ld written
		e.Bytes = w*a.i("rows")*a.i("D") + 2*a.i("rows")*a.i("ld")
	case "layernorm_bwd_f32":
		// dy and x read, dx written, two double partials per column and chunk
		e.Bytes = 3*w*a.i("rows")*a.i("D") + 16*float64(grid[0])*a.i("W")
	case "layernorm_bwd_params_f32":
		// dy and x, then two double partials per column and chunk
		e.Bytes = 2*w*a.i("rows")*a.i("D") + 16*float64(grid[1])*a.i("D")
	case "softmax_ce_fused_f32", "softmax_ce_smem_f32":
		// the chunk's logits: read for the maximum and the sum (one pass),
		// read again (a chunk of rows × 50,257 does not fit in L2; the
		// smem kernel reads its copy in shared memory) and written as the
		// gradient, in fp32 or (gb) as bf16
		reads := 2.0
		if e.Name == "softmax_ce_smem_f32" {
			reads = 1
		}
		e.Bytes = (reads + 1) * w * a.i("rows") * a.i("V")
		if a.ptr("gb") != 0 {
			e.Bytes = reads*w*a.i("rows")*a.i("V") + 2*a.i("rows")*a.i("gld")
		}
		// both passes' arithmetic per logit, whichever memory it reads
		// (ceInstrPerLogit: the floor the sixth run measured)
		e.Scalar = ceInstrPerLogit * a.i("rows") * a.i("V")
	case "gaussian_membership_f32":
		N, D, R := a.i("N"), a.i("D"), a.i("R")
		e.Bytes, e.Flops = w*(N*D+N*R), 3*N*D*R
	case "gaussian_membership_bwd_rows_f32":
		N, D, R := a.i("N"), a.i("D"), a.i("R")
		e.Bytes, e.Flops = w*(2*N*D+4*N*R), 6*N*D*R
	case "gaussian_membership_bwd_params_part_f32":
		// z and the rows' dz2, dss once (z's re-reads for each regime stay
		// in L1/L2), R·D + 2R double partials per chunk; the FMAs are in
		// double (half the fp32 rate on Hopper: counted twice)
		N, D, R := a.i("N"), a.i("D"), a.i("R")
		chunks := math.Ceil(N / max(1, a.i("chunk")))
		e.Bytes, e.Flops = w*(N*D+2*N*R)+8*(R*D+2*R)*chunks, 4*N*D*R
	case "gaussian_membership_bwd_params_f32":
		// every center's partials and its regime's Σ dz2 (re-read, in L2)
		D, R, chunks := a.i("D"), a.i("R"), a.i("chunks")
		e.Bytes = 8*(R*D+2*R)*chunks + w*(2*R*D+2*R)
	case "sinkhorn_f32", "sinkhorn_bwd_f32":
		R, K, it := a.i("R"), a.i("K"), a.i("iters")
		e.Class, e.Bytes = perf.ClassSerial, 8*R*K*(2*it+2)
	case "attention_fwd_f32", "attention_bwd_dq_f32", "attention_bwd_dkdv_f32", "attention_bwd_dbias_f32":
		attentionCost(e, a, grid)
	case "attention_fwd_bf16", "attention_bwd_dq_bf16", "attention_bwd_dkdv_bf16":
		flashCost(e, a, grid)
	case "attn_pack_bf16", "attn_unpack_f32", "attn_unpack_bf16", "attn_pack_do_bf16", "attn_softmax_fwd_f32", "attn_softmax_bwd_f32":
		attnGEMMCost(e, a)
	case "expert_route_i32", "expert_gather_f32", "expert_act_f32", "expert_drop_f32", "expert_scatter_f32", "expert_out_grad_f32",
		"expert_hidden_grad_f32", "expert_colsum_f32", "expert_gemm_f32":
		expertCost(e, a)
	case "attention_dbias_reduce_f32":
		T := a.i("T")
		e.Bytes = w * T * T * (a.i("G")/2 + 1) // the partial sums on and below the diagonal, the result
	default:
		if m, ok := matrixPasses[e.Name]; ok {
			e.Bytes = m.words * w * a.i(m.rows) * a.i(m.cols)
		}
	}
}

// matrixPasses: the kernels that move words fp32 words per element of a
// matrix whose rows and columns the arguments rows and cols count (one
// read and one write: 2).
var matrixPasses = map[string]struct {
	words      float64
	rows, cols string
}{
	"gather_rows_f32":      {2, "rows", "D"},
	"gather_grad_csr_f32":  {2, "nuniq", "D"},
	"layernorm_fwd_f32":    {2, "rows", "D"},
	"layernorm_bwd_dx_f32": {3, "rows", "D"},
	"softmax_rows_f32":     {2, "rows", "n"},
	"topk_mask_f32":        {2, "rows", "n"},
	"softmax_rows_bwd_f32": {3, "rows", "n"},
	"ce_rows_f32":          {2, "rows", "V"},
	"ce_grad_f32":          {3, "rows", "V"},
}

// attnGEMMCost: attngemm.cu's kernels. The packs read the fp32 operand
// and write its bf16 copy, the unpack reads and writes fp32; the row
// kernels read the scores (and dP) on and below the diagonal, the bias
// once (its re-reads by every sequence and head stay in L2), and write
// whole bf16 rows of Tp (and, with a bias, the bias gradient's G partial
// sums on and below the diagonal).
func attnGEMMCost(e *perf.Event, a kargs) {
	const w = 4.0
	BH, T, Hd := a.i("BH"), a.i("T"), a.i("Hd")
	rows, tri := BH*T, BH*T*(T+1)/2
	written := rows * a.i("Tp") // the weights' bf16 rows: whole, or (not full) pairs up to the diagonal
	if a.i("full") == 0 {
		written = tri + rows
	}
	bias := 0.0
	if a.ptr("bias") != 0 {
		bias = w * T * T
	}
	switch e.Name {
	case "attn_pack_bf16": // fp32 (or half: bf16) read, bf16 written
		e.Bytes = w*rows*Hd + 2*rows*a.i("Hp")
		if a.i("half") != 0 {
			e.Bytes = 2*rows*Hd + 2*rows*a.i("Hp")
		}
	case "attn_unpack_f32":
		e.Bytes = 2 * w * rows * Hd
		if a.ptr("tw") != 0 {
			e.Bytes += 2 * rows * Hd
		}
	case "attn_unpack_bf16": // fp32 read (or half: bf16), bf16 written
		e.Bytes = w*rows*Hd + 2*rows*Hd
		if a.i("half") != 0 {
			e.Bytes = 2*rows*a.i("Hp") + 2*rows*Hd
		}
	case "attn_pack_do_bf16":
		e.Bytes = 2*w*rows*Hd + 2*rows*a.i("Hp") + w*rows
	case "attn_softmax_fwd_f32":
		e.Bytes = w*tri + bias + 2*written + w*rows
	case "attn_softmax_bwd_f32":
		e.Bytes = 2*w*tri + bias + 4*written + 2*w*rows
		if a.ptr("part") != 0 {
			e.Bytes += w * a.i("G") * T * (T + 1) / 2
		}
	}
}

// flashWarpTiles counts the 16×32 tiles of scores flash.cu's warps compute
// for one (sequence, head) pair: rows in blocks of 64 (4 warps of 16), the
// other side in tiles of 32, tiles wholly above the diagonal skipped. keys
// is true for the dk/dv kernel (warps own keys and walk the queries).
func flashWarpTiles(T int, keys bool) float64 {
	n := 0
	for w0 := 0; w0 < T; w0 += 16 {
		if keys { // query tiles from the warp's diagonal to the end
			n += (T+31)/32 - w0/32
			continue
		}
		q0 := w0 / 64 * 64 // key tiles up to the warp's last row, within the block's
		n += min((w0+15)/32, (min(q0+64, T)-1)/32) + 1
	}
	return float64(n)
}

// flashCost: flash.cu's tensor-core attention. Per 16×32 tile of scores a
// warp does 16·32·Hp multiply-adds per product (Hp = Hd padded to 16): the
// forward two (q·k, P·v: one pass with the online softmax), dq three (q·k,
// dO·v, dS·k), dk/dv four (q·k, dO·v, P·dO, dS·q), and about 60 scalar
// instructions per score for the mask, bias, exp, the dropout hash (two
// 64-bit multiplies) and the bf16 rounding. Bytes: the fp32
// operands read once and results written once (tiles re-read by other
// blocks stay in L2); the bias read once; dq's bias-gradient partial sums
// read and written once per (sequence, head) pair.
func flashCost(e *perf.Event, a kargs, grid [3]uint32) {
	T, Hd := a.i("T"), a.i("Hd")
	Hp := math.Ceil(Hd/16) * 16
	BH := float64(grid[1])
	if e.Name == "attention_bwd_dq_bf16" { // grid.y: the partial sums
		BH = a.i("BH")
	}
	rows := BH * T * Hd * 4
	bias := 0.0
	if a.ptr("bias") != 0 {
		bias = T * T * 4
	}
	const perScore = 60.0
	tile := 2 * 16 * 32 * Hp // FLOPs of one product over a tile
	e.Class = perf.ClassMMA
	switch e.Name {
	case "attention_fwd_bf16":
		n := BH * flashWarpTiles(int(T), false)
		e.Flops, e.Scalar, e.Bytes = 2*tile*n, perScore*512*n, 4*rows+bias
	case "attention_bwd_dq_bf16":
		n := BH * flashWarpTiles(int(T), false)
		e.Flops, e.Scalar, e.Bytes = 3*tile*n, perScore*512*n, 6*rows+bias
		if a.ptr("part") != 0 {
			e.Bytes += 2 * 4 * BH * T * (T + 1) / 2
		}
	case "attention_bwd_dkdv_bf16":
		n := BH * flashWarpTiles(int(T), true)
		e.Flops, e.Scalar, e.Bytes = 4*tile*n, perScore*512*n, 6*rows+bias
	}
}

// reduceCost: the first pass of a two-pass reduction over x [A, R, C]
// (C = 1 for reduce_rows_f32): x once, then a double partial per output
// and chunk, or the float output itself with one chunk.
func reduceCost(e *perf.Event, a kargs) {
	A, R, C := a.i("A"), a.i("R"), max(1, a.i("C"))
	chunks := math.Ceil(R / max(1, a.i("chunk")))
	out := 4.0
	if a.ptr("part") != 0 {
		out = 8 * chunks
	}
	e.Bytes = 4*A*R*C*reduceInputs(a) + out*A*C
}

// reduceInputs: a reduction kernel reads x, and y too when it sums the
// products x·y.
func reduceInputs(a kargs) float64 {
	if a.ptr("y") != 0 {
		return 2
	}
	return 1
}

// attentionCost: the scalar attention kernels of attention.cu. P is the
// number of causal (i, j) pairs over every sequence and head. Products
// where each thread walks its own row of Hd floats (q·k in every kernel,
// dO·v in the backward) touch 32 lines per warp-wide load: Strided. The
// products over j with threads along d (p·v, dS·k, dS·q, p·dO) are
// coalesced: SIMT.
func attentionCost(e *perf.Event, a kargs, grid [3]uint32) {
	T, Hd := a.i("T"), a.i("Hd")
	BH := float64(grid[1])
	if e.Name == "attention_bwd_dbias_f32" {
		BH = a.i("BH")
	}
	P := BH * T * (T + 1) / 2
	rows := BH * T * Hd * 4 // one [B,H,T,Hd] fp32 tensor
	bias := 0.0
	if a.ptr("bias") != 0 {
		bias = T * T * 4
	}
	e.Class = perf.ClassSIMT
	switch e.Name {
	case "attention_fwd_f32": // s = q·k; o = p·v
		e.Strided, e.Flops, e.Bytes = 2*P*Hd, 2*P*Hd, 4*rows+bias
	case "attention_bwd_dq_f32": // q·k, dO·v; dq = dS·k
		e.Strided, e.Flops, e.Bytes = 4*P*Hd, 2*P*Hd, 6*rows+bias
	case "attention_bwd_dkdv_f32": // q·k, dO·v; dk = dS·q, dv = p·dO
		e.Strided, e.Flops, e.Bytes = 4*P*Hd, 4*P*Hd, 6*rows+bias
	case "attention_bwd_dbias_f32": // q·k, dO·v over every head
		e.Strided, e.Bytes = 4*P*Hd, 4*rows+2*bias
	}
}

// expertCost: src/expert.cu's kernels over every row of their capacity
// (an upper bound: the backend states the routed rows it expects,
// workHinter, and those figures replace these).
func expertCost(e *perf.Event, a kargs) {
	const w = 4.0
	n := a.i("n")
	switch e.Name {
	case "expert_route_i32": // a column of w read (a sector a token), the rows written
		e.Class, e.Bytes = perf.ClassSerial, (32+w)*n
	case "expert_gather_f32", "expert_act_f32", "expert_drop_f32", "expert_scatter_f32":
		e.Bytes = 2 * w * n
	case "expert_hidden_grad_f32":
		e.Bytes = 3 * w * n
	case "expert_out_grad_f32": // dout and h read, dh written: a thread walks its row
		e.Class, e.Bytes = perf.ClassSerial, 3*w*n*a.i("D")
	case "expert_colsum_f32":
		e.Bytes = w * a.i("cap") * a.i("W")
	case "expert_gemm_f32":
		m, k := a.i("m"), a.i("k")
		switch a.i("dyn") {
		case 1:
			m = a.i("cap")
		case 2:
			k = a.i("cap")
		}
		N := a.i("N")
		e.Class, e.Flops, e.Bytes = perf.ClassSIMT, 2*m*N*k, w*(m*k+k*N+m*N)
	}
}
