package ir_test

import (
	"regexp"
	"slices"
	"testing"

	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/rpac-dev/rpac/passes"
)

// gradName is the naming rule of gradient ops, checked against their mark.
var gradName = regexp.MustCompile(`Grad[A-Z]?$`)

// TestEveryOpIsCovered is the one coverage test of the op table: every op
// of ir.Ops has a CPU kernel, a CUDA kernel, a gradient rule (unless it is
// itself a gradient op or a fused op made after autodiff) and an ONNX
// lowering (unless its definition marks it training-only, a loss, a
// gradient or a fused op), and the facts its definition states agree with
// each other.
func TestEveryOpIsCovered(t *testing.T) {
	rules := map[ir.OpName]bool{}
	for _, op := range passes.GradOps() {
		rules[op] = true
	}
	names := make([]ir.OpName, 0, len(ir.Ops))
	for name := range ir.Ops {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		def := ir.Ops[name]
		if def.Name != name {
			t.Errorf("op %s is registered as %q", name, def.Name)
		}
		if !cpu.HasKernel(name) {
			t.Errorf("op %s has no CPU kernel (kernels/cpu)", name)
		}
		if !cuda.HasKernel(name) {
			t.Errorf("op %s has no CUDA kernel (kernels/cuda)", name)
		}
		switch {
		case (def.Gradient || def.Fused) && rules[name]:
			t.Errorf("gradient or fused op %s has a gradient rule; autodiff never sees it", name)
		case !def.Gradient && !def.Fused && !rules[name]:
			t.Errorf("op %s has no gradient rule (passes/autodiff.go) and is not marked Gradient or Fused", name)
		}
		if def.Fused && def.Gradient {
			t.Errorf("op %s is marked both Fused and Gradient", name)
		}
		if def.Exported() != onnx.Lowered(name) {
			t.Errorf("op %s: exported %v (not training-only, loss or gradient), ONNX lowering %v",
				name, def.Exported(), onnx.Lowered(name))
		}
		if gradName.MatchString(string(name)) != def.Gradient {
			t.Errorf("op %s: Gradient is %v; gradient ops, and only they, are named ...Grad or ...GradX", name, def.Gradient)
		}
		if def.Elementwise && !def.InPlace {
			t.Errorf("elementwise op %s is not InPlace", name)
		}
		if def.Elementwise && def.RowWise {
			t.Errorf("op %s is both elementwise and row-wise", name)
		}
	}
	for _, op := range []ir.OpName{"NoSuchOp"} {
		if cpu.HasKernel(op) || cuda.HasKernel(op) || onnx.Lowered(op) {
			t.Errorf("unknown op %s reported as covered", op)
		}
	}
}
