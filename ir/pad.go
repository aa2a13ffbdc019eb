package ir

import (
	"errors"
	"fmt"
)

// PadSpan is how Pad widens one axis: Blocks blocks of Size entries, each
// stored in Padded (≥ Size) entries, its own first and zeros after.
type PadSpan struct{ Blocks, Size, Padded int }

// Logical and Stored are the axis's length before and after Pad.
func (s PadSpan) Logical() int { return s.Blocks * s.Size }
func (s PadSpan) Stored() int  { return s.Blocks * s.Padded }

// Source is the logical index that stored index i holds, or -1 where i is
// padding.
func (s PadSpan) Source(i int) int {
	b, j := i/s.Padded, i%s.Padded
	if j >= s.Size {
		return -1
	}
	return b*s.Size + j
}

// Attr is the span as Pad's attribute value.
func (s PadSpan) Attr() []int { return []int{s.Blocks, s.Size, s.Padded} }

// PadSpans reads the spans of a Pad(Grad) node over x's logical shape:
// rows (axis 0 of a matrix) and cols (the last axis); an axis without its
// attribute keeps its length (one block, no padding).
func PadSpans(x Shape, a Attrs) (rows, cols PadSpan, err error) {
	if len(x) < 1 || len(x) > 2 {
		return rows, cols, fmt.Errorf("want a vector or a matrix, got %v", x)
	}
	span := func(key string, n int) (PadSpan, error) {
		v := a.Ints(key)
		if v == nil {
			return PadSpan{1, n, n}, nil
		}
		if len(v) != 3 || v[0] < 1 || v[1] < 1 || v[2] < v[1] || v[0]*v[1] != n {
			return PadSpan{}, fmt.Errorf("%s %v does not pad %d entries (blocks, size, padded)", key, v, n)
		}
		return PadSpan{v[0], v[1], v[2]}, nil
	}
	rows = PadSpan{1, 1, 1}
	if len(x) == 2 {
		if rows, err = span("rows", x[0]); err != nil {
			return rows, cols, err
		}
	} else if a.Ints("rows") != nil {
		return rows, cols, errors.New("rows padded on a vector")
	}
	cols, err = span("cols", x[len(x)-1])
	return rows, cols, err
}

func padShape(x Shape, a Attrs) (Shape, error) {
	rows, cols, err := PadSpans(x, a)
	if err != nil {
		return nil, err
	}
	if len(x) == 1 {
		return Shape{cols.Stored()}, nil
	}
	return Shape{rows.Stored(), cols.Stored()}, nil
}

func init() {
	reg(&OpDef{Name: OpPad, NumIn: 1, TrainingOnly: true,
		Doc: "Pad(x[R,C] or x[C]; rows, cols) -> x with each padded axis (rows: axis 0 of a matrix; cols: the last) of blocks·size entries stored as blocks·padded, each block's entries first and zeros after ([blocks, size, padded]; an axis without its attribute as it is). The aligned-width graphs' padded parameters (compiler/model).",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			s, err := padShape(in[0].Shape, a)
			if err != nil {
				return nil, nil, err
			}
			return one(s)
		}})
	reg(&OpDef{Name: OpPadGrad, NumIn: 1, Gradient: true,
		Doc: "PadGrad(dy; rows, cols, shape) -> dx[shape]: the entries of dy that Pad(x; rows, cols) took from x (its padding dropped).",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			x := Shape(a.Ints("shape"))
			s, err := padShape(x, a)
			if err != nil {
				return nil, nil, err
			}
			if !s.Equal(in[0].Shape) {
				return nil, nil, fmt.Errorf("dy%v is not Pad's output %v of %v", in[0].Shape, s, x)
			}
			return one(x.Clone())
		}})
}
