package cuda

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// TestMidAxisOfRecognisesReductions: the reductions over the middle axis
// of a row-major [A, R, C] are recognised with their extents; reductions
// whose axes interleave with kept ones are left to reduce_view_f32.
func TestMidAxisOfRecognisesReductions(t *testing.T) {
	for _, tc := range []struct {
		x    ir.Shape
		axes []int // ReduceSum axes (nil: all)
		want midAxis
		ok   bool
	}{
		{ir.Shape{32, 768, 510}, []int{0, 1}, midAxis{1, 24576, 510}, true}, // a bias gradient
		{ir.Shape{32, 768, 510}, []int{2}, midAxis{24576, 510, 1}, true},    // row sums
		{ir.Shape{32, 768, 4}, []int{1}, midAxis{32, 768, 4}, true},         // the middle axis
		{ir.Shape{768, 768}, nil, midAxis{1, 589824, 1}, true},              // everything
		{ir.Shape{1, 85}, []int{0}, midAxis{1, 1, 85}, true},                // one row
		{ir.Shape{2000, 1}, []int{0}, midAxis{1, 2000, 1}, true},            // one column
		{ir.Shape{3, 1, 5}, []int{1}, midAxis{1, 1, 15}, true},              // a unit axis: nothing summed
		{ir.Shape{}, nil, midAxis{1, 1, 1}, true},                           // a scalar
		{ir.Shape{3, 4, 5}, []int{0, 2}, midAxis{}, false},                  // interleaved
		{ir.Shape{2, 3, 4, 5}, []int{1, 3}, midAxis{}, false},
	} {
		red, err := reduceAxes(tc.x, tc.axes)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := midAxisOf(reduceViews(tc.x, red))
		if ok != tc.ok || got != tc.want {
			t.Errorf("%v axes %v: midAxis %+v %v, want %+v %v", tc.x, tc.axes, got, ok, tc.want, tc.ok)
		}
	}
}

// TestOuterInnerOfRecognisesReductions: sums over the outer and inner axes
// around one kept axis are recognised with their extents; other
// interleavings are not.
func TestOuterInnerOfRecognisesReductions(t *testing.T) {
	for _, tc := range []struct {
		x    ir.Shape
		axes []int
		want outerInner
		ok   bool
	}{
		{ir.Shape{3, 4, 5}, []int{0, 2}, outerInner{3, 4, 5}, true},
		{ir.Shape{32, 768, 6, 85}, []int{0, 1, 3}, outerInner{24576, 6, 85}, true}, // a per-head parameter
		{ir.Shape{2, 3, 4, 5}, []int{0, 3}, outerInner{2, 12, 5}, true},            // two adjacent kept axes, collapsed
		{ir.Shape{2, 3, 4, 5}, []int{1, 3}, outerInner{}, false},
		{ir.Shape{3, 4, 5}, []int{1}, outerInner{}, false}, // the middle axis: midAxis
	} {
		red, err := reduceAxes(tc.x, tc.axes)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := outerInnerOf(reduceViews(tc.x, red))
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("%v axes %v: outerInner %+v %v, want %+v %v", tc.x, tc.axes, got, ok, tc.want, tc.ok)
		}
	}
}

// TestPlanReduceCoversTheAxis: the chunks of a plan cover the reduced axis
// exactly once, aligned to the kernels' lanes, and a large reduction is
// spread over many warps or blocks.
func TestPlanReduceCoversTheAxis(t *testing.T) {
	for _, m := range []midAxis{{1, 24576, 510}, {24576, 510, 1}, {1, 589824, 1}, {32, 768, 4}, {1, 1, 85},
		{1, 1, 1}, {3, 70001, 1}, {1, 300, 1030}, {5, 701, 9}} {
		r := planReduce(m)
		if r.chunks < 1 || r.chunk*r.chunks < m.R || r.chunk*(r.chunks-1) >= max(1, m.R) {
			t.Errorf("%+v: %d chunks of %d do not cover %d", m, r.chunks, r.chunk, m.R)
		}
		lanes, units := 8, m.A*r.chunks*ceilDiv(m.C, 32) // row lanes of a block; blocks
		if m.C == 1 {
			lanes, units = 32, m.A*r.chunks // lanes of a warp; warps
		}
		if r.chunk%lanes != 0 {
			t.Errorf("%+v: chunk %d is not a multiple of %d lanes", m, r.chunk, lanes)
		}
		if n := m.A * m.R * m.C; n >= 1<<20 && units < 256 {
			t.Errorf("%+v: %d elements on only %d warps or blocks", m, n, units)
		}
		if (r.chunks > 1) != (r.workspace() > 0) {
			t.Errorf("%+v: %d chunks but a workspace of %d", m, r.chunks, r.workspace())
		}
	}
}

// reductionCase is a node whose reductions must run through the named
// kernels (checked in the trace).
type reductionCase struct {
	opCase
	kernels []string
}

// reductionCases: every reduction path with shapes that end mid-chunk,
// one row, one column, many chunks per row, the middle axis, axes that
// interleave, and the ops whose sums are two-pass reductions.
func reductionCases() []reductionCase {
	two := func(first string) []string { return []string{first, "reduce_parts_f32"} }
	membership := func(N, D int) opCase {
		return opCase{op: "GaussianMembershipGrad", in: []ir.Shape{{N, 4}, {N, D}, {4, D}, {4}, {N, 4}}}
	}
	return []reductionCase{
		{opCase{op: "SumTo", attrs: ir.Attrs{"shape": []int{7}}, in: []ir.Shape{{3, 411, 7}}}, two("reduce_cols_f32")},
		{opCase{op: "SumTo", attrs: ir.Attrs{"shape": []int{1030}}, in: []ir.Shape{{130, 1030}}}, two("reduce_cols_f32")},
		{opCase{op: "SumTo", attrs: ir.Attrs{"shape": []int{2}}, in: []ir.Shape{{1025, 2}}}, two("reduce_cols_f32")},
		{opCase{op: "SumTo", attrs: ir.Attrs{"shape": []int{85}}, in: []ir.Shape{{1, 85}}}, []string{"reduce_cols_f32"}},
		{opCase{op: "SumTo", attrs: ir.Attrs{"shape": []int{1}}, in: []ir.Shape{{2000, 1}}}, two("reduce_rows_f32")},
		{opCase{op: "ReduceSum", attrs: ir.Attrs{"axes": []int{-1}}, in: []ir.Shape{{2, 9001}}}, two("reduce_rows_f32")},
		{opCase{op: "ReduceMean", attrs: ir.Attrs{"axes": []int{-1}}, in: []ir.Shape{{37, 85}}}, []string{"reduce_rows_f32"}},
		{opCase{op: "ReduceSum", attrs: ir.Attrs{"axes": []int{1}}, in: []ir.Shape{{5, 701, 9}}}, two("reduce_cols_f32")},
		{opCase{op: "ReduceMean", attrs: ir.Attrs{"axes": []int{1}}, in: []ir.Shape{{4, 37, 6}}}, []string{"reduce_cols_f32"}},
		{opCase{op: "ReduceSum", in: []ir.Shape{{100, 103}}}, two("reduce_rows_f32")},
		{opCase{op: "ReduceMean", attrs: ir.Attrs{"axes": []int{0, 2}}, in: []ir.Shape{{3, 40, 5}}}, []string{"reduce_rows_f32", "reduce_cols_f32"}},
		// a per-head parameter's gradient ([B,T,H,Hd] to [H,1]), rows and columns over many chunks
		{opCase{op: "SumTo", attrs: ir.Attrs{"shape": []int{4, 1}}, in: []ir.Shape{{3, 700, 4, 300}}},
			[]string{"reduce_rows_f32", "reduce_cols_f32", "reduce_parts_f32"}},
		{opCase{op: "ReduceSum", attrs: ir.Attrs{"axes": []int{1, 3}}, in: []ir.Shape{{2, 3, 4, 5}}}, []string{"reduce_view_f32"}},
		// sums of products (SumToProduct): columns, rows, outer and inner axes, interleaved axes
		{opCase{op: "SumToProduct", attrs: ir.Attrs{"shape": []int{7}}, in: []ir.Shape{{3, 411, 7}, {3, 411, 7}}}, two("reduce_cols_f32")},
		{opCase{op: "SumToProduct", attrs: ir.Attrs{"shape": []int{5, 1}}, in: []ir.Shape{{5, 9001}, {5, 9001}}}, two("reduce_rows_f32")},
		{opCase{op: "SumToProduct", attrs: ir.Attrs{"shape": []int{37, 1}}, in: []ir.Shape{{37, 85}, {37, 85}}}, []string{"reduce_rows_f32"}},
		{opCase{op: "SumToProduct", attrs: ir.Attrs{"shape": []int{4, 1}}, in: []ir.Shape{{3, 700, 4, 300}, {3, 700, 4, 300}}},
			[]string{"reduce_rows_f32", "reduce_cols_f32", "reduce_parts_f32"}},
		{opCase{op: "SumToProduct", attrs: ir.Attrs{"shape": []int{2, 1, 4, 1}}, in: []ir.Shape{{2, 3, 4, 5}, {2, 3, 4, 5}}}, []string{"reduce_view_f32"}},
		{opCase{op: "ZScore", in: []ir.Shape{{100, 103}}}, []string{"reduce_rows_f32", "sum_parts_f64", "zscore_sq_part_f32"}},
		{opCase{op: "ZScoreGrad", in: []ir.Shape{{100, 103}, {100, 103}}}, []string{"zscore_grad_part_f32", "sum_parts_f64"}},
		{opCase{op: "ZScoreGrad", in: []ir.Shape{{1, 2}, {1, 2}}}, []string{"zscore_grad_part_f32", "sum_parts_f64"}},
		// rows up to 512: dx and the parameters' partials in one kernel (chunks of 32 rows)
		{opCase{op: "LayerNormGrad", attrs: ir.Attrs{"eps": 1e-5}, in: []ir.Shape{{300, 33}, {300, 33}, {33}}},
			two("layernorm_bwd_f32")},
		{opCase{op: "LayerNormGrad", attrs: ir.Attrs{"eps": 1e-5}, in: []ir.Shape{{1, 33}, {1, 33}, {33}}},
			two("layernorm_bwd_f32")},
		{opCase{op: "LayerNormGrad", attrs: ir.Attrs{"eps": 1e-5}, in: []ir.Shape{{70, 512}, {70, 512}, {512}}},
			two("layernorm_bwd_f32")},
		// wider: layernorm_bwd_dx_f32, then layernorm_bwd_params_f32 over chunks of 128 rows
		{opCase{op: "LayerNormGrad", attrs: ir.Attrs{"eps": 1e-5}, in: []ir.Shape{{300, 600}, {300, 600}, {600}}},
			[]string{"layernorm_bwd_dx_f32", "layernorm_bwd_params_f32", "reduce_parts_f32"}},
		{membership(300, 33), []string{"gaussian_membership_bwd_params_part_f32", "gaussian_membership_bwd_params_f32"}},
		{membership(1, 33), []string{"gaussian_membership_bwd_params_part_f32", "gaussian_membership_bwd_params_f32"}},
		{opCase{op: "CrossEntropy", attrs: ir.Attrs{"label_smoothing": 0.1}, in: []ir.Shape{{257, 7}, {257}}, ids: map[int]int{1: 7}},
			two("reduce_rows_f32")},
	}
}

// checkReductions runs each case on be and compares every output with the
// CPU backend in float64, and checks the trace names the case's kernels.
func checkReductions(t *testing.T, be *Backend, tr *Trace) {
	t.Helper()
	r := rand.New(rand.NewPCG(41, 42))
	for _, c := range reductionCases() {
		g, feeds := caseGraph(c.opCase, r)
		var ins [][]float32
		var shapes []ir.Shape
		for i, s := range c.in {
			f := feeds[string(rune('a'+i))]
			x := f.F32
			if f.I32 != nil {
				x = make([]float32, len(f.I32))
				for j, id := range f.I32 {
					x[j] = float32(id)
				}
			}
			ins, shapes = append(ins, x), append(shapes, s)
		}
		want := cpuOp64(t, c.op, c.attrs, shapes, c.ids, ins...)
		tr.Reset()
		got := runCUDA(t, be, g, feeds)
		for i, w := range want {
			tol := c.tol
			if tol == 0 {
				tol = 1e-5
			}
			closeTo(t, string(c.op)+" "+shapes[0].String()+" output "+string(rune('p'+i)), got[i], w, tol)
		}
		ran := map[string]bool{}
		for _, e := range tr.Events() {
			ran[e.Name] = true
		}
		for _, k := range c.kernels {
			if !ran[k] {
				t.Errorf("%s %v: no launch of %s", c.op, c.in, k)
			}
		}
		if ran["reduce_view_f32"] && !slices.Contains(c.kernels, "reduce_view_f32") {
			t.Errorf("%s %v: fell back to reduce_view_f32", c.op, c.in)
		}
	}
}

// cpuOp64 is cpuOp with i32 inputs (ids given as floats) where ids says.
func cpuOp64(t *testing.T, op ir.OpName, a ir.Attrs, shapes []ir.Shape, ids map[int]int, ins ...[]float32) [][]float64 {
	t.Helper()
	if len(ids) == 0 {
		return cpuOp(t, op, a, shapes, ins...)
	}
	g := ir.New(string(op))
	feeds := map[string]*kernels.Tensor{}
	var vals []*ir.Value
	for i, x := range ins {
		name := string(rune('a' + i))
		if _, ok := ids[i]; ok {
			vals = append(vals, g.Input(name, shapes[i], ir.I32))
			v := make([]int32, len(x))
			for j := range x {
				v[j] = int32(x[j])
			}
			feeds[name] = kernels.IntTensor(shapes[i], v)
			continue
		}
		vals = append(vals, g.Input(name, shapes[i], ir.F32))
		tt := kernels.NewTensor(ir.FP64, shapes[i])
		for j, v := range x {
			tt.F64[j] = float64(v)
		}
		feeds[name] = tt
	}
	return runGraph(t, g, g.Apply(op, a, vals...), feeds)
}

// runProgram compiles g on be with the store st (the backend's own plan)
// and runs it once with seed 0; the caller closes it.
func runProgram(t *testing.T, be kernels.Backend, g *ir.Graph, st *kernels.Store, feeds map[string]*kernels.Tensor) kernels.Program {
	t.Helper()
	p, err := be.Compile(g, nil, st)
	if err != nil {
		t.Fatalf("%s: %v", g.Name, err)
	}
	if err := p.Run(feeds, 0); err != nil {
		p.Close()
		t.Fatalf("%s: %v", g.Name, err)
	}
	return p
}

// runCUDA runs g once on be and returns its outputs p, q, ... as floats.
func runCUDA(t *testing.T, be *Backend, g *ir.Graph, feeds map[string]*kernels.Tensor) [][]float32 {
	t.Helper()
	p, err := be.Compile(g, nil, kernels.NewStore(ir.FP32))
	if err != nil {
		t.Fatalf("%s: %v", g.Name, err)
	}
	defer p.Close()
	if err := p.Run(feeds, 7); err != nil {
		t.Fatalf("%s: %v", g.Name, err)
	}
	var out [][]float32
	for i := 0; i < len(g.Outputs); i++ {
		o := p.Output(string(rune('p' + i)))
		if o == nil {
			t.Fatalf("%s: no output %c", g.Name, 'p'+i)
		}
		out = append(out, slices.Clone(o.F32))
	}
	return out
}

// TestSimReductionsMatchCPU: every reduction path against the CPU backend
// in float64, on the simulator or a GPU, then, on the simulator, again in
// differential mode (each launch run a second time in reverse block and
// thread order, results compared bit for bit).
func TestSimReductionsMatchCPU(t *testing.T) {
	d := parityDevice(t)
	be := gpuBackend(t, ir.FP32)
	tr, err := be.StartTrace()
	if err != nil {
		t.Fatal(err)
	}
	checkReductions(t, be, tr)
	if t.Failed() || !d.Simulated() {
		return
	}
	d.SimConfig("diff", 1)
	defer d.SimConfig("diff", 0)
	checkReductions(t, be, tr)
}

// TestSimReductionsRepeatBitForBit: each reduction gives the same bits on
// a second run of its program and on a freshly compiled program (a new
// workspace; on the simulator, poisoned with other bytes), on the simulator
// or a GPU.
func TestSimReductionsRepeatBitForBit(t *testing.T) {
	parityDevice(t)
	be := gpuBackend(t, ir.FP32)
	r := rand.New(rand.NewPCG(43, 44))
	for _, c := range reductionCases() {
		g, feeds := caseGraph(c.opCase, r)
		p, err := be.Compile(g, nil, kernels.NewStore(ir.FP32))
		if err != nil {
			t.Fatal(err)
		}
		var runs [][]uint32
		for i := 0; i < 2; i++ {
			if err := p.Run(feeds, 7); err != nil {
				t.Fatal(err)
			}
			runs = append(runs, bitsOf(p.Output("p").F32))
		}
		p.Close()
		runs = append(runs, bitsOf(runCUDA(t, be, g, feeds)[0]))
		for i := 1; i < len(runs); i++ {
			if !slices.Equal(runs[0], runs[i]) {
				t.Errorf("%s %v: run %d differs from the first", c.op, c.in, i+1)
			}
		}
	}
}

func bitsOf(x []float32) []uint32 {
	out := make([]uint32, len(x))
	for i, v := range x {
		out[i] = math.Float32bits(v)
	}
	return out
}

// TestSimSumToProductIsMulThenSumTo: a sum of products gives the bits of
// the Mul and SumTo it replaces, on the same device, for each reduction
// path (the products rounded to float as the Mul writes them, summed in
// the same order).
func TestSimSumToProductIsMulThenSumTo(t *testing.T) {
	parityDevice(t)
	be := gpuBackend(t, ir.FP32)
	r := rand.New(rand.NewPCG(45, 46))
	checked := 0
	for _, c := range reductionCases() {
		if c.op != ir.OpSumToProduct {
			continue
		}
		g, feeds := caseGraph(c.opCase, r)
		u := ir.New("unfused")
		a := u.Input("a", c.in[0], ir.F32)
		b := u.Input("b", c.in[1], ir.F32)
		u.SetOutput("p", u.Op1("SumTo", c.attrs, u.Op1("Mul", nil, a, b)))
		got, want := runCUDA(t, be, g, feeds)[0], runCUDA(t, be, u, feeds)[0]
		if !slices.Equal(bitsOf(got), bitsOf(want)) {
			t.Errorf("SumToProduct %v to %v differs from SumTo(Mul)", c.in[0], c.attrs["shape"])
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no SumToProduct case")
	}
}
