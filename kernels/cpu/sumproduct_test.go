package cpu

import (
	"math/rand/v2"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// TestSumToProductMatchesMulSumTo: SumToProduct(x, y) gives SumTo(Mul(x, y))
// bit for bit, in float32 and float64, summed to rows, to a leading axis
// (many rows: the partial sums per part) and to everything.
func TestSumToProductMatchesMulSumTo(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct {
		in ir.Shape
		to []int
	}{{ir.Shape{4, 6, 9}, []int{4, 6, 1}}, {ir.Shape{3000, 7}, []int{7}}, {ir.Shape{5, 11}, []int{}}} {
		feeds := map[string]*kernels.Tensor{}
		for _, name := range []string{"x", "y"} {
			x := kernels.NewTensor(ir.FP32, c.in)
			for j := range x.F32 {
				x.F32[j] = float32(r.NormFloat64())
			}
			feeds[name] = x
		}
		sameBitsFused(t, feeds, func(fused bool) *ir.Graph {
			g := ir.New("sum " + c.in.String())
			x, y := g.Input("x", c.in, ir.F32), g.Input("y", c.in, ir.F32)
			a := ir.Attrs{"shape": c.to}
			if fused {
				g.SetOutput("out", g.Op1("SumToProduct", a, x, y))
			} else {
				g.SetOutput("out", g.Op1("SumTo", a, g.Op1("Mul", nil, x, y)))
			}
			return g
		})
	}
}
