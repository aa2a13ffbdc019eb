package passes_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/passes"
)

// siblingGraph: h = Tanh(Linear(x, w0)) read by three Linears (q, k, v; v
// with a bias), whose gradients join fully; h2 = Tanh(Linear(x, w4)) read
// by two Linears and by a Mul, so its input gradient has another term and
// only the weight gradients join; x, an input, read by two Linears (w0,
// w4), which need no input gradient. The loss mixes all outputs.
func siblingGraph() *ir.Graph {
	g := ir.New("siblings")
	x := g.Input("x", ir.Shape{2, 5, 6}, ir.F32)
	h := g.Op1("Tanh", nil, g.Op1("Linear", nil, x, g.Param("w0", ir.Shape{7, 6})))
	q := g.Op1("Linear", nil, h, g.Param("wq", ir.Shape{4, 7}))
	k := g.Op1("Linear", nil, h, g.Param("wk", ir.Shape{4, 7}))
	v := g.Op1("Linear", nil, h, g.Param("wv", ir.Shape{3, 7}), g.Param("bv", ir.Shape{3}))
	h2 := g.Op1("Tanh", nil, g.Op1("Linear", nil, x, g.Param("w4", ir.Shape{5, 6})))
	u1 := g.Op1("Linear", nil, h2, g.Param("u1", ir.Shape{2, 5}))
	u2 := g.Op1("Linear", nil, h2, g.Param("u2", ir.Shape{3, 5}))
	sum := func(v *ir.Value) *ir.Value { return g.Op1("ReduceSum", nil, v) }
	loss := g.Op1("Add", nil, sum(g.Op1("Mul", nil, q, k)), sum(g.Op1("Mul", nil, v, v)))
	loss = g.Op1("Add", nil, loss, sum(g.Op1("Tanh", nil, u1)))
	loss = g.Op1("Add", nil, loss, sum(g.Op1("Mul", nil, u2, u2)))
	loss = g.Op1("Add", nil, loss, sum(g.Op1("Mul", nil, h2, h2)))
	g.SetOutput("loss", loss)
	if err := passes.Autodiff(g, "loss"); err != nil {
		panic(err)
	}
	if err := passes.DCE(g); err != nil {
		panic(err)
	}
	return g
}

func runF64(t *testing.T, g *ir.Graph, st *kernels.Store, feeds map[string]*kernels.Tensor) map[string][]float64 {
	t.Helper()
	p, err := cpu.New(ir.FP64).Compile(g, passes.Plan(g), st)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Run(feeds, 3); err != nil {
		t.Fatal(err)
	}
	out := map[string][]float64{}
	for _, name := range g.OutputNames() {
		out[name] = p.Output(name).Float64s()
	}
	return out
}

// TestJoinSiblingGrads: the three q, k, v weight gradients become one
// LinearGradW over a lazy Concat of their dy, and their input gradients
// one LinearGradX (the two Adds gone); of the u1, u2 group only the
// weight gradients join (h2's gradient has the Mul's term too), and the
// w0, w4 pair has weight gradients only. Every gradient equals the
// unjoined graph's in float64 to 1e-12.
func TestJoinSiblingGrads(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	st := kernels.NewStore(ir.FP64)
	g0 := siblingGraph()
	for _, v := range g0.ValuesOfKind(ir.Param) {
		tt, _ := st.Ensure(v.Name, v.Shape)
		for i := range tt.F64 {
			tt.F64[i] = r.NormFloat64() * 0.5
		}
	}
	x := kernels.NewTensor(ir.FP64, ir.Shape{2, 5, 6})
	for i := range x.F64 {
		x.F64[i] = r.NormFloat64()
	}
	feeds := map[string]*kernels.Tensor{"x": x}
	want := runF64(t, g0, st, feeds)
	before := g0.OpCounts()

	g := siblingGraph()
	if err := passes.JoinSiblingGrads(g); err != nil {
		t.Fatal(err)
	}
	if err := ir.Verify(g, false); err != nil {
		t.Fatal(err)
	}
	after := g.OpCounts()
	// weight gradients 7 → 3 (three groups), input gradients 5 → 3 (q, k, v)
	if before["LinearGradW"] != 7 || after["LinearGradW"] != 3 || before["LinearGradX"] != 5 || after["LinearGradX"] != 3 {
		t.Errorf("LinearGradW %d → %d, LinearGradX %d → %d; want 7 → 3 and 5 → 3",
			before["LinearGradW"], after["LinearGradW"], before["LinearGradX"], after["LinearGradX"])
	}
	lazy := 0
	for _, n := range g.Nodes {
		if n.Op == ir.OpConcat && n.Attrs.Bool("lazy", false) {
			lazy++
		}
	}
	if lazy != 3 {
		t.Errorf("%d lazy Concats, want 3 (one per group)", lazy)
	}
	got := runF64(t, g, st, feeds)
	for name, w := range want {
		for i := range w {
			if d := math.Abs(got[name][i] - w[i]); d > 1e-12*(1+math.Abs(w[i])) {
				t.Fatalf("%s[%d] = %.15g joined, %.15g not", name, i, got[name][i], w[i])
			}
		}
	}
}

// TestPlanKeepsLazyConcatInputs: the inputs of a lazy Concat stay in their
// slots until the Concat's last reader; no value made in between shares
// a slot with them.
func TestPlanKeepsLazyConcatInputs(t *testing.T) {
	g := siblingGraph()
	if err := passes.JoinSiblingGrads(g); err != nil {
		t.Fatal(err)
	}
	plan := passes.Plan(g)
	pos := map[*ir.Node]int{}
	for i, n := range g.Nodes {
		pos[n] = i
	}
	uses := g.Uses()
	checked := 0
	for i, n := range g.Nodes {
		if n.Op != ir.OpConcat || !n.Attrs.Bool("lazy", false) {
			continue
		}
		end := i
		for _, u := range uses[n.Outputs[0]] {
			end = max(end, pos[u])
		}
		parts := map[int]bool{}
		for _, in := range n.Inputs {
			parts[plan.Slot[in.ID]] = true
		}
		for _, m := range g.Nodes[i+1 : end+1] {
			for _, o := range m.Outputs {
				if s, ok := plan.Slot[o.ID]; ok && parts[s] {
					t.Errorf("%s node %d writes slot %d of a part of the lazy Concat node %d, read until node %d", m.Op, m.ID, s, n.ID, g.Nodes[end].ID)
				}
			}
		}
		checked++
	}
	if checked != 3 {
		t.Fatalf("%d lazy Concats checked, want 3", checked)
	}
}
