package cuda

import (
	"fmt"

	"github.com/rpac-dev/rpac/ir"
)

// A view maps element i of a row-major iteration space (dims) to an element
// offset in each operand: base + Σ_d idx_d·strides[k][d]. Transpose, Slice,
// BroadcastTo, broadcasting elementwise ops and reductions are all views,
// so one kernel per family serves them (src/graph.cu).
type view struct {
	dims    []int64
	strides [][]int64 // one per operand
	base    int64
}

// pack lays the view out as the kernels read it: dims, each operand's
// strides, then base.
func (v view) pack() []int64 {
	out := append([]int64(nil), v.dims...)
	for _, s := range v.strides {
		out = append(out, s...)
	}
	return append(out, v.base)
}

func (v view) rank() int { return len(v.dims) }

// offset is the host twin of the kernels' view_offset (for tests).
func (v view) offset(i int64, operand int) int64 {
	off := v.base
	for d := len(v.dims) - 1; d >= 0; d-- {
		q := i / v.dims[d]
		off += (i - q*v.dims[d]) * v.strides[operand][d]
		i = q
	}
	return off
}

// rowMajor returns the contiguous strides of shape s.
func rowMajor(s ir.Shape) []int64 {
	st := make([]int64, len(s))
	acc := int64(1)
	for d := len(s) - 1; d >= 0; d-- {
		st[d] = acc
		acc *= int64(s[d])
	}
	return st
}

// collapse drops unit dims and merges adjacent dims that every operand
// walks contiguously, so most views end with rank 1 or 2 (fewer divisions
// per element). It keeps at least one dim.
func (v view) collapse() view {
	out := view{base: v.base, strides: make([][]int64, len(v.strides))}
	for d, n := range v.dims {
		if n == 1 {
			continue
		}
		last := len(out.dims) - 1
		merge := last >= 0
		for k := range v.strides {
			if merge && out.strides[k][last] != v.strides[k][d]*n {
				merge = false
			}
		}
		if merge {
			out.dims[last] *= n
			for k := range v.strides {
				out.strides[k][last] = v.strides[k][d]
			}
			continue
		}
		out.dims = append(out.dims, n)
		for k := range v.strides {
			out.strides[k] = append(out.strides[k], v.strides[k][d])
		}
	}
	if len(out.dims) == 0 {
		out.dims = []int64{1}
		for k := range out.strides {
			out.strides[k] = []int64{0}
		}
	}
	return out
}

// broadcastStrides gives x's strides over the iteration space out (numpy
// broadcasting, right-aligned): 0 where x has size 1 or lacks the axis.
func broadcastStrides(x, out ir.Shape) ([]int64, error) {
	if len(x) > len(out) {
		return nil, fmt.Errorf("cannot broadcast %v to %v", x, out)
	}
	st := make([]int64, len(out))
	xs := rowMajor(x)
	off := len(out) - len(x)
	for d := range x {
		switch x[d] {
		case out[off+d]:
			if x[d] != 1 {
				st[off+d] = xs[d]
			}
		case 1:
		default:
			return nil, fmt.Errorf("cannot broadcast %v to %v", x, out)
		}
	}
	return st, nil
}

// binaryView is the view of out = a op b with broadcasting.
func binaryView(out, a, b ir.Shape) (view, error) {
	as, err := broadcastStrides(a, out)
	if err != nil {
		return view{}, err
	}
	bs, err := broadcastStrides(b, out)
	if err != nil {
		return view{}, err
	}
	return view{dims: dims64(out), strides: [][]int64{as, bs}}.collapse(), nil
}

// broadcastToView reads x broadcast to out.
func broadcastToView(x, out ir.Shape) (view, error) {
	st, err := broadcastStrides(x, out)
	if err != nil {
		return view{}, err
	}
	return view{dims: dims64(out), strides: [][]int64{st}}.collapse(), nil
}

// transposeView reads x with its axes permuted: out axis i is x axis perm[i].
func transposeView(x ir.Shape, perm []int) (view, error) {
	if len(perm) != len(x) {
		return view{}, fmt.Errorf("perm %v for shape %v", perm, x)
	}
	xs := rowMajor(x)
	v := view{dims: make([]int64, len(x)), strides: [][]int64{make([]int64, len(x))}}
	for i, p := range perm {
		if p < 0 || p >= len(x) {
			return view{}, fmt.Errorf("perm %v for shape %v", perm, x)
		}
		v.dims[i], v.strides[0][i] = int64(x[p]), xs[p]
	}
	return v.collapse(), nil
}

// sliceView reads x restricted to [start,end) on axis (also the layout
// SliceGrad scatters into).
func sliceView(x ir.Shape, axis, start, end int) (view, error) {
	if axis < 0 {
		axis += len(x)
	}
	if axis < 0 || axis >= len(x) || start < 0 || end > x[axis] || start >= end {
		return view{}, fmt.Errorf("slice axis %d [%d,%d) of %v", axis, start, end, x)
	}
	xs := rowMajor(x)
	d := dims64(x)
	d[axis] = int64(end - start)
	return view{dims: d, strides: [][]int64{xs}, base: int64(start) * xs[axis]}.collapse(), nil
}

// reduceViews splits x's axes into kept ones (the output's elements, in
// order) and reduced ones: out walks the kept axes, red the reduced ones,
// both with x's strides.
func reduceViews(x ir.Shape, reduced []bool) (out, red view) {
	xs := rowMajor(x)
	out.strides, red.strides = [][]int64{nil}, [][]int64{nil}
	for d, n := range x {
		if reduced[d] {
			red.dims = append(red.dims, int64(n))
			red.strides[0] = append(red.strides[0], xs[d])
		} else {
			out.dims = append(out.dims, int64(n))
			out.strides[0] = append(out.strides[0], xs[d])
		}
	}
	return out.collapse(), red.collapse()
}

// sumToAxes marks the axes of x that SumTo(x; shape) sums over.
func sumToAxes(x, s ir.Shape) ([]bool, error) {
	if !ir.CanSumTo(x, s) {
		return nil, fmt.Errorf("cannot sum %v to %v", x, s)
	}
	red := make([]bool, len(x))
	off := len(x) - len(s)
	for d := range x {
		red[d] = d < off || (s[d-off] == 1 && x[d] != 1)
	}
	return red, nil
}

// reduceAxes marks the axes ReduceSum/ReduceMean(x; axes) reduce (none
// listed: all).
func reduceAxes(x ir.Shape, axes []int) ([]bool, error) {
	red := make([]bool, len(x))
	if len(axes) == 0 {
		for d := range red {
			red[d] = true
		}
		return red, nil
	}
	for _, a := range axes {
		if a < 0 {
			a += len(x)
		}
		if a < 0 || a >= len(x) {
			return nil, fmt.Errorf("axis %d out of range for %v", a, x)
		}
		red[a] = true
	}
	return red, nil
}

func dims64(s ir.Shape) []int64 {
	d := make([]int64, len(s))
	for i, n := range s {
		d[i] = int64(n)
	}
	return d
}
