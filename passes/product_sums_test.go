package passes_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/passes"
)

// productGraph: three sums of products that fuse (rows, a leading axis, two
// axes) and three that do not (a broadcast factor; a product read twice; a
// product that is a graph output).
func productGraph() *ir.Graph {
	g := ir.New("products")
	a := g.Input("a", ir.Shape{4, 6, 9}, ir.F32)
	b := g.Input("b", ir.Shape{4, 6, 9}, ir.F32)
	c := g.Input("c", ir.Shape{9}, ir.F32)
	sum := func(v *ir.Value, shape ...int) *ir.Value { return g.Op1("SumTo", ir.Attrs{"shape": shape}, v) }
	g.SetOutput("rows", sum(g.Op1("Mul", nil, a, b), 4, 6, 1))
	g.SetOutput("lead", sum(g.Op1("Mul", nil, b, a), 9))
	g.SetOutput("two", sum(g.Op1("Mul", nil, a, a), 1, 6, 1))
	g.SetOutput("broadcast", sum(g.Op1("Mul", nil, a, c), 9))
	twice := g.Op1("Mul", nil, b, b)
	g.SetOutput("twice", sum(twice, 4, 1, 1))
	g.SetOutput("twice2", g.Op1("Neg", nil, twice))
	out := g.Op1("Mul", nil, a, g.Op1("Neg", nil, b))
	g.SetOutput("product", out)
	g.SetOutput("outsum", sum(out, 1, 1, 9))
	return g
}

// TestFuseProductSums: the three sums of plain products become
// SumToProduct (their Muls gone), the other three stay, and every output
// equals the unfused graph's bit for bit.
func TestFuseProductSums(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	feeds := map[string]*kernels.Tensor{}
	for name, s := range map[string]ir.Shape{"a": {4, 6, 9}, "b": {4, 6, 9}, "c": {9}} {
		x := kernels.NewTensor(ir.FP32, s)
		for i := range x.F32 {
			x.F32[i] = float32(r.NormFloat64())
		}
		feeds[name] = x
	}
	run := func(g *ir.Graph) map[string][]float32 {
		p, err := cpu.New(ir.FP32).Compile(g, passes.Plan(g), kernels.NewStore(ir.FP32))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if err := p.Run(feeds, 1); err != nil {
			t.Fatal(err)
		}
		out := map[string][]float32{}
		for _, name := range g.OutputNames() {
			out[name] = slices.Clone(p.Output(name).Float32s())
		}
		return out
	}
	want := run(productGraph())
	g := productGraph()
	if err := passes.FuseProductSums(g); err != nil {
		t.Fatal(err)
	}
	if err := ir.Verify(g, false); err != nil {
		t.Fatal(err)
	}
	if c := g.OpCounts(); c["SumToProduct"] != 3 || c["Mul"] != 3 || c["SumTo"] != 3 {
		t.Errorf("ops %v: want 3 SumToProduct, 3 Mul and 3 SumTo left", c)
	}
	got := run(g)
	for name, w := range want {
		if !slices.Equal(got[name], w) {
			t.Errorf("%s: %v fused, %v unfused", name, got[name], w)
		}
	}
}
