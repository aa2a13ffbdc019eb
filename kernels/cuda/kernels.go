package cuda

import (
	"errors"

	"github.com/rpac-dev/rpac/ir"
)

// HasKernel reports whether the backend's dispatch (program.build) has a
// kernel for op. It asks the dispatch itself with an empty node: an op
// without a kernel answers errUnsupported; any other answer, a panic on the
// missing inputs included, means the dispatch took the op. Nothing is
// allocated or launched.
func HasKernel(op string) (ok bool) {
	if ir.Ops[op] == nil {
		return false
	}
	defer func() {
		if recover() != nil {
			ok = true
		}
	}()
	_, err := (&program{}).build(&ir.Node{Op: op, Attrs: ir.Attrs{}}, nil, nil)
	return !errors.Is(err, errUnsupported)
}
