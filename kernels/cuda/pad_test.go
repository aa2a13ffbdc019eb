package cuda

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/passes"
)

// TestGPUPadBF16: pad_bf16 writes a weight's bf16 copy in a Pad layout
// (rows in head blocks of 85 stored as 88, columns 37 as 40) in rows of ld,
// each value rounded to bf16 and zeros in the padding and up to ld,
// whatever the buffer held; on the simulator again in differential mode.
func TestGPUPadBF16(t *testing.T) {
	differentially(t, []string{"pad_bf16"}, func() { padBF16(t) })
}

func padBF16(t *testing.T) {
	c := gpuContext(t)
	r := rand.New(rand.NewPCG(61, 62))
	pd := padding{rows: ir.PadSpan{Blocks: 3, Size: 85, Padded: 88}, cols: ir.PadSpan{Blocks: 1, Size: 37, Padded: 40}}
	rows, cols, ld := pd.rows.Stored(), pd.cols.Stored(), 48 // ld past the padded columns too
	x := randF32(r, pd.rows.Logical()*pd.cols.Logical(), 10)
	dx := devF32(t, c, x)
	dy := devF32(t, c, randF32(r, rows*ld/2, 1)) // garbage where the padding goes
	n := rows * ld
	if err := c.Launch("pad_bf16", grid1(n), block1, 0, dy.Ptr, dx.Ptr, int32(pd.rows.Size), int32(pd.rows.Padded),
		int32(cols), int32(pd.cols.Size), int32(pd.cols.Padded), int32(ld), int64(n)); err != nil {
		t.Fatal(err)
	}
	words := hostF32(t, c, dy, n/2)
	h := unsafe.Slice((*uint16)(unsafe.Pointer(&words[0])), n)
	for i := 0; i < rows; i++ {
		for j := 0; j < ld; j++ {
			got := float64(math.Float32frombits(uint32(h[i*ld+j]) << 16))
			want := 0.0
			if si, sj := pd.rows.Source(i), pd.cols.Source(j); j < cols && si >= 0 && sj >= 0 {
				want = roundBF16(x[si*pd.cols.Logical()+sj])
			}
			if got != want {
				t.Fatalf("row %d column %d: %g, want %g", i, j, got, want)
			}
		}
	}
}

// TestGPUPaddedWeights: a Linear and the fused LM head whose weights are
// Pads of store tensors (columns 85 → 88; the Linear's rows in head blocks
// 2 × 15 → 2 × 16) match the CPU within bf16's bounds. The Linear's Pad runs
// no fp32 kernel (its GEMM reads the bf16 copy pad_bf16 makes); the head's
// does, since its last chunk of rows (8 of 26, chunks of 9) is too short
// for a bf16 GEMM and reads the fp32 value.
func TestGPUPaddedWeights(t *testing.T) {
	const R, D, V, N = 26, 85, 111, 30
	g := ir.New("padded")
	x := g.Input("x", ir.Shape{R, 88}, ir.F32)
	w := g.Op1("Pad", ir.Attrs{"cols": []int{1, D, 88}}, g.Param("w", ir.Shape{V, D}))
	u := g.Op1("Pad", ir.Attrs{"rows": []int{2, 15, 16}, "cols": []int{1, D, 88}}, g.Param("u", ir.Shape{N, D}))
	tg := g.Input("t", ir.Shape{R}, ir.I32)
	outs := g.Apply("LMHeadCrossEntropy", ir.Attrs{"chunk": 9}, x, w, tg)
	outs = append(outs, g.Op1("Linear", nil, x, u))
	names := []string{"sum", "ce", "pred", "y"}
	for i, o := range outs {
		g.SetOutput(names[i], o)
	}
	r := rand.New(rand.NewPCG(81, 82))
	weights := map[string]*kernels.Tensor{"w": {Shape: ir.Shape{V, D}, F32: randF32(r, V*D, 1)}, "u": {Shape: ir.Shape{N, D}, F32: randF32(r, N*D, 1)}}
	xs := randF32(r, R*88, 1)
	for i := range R { // the input's padding is zero, as the model's is
		clear(xs[i*88+D : (i+1)*88])
	}
	ids := make([]int32, R)
	for i := range ids {
		ids[i] = int32(r.IntN(V))
	}
	feeds := map[string]*kernels.Tensor{"x": {Shape: ir.Shape{R, 88}, F32: xs}, "t": kernels.IntTensor(ir.Shape{R}, ids)}
	want := cpuOutputs(t, g, weights, feeds, names)
	got := runOn(t, gpuBackend(t, ir.BF16), g, weights, feeds, names)
	if got.launches["pad_f32"] != 1 || got.launches["pad_bf16"] != 1 {
		t.Errorf("pad_f32 ran %d times (want 1: the head's), pad_bf16 %d (want 1: the Linear's)", got.launches["pad_f32"], got.launches["pad_bf16"])
	}
	for _, n := range []string{"sum", "ce"} {
		if worst, l2 := attnErrors(got.outs[n], float64s(want[n])); worst > 3e-2 || l2 > 1e-2 {
			t.Errorf("%s: worst %.3g, L2 %.3g against the CPU (bounds 3e-2, 1e-2)", n, worst, l2)
		}
	}
	// y over the bf16-rounded operands, its padded rows zero: fp32 rounding apart
	rows := ir.PadSpan{Blocks: 2, Size: 15, Padded: 16}
	ref := make([]float64, R*rows.Stored())
	for i := range R {
		for j := range rows.Stored() {
			if src := rows.Source(j); src >= 0 {
				for k := range D {
					ref[i*rows.Stored()+j] += roundBF16(xs[i*88+k]) * roundBF16(weights["u"].F32[src*D+k])
				}
			}
		}
	}
	if worst, _ := attnErrors(got.outs["y"], ref); worst > 1e-5 {
		t.Errorf("y: worst %.3g against the product of the bf16 operands", worst)
	}
}

// TestSimPadRuns: consecutive Pads run as one pad_multi_f32 launch, and
// consecutive PadGrads too where none would write a plan slot an earlier
// one reads (here each PadGrad's dy is an intermediate the plan frees for
// the next one's result, so those run apart); every output equals the
// CPU's bit for bit (a Pad and its gradient copy values). Normal and
// differential.
func TestSimPadRuns(t *testing.T) {
	parityDevice(t)
	differentially(t, []string{"pad_multi_f32"}, func() { padRuns(t) })
}

func padRuns(t *testing.T) {
	r := rand.New(rand.NewPCG(63, 64))
	g := ir.New("pad-runs")
	feeds := map[string]*kernels.Tensor{}
	input := func(name string, s ir.Shape) *ir.Value {
		feeds[name] = randTensor(r, s)
		return g.Input(name, s, ir.F32)
	}
	grad := ir.Attrs{"rows": []int{3, 85, 88}, "cols": []int{1, 37, 40}, "shape": []int{255, 37}}
	// two dy intermediates, each read last by its PadGrad below
	n0 := g.Op1("Neg", nil, input("d2", ir.Shape{264, 40}))
	n1 := g.Op1("Neg", nil, input("d3", ir.Shape{264, 40}))
	heads := ir.Attrs{"rows": []int{3, 85, 88}, "cols": []int{1, 37, 40}}
	g.SetOutput("p0", g.Op1("Pad", heads, input("x0", ir.Shape{255, 37})))
	g.SetOutput("p1", g.Op1("Pad", ir.Attrs{"cols": []int{1, 1021, 1024}}, input("x1", ir.Shape{1021})))
	g.SetOutput("p2", g.Op1("Pad", ir.Attrs{"cols": []int{2, 15, 16}}, input("x2", ir.Shape{9, 30})))
	g.SetOutput("g0", g.Op1("PadGrad", grad, input("d0", ir.Shape{264, 40})))
	g.SetOutput("g1", g.Op1("PadGrad", grad, input("d1", ir.Shape{264, 40})))
	pg0 := g.Op1("PadGrad", grad, n0)
	pg1 := g.Op1("PadGrad", grad, n1) // its result may take n0's slot, which pg0 freed: a run of its own then
	g.SetOutput("g2", g.Op1("Scale", ir.Attrs{"alpha": 2.0, "beta": 0.0}, pg0))
	g.SetOutput("g3", g.Op1("Scale", ir.Attrs{"alpha": 2.0, "beta": 0.0}, pg1))
	be := gpuBackend(t, ir.FP32)
	tr, err := be.StartTrace()
	if err != nil {
		t.Fatal(err)
	}
	var outs [2]kernels.Program
	for i, b := range []kernels.Backend{cpu.New(ir.FP32), be} {
		p, err := b.Compile(g, passes.Plan(g), kernels.NewStore(ir.FP32))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if err := p.Run(feeds, 7); err != nil {
			t.Fatal(err)
		}
		outs[i] = p
	}
	for name := range g.Outputs {
		if !sameBits(outs[0].Output(name).F32, outs[1].Output(name).F32) {
			t.Errorf("output %s differs from the CPU's", name)
		}
	}
	launches := map[string]int{}
	for _, e := range tr.Events() {
		launches[e.Name]++
	}
	t.Logf("pad_multi_f32 %d launches, pad_grad_f32 %d", launches["pad_multi_f32"], launches["pad_grad_f32"])
	if launches["pad_multi_f32"] < 2 || launches["pad_f32"] != 0 {
		t.Errorf("pad_multi_f32 ran %d times (want the Pads' run and the first PadGrads'), pad_f32 %d (want 0), pad_grad_f32 %d",
			launches["pad_multi_f32"], launches["pad_f32"], launches["pad_grad_f32"])
	}
}
