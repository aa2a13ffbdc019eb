package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// spec describes one input of a test graph.
type spec struct {
	shape ir.Shape
	ids   []int32                           // set: an i32 input with these ids
	gen   func(r *rand.Rand, i int) float64 // nil: standard normal
}

func in(s ...int) spec { return spec{shape: ir.Shape(s)} }

func withGen(s spec, gen func(r *rand.Rand, i int) float64) spec { s.gen = gen; return s }

func ids(shape ir.Shape, v ...int32) spec { return spec{shape: shape, ids: v} }

// awayFrom draws normals kept at least gap from each point in kinks.
func awayFrom(gap float64, kinks ...float64) func(r *rand.Rand, i int) float64 {
	return func(r *rand.Rand, i int) float64 {
		for {
			x := r.NormFloat64() * 2
			ok := true
			for _, k := range kinks {
				if math.Abs(x-k) < gap {
					ok = false
				}
			}
			if ok {
				return x
			}
		}
	}
}

func positive(lo, hi float64) func(r *rand.Rand, i int) float64 {
	return func(r *rand.Rand, i int) float64 { return lo + (hi-lo)*r.Float64() }
}

// gradCase: fwd builds y from the inputs; bwd builds, from y and dy, the
// gradient of Σ dy·y with respect to each input (nil: no gradient).
type gradCase struct {
	name string
	ins  []spec
	fwd  func(g *ir.Graph, x []*ir.Value) *ir.Value
	bwd  func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value
	// big: check random directional derivatives instead of every element
	big bool
	tol float64 // relative tolerance (default 1e-6)
}

func op1(g *ir.Graph, op ir.OpName, a ir.Attrs, in ...*ir.Value) *ir.Value {
	return g.Op1(op, a, in...)
}

// sumTo reduces a broadcast gradient back to v's shape.
func sumTo(g *ir.Graph, d, v *ir.Value) *ir.Value {
	if d.Shape.Equal(v.Shape) {
		return d
	}
	return op1(g, "SumTo", ir.Attrs{"shape": []int(v.Shape)}, d)
}

type builtCase struct {
	g      *ir.Graph
	xs     []*ir.Value
	y, dy  *ir.Value
	grads  []*ir.Value
	feeds  map[string]*kernels.Tensor
	floats []int // indices of float inputs
}

func buildCase(c gradCase, seed uint64) *builtCase {
	r := rand.New(rand.NewPCG(seed, 99))
	g := ir.New(c.name)
	b := &builtCase{g: g, feeds: map[string]*kernels.Tensor{}}
	for i, s := range c.ins {
		name := fmt.Sprintf("x%d", i)
		if s.ids != nil {
			v := g.Input(name, s.shape, ir.I32)
			b.xs = append(b.xs, v)
			b.feeds[name] = kernels.IntTensor(s.shape, append([]int32(nil), s.ids...))
			continue
		}
		v := g.Input(name, s.shape, ir.F32)
		b.xs = append(b.xs, v)
		t := kernels.NewTensor(ir.FP64, s.shape)
		for j := range t.F64 {
			if s.gen != nil {
				t.F64[j] = s.gen(r, j)
			} else {
				t.F64[j] = r.NormFloat64()
			}
		}
		b.feeds[name] = t
		b.floats = append(b.floats, i)
	}
	b.y = c.fwd(g, b.xs)
	b.dy = g.Input("dy", b.y.Shape, ir.F32)
	dt := kernels.NewTensor(ir.FP64, b.y.Shape)
	for j := range dt.F64 {
		dt.F64[j] = r.NormFloat64()
	}
	b.feeds["dy"] = dt
	b.grads = c.bwd(g, b.xs, b.y, b.dy)
	g.SetOutput("y", b.y)
	for i, gv := range b.grads {
		if gv != nil {
			g.SetOutput(fmt.Sprintf("g%d", i), gv)
		}
	}
	return b
}

func checkGrad(t *testing.T, c gradCase) {
	t.Helper()
	b := buildCase(c, 1)
	prog, err := New(ir.FP64).Compile(b.g, nil, kernels.NewStore(ir.FP64))
	if err != nil {
		t.Fatalf("%s: compile: %v", c.name, err)
	}
	defer prog.Close()
	const seed = 12345
	if err := prog.Run(b.feeds, seed); err != nil {
		t.Fatalf("%s: run: %v", c.name, err)
	}
	analytic := map[int][]float64{}
	for i, gv := range b.grads {
		if gv != nil {
			out := prog.Output(fmt.Sprintf("g%d", i))
			if !out.Shape.Equal(b.xs[i].Shape) {
				t.Fatalf("%s: gradient %d has shape %v, input %v", c.name, i, out.Shape, b.xs[i].Shape)
			}
			analytic[i] = out.Float64s()
		}
	}
	dy := b.feeds["dy"].F64
	loss := func() float64 {
		if err := prog.Run(b.feeds, seed); err != nil {
			t.Fatalf("%s: run: %v", c.name, err)
		}
		y := prog.Output("y").F64
		var s float64
		for j := range y {
			s += dy[j] * y[j]
		}
		return s
	}
	tol := c.tol
	if tol == 0 {
		tol = 1e-6
	}
	const h = 1e-5
	r := rand.New(rand.NewPCG(7, 7))
	for _, i := range b.floats {
		a, ok := analytic[i]
		if !ok {
			continue
		}
		x := b.feeds[fmt.Sprintf("x%d", i)].F64
		if c.big {
			for k := 0; k < 3; k++ {
				dir := make([]float64, len(x))
				var want float64
				for j := range dir {
					dir[j] = r.NormFloat64()
					want += dir[j] * a[j]
				}
				orig := append([]float64(nil), x...)
				for j := range x {
					x[j] = orig[j] + h*dir[j]
				}
				lp := loss()
				for j := range x {
					x[j] = orig[j] - h*dir[j]
				}
				lm := loss()
				copy(x, orig)
				num := (lp - lm) / (2 * h)
				if d := math.Abs(num - want); d > tol*math.Max(math.Abs(num), 1e-2)*10 {
					t.Errorf("%s: input %d direction %d: analytic %.10g, numeric %.10g", c.name, i, k, want, num)
				}
			}
			continue
		}
		scale := 0.0
		for _, v := range a {
			scale = math.Max(scale, math.Abs(v))
		}
		for j := range x {
			orig := x[j]
			x[j] = orig + h
			lp := loss()
			x[j] = orig - h
			lm := loss()
			x[j] = orig
			num := (lp - lm) / (2 * h)
			if d := math.Abs(num - a[j]); d > tol*(math.Abs(num)+1e-3*scale+1e-6) {
				t.Errorf("%s: d/dx%d[%d]: analytic %.10g, numeric %.10g (diff %.2g)", c.name, i, j, a[j], num, d)
			}
		}
	}
}

func binaryCases() []gradCase {
	shapes := [][2]ir.Shape{
		{{2, 3, 4}, {2, 3, 4}},
		{{2, 3, 4}, {4}},
		{{2, 3, 4}, {2, 3, 1}},
		{{2, 2, 3, 3}, {3, 3}},
		{{3, 1}, {1, 4}},
		{{2, 3}, {}},
		{{4}, {2, 3, 4}},
		{{2, 1, 4}, {2, 3, 1}},
	}
	var cs []gradCase
	nonzero := awayFrom(0.5, 0)
	for _, op := range ir.Elementwise {
		if op.Kind != ir.EwBinary {
			continue
		}
		for _, s := range shapes {
			b := in(s[1]...)
			if op.Cases[0].Positive { // a divisor: kept away from 0
				b = withGen(b, nonzero)
			}
			cs = append(cs, gradCase{
				name: fmt.Sprintf("%s%v%v", op.Name, s[0], s[1]),
				ins:  []spec{in(s[0]...), b},
				fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, op.Name, nil, x[0], x[1]) },
				bwd:  specGrad(op),
			})
		}
	}
	return cs
}

// specGrad is the gradient an elementwise op's spec states (EwSpec.Grad),
// which the check holds against finite differences.
func specGrad(op *ir.EwSpec) func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
	return func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
		return op.Grad(g, y.Def, []*ir.Value{dy})
	}
}

// unaryCases: every unary op of ir.Elementwise on each of its test cases
// (EwSpec.Cases), inputs kept away from its kinks.
func unaryCases() []gradCase {
	var cs []gradCase
	for _, op := range ir.Elementwise {
		if op.Kind != ir.EwUnary {
			continue
		}
		for _, c := range op.Cases {
			s := in(3, 5)
			switch {
			case c.Positive:
				s.gen = positive(0.2, 3)
			case len(c.Kinks) > 0:
				s.gen = awayFrom(0.05, c.Kinks...)
			}
			cs = append(cs, gradCase{
				name: fmt.Sprintf("%s%v", op.Name, c.Attrs),
				ins:  []spec{s},
				fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, op.Name, c.Attrs, x[0]) },
				bwd:  specGrad(op),
			})
		}
	}
	return cs
}

func reduceCases() []gradCase {
	var cs []gradCase
	for _, op := range []ir.OpName{"ReduceSum", "ReduceMean"} {
		for _, ax := range [][]int{nil, {1}, {0, 2}, {-1}, {0}} {
			for _, keep := range []bool{false, true} {
				op, ax, keep := op, ax, keep
				shape := ir.Shape{2, 3, 4}
				a := ir.Attrs{"axes": ax, "keepdims": keep}
				cs = append(cs, gradCase{
					name: fmt.Sprintf("%s%v/keep=%v", op, ax, keep),
					ins:  []spec{in(shape...)},
					fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, op, a, x[0]) },
					bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
						ks, _ := ir.ReduceShape(shape, ax, true)
						d := dy
						if !keep {
							d = op1(g, "Reshape", ir.Attrs{"shape": []int(ks)}, d)
						}
						d = op1(g, "BroadcastTo", ir.Attrs{"shape": []int(shape)}, d)
						if op == ir.OpReduceMean {
							d = op1(g, "Scale", ir.Attrs{"alpha": float64(ks.Numel()) / float64(shape.Numel())}, d)
						}
						return []*ir.Value{d}
					},
				})
			}
		}
	}
	return cs
}

func matmulCases() []gradCase {
	var cs []gradCase
	for _, batch := range [][]int{{}, {2}, {2, 3}} {
		for _, tA := range []bool{false, true} {
			for _, tB := range []bool{false, true} {
				tA, tB := tA, tB
				M, K, N := 3, 4, 5
				as := append(append([]int{}, batch...), M, K)
				if tA {
					as = append(append([]int{}, batch...), K, M)
				}
				bs := append(append([]int{}, batch...), K, N)
				if tB {
					bs = append(append([]int{}, batch...), N, K)
				}
				mm := func(g *ir.Graph, a, b *ir.Value, ta, tb bool) *ir.Value {
					return op1(g, "MatMul", ir.Attrs{"transA": ta, "transB": tb}, a, b)
				}
				cs = append(cs, gradCase{
					name: fmt.Sprintf("MatMul%v/tA=%v/tB=%v", batch, tA, tB),
					ins:  []spec{in(as...), in(bs...)},
					fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return mm(g, x[0], x[1], tA, tB) },
					bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
						a, b := x[0], x[1]
						switch {
						case !tA && !tB:
							return []*ir.Value{mm(g, dy, b, false, true), mm(g, a, dy, true, false)}
						case tA && !tB:
							return []*ir.Value{mm(g, b, dy, false, true), mm(g, a, dy, false, false)}
						case !tA && tB:
							return []*ir.Value{mm(g, dy, b, false, false), mm(g, dy, a, true, false)}
						default:
							return []*ir.Value{mm(g, b, dy, true, true), mm(g, dy, a, true, true)}
						}
					},
				})
			}
		}
	}
	return cs
}

func linearCases() []gradCase {
	var cs []gradCase
	for _, bias := range []bool{true, false} {
		for _, xs := range []ir.Shape{{2, 3, 4}, {4}, {5, 4}} {
			bias, xs := bias, xs
			ins := []spec{in(xs...), in(6, 4)}
			if bias {
				ins = append(ins, in(6))
			}
			cs = append(cs, gradCase{
				name: fmt.Sprintf("Linear%v/bias=%v", xs, bias),
				ins:  ins,
				fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "Linear", nil, x...) },
				bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
					out := []*ir.Value{op1(g, "LinearGradX", nil, dy, x[1]), op1(g, "LinearGradW", nil, dy, x[0])}
					if bias {
						out = append(out, op1(g, "SumTo", ir.Attrs{"shape": []int{6}}, dy))
					}
					return out
				},
			})
		}
	}
	return cs
}

func movementCases() []gradCase {
	var cs []gradCase
	cs = append(cs, gradCase{
		name: "Gather",
		ins:  []spec{in(6, 3), ids(ir.Shape{2, 4}, 0, 5, 2, 2, 1, 5, 5, 3)},
		fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "Gather", nil, x[0], x[1]) },
		bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
			return []*ir.Value{op1(g, "GatherGrad", ir.Attrs{"vocab": 6}, dy, x[1]), nil}
		},
	})
	cs = append(cs, gradCase{
		name: "Gather/reshaped-ids",
		ins:  []spec{in(5, 2), ids(ir.Shape{6}, 4, 0, 0, 3, 1, 4)},
		fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
			r := op1(g, "Reshape", ir.Attrs{"shape": []int{2, 3}}, x[1])
			return op1(g, "Gather", nil, x[0], r)
		},
		bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
			r := y.Def.Inputs[1]
			return []*ir.Value{op1(g, "GatherGrad", ir.Attrs{"vocab": 5}, dy, r), nil}
		},
	})
	for _, sl := range []struct {
		shape            ir.Shape
		axis, start, end int
	}{{ir.Shape{3, 5, 2}, 1, 1, 4}, {ir.Shape{3, 5, 2}, -1, 0, 1}, {ir.Shape{4, 3}, 0, 2, 4}, {ir.Shape{7}, 0, 3, 6}} {
		sl := sl
		a := ir.Attrs{"axis": sl.axis, "start": sl.start, "end": sl.end}
		cs = append(cs, gradCase{
			name: fmt.Sprintf("Slice%v/%d[%d,%d)", sl.shape, sl.axis, sl.start, sl.end),
			ins:  []spec{in(sl.shape...)},
			fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "Slice", a, x[0]) },
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				ga := a.Clone()
				ga["shape"] = []int(sl.shape)
				return []*ir.Value{op1(g, "SliceGrad", ga, dy)}
			},
		})
	}
	cs = append(cs, gradCase{
		name: "Reshape",
		ins:  []spec{in(2, 6)},
		fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
			return op1(g, "Reshape", ir.Attrs{"shape": []int{3, 1, 4}}, x[0])
		},
		bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
			return []*ir.Value{op1(g, "Reshape", ir.Attrs{"shape": []int{2, 6}}, dy)}
		},
	})
	for _, tc := range []struct {
		shape ir.Shape
		perm  []int
	}{
		{ir.Shape{3, 4}, []int{1, 0}},
		{ir.Shape{2, 3, 4, 5}, []int{0, 2, 1, 3}},
		{ir.Shape{2, 3, 4}, []int{2, 0, 1}},
		{ir.Shape{2, 3, 4}, []int{0, 2, 1}},
		{ir.Shape{2, 1, 4}, []int{1, 0, 2}},
	} {
		tc := tc
		inv := make([]int, len(tc.perm))
		for i, p := range tc.perm {
			inv[p] = i
		}
		cs = append(cs, gradCase{
			name: fmt.Sprintf("Transpose%v%v", tc.shape, tc.perm),
			ins:  []spec{in(tc.shape...)},
			fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
				return op1(g, "Transpose", ir.Attrs{"perm": tc.perm}, x[0])
			},
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return []*ir.Value{op1(g, "Transpose", ir.Attrs{"perm": inv}, dy)}
			},
		})
	}
	for _, tc := range [][2]ir.Shape{{{3, 1}, {2, 3, 4}}, {{4}, {3, 4}}, {{}, {2, 2}}, {{2, 1, 3}, {2, 4, 3}}} {
		tc := tc
		cs = append(cs, gradCase{
			name: fmt.Sprintf("BroadcastTo%v->%v", tc[0], tc[1]),
			ins:  []spec{in(tc[0]...)},
			fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
				return op1(g, "BroadcastTo", ir.Attrs{"shape": []int(tc[1])}, x[0])
			},
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return []*ir.Value{op1(g, "SumTo", ir.Attrs{"shape": []int(tc[0])}, dy)}
			},
		})
		cs = append(cs, gradCase{
			name: fmt.Sprintf("SumTo%v->%v", tc[1], tc[0]),
			ins:  []spec{in(tc[1]...)},
			fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
				return op1(g, "SumTo", ir.Attrs{"shape": []int(tc[0])}, x[0])
			},
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return []*ir.Value{op1(g, "BroadcastTo", ir.Attrs{"shape": []int(tc[1])}, dy)}
			},
		})
	}
	return cs
}

func nnCases() []gradCase {
	var cs []gradCase
	cs = append(cs, gradCase{
		name: "Softmax",
		ins:  []spec{in(2, 3, 5)},
		fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "Softmax", nil, x[0]) },
		bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
			return []*ir.Value{op1(g, "SoftmaxGrad", nil, dy, y)}
		},
	})
	cs = append(cs, gradCase{
		name: "CausalMask+Softmax",
		ins:  []spec{in(2, 4, 4)},
		fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
			return op1(g, "Softmax", nil, op1(g, "CausalMask", nil, x[0]))
		},
		bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
			d := op1(g, "SoftmaxGrad", nil, dy, y)
			return []*ir.Value{op1(g, "CausalMask", ir.Attrs{"fill": 0.0}, d)}
		},
	})
	for _, a := range []ir.Attrs{{}, {"eps": 1e-3}, {"width": 3}} {
		a := a
		W := a.Int("width", 5)
		cs = append(cs, gradCase{
			name: fmt.Sprintf("LayerNorm/%v", a),
			ins:  []spec{in(2, 3, 5), in(W), in(W)},
			fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "LayerNorm", a, x...) },
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return g.Apply("LayerNormGrad", a, dy, x[0], x[1])
			},
		})
	}
	for _, p := range []float64{0, 0.3} {
		p := p
		cs = append(cs, gradCase{
			name: fmt.Sprintf("Dropout/p=%v", p),
			ins:  []spec{in(4, 6)},
			fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return g.Apply("Dropout", ir.Attrs{"p": p}, x[0])[0] },
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return []*ir.Value{op1(g, "DropoutGrad", ir.Attrs{"p": p, "stream": y.Def.ID}, dy)}
			},
		})
	}
	cs = append(cs, gradCase{
		name: "GumbelNoise",
		ins:  []spec{in(3, 4)},
		fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "GumbelNoise", nil, x[0]) },
		bwd:  func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value { return []*ir.Value{dy} },
	})
	// the second target list leaves rows 1 and 2 out (ir.IgnoreTarget)
	for ti, tg := range []spec{ids(ir.Shape{4}, 3, 0, 6, 3), ids(ir.Shape{4}, 3, ir.IgnoreTarget, ir.IgnoreTarget, 3)} {
		for _, ls := range []float64{0, 0.1} {
			for out := 0; out < 2; out++ {
				ls, out := ls, out
				name := fmt.Sprintf("CrossEntropy/ls=%v/out%d", ls, out)
				if ti == 1 {
					name += "/ignored"
				}
				cs = append(cs, gradCase{
					name: name,
					ins:  []spec{in(4, 7), tg},
					fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
						return g.Apply("CrossEntropy", ir.Attrs{"label_smoothing": ls}, x[0], x[1])[out]
					},
					bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
						gl := ls
						if out == 1 {
							gl = 0
						}
						return []*ir.Value{op1(g, "CrossEntropyGrad", ir.Attrs{"label_smoothing": gl}, dy, x[0], x[1]), nil}
					},
				})
			}
		}
	}
	// Logits computed in the graph and read only by CrossEntropy and its
	// gradient: the forward works in place in the logits buffer (the
	// second case with an ignored target).
	for ci, ls := range []float64{0, 0.1} {
		ls := ls
		a := ir.Attrs{"label_smoothing": ls}
		tg := ids(ir.Shape{4}, 6, 2, 0, 2)
		if ci == 1 {
			tg = ids(ir.Shape{4}, 6, ir.IgnoreTarget, 0, 2)
		}
		cs = append(cs, gradCase{
			name: fmt.Sprintf("CrossEntropy/in-place/ls=%v", ls),
			ins:  []spec{in(4, 7), tg},
			fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
				l := op1(g, "Scale", ir.Attrs{"alpha": 1.5}, x[0])
				return g.Apply("CrossEntropy", a, l, x[1])[0]
			},
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				l := y.Def.Inputs[0]
				d := op1(g, "CrossEntropyGrad", a, dy, l, x[1])
				return []*ir.Value{op1(g, "Scale", ir.Attrs{"alpha": 1.5}, d), nil}
			},
		})
	}
	// The same logits also read by another op: no in-place.
	cs = append(cs, gradCase{
		name: "CrossEntropy/shared-logits",
		ins:  []spec{in(3, 6), ids(ir.Shape{3}, 5, 0, 3)},
		fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
			l := op1(g, "Scale", ir.Attrs{"alpha": 2.0}, x[0])
			ce := g.Apply("CrossEntropy", ir.Attrs{"label_smoothing": 0.05}, l, x[1])[0]
			return op1(g, "Add", nil, ce, op1(g, "ReduceSum", nil, op1(g, "Exp", nil, op1(g, "Scale", ir.Attrs{"alpha": 0.1}, l))))
		},
		bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
			l := y.Def.Inputs[0].Def.Inputs[0]
			d := op1(g, "CrossEntropyGrad", ir.Attrs{"label_smoothing": 0.05}, dy, l, x[1])
			e := y.Def.Inputs[1].Def.Inputs[0] // exp(0.1·l)
			d2 := op1(g, "Scale", ir.Attrs{"alpha": 0.1}, op1(g, "Mul", nil, op1(g, "BroadcastTo", ir.Attrs{"shape": []int{3, 6}}, dy), e))
			return []*ir.Value{op1(g, "Scale", ir.Attrs{"alpha": 2.0}, op1(g, "Add", nil, d, d2)), nil}
		},
	})
	// CrossEntropyGrad without a preceding CrossEntropy (no cached row statistics).
	cs = append(cs, gradCase{
		name: "CrossEntropyGrad/uncached",
		ins:  []spec{in(3, 5), ids(ir.Shape{3}, 4, ir.IgnoreTarget, 0)},
		fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
			return g.Apply("CrossEntropy", ir.Attrs{"label_smoothing": 0.2}, x[0], x[1])[0]
		},
		bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
			// logits copied through StopGradient: a different value, so no cache
			l2 := op1(g, "StopGradient", nil, x[0])
			return []*ir.Value{op1(g, "CrossEntropyGrad", ir.Attrs{"label_smoothing": 0.2}, dy, l2, x[1]), nil}
		},
	})
	return cs
}

func paperCases() []gradCase {
	var cs []gradCase
	// GaussianMembership: z near the centers, moderate sigmas, so neither
	// clamp is active.
	for _, zs := range []ir.Shape{{2, 3, 4}, {5, 4}} {
		zs := zs
		cs = append(cs, gradCase{
			name: fmt.Sprintf("GaussianMembership%v", zs),
			ins: []spec{
				withGen(in(zs...), func(r *rand.Rand, i int) float64 { return 0.7 * r.NormFloat64() }),
				withGen(in(3, 4), func(r *rand.Rand, i int) float64 { return 0.5 * r.NormFloat64() }),
				withGen(in(3), func(r *rand.Rand, i int) float64 { return -0.5 + 0.8*r.Float64() }),
			},
			fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "GaussianMembership", nil, x...) },
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return g.Apply("GaussianMembershipGrad", nil, dy, x[0], x[1], x[2], y)
			},
		})
	}
	for _, it := range []int{1, 3, 6} {
		it := it
		cs = append(cs, gradCase{
			name: fmt.Sprintf("Sinkhorn/iters=%d", it),
			ins:  []spec{withGen(in(3, 4), positive(0.2, 2))},
			fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "Sinkhorn", ir.Attrs{"iters": it}, x[0]) },
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return []*ir.Value{op1(g, "SinkhornGrad", ir.Attrs{"iters": it}, dy, x[0])}
			},
		})
	}
	cs = append(cs, gradCase{
		name: "ZScore",
		ins:  []spec{in(4, 5)},
		fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "ZScore", nil, x[0]) },
		bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
			return []*ir.Value{op1(g, "ZScoreGrad", nil, dy, x[0])}
		},
	})
	return cs
}

// bigCases run the same checks at sizes that take the parallel and
// specialised paths (row partials, tiled transpose, cached CE statistics),
// by directional derivatives.
func bigCases() []gradCase {
	cs := []gradCase{
		{
			name: "big/Add[64,40,32]+[32]",
			ins:  []spec{in(64, 40, 32), in(32)},
			fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "Add", nil, x[0], x[1]) },
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return []*ir.Value{dy, sumTo(g, dy, x[1])}
			},
		},
		{
			name: "big/Mul[64,40,32]*[64,40,1]",
			ins:  []spec{in(64, 40, 32), in(64, 40, 1)},
			fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "Mul", nil, x[0], x[1]) },
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return []*ir.Value{sumTo(g, op1(g, "Mul", nil, dy, x[1]), x[0]), sumTo(g, op1(g, "Mul", nil, dy, x[0]), x[1])}
			},
		},
		{
			name: "big/Softmax(CausalMask)+[T,T]",
			ins:  []spec{in(2, 3, 64, 64), in(64, 64)},
			fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
				return op1(g, "Softmax", nil, op1(g, "CausalMask", nil, op1(g, "Add", nil, x[0], x[1])))
			},
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				d := op1(g, "CausalMask", ir.Attrs{"fill": 0.0}, op1(g, "SoftmaxGrad", nil, dy, y))
				return []*ir.Value{d, sumTo(g, d, x[1])}
			},
		},
		{
			name: "big/LayerNorm",
			ins:  []spec{in(300, 96), in(96), in(96)},
			fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "LayerNorm", nil, x...) },
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return g.Apply("LayerNormGrad", nil, dy, x[0], x[1])
			},
		},
		{
			name: "big/GELU",
			ins:  []spec{in(200, 100)},
			fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "GELU", nil, x[0]) },
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return []*ir.Value{op1(g, "GELUGrad", nil, dy, x[0])}
			},
		},
		{
			name: "big/Transpose[4,64,6,48]",
			ins:  []spec{in(4, 64, 6, 48)},
			fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
				return op1(g, "Transpose", ir.Attrs{"perm": []int{0, 2, 3, 1}}, x[0])
			},
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return []*ir.Value{op1(g, "Transpose", ir.Attrs{"perm": []int{0, 3, 1, 2}}, dy)}
			},
		},
		{
			name: "big/MatMul",
			ins:  []spec{in(12, 64, 16), in(12, 64, 16)},
			fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
				return op1(g, "MatMul", ir.Attrs{"transB": true}, x[0], x[1])
			},
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return []*ir.Value{
					op1(g, "MatMul", nil, dy, x[1]),
					op1(g, "MatMul", ir.Attrs{"transA": true}, dy, x[0]),
				}
			},
		},
		{
			name: "big/GaussianMembership",
			ins: []spec{
				withGen(in(400, 32), func(r *rand.Rand, i int) float64 { return 0.2 * r.NormFloat64() }),
				withGen(in(4, 32), func(r *rand.Rand, i int) float64 { return 0.2 * r.NormFloat64() }),
				withGen(in(4), func(r *rand.Rand, i int) float64 { return 0.3 * r.Float64() }),
			},
			fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "GaussianMembership", nil, x...) },
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return g.Apply("GaussianMembershipGrad", nil, dy, x[0], x[1], x[2], y)
			},
		},
		{
			name: "big/ZScore",
			ins:  []spec{in(200, 300)},
			fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "ZScore", nil, x[0]) },
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return []*ir.Value{op1(g, "ZScoreGrad", nil, dy, x[0])}
			},
		},
		{
			name: "big/SumTo-leading",
			ins:  []spec{in(300, 200)},
			fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
				return op1(g, "SumTo", ir.Attrs{"shape": []int{200}}, x[0])
			},
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return []*ir.Value{op1(g, "BroadcastTo", ir.Attrs{"shape": []int{300, 200}}, dy)}
			},
		},
	}
	gid := make([]int32, 2048)
	for i := range gid {
		gid[i] = int32((i * 7919) % 500)
	}
	cs = append(cs, gradCase{
		name: "big/Gather",
		ins:  []spec{in(500, 64), ids(ir.Shape{32, 64}, gid...)},
		fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "Gather", nil, x[0], x[1]) },
		bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
			return []*ir.Value{op1(g, "GatherGrad", ir.Attrs{"vocab": 500}, dy, x[1]), nil}
		},
	})
	ce := gradCase{
		name: "big/CrossEntropy",
		fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
			return g.Apply("CrossEntropy", ir.Attrs{"label_smoothing": 0.05}, x[0], x[1])[0]
		},
		bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
			return []*ir.Value{op1(g, "CrossEntropyGrad", ir.Attrs{"label_smoothing": 0.05}, dy, x[0], x[1]), nil}
		},
	}
	tg := make([]int32, 64)
	for i := range tg {
		tg[i] = int32((i * 37) % 500)
	}
	ce.ins = []spec{in(64, 500), ids(ir.Shape{64}, tg...)}
	cs = append(cs, ce)
	for i := range cs {
		cs[i].big = true
	}
	return cs
}

func allGradCases() []gradCase {
	var cs []gradCase
	cs = append(cs, binaryCases()...)
	cs = append(cs, unaryCases()...)
	cs = append(cs, reduceCases()...)
	cs = append(cs, matmulCases()...)
	cs = append(cs, linearCases()...)
	cs = append(cs, movementCases()...)
	cs = append(cs, nnCases()...)
	cs = append(cs, paperCases()...)
	cs = append(cs, lmHeadCases()...)
	cs = append(cs, concatCases()...)
	cs = append(cs, padCases()...)
	cs = append(cs, attentionCases()...)
	cs = append(cs, expertCases()...)
	return cs
}

// attentionCases: FusedAttention's gradient (FusedAttentionGrad) with and
// without a mask, causal or not, with dropout, and with a v head size of
// its own.
func attentionCases() []gradCase {
	var cs []gradCase
	for _, tc := range []struct {
		name    string
		attrs   ir.Attrs
		mask    bool
		hd, hv  int
		t, s    int
		dropout float64
	}{
		{"causal+mask", ir.Attrs{"scale": 0.4, "causal": true}, true, 4, 4, 5, 5, 0},
		{"causal+mask+dropout", ir.Attrs{"scale": 0.4, "causal": true, "dropout": 0.3, "stream": 77}, true, 4, 4, 5, 5, 0.3},
		{"cross", ir.Attrs{"scale": 0.5}, false, 3, 5, 4, 6, 0},
		{"dropout, narrow v", ir.Attrs{"causal": true, "dropout": 0.5, "stream": 3}, false, 5, 2, 6, 6, 0.5},
	} {
		ins := []spec{in(2, 2, tc.t, tc.hd), in(2, 2, tc.s, tc.hd), in(2, 2, tc.s, tc.hv)}
		if tc.mask {
			ins = append(ins, in(tc.t, tc.s))
		}
		a := tc.attrs
		cs = append(cs, gradCase{
			name: "FusedAttention/" + tc.name,
			ins:  ins,
			fwd:  func(g *ir.Graph, x []*ir.Value) *ir.Value { return op1(g, "FusedAttention", a, x...) },
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				return g.Apply("FusedAttentionGrad", a, append([]*ir.Value{dy}, x...)...)
			},
		})
	}
	return cs
}

func TestGradients(t *testing.T) {
	for _, c := range allGradCases() {
		t.Run(c.name, func(t *testing.T) { checkGrad(t, c) })
	}
}

func TestGradientsLarge(t *testing.T) {
	for _, c := range bigCases() {
		t.Run(c.name, func(t *testing.T) { checkGrad(t, c) })
	}
}

// TestEveryOpHasKernelAndCheck: each op of the table is exercised by the
// tests of this package, and compiles on this backend.
func TestEveryOpHasKernelAndCheck(t *testing.T) {
	// forward tests (no gradient rule)
	seen := map[ir.OpName]bool{"StopGradient": true, "TopKMask": true,
		"FusedElementwise": true, // fused_test.go: no gradient (made after autodiff)
		"SumToProduct":     true} // sumproduct_test.go: likewise
	for _, c := range append(allGradCases(), bigCases()...) {
		b := buildCase(c, 1)
		for _, n := range b.g.Nodes {
			seen[n.Op] = true
		}
	}
	for name := range ir.Ops {
		if !seen[name] {
			t.Errorf("op %s has no test in kernels/cpu", name)
		}
	}
}
