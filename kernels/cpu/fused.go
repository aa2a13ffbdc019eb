package cpu

import (
	"fmt"

	"github.com/rpac-dev/rpac/ir"
)

func fusedKernels[T float](k kernelTable[T]) {
	k.add("FusedElementwise", (*program[T]).buildFused)
}

// buildFused runs a FusedElementwise body step by step through the
// kernels of the ops it fused, each intermediate in a buffer of its own:
// the result equals the unfused graph's bit for bit. This backend does not
// ask for fusion (its Capabilities), so the kernel is the reference the
// fused CUDA kernel is checked against; its intermediates are not in the
// memory plan, which is sized for the graphs a backend runs.
func (p *program[T]) buildFused(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	body, err := n.Body()
	if err != nil {
		return nil, err
	}
	regs := append([]*tensor[T](nil), in...)
	var execs []func() error
	for j, s := range body {
		dst := out[0]
		if j < len(body)-1 {
			shape := out[0].shape.Clone()
			dst = &tensor[T]{v: &ir.Value{Shape: shape, DType: ir.F32}, shape: shape, f: make([]T, shape.Numel()), slot: -1}
		}
		args := make([]*tensor[T], len(s.Args))
		vals := make([]*ir.Value, len(s.Args))
		for i, r := range s.Args {
			args[i], vals[i] = regs[r], regs[r].v
		}
		build, ok := kernelsOf[T]()[s.Op]
		if !ok {
			return nil, fmt.Errorf("fused step %d: no cpu kernel for %s", j, s.Op)
		}
		step := &ir.Node{ID: n.ID, Op: s.Op, Inputs: vals, Outputs: []*ir.Value{dst.v}, Attrs: s.Attrs}
		exec, err := build(p, step, args, []*tensor[T]{dst})
		if err != nil {
			return nil, fmt.Errorf("fused step %d (%s): %w", j, s.Op, err)
		}
		execs = append(execs, exec)
		regs = append(regs, dst)
	}
	return func() error {
		for _, e := range execs {
			if err := e(); err != nil {
				return err
			}
		}
		return nil
	}, nil
}
