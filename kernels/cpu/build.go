package cpu

import (
	"fmt"
	"sync"

	"github.com/rpac-dev/rpac/ir"
)

// kernelFunc builds the kernel of one node. in and out are the node's value
// storages; kernels read their data slices when they run, so parameters and
// feeds rebound by Run are seen.
type kernelFunc[T float] func(p *program[T], n *ir.Node, in, out []*tensor[T]) (func() error, error)

// kernelTable maps an op of ir.Ops to its kernel. Each file registers the
// kernels it defines (shapeKernels in shape.go, elementwiseKernels in
// elementwise.go, ...); newKernelTable collects them.
type kernelTable[T float] map[ir.OpName]kernelFunc[T]

func (k kernelTable[T]) add(op ir.OpName, f kernelFunc[T]) {
	if _, dup := k[op]; dup {
		panic("cpu: two kernels for " + string(op))
	}
	if ir.Ops[op] == nil {
		panic("cpu: kernel for unknown op " + string(op))
	}
	k[op] = f
}

// withoutNode adapts a builder that needs no attributes.
func withoutNode[T float](f func(p *program[T], in, out []*tensor[T]) (func() error, error)) kernelFunc[T] {
	return func(p *program[T], _ *ir.Node, in, out []*tensor[T]) (func() error, error) { return f(p, in, out) }
}

func newKernelTable[T float]() kernelTable[T] {
	k := kernelTable[T]{}
	shapeKernels(k)
	linalgKernels(k)
	elementwiseKernels(k)
	nnKernels(k)
	lmHeadKernels(k)
	paperKernels(k)
	expertKernels(k)
	attentionKernels(k)
	concatKernels(k)
	padKernels(k)
	fusedKernels(k)
	return k
}

var (
	kernels32 = sync.OnceValue(newKernelTable[float32])
	kernels64 = sync.OnceValue(newKernelTable[float64])
)

// kernelsOf is the kernel table of one precision.
func kernelsOf[T float]() kernelTable[T] {
	if isF32[T]() {
		return any(kernels32()).(kernelTable[T])
	}
	return any(kernels64()).(kernelTable[T])
}

// HasKernel reports whether the CPU backend has a kernel for op.
func HasKernel(op ir.OpName) bool { _, ok := kernels64()[op]; return ok }

// build returns the kernel of one node.
func (p *program[T]) build(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	def := ir.Ops[n.Op]
	for i, t := range in {
		if t.v.DType == ir.I32 && (def == nil || !def.TakesIDs(i)) {
			return nil, fmt.Errorf("input %s is i32; %s takes float data there", t.v, n.Op)
		}
	}
	f, ok := kernelsOf[T]()[n.Op]
	if !ok {
		return nil, errUnsupported
	}
	return f(p, n, in, out)
}
