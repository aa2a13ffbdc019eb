package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cuda/driver"
	"github.com/rpac-dev/rpac/kernels/cuda/perf"
	"github.com/rpac-dev/rpac/training/optim"
)

// roundBF16 rounds to the nearest bfloat16 (ties to even), as
// f32_to_bf16 does.
func roundBF16(v float32) float64 {
	u := math.Float32bits(v)
	u += 0x7fff + (u>>16)&1
	return float64(math.Float32frombits(u &^ 0xffff))
}

// matmulRef is the float64 row-major product op(A)·op(B) of a batch, the
// inputs first rounded to bf16 when bf16 is set.
func matmulRef(a, b []float32, batch, M, N, K int, transA, transB, bf16 bool) []float64 {
	in := func(x float32) float64 {
		if bf16 {
			return roundBF16(x)
		}
		return float64(x)
	}
	out := make([]float64, batch*M*N)
	for p := 0; p < batch; p++ {
		A, B := a[p*M*K:(p+1)*M*K], b[p*K*N:(p+1)*K*N]
		for i := 0; i < M; i++ {
			for j := 0; j < N; j++ {
				var s float64
				for k := 0; k < K; k++ {
					ai, bi := i*K+k, k*N+j
					if transA {
						ai = k*M + i
					}
					if transB {
						bi = j*K + k
					}
					s += in(A[ai]) * in(B[bi])
				}
				out[p*M*N+i*N+j] = s
			}
		}
	}
	return out
}

// gemmCase is one MatMul: op(A) [M,K], op(B) [K,N], a batch of Batch
// (0: plain 2-D matrices), A and B inputs or parameters (weights).
type gemmCase struct {
	M, N, K, Batch int
	TransA, TransB bool
	Stored         bool
}

func (c gemmCase) String() string {
	return fmt.Sprintf("%dx%dx%d batch %d trans %v/%v stored %v", c.M, c.N, c.K, c.Batch, c.TransA, c.TransB, c.Stored)
}

// shapes are the stored shapes of A and B.
func (c gemmCase) shapes() (ir.Shape, ir.Shape) {
	a, b := ir.Shape{c.M, c.K}, ir.Shape{c.K, c.N}
	if c.TransA {
		a = ir.Shape{c.K, c.M}
	}
	if c.TransB {
		b = ir.Shape{c.N, c.K}
	}
	if c.Batch > 0 {
		a, b = append(ir.Shape{c.Batch}, a...), append(ir.Shape{c.Batch}, b...)
	}
	return a, b
}

// graph builds the case's MatMul, its operands in store (parameters) or
// in feeds (inputs).
func (c gemmCase) graph(r *rand.Rand) (*ir.Graph, *kernels.Store, map[string]*kernels.Tensor) {
	g := ir.New("gemm")
	st, feeds := kernels.NewStore(ir.FP32), map[string]*kernels.Tensor{}
	sa, sb := c.shapes()
	var vals []*ir.Value
	for i, s := range []ir.Shape{sa, sb} {
		name := string(rune('a' + i))
		x := randF32(r, s.Numel(), 1)
		if c.Stored {
			vals = append(vals, g.Param(name, s))
			t, _ := st.Ensure(name, s)
			copy(t.F32, x)
			continue
		}
		vals = append(vals, g.Input(name, s, ir.F32))
		feeds[name] = &kernels.Tensor{Shape: s.Clone(), F32: x}
	}
	g.SetOutput("y", g.Op1("MatMul", ir.Attrs{"transA": c.TransA, "transB": c.TransB}, vals...))
	return g, st, feeds
}

// operands returns A's and B's values.
func operands(st *kernels.Store, feeds map[string]*kernels.Tensor) ([]float32, []float32) {
	if t := feeds["a"]; t != nil {
		return t.F32, feeds["b"].F32
	}
	return st.Get("a").F32, st.Get("b").F32
}

// gemmCases: the paper preset's awkward sizes (85, 510, 1,020) and tiny
// ones (5, 1) in every position and every transpose combination, batched
// and not, inputs and weights.
func gemmCases() []gemmCase {
	dims := [][3]int{{85, 510, 1020}, {1020, 85, 510}, {510, 1020, 85}, {5, 85, 510}, {85, 1, 510}, {1, 510, 85}, {510, 85, 5}}
	var cs []gemmCase
	for i, d := range dims {
		for tr := 0; tr < 4; tr++ {
			c := gemmCase{M: d[0], N: d[1], K: d[2], TransA: tr&1 != 0, TransB: tr&2 != 0, Stored: (i+tr)%2 == 0}
			cs = append(cs, c)
		}
	}
	for tr := 0; tr < 4; tr++ {
		cs = append(cs, gemmCase{M: 37, N: 85, K: 13, Batch: 3, TransA: tr&1 != 0, TransB: tr&2 != 0, Stored: tr%2 == 1})
	}
	return cs
}

// TestSimGEMMParity: MatMul through the backend (cached plans; in bf16
// with padded operand copies) against float64 products of the same inputs
// (rounded to bf16 where the backend rounds them), for unaligned sizes in
// every transpose combination, batched and not, activations and weights;
// a second Run repeats the first bit for bit. On the simulator or a GPU.
func TestSimGEMMParity(t *testing.T) {
	parityDevice(t)
	for _, prec := range []ir.Precision{ir.FP32, ir.BF16} {
		be := gpuBackend(t, prec)
		r := rand.New(rand.NewPCG(41, 42))
		for _, c := range gemmCases() {
			g, st, feeds := c.graph(r)
			p, err := be.Compile(g, nil, st)
			if err != nil {
				t.Fatalf("%s %v: %v", prec, c, err)
			}
			if err := p.Run(feeds, 0); err != nil {
				t.Fatalf("%s %v: %v", prec, c, err)
			}
			got := append([]float32(nil), p.Output("y").F32...)
			a, b := operands(st, feeds)
			bf16 := prec == ir.BF16 && min(c.M, c.N, c.K) > SmallGEMMDim
			want := matmulRef(a, b, max(1, c.Batch), c.M, c.N, c.K, c.TransA, c.TransB, bf16)
			closeTo(t, fmt.Sprintf("%s %v", prec, c), got, want, 1e-4)
			if err := p.Run(feeds, 0); err != nil {
				t.Fatalf("%s %v: second run: %v", prec, c, err)
			}
			for i, v := range p.Output("y").F32 {
				if math.Float32bits(v) != math.Float32bits(got[i]) {
					t.Fatalf("%s %v: second run differs at %d: %g, first %g", prec, c, i, v, got[i])
				}
			}
			p.Close()
			be.Release(st)
		}
	}
}

// linearGraph is y = Linear(x, w) (no bias), dx = LinearGradX(dy, w) and
// dw = LinearGradW(dy, x): the weight as transposed and as plain B, dy
// read by two GEMMs in a row.
func linearGraph(R, N, K int) *ir.Graph {
	g := ir.New("linear")
	w := g.Param("w", ir.Shape{N, K})
	x := g.Input("x", ir.Shape{R, K}, ir.F32)
	dy := g.Input("dy", ir.Shape{R, N}, ir.F32)
	g.SetOutput("y", g.Op1("Linear", nil, x, w))
	g.SetOutput("dx", g.Op1("LinearGradX", nil, dy, w))
	g.SetOutput("dw", g.Op1("LinearGradW", nil, dy, x))
	return g
}

// checkLinear compares the program's outputs with bf16 products on w.
func checkLinear(t *testing.T, what string, p kernels.Program, feeds map[string]*kernels.Tensor, w []float32, R, N, K int) {
	t.Helper()
	closeTo(t, what+" y", p.Output("y").F32, matmulRef(feeds["x"].F32, w, 1, R, N, K, false, true, true), 1e-4)
	closeTo(t, what+" dx", p.Output("dx").F32, matmulRef(feeds["dy"].F32, w, 1, R, K, N, false, false, true), 1e-4)
	closeTo(t, what+" dw", p.Output("dw").F32, matmulRef(feeds["dy"].F32, feeds["x"].F32, 1, N, K, R, true, false, true), 1e-4)
}

// TestSimGEMMPlansReused: a program makes its cuBLASLt descriptors,
// layouts and algorithms on the first Run only; later Runs only multiply;
// Close destroys them.
func TestSimGEMMPlansReused(t *testing.T) {
	d := simOnly(t)
	be := gpuBackend(t, ir.BF16)
	const R, N, K = 37, 85, 510
	g, st, w, feeds := linearFixture(R, N, K, 43)
	live := d.SimStat("lt_live")
	p, err := be.Compile(g, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(feeds, 0); err != nil {
		t.Fatal(err)
	}
	descs, heur, gemms := d.SimStat("lt_descs"), d.SimStat("lt_heuristics"), d.SimStat("gemms")
	if got := d.SimStat("lt_live") - live; got != 3*4 {
		t.Errorf("after the first run: %d live descriptors and layouts, want 12 (three plans)", got)
	}
	for i := 0; i < 3; i++ {
		if err := p.Run(feeds, 0); err != nil {
			t.Fatal(err)
		}
	}
	if d.SimStat("lt_descs") != descs || d.SimStat("lt_heuristics") != heur {
		t.Errorf("later runs made %d descriptors and asked the heuristic %d times, want 0 and 0",
			d.SimStat("lt_descs")-descs, d.SimStat("lt_heuristics")-heur)
	}
	if n := d.SimStat("gemms") - gemms; n != 9 {
		t.Errorf("three runs of three GEMMs ran %d matmuls", n)
	}
	checkLinear(t, "reused plans", p, feeds, w.F32, R, N, K)
	p.Close()
	if got := d.SimStat("lt_live"); got != live {
		t.Errorf("after Close: %d live descriptors and layouts, want %d", got, live)
	}
	be.Release(st)
}

// TestSimBF16WeightRefreshed: a weight's bf16 copy is made once and used
// until the weight changes: by an upload of a changed store value, or by a
// device optimizer step, which writes the copy itself (the next run
// converts no weight; the copy equals the conversion of the new weights
// bit for bit, its padding zero); a stale copy fails the comparison. On
// the simulator or a GPU (the launch count, a simulator counter, is
// checked on the simulator only). On the simulator all of it again in
// differential mode.
func TestSimBF16WeightRefreshed(t *testing.T) {
	d := parityDevice(t)
	differentially(t, []string{"adamw_multi_f64_f32", "f32_to_bf16_pad_kernel"}, func() { bf16WeightRefreshed(t, d) })
}

func bf16WeightRefreshed(t *testing.T, d *driver.Driver) {
	be := gpuBackend(t, ir.BF16)
	const R, N, K = 37, 85, 510
	g, st, w, feeds := linearFixture(R, N, K, 45)
	p, err := be.Compile(g, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Release(st)
	defer p.Close()
	launches := func() int64 { return d.SimStat("launches") }
	if err := p.Run(feeds, 0); err != nil {
		t.Fatal(err)
	}
	checkLinear(t, "first run", p, feeds, w.F32, R, N, K)
	// the same weight again: converted in the first run only
	n0 := launches()
	p.(interface{ ReuseStored() }).ReuseStored()
	if err := p.Run(feeds, 0); err != nil {
		t.Fatal(err)
	}
	// x for y, dy for dx (kept for dw), x again for dw: 3 launches, and dw
	// (85 × 510, over padded dims) compacted out of the workspace; w is
	// not converted
	want := int64(3)
	if be.padGradW {
		want++
	}
	if n := launches() - n0; d.Simulated() && n != want {
		t.Errorf("a run on an unchanged weight made %d launches, want %d (the activations' conversions, dw's compaction)", n, want)
	}
	// a changed store value, uploaded by the next Run
	for i := range w.F32 {
		w.F32[i] = -2 * w.F32[i]
	}
	if err := p.Run(feeds, 0); err != nil {
		t.Fatal(err)
	}
	checkLinear(t, "after an upload", p, feeds, w.F32, R, N, K)
	// a device optimizer step
	opt, err := NewDeviceAdamW(be, st, hyperOf(optim.DefaultAdamW()), []string{"w"})
	if err != nil {
		t.Fatal(err)
	}
	defer opt.Close()
	if err := p.Run(feeds, 0); err != nil {
		t.Fatal(err)
	}
	checkLinear(t, "on the device optimizer's weights", p, feeds, w.F32, R, N, K)
	unbind, _ := be.bind()
	grad, err := be.dev.alloc(uint64(4 * N * K))
	if err == nil {
		err = be.dev.upload(grad, f32Ptr(randF32(rand.New(rand.NewPCG(47, 48)), N*K, 1)), uint64(4*N*K))
	}
	unbind()
	if err != nil {
		t.Fatal(err)
	}
	if err := opt.Step(map[string]Buffer{"w": grad}, 0.05); err != nil {
		t.Fatal(err)
	}
	if err := opt.SyncToHost(); err != nil {
		t.Fatal(err)
	}
	// the step wrote the weight's bf16 copy too: the next run converts no
	// weight, and the copy holds the new weights rounded as the
	// conversion rounds them, the padding zero
	n0 = launches()
	if err := p.Run(feeds, 0); err != nil {
		t.Fatal(err)
	}
	if n := launches() - n0; d.Simulated() && n != want {
		t.Errorf("a run after a device step made %d launches, want %d (the activations' conversions, dw's compaction)", n, want)
	}
	checkLinear(t, "after a device step", p, feeds, w.F32, R, N, K)
	c, cols := be.maintainedCopy(st, "w")
	if c == nil || cols != K {
		t.Fatalf("the weight's bf16 copy: %v of rows of %d, want one of rows of %d", c, cols, K)
	}
	ld := bf16LD(K)
	got := make([]uint16, N*ld)
	unbind, _ = be.bind()
	err = be.dev.download(unsafe.Pointer(&got[0]), c.buf, uint64(2*len(got)))
	be.dev.free(grad)
	unbind()
	if err != nil {
		t.Fatal(err)
	}
	for r := range N {
		for j := range ld {
			want := uint16(0)
			if j < K {
				want = uint16(math.Float32bits(float32(bf16Round(w.F32[r*K+j]))) >> 16)
			}
			if got[r*ld+j] != want {
				t.Fatalf("copy[%d, %d] = %#04x, want %#04x", r, j, got[r*ld+j], want)
			}
		}
	}
}

// TestSimLinearBiasEpilogue: a Linear's bias is added in the GEMM's
// epilogue (no separate launch), in fp32 and bf16, on unaligned sizes. On
// the simulator or a GPU (the launch count, a simulator counter, is checked
// on the simulator only).
func TestSimLinearBiasEpilogue(t *testing.T) {
	d := parityDevice(t)
	const R, N, K = 37, 85, 510
	for _, prec := range []ir.Precision{ir.FP32, ir.BF16} {
		be := gpuBackend(t, prec)
		g := ir.New("linear-bias")
		w, b := g.Param("w", ir.Shape{N, K}), g.Param("b", ir.Shape{N})
		x := g.Input("x", ir.Shape{R, K}, ir.F32)
		g.SetOutput("y", g.Op1("Linear", nil, x, w, b))
		st := kernels.NewStore(ir.FP32)
		r := rand.New(rand.NewPCG(49, 50))
		wt, _ := st.Ensure("w", ir.Shape{N, K})
		bt, _ := st.Ensure("b", ir.Shape{N})
		copy(wt.F32, randF32(r, N*K, 1))
		copy(bt.F32, randF32(r, N, 1))
		feeds := map[string]*kernels.Tensor{"x": {Shape: ir.Shape{R, K}, F32: randF32(r, R*K, 1)}}
		p, err := be.Compile(g, nil, st)
		if err != nil {
			t.Fatal(err)
		}
		n0 := d.SimStat("launches")
		if err := p.Run(feeds, 0); err != nil {
			t.Fatal(err)
		}
		want := matmulRef(feeds["x"].F32, wt.F32, 1, R, N, K, false, true, prec == ir.BF16)
		for i := range want {
			want[i] += float64(bt.F32[i%N])
		}
		closeTo(t, prec.String()+" Linear with bias", p.Output("y").F32, want, 1e-4)
		// bf16: x and w converted; fp32: nothing but the GEMM
		if n, wantN := d.SimStat("launches")-n0, map[ir.Precision]int64{ir.FP32: 0, ir.BF16: 2}[prec]; d.Simulated() && n != wantN {
			t.Errorf("%s: %d launches besides the GEMM, want %d", prec, n, wantN)
		}
		p.Close()
		be.Release(st)
	}
}

// TestGPUBF16Pad: f32_to_bf16_pad_kernel writes each row's values rounded
// to bf16 (nearest even) and zeros up to the leading dimension, from dense
// source rows and from rows further apart (the LM head's padded logits).
func TestGPUBF16Pad(t *testing.T) {
	c := gpuContext(t)
	r := rand.New(rand.NewPCG(51, 52))
	const rows, cols, ld = 37, 85, 88
	for _, xld := range []int{cols, 92} {
		x := randF32(r, rows*xld, 10)
		dx := devF32(t, c, x)
		dh := devF32(t, c, randF32(r, rows*ld/2, 1)) // garbage where the padding goes
		if err := c.Launch("f32_to_bf16_pad_kernel", grid1D, block1D, 0, dh.Ptr, dx.Ptr, int64(rows), int32(cols), int32(xld), int32(ld)); err != nil {
			t.Fatal(err)
		}
		words := hostF32(t, c, dh, rows*ld/2)
		h := unsafe.Slice((*uint16)(unsafe.Pointer(&words[0])), rows*ld)
		for i := 0; i < rows; i++ {
			for j := 0; j < ld; j++ {
				got := float64(math.Float32frombits(uint32(h[i*ld+j]) << 16))
				want := 0.0
				if j < cols {
					want = roundBF16(x[i*xld+j])
				}
				if got != want {
					t.Fatalf("source rows %d apart: row %d column %d: %g, want %g", xld, i, j, got, want)
				}
			}
		}
	}
}

// linearFixture is linearGraph's R×K by N×K Linear with a random weight
// "w" in a store and random feeds x and dy, drawn from seed.
func linearFixture(R, N, K int, seed uint64) (*ir.Graph, *kernels.Store, *kernels.Tensor, map[string]*kernels.Tensor) {
	g := linearGraph(R, N, K)
	st := kernels.NewStore(ir.FP32)
	w, _ := st.Ensure("w", ir.Shape{N, K})
	r := rand.New(rand.NewPCG(seed, seed+1))
	copy(w.F32, randF32(r, N*K, 1))
	feeds := map[string]*kernels.Tensor{
		"x": {Shape: ir.Shape{R, K}, F32: randF32(r, R*K, 1)}, "dy": {Shape: ir.Shape{R, N}, F32: randF32(r, R*N, 1)}}
	return g, st, w, feeds
}

// TestGPUMeasuredTrace: a measured trace times every launch and GEMM on
// the device (a GPU or the simulator) less the floor of an empty launch,
// Predict sums the times per kernel and in all,
// and the dry-run device, which computes nothing, refuses to measure.
func TestGPUMeasuredTrace(t *testing.T) {
	be := gpuBackend(t, ir.BF16)
	g, st, _, feeds := linearFixture(37, 85, 510, 49)
	p, err := be.Compile(g, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tr, err := be.StartMeasuredTrace()
	if err != nil {
		t.Fatal(err)
	}
	tr.Reset()
	if err := p.Run(feeds, 0); err != nil {
		t.Fatal(err)
	}
	var n, gemms int
	var sum float64
	for _, e := range tr.Events() {
		if e.Kind != perf.EvLaunch && e.Kind != perf.EvGEMM {
			continue
		}
		n++
		if e.Kind == perf.EvGEMM {
			gemms++
		}
		if !(e.Measured >= 0) { // less the floor: 0 for a call no slower than an empty launch
			t.Errorf("%s: measured %v", e.Name, e.Measured)
		}
		sum += e.Measured
	}
	if n == 0 || gemms == 0 || !(sum > 0) || !(tr.Floor() > 0) {
		t.Fatalf("%d launches and GEMMs traced (%d GEMMs), %g s measured in all, floor %g s", n, gemms, sum, tr.Floor())
	}
	pr := perf.Predict(tr.Events(), perf.Machines["h100"], 0)
	var per float64
	for _, k := range pr.Kernels {
		per += k.Measured
	}
	if math.Abs(pr.Measured-sum) > 1e-12 || math.Abs(per-sum) > 1e-12 {
		t.Errorf("measured: events %.6g s, prediction %.6g s, kernels %.6g s", sum, pr.Measured, per)
	}
	dry, err := NewDryRun(ir.BF16, CandidateOptions())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dry.StartMeasuredTrace(); err == nil {
		t.Errorf("the dry-run device accepted a measured trace")
	}
}
