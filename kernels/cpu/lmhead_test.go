package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// lmHeadCases: finite-difference checks of LMHeadCrossEntropyGrad with
// respect to x and W, for chunks that divide N, that do not, of one row,
// and larger than N.
func lmHeadCases() []gradCase {
	var cs []gradCase
	const N, D, V = 5, 3, 7
	// the second target list leaves rows 1 and 3 out (ir.IgnoreTarget)
	for ti, tg := range []spec{ids(ir.Shape{N}, 3, 0, 6, 3, 5), ids(ir.Shape{N}, 3, ir.IgnoreTarget, 6, ir.IgnoreTarget, 5)} {
		for _, ls := range []float64{0, 0.1} {
			for _, chunk := range []int{1, 2, 5, 8} {
				a := ir.Attrs{"label_smoothing": ls, "chunk": chunk}
				name := fmt.Sprintf("LMHeadCrossEntropy/ls=%v/chunk=%d", ls, chunk)
				if ti == 1 {
					name += "/ignored"
				}
				cs = append(cs, gradCase{
					name: name,
					ins:  []spec{in(N, D), in(V, D), tg},
					fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
						return g.Apply("LMHeadCrossEntropy", a, x[0], x[1], x[2])[0]
					},
					bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
						d := g.Apply("LMHeadCrossEntropyGrad", a, dy, x[0], x[1], x[2])
						return []*ir.Value{d[0], d[1], nil}
					},
				})
			}
		}
	}
	// x computed in the graph (a planned intermediate), default chunk.
	a := ir.Attrs{"label_smoothing": 0.2}
	cs = append(cs, gradCase{
		name: "LMHeadCrossEntropy/intermediate-x",
		ins:  []spec{in(4, 2), in(6, 2), ids(ir.Shape{4}, 5, 5, 0, 2)},
		fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
			h := op1(g, "Scale", ir.Attrs{"alpha": 1.5}, x[0])
			return g.Apply("LMHeadCrossEntropy", a, h, x[1], x[2])[0]
		},
		bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
			h := y.Def.Inputs[0]
			d := g.Apply("LMHeadCrossEntropyGrad", a, dy, h, x[1], x[2])
			return []*ir.Value{op1(g, "Scale", ir.Attrs{"alpha": 1.5}, d[0]), d[1], nil}
		},
	})
	return cs
}

// lmHeadData draws x, W and targets with logits of a few units.
func lmHeadData(seed uint64, N, D, V int) (x, w []float64, tg []int32) {
	r := rand.New(rand.NewPCG(seed, 3))
	x = randData(r, N*D, 1)
	w = randData(r, V*D, 1/math.Sqrt(float64(D))*2)
	tg = make([]int32, N)
	for i := range tg {
		tg[i] = int32(r.IntN(V))
	}
	return x, w, tg
}

// The fused op gives the sums of Linear + CrossEntropy on the same inputs
// and the argmax of the Linear logits, and its gradient is that of
// LinearGradX/LinearGradW over CrossEntropyGrad, in both precisions, with
// and without a plan, for several chunk sizes.
func TestLMHeadMatchesLinearCrossEntropy(t *testing.T) {
	for _, sh := range []struct {
		N, D, V int
		chunks  []int
	}{
		{37, 16, 300, []int{1, 8, 10, 37, 64, 0}},
		{9, 8, 2500, []int{4, 0}}, // rows longer than one argmax block
	} {
		N, D, V := sh.N, sh.D, sh.V
		xd, wd, tg := lmHeadData(11, N, D, V)
		// Confident rows: x_r along W of its target, so softmax ≈ onehot there.
		for r := 0; r < 3; r++ {
			for j := 0; j < D; j++ {
				xd[r*D+j] = 8 * wd[int(tg[r])*D+j]
			}
		}
		for _, prec := range []ir.Precision{ir.FP64, ir.FP32} {
			for _, ls := range []float64{0, 0.1} {
				for _, chunk := range sh.chunks {
					for _, planned := range []bool{false, true} {
						name := fmt.Sprintf("V=%d/%v/ls=%v/chunk=%d/plan=%v", V, prec, ls, chunk, planned)
						checkLMHeadParity(t, name, prec, ls, chunk, planned, xd, wd, tg, N, D, V)
					}
				}
			}
		}
	}
}

func checkLMHeadParity(t *testing.T, name string, prec ir.Precision, ls float64, chunk int, planned bool,
	xd, wd []float64, tg []int32, N, D, V int) {
	t.Helper()
	build := func(fused bool) *ir.Graph {
		g := ir.New("head")
		x := g.Input("x", ir.Shape{N, D}, ir.F32)
		w := g.Input("w", ir.Shape{V, D}, ir.F32)
		tv := g.Input("t", ir.Shape{N}, ir.I32)
		one := g.Input("dsm", ir.Shape{}, ir.F32)
		h := op1(g, "Scale", ir.Attrs{"alpha": 1.0}, x) // an intermediate x
		if fused {
			a := ir.Attrs{"label_smoothing": ls, "chunk": chunk}
			o := g.Apply("LMHeadCrossEntropy", a, h, w, tv)
			d := g.Apply("LMHeadCrossEntropyGrad", a, one, h, w, tv)
			g.SetOutput("sm", o[0])
			g.SetOutput("ce", o[1])
			g.SetOutput("pred", o[2])
			g.SetOutput("dx", d[0])
			g.SetOutput("dw", d[1])
			return g
		}
		a := ir.Attrs{"label_smoothing": ls}
		l := op1(g, "Linear", nil, h, w)
		o := g.Apply("CrossEntropy", a, l, tv)
		dl := op1(g, "CrossEntropyGrad", a, one, l, tv)
		g.SetOutput("logits", l)
		g.SetOutput("sm", o[0])
		g.SetOutput("ce", o[1])
		g.SetOutput("dx", op1(g, "LinearGradX", nil, dl, w))
		g.SetOutput("dw", op1(g, "LinearGradW", nil, dl, h))
		return g
	}
	feeds := map[string]*kernels.Tensor{
		"x":   floatTensor(prec, ir.Shape{N, D}, xd),
		"w":   floatTensor(prec, ir.Shape{V, D}, wd),
		"t":   kernels.IntTensor(ir.Shape{N}, tg),
		"dsm": floatTensor(prec, ir.Shape{}, []float64{0.37}),
	}
	run := func(g *ir.Graph) kernels.Program {
		var plan *kernels.Plan
		if planned {
			plan = planOf(g)
		}
		p := mustCompile(t, prec, g, plan, nil)
		for i := 0; i < 2; i++ { // a second run reuses the buffers
			mustRun(t, p, feeds, 0)
		}
		return p
	}
	ref, got := run(build(false)), run(build(true))
	defer ref.Close()
	defer got.Close()
	tol := 1e-12
	if prec == ir.FP32 {
		tol = 1e-5
	}
	for _, o := range []string{"sm", "ce"} {
		if a, b := got.Output(o).At(0), ref.Output(o).At(0); !near(a, b, tol) {
			t.Errorf("%s: %s = %.12g, Linear+CrossEntropy %.12g", name, o, a, b)
		}
	}
	for _, o := range []string{"dx", "dw"} {
		// errors relative to the largest entry of the reference gradient
		a, b := got.Output(o).Float64s(), ref.Output(o).Float64s()
		var scale, worst float64
		for i := range b {
			scale = math.Max(scale, math.Abs(b[i]))
		}
		for i := range b {
			worst = math.Max(worst, math.Abs(a[i]-b[i])/scale)
		}
		if worst > tol || worst != worst {
			t.Errorf("%s: %s differs from the reference by %.3g of its largest entry", name, o, worst)
		}
		if testing.Verbose() && chunk == 0 && planned {
			t.Logf("%s: %s worst error %.3g of the largest entry %.3g", name, o, worst, scale)
		}
	}
	logits := ref.Output("logits").Float64s()
	pred := got.Output("pred").I32
	for r := 0; r < N; r++ {
		row := logits[r*V : (r+1)*V]
		want := 0
		for i, v := range row {
			if v > row[want] {
				want = i
			}
		}
		if int(pred[r]) != want && !(prec == ir.FP32 && near(row[pred[r]], row[want], 1e-6)) {
			t.Errorf("%s: pred[%d] = %d (logit %g), argmax %d (logit %g)", name, r, pred[r], row[pred[r]], want, row[want])
		}
	}
}

// planOf is a minimal memory plan: one slot per float intermediate.
func planOf(g *ir.Graph) *kernels.Plan {
	p := &kernels.Plan{Slot: map[int]int{}}
	for _, n := range g.Nodes {
		for _, o := range n.Outputs {
			if o.DType == ir.F32 {
				p.Slot[o.ID] = len(p.SlotElems)
				p.SlotElems = append(p.SlotElems, max(1, o.Shape.Numel()))
			}
		}
	}
	return p
}

// Without a gradient node (evaluation) the forward computes the losses and
// pred only; argmax ties go to the lower index and NaN ranks last.
func TestLMHeadForwardOnly(t *testing.T) {
	const N, D, V = 4, 2, 5
	// W rows 1 and 3 equal: ties between them.
	w := []float64{0, 0, 1, 2, -1, 0, 1, 2, 0.5, 0.5}
	x := []float64{1, 1, -1, -1, 0, 0, 2, -1}
	tg := []int32{1, 2, 0, 4}
	for _, prec := range []ir.Precision{ir.FP64, ir.FP32} {
		g := ir.New("eval")
		xv := g.Input("x", ir.Shape{N, D}, ir.F32)
		wv := g.Input("w", ir.Shape{V, D}, ir.F32)
		tv := g.Input("t", ir.Shape{N}, ir.I32)
		o := g.Apply("LMHeadCrossEntropy", ir.Attrs{"chunk": 3}, xv, wv, tv)
		g.SetOutput("ce", o[1])
		g.SetOutput("pred", o[2])
		p := mustCompile(t, prec, g, nil, nil)
		mustRun(t, p, map[string]*kernels.Tensor{
			"x": floatTensor(prec, ir.Shape{N, D}, x), "w": floatTensor(prec, ir.Shape{V, D}, w), "t": kernels.IntTensor(ir.Shape{N}, tg),
		}, 0)
		// row 0: logits 0,3,-1,3,1 -> 1; row 1: 0,-3,1,-3,-1 -> 2;
		// row 2: all 0 -> 0; row 3: 0,0,-2,0,0.5 -> 4.
		want := []int32{1, 2, 0, 4}
		for r, v := range p.Output("pred").I32 {
			if v != want[r] {
				t.Errorf("%v: pred[%d] = %d, want %d", prec, r, v, want[r])
			}
		}
		var ce float64
		for r := 0; r < N; r++ {
			var l []float64
			for v := 0; v < V; v++ {
				l = append(l, x[r*D]*w[v*D]+x[r*D+1]*w[v*D+1])
			}
			var s float64
			for _, z := range l {
				s += math.Exp(z)
			}
			ce += math.Log(s) - l[tg[r]]
		}
		if got := p.Output("ce").At(0); !near(got, ce, 1e-6) {
			t.Errorf("%v: ce %.10g, want %.10g", prec, got, ce)
		}
		var kept int
		switch q := p.(type) {
		case *program[float64]:
			kept = len(q.lmh)
		case *program[float32]:
			kept = len(q.lmh)
		}
		if kept != 0 {
			t.Errorf("%v: an evaluation graph keeps %d gradient accumulators", prec, kept)
		}
		p.Close()
	}
	if got := argmaxRow([]float64{math.NaN(), 1, 3, 3, math.Inf(-1)}); got != 2 {
		t.Errorf("argmax with NaN: %d, want 2", got)
	}
}

// A gradient node needs its forward in the same program, with the same
// label smoothing.
func TestLMHeadGradErrors(t *testing.T) {
	mk := func(fwd bool, gls float64) *ir.Graph {
		g := ir.New("e")
		x := g.Input("x", ir.Shape{3, 2}, ir.F32)
		w := g.Input("w", ir.Shape{4, 2}, ir.F32)
		tv := g.Input("t", ir.Shape{3}, ir.I32)
		if fwd {
			g.SetOutput("sm", g.Apply("LMHeadCrossEntropy", ir.Attrs{"label_smoothing": 0.1}, x, w, tv)[0])
		}
		d := g.Apply("LMHeadCrossEntropyGrad", ir.Attrs{"label_smoothing": gls}, g.Scalar(1), x, w, tv)
		g.SetOutput("dx", d[0])
		return g
	}
	for _, c := range []struct {
		g    *ir.Graph
		want string
	}{
		{mk(false, 0.1), "no LMHeadCrossEntropy"},
		{mk(true, 0.2), "label_smoothing"},
	} {
		_, err := New(ir.FP64).Compile(c.g, nil, kernels.NewStore(ir.FP64))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error containing %q, got %v", c.want, err)
		}
	}
}

// Several gradient nodes on one forward each scale the same accumulators.
func TestLMHeadTwoGradients(t *testing.T) {
	const N, D, V = 6, 3, 5
	xd, wd, tg := lmHeadData(4, N, D, V)
	g := ir.New("two")
	x := g.Input("x", ir.Shape{N, D}, ir.F32)
	w := g.Input("w", ir.Shape{V, D}, ir.F32)
	tv := g.Input("t", ir.Shape{N}, ir.I32)
	a := ir.Attrs{"label_smoothing": 0.1, "chunk": 4}
	g.SetOutput("sm", g.Apply("LMHeadCrossEntropy", a, x, w, tv)[0])
	d1 := g.Apply("LMHeadCrossEntropyGrad", a, g.Scalar(1), x, w, tv)
	d2 := g.Apply("LMHeadCrossEntropyGrad", a, g.Scalar(-0.5), x, w, tv)
	g.SetOutput("dx1", d1[0])
	g.SetOutput("dw1", d1[1])
	g.SetOutput("dx2", d2[0])
	g.SetOutput("dw2", d2[1])
	p := mustCompile(t, ir.FP64, g, nil, nil)
	defer p.Close()
	mustRun(t, p, map[string]*kernels.Tensor{
		"x": floatTensor(ir.FP64, x.Shape, xd), "w": floatTensor(ir.FP64, w.Shape, wd), "t": kernels.IntTensor(tv.Shape, tg),
	}, 0)
	for _, o := range []string{"dx", "dw"} {
		a, b := p.Output(o+"1").F64, p.Output(o+"2").F64
		for i := range a {
			if !near(b[i], -0.5*a[i], 1e-14) {
				t.Fatalf("%s: second gradient %g, want -0.5·%g", o, b[i], a[i])
			}
		}
	}
}

// TestIgnoredTargets: rows whose target is ir.IgnoreTarget add nothing to
// either loss sum of CrossEntropy or LMHeadCrossEntropy (the sums equal
// those over the kept rows alone), LMHeadCrossEntropy still predicts them,
// their gradient rows are zero, and an id below -1 is still refused.
func TestIgnoredTargets(t *testing.T) {
	const N, D, V = 6, 3, 9
	x, w, _ := lmHeadData(11, N, D, V)
	tg := []int32{4, ir.IgnoreTarget, 0, 8, ir.IgnoreTarget, 2}
	keep := []int{0, 2, 3, 5}
	sub := func(a []float64, rows []int, width int) []float64 {
		var out []float64
		for _, r := range rows {
			out = append(out, a[r*width:(r+1)*width]...)
		}
		return out
	}
	kx, ktg := sub(x, keep, D), []int32{4, 0, 8, 2}
	for _, prec := range []ir.Precision{ir.FP64, ir.FP32} {
		run := func(n int, xs []float64, tgs []int32, grad bool) (sm, ce float64, pred []int32, dx []float64) {
			g := ir.New("ignored")
			xv := g.Input("x", ir.Shape{n, D}, ir.F32)
			wv := g.Input("w", ir.Shape{V, D}, ir.F32)
			tv := g.Input("t", ir.Shape{n}, ir.I32)
			a := ir.Attrs{"label_smoothing": 0.1, "chunk": 4}
			o := g.Apply("LMHeadCrossEntropy", a, xv, wv, tv)
			g.SetOutput("sm", o[0])
			g.SetOutput("ce", o[1])
			g.SetOutput("pred", o[2])
			if grad {
				g.SetOutput("dx", g.Apply("LMHeadCrossEntropyGrad", a, g.Scalar(1), xv, wv, tv)[0])
			}
			p := mustCompile(t, prec, g, nil, nil)
			defer p.Close()
			mustRun(t, p, map[string]*kernels.Tensor{"x": floatTensor(prec, ir.Shape{n, D}, xs),
				"w": floatTensor(prec, ir.Shape{V, D}, w), "t": kernels.IntTensor(ir.Shape{n}, tgs)}, 0)
			if grad {
				dx = p.Output("dx").Float64s()
			}
			return p.Output("sm").At(0), p.Output("ce").At(0), append([]int32(nil), p.Output("pred").I32...), dx
		}
		for _, grad := range []bool{false, true} {
			sm, ce, pred, dx := run(N, x, tg, grad)
			wsm, wce, wpred, wdx := run(len(keep), kx, ktg, grad)
			tol := 1e-12
			if prec == ir.FP32 {
				tol = 1e-6
			}
			if !near(sm, wsm, tol) || !near(ce, wce, tol) {
				t.Errorf("%v grad=%v: sums %g, %g; over the kept rows %g, %g", prec, grad, sm, ce, wsm, wce)
			}
			_, _, all, _ := run(N, x, []int32{4, 1, 0, 8, 1, 2}, false)
			if !slices.Equal(pred, all) || pred[0] != wpred[0] || pred[5] != wpred[3] {
				t.Errorf("%v grad=%v: pred %v, with every target %v", prec, grad, pred, all)
			}
			for i, r := range keep {
				for j := range D {
					if grad && !near(dx[r*D+j], wdx[i*D+j], tol) {
						t.Errorf("%v: dx[%d,%d] = %g, over the kept rows %g", prec, r, j, dx[r*D+j], wdx[i*D+j])
					}
				}
			}
			for _, r := range []int{1, 4} {
				for j := 0; grad && j < D; j++ {
					if dx[r*D+j] != 0 {
						t.Errorf("%v: dx of ignored row %d = %v", prec, r, dx[r*D:(r+1)*D])
						break
					}
				}
			}
		}
		// CrossEntropy on the same logits
		logits := make([]float64, N*V)
		for r := range N {
			for v := range V {
				for j := range D {
					logits[r*V+v] += x[r*D+j] * w[v*D+j]
				}
			}
		}
		ceRun := func(n int, l []float64, tgs []int32) (float64, float64, []float64) {
			g := ir.New("ce")
			lv := g.Input("l", ir.Shape{n, V}, ir.F32)
			tv := g.Input("t", ir.Shape{n}, ir.I32)
			a := ir.Attrs{"label_smoothing": 0.1}
			o := g.Apply("CrossEntropy", a, lv, tv)
			g.SetOutput("sm", o[0])
			g.SetOutput("ce", o[1])
			g.SetOutput("d", g.Op1("CrossEntropyGrad", a, g.Scalar(1), lv, tv))
			p := mustCompile(t, prec, g, nil, nil)
			defer p.Close()
			mustRun(t, p, map[string]*kernels.Tensor{"l": floatTensor(prec, ir.Shape{n, V}, l), "t": kernels.IntTensor(ir.Shape{n}, tgs)}, 0)
			return p.Output("sm").At(0), p.Output("ce").At(0), p.Output("d").Float64s()
		}
		sm, ce, d := ceRun(N, logits, tg)
		wsm, wce, wd := ceRun(len(keep), sub(logits, keep, V), ktg)
		if !near(sm, wsm, 1e-6) || !near(ce, wce, 1e-6) {
			t.Errorf("%v CrossEntropy: sums %g, %g; over the kept rows %g, %g", prec, sm, ce, wsm, wce)
		}
		if !slices.Equal(sub(d, keep, V), wd) || slices.ContainsFunc(sub(d, []int{1, 4}, V), func(v float64) bool { return v != 0 }) {
			t.Errorf("%v CrossEntropyGrad: rows %v", prec, d)
		}
	}
	g := ir.New("bad")
	lv := g.Input("l", ir.Shape{2, 3}, ir.F32)
	tv := g.Input("t", ir.Shape{2}, ir.I32)
	g.SetOutput("ce", g.Apply("CrossEntropy", nil, lv, tv)[1])
	p := mustCompile(t, ir.FP32, g, nil, nil)
	defer p.Close()
	err := p.Run(map[string]*kernels.Tensor{"l": floatTensor(ir.FP32, ir.Shape{2, 3}, make([]float64, 6)), "t": kernels.IntTensor(ir.Shape{2}, []int32{0, -2})}, 0)
	if err == nil {
		t.Error("target -2 accepted")
	}
}
