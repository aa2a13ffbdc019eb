package cuda

import "github.com/rpac-dev/rpac/ir"

// HasKernel reports whether the backend has a kernel for op: an
// elementwise op with a CUDA formula (its case in the prelude's generated
// section), or an op of the registration table (builders).
func HasKernel(op ir.OpName) bool {
	if ir.Ops[op] == nil {
		return false
	}
	if s := ir.ElementwiseOf(op); s != nil {
		_, _, ok := ewCode(op)
		return ok && s.CUDA != ""
	}
	_, ok := builders[op]
	return ok
}
