package ir

import (
	"errors"
	"fmt"
)

// The routed expert of a mixture of experts: ExpertFFN runs expert e's
// feed-forward network on the tokens routed to it only (a gather, two
// GEMMs over those rows, a weighted scatter), ExpertFFNGrad its backward
// over the same rows.

// ExpertShape is the geometry of an ExpertFFN node or its gradient: N
// token rows of width D, E experts, hidden width F.
type ExpertShape struct{ N, D, E, F int }

// ExpertShapeOf reads the geometry off x[...,D], w[...,E] and W1[F,D].
func ExpertShapeOf(x, w, w1 Shape) (ExpertShape, error) {
	if len(x) < 1 || len(w) != len(x) || len(w1) != 2 {
		return ExpertShape{}, fmt.Errorf("want x[...,D], w[...,E], W1[F,D], got x %v, w %v, W1 %v", x, w, w1)
	}
	D, E := x[len(x)-1], w[len(w)-1]
	N := x.Numel() / max(D, 1)
	if w.Numel() != N*E || w1[1] != D {
		return ExpertShape{}, fmt.Errorf("x %v, w %v, W1 %v do not agree", x, w, w1)
	}
	return ExpertShape{N: N, D: D, E: E, F: w1[0]}, nil
}

// ExpertOf is the expert attribute of an ExpertFFN or ExpertFFNGrad node.
func ExpertOf(n *Node) int { return n.Attrs.Int("expert", 0) }

// ExpertStreams are the streams of the two dropouts of an ExpertFFN node:
// the hidden one (attribute stream, else the node's id) and the output one
// (attribute stream2).
func ExpertStreams(n *Node) (hidden, output int) {
	return n.Stream(), n.Attrs.Int("stream2", -1)
}

// ExpertShare is the fraction of the N·E (token, expert) pairs a routed
// expert layer computes: top_k/E (attribute top_k; absent: every pair).
func ExpertShare(n *Node, E int) float64 {
	k := n.Attrs.Int("top_k", E)
	return float64(min(k, E)) / float64(max(E, 1))
}

func expertParams(s ExpertShape, in []*Value, w1, b1, w2, b2 int) error {
	want := []Shape{{s.F, s.D}, {s.F}, {s.D, s.F}, {s.D}}
	for i, j := range []int{w1, b1, w2, b2} {
		if j >= 0 && !in[j].Shape.Equal(want[i]) {
			return fmt.Errorf("input %d is %v, want %v", j, in[j].Shape, want[i])
		}
	}
	return nil
}

func init() {
	// Training-only: the builder emits it in training steps only (export
	// and evaluation graphs hold the dense form, which it equals).
	reg(&OpDef{Name: OpExpertFFN, NumIn: 6, Random: true, TrainingOnly: true,
		Doc: "ExpertFFN(x[...,D], w[...,E], W1[F,D], b1[F], W2[D,F], b2[D]; expert e, p, stream, stream2, top_k) -> " +
			"(out[...,D], u[N,F], a[N,F], h[N,D]), N the rows of x: expert e's network on the tokens t with w[t,e] ≠ 0 only " +
			"(in ascending order, row r of the saved values the r-th of them): u = x[t]·W1ᵀ + b1, a = Dropout(GELU(u)), " +
			"h = Dropout(a·W2ᵀ + b2), out[t] = w[t,e]·h, and out[t] = 0 for the other tokens (as w[t,e]·h would be). " +
			"The dropout of a[r,f] draws element t·F + f of stream (else the node's id), that of h[r,d] element t·D + d of " +
			"stream2 (Dropout's draws): a function of the node, the token and the feature, as a Dropout of the dense [...,F] " +
			"and [...,D] tensors would draw them. Rows of u, a and h past the routed tokens are unspecified. " +
			"top_k (the routing's k; default E) only states the expected share of tokens for the FLOP count.",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			s, err := expertInputs(in, a, 0, 2, 3, 4, 5)
			if err != nil {
				return nil, nil, err
			}
			return []Shape{in[0].Shape, {s.N, s.F}, {s.N, s.F}, {s.N, s.D}}, []DType{F32, F32, F32, F32}, nil
		},
		Scratch: func(n *Node) int { return n.Inputs[0].Shape.Numel() }, SharedScratch: true}) // the gathered rows of x
	reg(&OpDef{Name: OpExpertFFNGrad, NumIn: 8, Random: true, TrainingOnly: true, Gradient: true,
		Doc: "ExpertFFNGrad(dout[...,D], x[...,D], w[...,E], W1[F,D], W2[D,F], u, a, h; expert e, p, stream, stream2, top_k) -> " +
			"(dx[...,D], dw[...,E], dW1[F,D], db1[F], dW2[D,F], db2[D]): the gradient of Σ dout·out of the ExpertFFN node with " +
			"the same attributes whose saved values u, a, h are given, over the routed tokens only (the same rows, the same " +
			"dropout draws). dx is zero on the other tokens and dw zero outside column e and on the other tokens (where w is " +
			"0: the gradient through the mask that made it 0 is 0).",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			s, err := expertInputs(in, a, 1, 3, -1, 4, -1)
			if err != nil {
				return nil, nil, err
			}
			if !in[0].Shape.Equal(in[1].Shape) {
				return nil, nil, fmt.Errorf("dout %v, x %v", in[0].Shape, in[1].Shape)
			}
			for i, want := range []Shape{{s.N, s.F}, {s.N, s.F}, {s.N, s.D}} {
				if !in[5+i].Shape.Equal(want) {
					return nil, nil, fmt.Errorf("saved value %d is %v, want %v", i, in[5+i].Shape, want)
				}
			}
			return []Shape{in[1].Shape, in[2].Shape, in[3].Shape, {s.F}, in[4].Shape, {s.D}}, []DType{F32, F32, F32, F32, F32, F32}, nil
		},
		// the gathered rows of x, the output's gradient and the hidden gradient
		Scratch: func(n *Node) int {
			x := n.Inputs[1].Shape
			return 2*x.Numel() + x.Numel()/x[len(x)-1]*n.Inputs[3].Shape[0]
		}, SharedScratch: true})
}

// expertInputs reads the geometry off inputs x and x+1 (x, w) and w1
// (W1), and checks the attributes and the parameters at w1, b1, w2, b2
// (-1: absent).
func expertInputs(in []*Value, a Attrs, x, w1, b1, w2, b2 int) (ExpertShape, error) {
	s, err := ExpertShapeOf(in[x].Shape, in[x+1].Shape, in[w1].Shape)
	if err != nil {
		return s, err
	}
	if err := checkExpertAttrs(s, a); err != nil {
		return s, err
	}
	return s, expertParams(s, in, w1, b1, w2, b2)
}

func checkExpertAttrs(s ExpertShape, a Attrs) error {
	if e := a.Int("expert", 0); e < 0 || e >= s.E {
		return fmt.Errorf("expert %d of %d", e, s.E)
	}
	if p := a.Float("p", 0); p < 0 || p >= 1 {
		return fmt.Errorf("dropout p %v outside [0,1)", p)
	}
	if a.Float("p", 0) > 0 && a.Int("stream2", -1) < 0 {
		return errors.New("dropout without stream2")
	}
	return nil
}
