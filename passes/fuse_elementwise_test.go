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

// chainGraph: a chain with a broadcast input, a parameterised unary op, a
// gradient op and a value read twice (c feeds two nodes: it stays), plus a
// Dropout (its draws per element fuse too, from its own stream).
func chainGraph() *ir.Graph {
	g := ir.New("chain")
	x := g.Input("x", ir.Shape{3, 5, 7}, ir.F32)
	y := g.Input("y", ir.Shape{7}, ir.F32)
	a := g.Op1("Add", nil, x, y)
	b := g.Op1("Scale", ir.Attrs{"alpha": 1.5, "beta": -0.25}, a)
	c := g.Op1("GELU", nil, b)
	d := g.Op1("GELUGrad", nil, x, c) // dy = x, at c
	e := g.Op1("Mul", nil, d, c)
	f := g.Op1("Clamp", ir.Attrs{"lo": -0.5, "hi": 0.5}, e)
	h := g.Apply("Dropout", ir.Attrs{"p": 0.2}, f)[0]
	g.SetOutput("out", g.Op1("Neg", nil, h))
	return g
}

func runGraph(t *testing.T, g *ir.Graph, feeds map[string]*kernels.Tensor) []float32 {
	t.Helper()
	p, err := cpu.New(ir.FP32).Compile(g, passes.Plan(g), kernels.NewStore(ir.FP32))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Run(feeds, 7); err != nil {
		t.Fatal(err)
	}
	return p.Output("out").Float32s()
}

// TestFuseElementwise: the chain becomes FusedElementwise nodes (the value
// read twice ends a group; Dropout joins the second with its node's id as
// its stream), the graph verifies, and the fused graph computes the
// unfused one's values bit for bit (the same dropout mask).
func TestFuseElementwise(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	feeds := map[string]*kernels.Tensor{}
	for _, in := range []struct {
		name string
		s    ir.Shape
	}{{"x", ir.Shape{3, 5, 7}}, {"y", ir.Shape{7}}} {
		t := kernels.NewTensor(ir.FP32, in.s)
		for i := range t.F32 {
			t.F32[i] = float32(r.NormFloat64())
		}
		feeds[in.name] = t
	}
	want := runGraph(t, chainGraph(), feeds)
	g := chainGraph()
	dropID := -1
	for _, n := range g.Nodes {
		if n.Op == ir.OpDropout {
			dropID = n.ID
		}
	}
	if err := passes.FuseElementwise(g); err != nil {
		t.Fatal(err)
	}
	if err := ir.Verify(g, false); err != nil {
		t.Fatal(err)
	}
	counts := g.OpCounts()
	// {Add, Scale, GELU} (GELU's output c is read twice), {GELUGrad, Mul,
	// Clamp, Dropout, Neg}
	if counts["FusedElementwise"] != 2 || len(g.Nodes) != 2 {
		t.Fatalf("fused graph ops %v, want 2 FusedElementwise", counts)
	}
	first, _ := g.Nodes[0].Body()
	if len(first) != 3 || first[1].Op != ir.OpScale || first[1].Attrs.Float("alpha", 0) != 1.5 || len(g.Nodes[0].Inputs) != 2 {
		t.Errorf("first group: %d inputs, body %+v", len(g.Nodes[0].Inputs), first)
	}
	second, _ := g.Nodes[1].Body()
	if len(second) != 5 || second[3].Op != ir.OpDropout || second[3].Attrs.Int("stream", -1) != dropID {
		t.Errorf("second group: body %+v, want the Dropout fourth with stream %d", second, dropID)
	}
	got := runGraph(t, g, feeds)
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("out[%d] = %v fused, %v unfused", i, got[i], want[i])
		}
	}
}

// TestFuseElementwiseDraws: a chain of more dropouts than
// ir.MaxFusedDraws is split into groups within the bound, and computes the
// unfused chain's values bit for bit.
func TestFuseElementwiseDraws(t *testing.T) {
	build := func() *ir.Graph {
		g := ir.New("drops")
		v := g.Input("x", ir.Shape{3, 5, 7}, ir.F32)
		for i := range ir.MaxFusedDraws + 2 {
			v = g.Apply("Dropout", ir.Attrs{"p": 0.1 * float64(i%3)}, v)[0]
		}
		g.SetOutput("out", v)
		return g
	}
	x := kernels.NewTensor(ir.FP32, ir.Shape{3, 5, 7})
	for i := range x.F32 {
		x.F32[i] = float32(i%11) - 5
	}
	feeds := map[string]*kernels.Tensor{"x": x}
	want := runGraph(t, build(), feeds)
	g := build()
	if err := passes.FuseElementwise(g); err != nil {
		t.Fatal(err)
	}
	if err := ir.Verify(g, false); err != nil {
		t.Fatal(err)
	}
	for _, n := range g.Nodes {
		if b, err := n.Body(); err != nil || b.Draws() > ir.MaxFusedDraws {
			t.Fatalf("%s: %v, %d draws", n.Op, err, b.Draws())
		}
	}
	if len(g.Nodes) != 2 {
		t.Errorf("%d nodes, want 2", len(g.Nodes))
	}
	got := runGraph(t, g, feeds)
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("out[%d] = %v fused, %v unfused", i, got[i], want[i])
		}
	}
}

// TestFuseElementwiseBounds: a chain longer than ir.MaxFusedSteps is split
// into groups within the bound.
func TestFuseElementwiseBounds(t *testing.T) {
	g := ir.New("long")
	v := g.Input("x", ir.Shape{4}, ir.F32)
	for range 40 {
		v = g.Op1("Neg", nil, v)
	}
	g.SetOutput("out", v)
	if err := passes.FuseElementwise(g); err != nil {
		t.Fatal(err)
	}
	steps := 0
	for _, n := range g.Nodes {
		b, err := n.Body()
		if err != nil {
			t.Fatalf("%s left unfused", n.Op)
		}
		if len(b) > ir.MaxFusedSteps {
			t.Errorf("group of %d steps", len(b))
		}
		steps += len(b)
	}
	if steps != 40 || len(g.Nodes) != 3 {
		t.Errorf("%d nodes holding %d steps, want 3 holding 40", len(g.Nodes), steps)
	}
}

// rematGraph: a Dropout's result h read by two chains (a gate times h, and
// y times h, summed along its rows); with extra, y is MaxFusedDraws
// dropouts of its own, which the second chain takes in first, so h's copy
// cannot join it.
func rematGraph(extra bool) *ir.Graph {
	g := ir.New("remat")
	z := g.Input("z", ir.Shape{3, 5, 8}, ir.F32)
	gate := g.Input("gate", ir.Shape{3, 5, 1}, ir.F32)
	y := g.Input("y", ir.Shape{3, 5, 8}, ir.F32)
	h := g.Apply("Dropout", ir.Attrs{"p": 0.25}, z)[0]
	a := g.Op1("Mul", nil, gate, h)
	if extra { // y's chain, which the Mul takes in first, draws MaxFusedDraws times
		for range ir.MaxFusedDraws {
			y = g.Apply("Dropout", ir.Attrs{"p": 0.1}, y)[0]
		}
	}
	b := g.Op1("Mul", nil, y, h)
	s := g.Op1("SumTo", ir.Attrs{"shape": []int{3, 5, 1}}, b)
	g.SetOutput("out", g.Op1("Add", nil, a, s))
	return g
}

// TestFuseElementwiseRemat: the Dropout read by two chains is drawn again
// in each (no Dropout node left, each chain one draw of its stream) and
// the graph computes the unfused one's values bit for bit; where a copy
// cannot join its reader's chain (the chain at ir.MaxFusedDraws), the
// Dropout stays as it was.
func TestFuseElementwiseRemat(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	feeds := map[string]*kernels.Tensor{}
	for name, sh := range map[string]ir.Shape{"z": {3, 5, 8}, "gate": {3, 5, 1}, "y": {3, 5, 8}} {
		x := kernels.NewTensor(ir.FP32, sh)
		for i := range x.F32 {
			x.F32[i] = float32(r.NormFloat64())
		}
		feeds[name] = x
	}
	for _, extra := range []bool{false, true} {
		want := runGraph(t, rematGraph(extra), feeds)
		g := rematGraph(extra)
		var dropID int
		for _, n := range g.Nodes {
			if n.Op == ir.OpDropout && n.Inputs[0].Name == "z" {
				dropID = n.ID
			}
		}
		if err := passes.FuseElementwiseRemat(g); err != nil {
			t.Fatal(err)
		}
		if err := ir.Verify(g, false); err != nil {
			t.Fatal(err)
		}
		kept, draws := 0, 0
		for _, n := range g.Nodes {
			if n.Op == ir.OpDropout && n.ID == dropID {
				kept++
			}
			if b, err := n.Body(); err == nil {
				for _, st := range b {
					if st.Op == ir.OpDropout && st.Attrs.Int("stream", -1) == dropID {
						draws++
					}
				}
			}
		}
		if extra && (kept != 1 || draws != 0) {
			t.Errorf("a copy that cannot join its chain: the Dropout kept %d times, drawn in %d chains; want kept, in none", kept, draws)
		}
		if !extra && (kept != 0 || draws != 2) {
			t.Errorf("the Dropout kept %d times, drawn in %d chains; want drawn again in both readers' chains", kept, draws)
		}
		got := runGraph(t, g, feeds)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("extra %v: out[%d] = %v fused, %v unfused", extra, i, got[i], want[i])
			}
		}
	}
}
