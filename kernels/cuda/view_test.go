package cuda

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rpac-dev/rpac/ir"
)

// The views the backend uploads are checked here without a GPU: each test
// runs the kernel's index arithmetic on the host (view.offset is the twin
// of graph.cu's view_offset) and compares with the CPU backend's op.

// gatherHost is gather_view_f32 on the host.
func gatherHost(v view, x []float32, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = float64(x[v.offset(int64(i), 0)])
	}
	return out
}

func TestViewsMatchCPUOps(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	x := randF32(r, 2*3*4*5, 1)
	sh := ir.Shape{2, 3, 4, 5}
	cases := []struct {
		op    ir.OpName
		attrs ir.Attrs
		v     func() (view, error)
		n     int
	}{
		{"Transpose", ir.Attrs{"perm": []int{0, 2, 1, 3}}, func() (view, error) { return transposeView(sh, []int{0, 2, 1, 3}) }, 120},
		{"Transpose", ir.Attrs{"perm": []int{3, 1, 0, 2}}, func() (view, error) { return transposeView(sh, []int{3, 1, 0, 2}) }, 120},
		{"Slice", ir.Attrs{"axis": 2, "start": 1, "end": 3}, func() (view, error) { return sliceView(sh, 2, 1, 3) }, 60},
		{"Slice", ir.Attrs{"axis": -1, "start": 4, "end": 5}, func() (view, error) { return sliceView(sh, -1, 4, 5) }, 24},
		{"Slice", ir.Attrs{"axis": 0, "start": 1, "end": 2}, func() (view, error) { return sliceView(sh, 0, 1, 2) }, 60},
	}
	for _, tc := range cases {
		v, err := tc.v()
		if err != nil {
			t.Fatalf("%s %v: %v", tc.op, tc.attrs, err)
		}
		want := cpuOp(t, tc.op, tc.attrs, []ir.Shape{sh}, x)[0]
		closeTo(t, string(tc.op), f32s(gatherHost(v, x, tc.n)), want, 0)
	}

	// BroadcastTo, from a shape with unit and missing axes.
	b := randF32(r, 3*1*5, 1)
	v, err := broadcastToView(ir.Shape{3, 1, 5}, sh)
	if err != nil {
		t.Fatal(err)
	}
	closeTo(t, "BroadcastTo", f32s(gatherHost(v, b, 120)), cpuOp(t, "BroadcastTo", ir.Attrs{"shape": []int{2, 3, 4, 5}}, []ir.Shape{{3, 1, 5}}, b)[0], 0)
}

func TestBinaryViewMatchesCPU(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct{ a, b ir.Shape }{
		{ir.Shape{2, 3, 4}, ir.Shape{2, 3, 4}},
		{ir.Shape{2, 3, 4}, ir.Shape{4}},
		{ir.Shape{2, 1, 4}, ir.Shape{3, 1}},
		{ir.Shape{}, ir.Shape{3, 2}},
		{ir.Shape{5, 1}, ir.Shape{1, 6}},
	} {
		out, err := ir.Broadcast(tc.a, tc.b)
		if err != nil {
			t.Fatal(err)
		}
		v, err := binaryView(out, tc.a, tc.b)
		if err != nil {
			t.Fatal(err)
		}
		a, b := randF32(r, tc.a.Numel(), 1), randF32(r, tc.b.Numel(), 1)
		got := make([]float32, out.Numel())
		for i := range got {
			got[i] = a[v.offset(int64(i), 0)] - b[v.offset(int64(i), 1)]
		}
		closeTo(t, "Sub broadcast", got, cpuOp(t, "Sub", nil, []ir.Shape{tc.a, tc.b}, a, b)[0], 1e-7) // float32 rounding of a−b
	}
	if _, err := binaryView(ir.Shape{2, 3}, ir.Shape{4}, ir.Shape{2, 3}); err == nil {
		t.Error("binaryView accepted shapes that do not broadcast")
	}
}

// reduceHost is reduce_view_f32 on the host (double accumulation).
func reduceHost(x []float32, ov, rv view, scale float64) []float32 {
	nout, nred := 1, 1
	for _, d := range ov.dims {
		nout *= int(d)
	}
	for _, d := range rv.dims {
		nred *= int(d)
	}
	out := make([]float32, nout)
	for o := range out {
		base := ov.offset(int64(o), 0)
		var s float64
		for k := 0; k < nred; k++ {
			s += float64(x[base+rv.offset(int64(k), 0)])
		}
		out[o] = float32(s * scale)
	}
	return out
}

func TestReduceViewsMatchCPU(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	sh := ir.Shape{3, 4, 5}
	x := randF32(r, sh.Numel(), 1)
	for _, to := range []ir.Shape{{5}, {4, 1}, {3, 1, 5}, {1, 4, 1}, {}, {3, 4, 5}} {
		red, err := sumToAxes(sh, to)
		if err != nil {
			t.Fatal(err)
		}
		ov, rv := reduceViews(sh, red)
		closeTo(t, "SumTo", reduceHost(x, ov, rv, 1), cpuOp(t, "SumTo", ir.Attrs{"shape": []int(to)}, []ir.Shape{sh}, x)[0], 1e-6)
	}
	for _, axes := range [][]int{{1}, {0, 2}, {-1}, nil} {
		red, err := reduceAxes(sh, axes)
		if err != nil {
			t.Fatal(err)
		}
		ov, rv := reduceViews(sh, red)
		nred := 1
		for _, d := range rv.dims {
			nred *= int(d)
		}
		closeTo(t, "ReduceMean", reduceHost(x, ov, rv, 1/float64(nred)),
			cpuOp(t, "ReduceMean", ir.Attrs{"axes": axes}, []ir.Shape{sh}, x)[0], 1e-6)
	}
	if _, err := reduceAxes(sh, []int{3}); err == nil {
		t.Error("reduceAxes accepted axis 3 of a rank-3 shape")
	}
}

func TestCollapseMergesContiguousDims(t *testing.T) {
	v, err := binaryView(ir.Shape{2, 3, 4}, ir.Shape{2, 3, 4}, ir.Shape{2, 3, 4})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(v.dims, []int64{24}) {
		t.Errorf("same-shape add collapses to dims %v, want [24]", v.dims)
	}
	v, _ = binaryView(ir.Shape{6, 8}, ir.Shape{6, 8}, ir.Shape{8})
	if !slices.Equal(v.dims, []int64{6, 8}) || !slices.Equal(v.strides[1], []int64{0, 1}) {
		t.Errorf("row bias view: dims %v strides %v", v.dims, v.strides)
	}
}

func TestCSRGroupsRowsByID(t *testing.T) {
	ids := []int32{3, 1, 3, 0, 1, 3}
	csr, err := csrOf(ids, 5)
	if err != nil {
		t.Fatal(err)
	}
	// distinct ids 0,1,3; starts 0,1,3,6; rows 3 | 1,4 | 0,2,5
	want := []int32{0, 1, 3, 0, 1, 3, 6, 3, 1, 4, 0, 2, 5}
	if !slices.Equal(csr, want) {
		t.Errorf("csr %v, want %v", csr, want)
	}
	if _, err := csrOf([]int32{0, 5}, 5); err == nil {
		t.Error("csrOf accepted id 5 of a 5-row table")
	}
	if csr, _ := csrOf(nil, 4); !slices.Equal(csr, []int32{0}) {
		t.Errorf("csr of no ids: %v", csr)
	}
}

func TestDropoutThresholdMatchesCPU(t *testing.T) {
	for _, tc := range []struct {
		p      float64
		thresh uint64
		scale  float32
	}{{0, 1 << 32, 1}, {0.25, 3 << 30, float32(1 / 0.75)}, {1, 0, 0}} {
		th, sc := dropoutThreshold(tc.p)
		if th != tc.thresh || sc != tc.scale {
			t.Errorf("p=%g: threshold %d scale %g, want %d %g", tc.p, th, sc, tc.thresh, tc.scale)
		}
	}
}

func f32s(x []float64) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(v)
	}
	return out
}
