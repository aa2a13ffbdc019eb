package ir

import (
	"errors"
	"fmt"
)

func init() {
	reg(&OpDef{Name: OpConcat, NumIn: -1,
		Doc: "Concat(x0, x1, ...; axis) -> the inputs joined along axis (negative counts from the end); every other dimension must agree. " +
			"With lazy, a backend may leave the result unwritten and have its readers read the inputs; the planner keeps the inputs live as long as the result.",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			if len(in) == 0 {
				return nil, nil, errors.New("want at least one input")
			}
			s, _, err := ConcatShape(in, a.Int("axis", 0))
			if err != nil {
				return nil, nil, err
			}
			return one(s)
		}})
}

// ConcatShape is the shape of Concat over in along axis, and the axis
// made non-negative.
func ConcatShape(in []*Value, axis int) (Shape, int, error) {
	r := len(in[0].Shape)
	ax := axis
	if ax < 0 {
		ax += r
	}
	if ax < 0 || ax >= r {
		return nil, 0, fmt.Errorf("axis %d out of range for rank %d", axis, r)
	}
	s := in[0].Shape.Clone()
	for _, v := range in[1:] {
		if len(v.Shape) != r {
			return nil, 0, fmt.Errorf("ranks differ: %v and %v", in[0].Shape, v.Shape)
		}
		for i := range s {
			if i != ax && v.Shape[i] != s[i] {
				return nil, 0, fmt.Errorf("shapes %v and %v differ outside axis %d", in[0].Shape, v.Shape, ax)
			}
		}
		s[ax] += v.Shape[ax]
	}
	return s, ax, nil
}
