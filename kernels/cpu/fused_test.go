package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// TestFusedElementwiseMatchesSteps: a FusedElementwise node (broadcast
// inputs, parameterised unary ops, a gradient op, a register read twice)
// gives the unfused ops' values bit for bit, in float32 and float64.
func TestFusedElementwiseMatchesSteps(t *testing.T) {
	body := ir.FusedBody{
		{Op: "Add", Args: []int{0, 1}},
		{Op: "Scale", Attrs: ir.Attrs{"alpha": 1.5, "beta": -0.25}, Args: []int{3}},
		{Op: "GELU", Args: []int{4}},
		{Op: "GELUGrad", Args: []int{2, 5}},
		{Op: "Mul", Args: []int{6, 5}},
		{Op: "Clamp", Attrs: ir.Attrs{"lo": -0.5, "hi": 0.5}, Args: []int{7}},
		{Op: "Sub", Args: []int{8, 1}},
	}
	shapes := []ir.Shape{{3, 5, 7}, {7}, {3, 5, 7}}
	build := func(fused bool) *ir.Graph {
		g := ir.New("fused")
		var regs []*ir.Value
		for i, s := range shapes {
			regs = append(regs, g.Input(string(rune('a'+i)), s, ir.F32))
		}
		if fused {
			g.SetOutput("out", g.Op1("FusedElementwise", ir.Attrs{"body": body, "shape": []int{3, 5, 7}}, regs...))
			return g
		}
		for _, s := range body {
			var args []*ir.Value
			for _, r := range s.Args {
				args = append(args, regs[r])
			}
			regs = append(regs, g.Op1(s.Op, s.Attrs, args...))
		}
		g.SetOutput("out", regs[len(regs)-1])
		return g
	}
	r := rand.New(rand.NewPCG(3, 4))
	feeds := map[string]*kernels.Tensor{}
	for i, s := range shapes {
		x := kernels.NewTensor(ir.FP32, s)
		for j := range x.F32 {
			x.F32[j] = float32(r.NormFloat64())
		}
		feeds[string(rune('a'+i))] = x
	}
	sameBitsFused(t, feeds, build)
}

// sameBitsFused runs build(false) and build(true) (an output "out" each) on
// feeds in float32 and float64 and requires the same bits.
func sameBitsFused(t *testing.T, feeds map[string]*kernels.Tensor, build func(fused bool) *ir.Graph) {
	t.Helper()
	for _, prec := range []ir.Precision{ir.FP32, ir.FP64} {
		var outs [2][]float64
		for k, fused := range []bool{false, true} {
			g := build(fused)
			p, err := New(prec).Compile(g, nil, kernels.NewStore(prec))
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Run(feeds, 1); err != nil {
				t.Fatal(err)
			}
			outs[k] = p.Output("out").Float64s()
			p.Close()
		}
		for i := range outs[0] {
			if math.Float64bits(outs[0][i]) != math.Float64bits(outs[1][i]) {
				t.Fatalf("%s %v: out[%d] = %v fused, %v unfused", build(true).Name, prec, i, outs[1][i], outs[0][i])
			}
		}
	}
}
