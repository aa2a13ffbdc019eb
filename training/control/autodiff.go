package control

import (
	"fmt"
	"math"
)

// Tape is a small reverse-mode automatic differentiator over float64
// vectors and matrices (row-major), enough for Guardian's policy: affine
// maps, tanh, exp and elementwise arithmetic. Operations record themselves on
// the tape; Backward walks the tape in reverse and accumulates gradients in
// each Var's Grad.
type Tape struct {
	ops []func()
}

// Var is a value on a tape: Rows×Cols numbers (a vector has Cols = 1).
type Var struct {
	Val        []float64
	Grad       []float64
	Rows, Cols int
	tape       *Tape
}

// Leaf puts a value on the tape. The slice is used, not copied.
func (t *Tape) Leaf(val []float64, rows, cols int) *Var {
	if rows*cols != len(val) {
		panic(fmt.Sprintf("control: Leaf %d×%d with %d values", rows, cols, len(val)))
	}
	return &Var{Val: val, Grad: make([]float64, len(val)), Rows: rows, Cols: cols, tape: t}
}

// Vec puts a vector on the tape.
func (t *Tape) Vec(val []float64) *Var { return t.Leaf(val, len(val), 1) }

func (t *Tape) result(rows, cols int) *Var {
	return &Var{Val: make([]float64, rows*cols), Grad: make([]float64, rows*cols), Rows: rows, Cols: cols, tape: t}
}

func sameLen(a, b *Var, op string) {
	if len(a.Val) != len(b.Val) {
		panic(fmt.Sprintf("control: %s of %d and %d values", op, len(a.Val), len(b.Val)))
	}
}

// Affine is W·x + b for W [out,in], x [in], b [out] (b may be nil).
func (t *Tape) Affine(W, x, b *Var) *Var {
	if W.Cols != len(x.Val) || (b != nil && len(b.Val) != W.Rows) {
		panic(fmt.Sprintf("control: Affine W %d×%d, x %d", W.Rows, W.Cols, len(x.Val)))
	}
	y := t.result(W.Rows, 1)
	for o := 0; o < W.Rows; o++ {
		s := 0.0
		if b != nil {
			s = b.Val[o]
		}
		row := W.Val[o*W.Cols : (o+1)*W.Cols]
		for i, xv := range x.Val {
			s += row[i] * xv
		}
		y.Val[o] = s
	}
	t.ops = append(t.ops, func() {
		for o := 0; o < W.Rows; o++ {
			g := y.Grad[o]
			if g == 0 {
				continue
			}
			if b != nil {
				b.Grad[o] += g
			}
			row := W.Val[o*W.Cols : (o+1)*W.Cols]
			grow := W.Grad[o*W.Cols : (o+1)*W.Cols]
			for i, xv := range x.Val {
				grow[i] += g * xv
				x.Grad[i] += g * row[i]
			}
		}
	})
	return y
}

// Tanh is elementwise tanh.
func (t *Tape) Tanh(x *Var) *Var {
	return t.unary(x, math.Tanh, func(y float64) float64 { return 1 - y*y })
}

// Exp is elementwise exp.
func (t *Tape) Exp(x *Var) *Var {
	return t.unary(x, math.Exp, func(y float64) float64 { return y })
}

// unary is f elementwise; dy gives f's derivative from f's value.
func (t *Tape) unary(x *Var, f, dy func(float64) float64) *Var {
	y := t.result(x.Rows, x.Cols)
	for i, v := range x.Val {
		y.Val[i] = f(v)
	}
	t.ops = append(t.ops, func() {
		for i, yv := range y.Val {
			x.Grad[i] += y.Grad[i] * dy(yv)
		}
	})
	return y
}

// Sub is a − b elementwise.
func (t *Tape) Sub(a, b *Var) *Var {
	sameLen(a, b, "Sub")
	y := t.result(a.Rows, a.Cols)
	for i := range y.Val {
		y.Val[i] = a.Val[i] - b.Val[i]
	}
	t.ops = append(t.ops, func() {
		for i, g := range y.Grad {
			a.Grad[i] += g
			b.Grad[i] -= g
		}
	})
	return y
}

// Add is a + b elementwise.
func (t *Tape) Add(a, b *Var) *Var {
	sameLen(a, b, "Add")
	y := t.result(a.Rows, a.Cols)
	for i := range y.Val {
		y.Val[i] = a.Val[i] + b.Val[i]
	}
	t.ops = append(t.ops, func() {
		for i, g := range y.Grad {
			a.Grad[i] += g
			b.Grad[i] += g
		}
	})
	return y
}

// Mul is a ⊙ b elementwise.
func (t *Tape) Mul(a, b *Var) *Var {
	sameLen(a, b, "Mul")
	y := t.result(a.Rows, a.Cols)
	for i := range y.Val {
		y.Val[i] = a.Val[i] * b.Val[i]
	}
	t.ops = append(t.ops, func() {
		for i, g := range y.Grad {
			a.Grad[i] += g * b.Val[i]
			b.Grad[i] += g * a.Val[i]
		}
	})
	return y
}

// Div is a / b elementwise.
func (t *Tape) Div(a, b *Var) *Var {
	sameLen(a, b, "Div")
	y := t.result(a.Rows, a.Cols)
	for i := range y.Val {
		y.Val[i] = a.Val[i] / b.Val[i]
	}
	t.ops = append(t.ops, func() {
		for i, g := range y.Grad {
			a.Grad[i] += g / b.Val[i]
			b.Grad[i] -= g * a.Val[i] / (b.Val[i] * b.Val[i])
		}
	})
	return y
}

// Affine1 is alpha·x + beta elementwise.
func (t *Tape) Affine1(x *Var, alpha, beta float64) *Var {
	y := t.result(x.Rows, x.Cols)
	for i, v := range x.Val {
		y.Val[i] = alpha*v + beta
	}
	t.ops = append(t.ops, func() {
		for i, g := range y.Grad {
			x.Grad[i] += alpha * g
		}
	})
	return y
}

// Sum is the sum of all elements, a 1×1 Var.
func (t *Tape) Sum(x *Var) *Var {
	y := t.result(1, 1)
	for _, v := range x.Val {
		y.Val[0] += v
	}
	t.ops = append(t.ops, func() {
		for i := range x.Grad {
			x.Grad[i] += y.Grad[0]
		}
	})
	return y
}

// Backward sets d(out)/d(out) = 1 for a scalar out and accumulates the
// gradient of out into every Var recorded on the tape.
func (t *Tape) Backward(out *Var) {
	if len(out.Val) != 1 {
		panic("control: Backward of a non-scalar")
	}
	out.Grad[0] = 1
	for i := len(t.ops) - 1; i >= 0; i-- {
		t.ops[i]()
	}
}
