package ir

import (
	"errors"
	"fmt"
)

// FusedStep is one elementwise op inside a FusedElementwise node: Op (an
// elementwise op of the table) with its Attrs, applied to registers Args.
// Registers 0..k-1 are the node's k inputs; register k+j holds step j's
// result. The last step's result is the node's output.
type FusedStep struct {
	Op    OpName
	Attrs Attrs
	Args  []int
}

// FusedBody is the "body" attribute of a FusedElementwise node.
type FusedBody []FusedStep

// MaxFusedInputs and MaxFusedSteps bound a FusedElementwise node (a
// backend keeps one register per input and step), MaxFusedDraws its steps
// of ElementDraws ops (a backend passes one stream key per such step).
const (
	MaxFusedInputs = 8
	MaxFusedSteps  = 16
	MaxFusedDraws  = 8
)

// Fusable reports whether op may be a step of a FusedElementwise body:
// elementwise and either deterministic or drawing per element
// (OpDef.ElementDraws).
func Fusable(op OpName) bool {
	d := Ops[op]
	return d != nil && (d.Elementwise || d.ElementDraws) && (!d.Random || d.ElementDraws) && !d.Fused
}

// Draws counts the body's steps of ElementDraws ops.
func (b FusedBody) Draws() int {
	n := 0
	for _, s := range b {
		if d := Ops[s.Op]; d != nil && d.ElementDraws {
			n++
		}
	}
	return n
}

// Body returns a FusedElementwise node's steps.
func (n *Node) Body() (FusedBody, error) {
	b, ok := n.Attrs["body"].(FusedBody)
	if !ok || len(b) == 0 {
		return nil, fmt.Errorf("%s: no body", n.Op)
	}
	return b, nil
}

// check verifies a body against k inputs: every step a fusable op
// (Fusable; a drawing one with its stream) with its input count, reading
// only registers defined before it.
func (b FusedBody) check(k int) error {
	if k > MaxFusedInputs || len(b) > MaxFusedSteps || b.Draws() > MaxFusedDraws {
		return fmt.Errorf("fused body of %d inputs, %d steps and %d draws exceeds %d, %d and %d", k, len(b), b.Draws(),
			MaxFusedInputs, MaxFusedSteps, MaxFusedDraws)
	}
	for j, s := range b {
		d := Ops[s.Op]
		if !Fusable(s.Op) {
			return fmt.Errorf("fused step %d: %s is not an elementwise op that fuses", j, s.Op)
		}
		if d.ElementDraws && s.Attrs.Int("stream", -1) < 0 {
			return fmt.Errorf("fused step %d: %s without its stream", j, s.Op)
		}
		if len(s.Args) != d.NumIn {
			return fmt.Errorf("fused step %d: %s takes %d inputs, got %d", j, s.Op, d.NumIn, len(s.Args))
		}
		for _, r := range s.Args {
			if r < 0 || r >= k+j {
				return fmt.Errorf("fused step %d: register %d is not defined before it", j, r)
			}
		}
	}
	return nil
}

func init() {
	reg(&OpDef{Name: OpFusedElementwise, NumIn: -1, Fused: true, InPlace: true,
		Doc: "FusedElementwise(x0..xk-1; body, shape) -> the chain of elementwise ops in body (FusedBody) evaluated " +
			"element by element, inputs broadcast to shape; equal to the unfused ops. Made by passes.FuseElementwise " +
			"after autodiff.",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			b, ok := a["body"].(FusedBody)
			if !ok || len(b) == 0 {
				return nil, nil, errors.New("no body")
			}
			if err := b.check(len(in)); err != nil {
				return nil, nil, err
			}
			s := Shape(a.Ints("shape"))
			for _, v := range in {
				if r, err := Broadcast(v.Shape, s); err != nil || !r.Equal(s) {
					return nil, nil, fmt.Errorf("input %s does not broadcast to %v", v, s)
				}
			}
			return one(s)
		}})
}
