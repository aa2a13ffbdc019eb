package cpu

import (
	"fmt"
	"testing"

	"github.com/rpac-dev/rpac/ir"
)

// padCases check Pad's gradient (PadGrad) against finite differences: a
// matrix padded in row blocks and columns, a vector, columns in blocks.
func padCases() []gradCase {
	var cs []gradCase
	for _, tc := range []struct {
		shape ir.Shape
		a     ir.Attrs
	}{
		{ir.Shape{6, 5}, ir.Attrs{"rows": []int{2, 3, 4}, "cols": []int{1, 5, 8}}},
		{ir.Shape{5}, ir.Attrs{"cols": []int{1, 5, 8}}},
		{ir.Shape{3, 6}, ir.Attrs{"cols": []int{3, 2, 3}}},
	} {
		tc := tc
		cs = append(cs, gradCase{
			name: fmt.Sprintf("Pad%v/%v", tc.shape, tc.a),
			ins:  []spec{in(tc.shape...)},
			fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "Pad", tc.a, x[0]) },
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				a := tc.a.Clone()
				a["shape"] = []int(tc.shape)
				return []*ir.Value{op1(g, "PadGrad", a, dy)}
			},
		})
	}
	return cs
}

// TestPadLayout: Pad puts each block's entries first and zeros after.
func TestPadLayout(t *testing.T) {
	var m []int
	if err := padEach(ir.Shape{4, 3}, ir.Attrs{"rows": []int{2, 2, 3}, "cols": []int{1, 3, 4}}, func(i, s int) { m = append(m, s) }); err != nil {
		t.Fatal(err)
	}
	want := []int{0, 1, 2, -1, 3, 4, 5, -1, -1, -1, -1, -1, 6, 7, 8, -1, 9, 10, 11, -1, -1, -1, -1, -1}
	if fmt.Sprint(m) != fmt.Sprint(want) {
		t.Fatalf("map %v, want %v", m, want)
	}
	if err := padEach(ir.Shape{4, 3}, ir.Attrs{"rows": []int{3, 2, 3}}, func(int, int) {}); err == nil {
		t.Fatal("3 blocks of 2 rows over 4 rows: no error")
	}
}
