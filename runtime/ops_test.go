package runtime_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/runtime"
)

const opV = 8 // vocabulary and embedding width of the op graphs

type opCase struct {
	name string
	f    func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value
	emb  []float64 // embedding override ([opV,opV])
	opts onnx.Options
	tol  float64
}

// specialEmb is an embedding whose rows 5, 6 and 7 hold NaN, +Inf and -Inf
// entries and whose row 4 has ties.
func specialEmb() []float64 {
	w := weightSet{}.get(&ir.Value{Name: "emb", Shape: ir.Shape{opV, opV}})
	w[5*opV+1], w[5*opV+6] = math.NaN(), math.NaN()
	w[6*opV+0], w[6*opV+3] = math.Inf(1), math.Inf(-1)
	w[7*opV+2] = math.Inf(-1)
	w[7*opV+5] = math.NaN()
	for j := 0; j < opV; j++ {
		w[4*opV+j] = float64(float32(0.25 * float64(j%3)))
	}
	return w
}

func opGraph(c opCase) func(B, T int) *ir.Graph {
	return func(B, T int) *ir.Graph {
		g := ir.New("op_" + c.name)
		ids := g.Input("input_ids", ir.Shape{B, T}, ir.I32)
		E := g.Param("emb", ir.Shape{opV, opV})
		h := g.Op1("Gather", nil, E, ids)
		x := c.f(g, h, B, T)
		s := x.Shape
		if len(s) == 2 && s[0] == B && s[1] == T {
			x = g.Op1("Reshape", ir.Attrs{"shape": []int{B, T, 1}}, x)
		}
		if len(x.Shape) == 3 && x.Shape[2] != opV {
			X := x.Shape[2]
			x = g.Op1("Linear", nil, x, g.Param("head.weight", ir.Shape{opV, X}), g.Param("head.bias", ir.Shape{opV}))
		}
		g.SetOutput("logits", x)
		return g
	}
}

func opCases() []opCase {
	p := func(g *ir.Graph, name string, s ...int) *ir.Value { return g.Param(name, ir.Shape(s)) }
	return []opCase{
		{name: "gather", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value { return h }},
		{name: "slice", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("Slice", ir.Attrs{"axis": -1, "start": 1, "end": 5}, h)
		}},
		{name: "slice_time", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			pos := p(g, "pos", 16, opV)
			return g.Op1("Add", nil, h, g.Op1("Slice", ir.Attrs{"axis": 0, "start": 0, "end": T}, pos))
		}},
		{name: "reshape_transpose", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			x := g.Op1("Reshape", ir.Attrs{"shape": []int{B, T, 2, 4}}, h)
			x = g.Op1("Transpose", ir.Attrs{"perm": []int{2, 0, 1, 3}}, x)
			x = g.Op1("Transpose", ir.Attrs{"perm": []int{1, 2, 3, 0}}, x)
			return g.Op1("Reshape", ir.Attrs{"shape": []int{B, T, 8}}, x)
		}},
		{name: "broadcast_to", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("Add", nil, h, g.Op1("BroadcastTo", ir.Attrs{"shape": []int{B, T, opV}}, p(g, "bias", opV)))
		}},
		{name: "sum_to", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("Add", nil, h, g.Op1("SumTo", ir.Attrs{"shape": []int{T, 1}}, h))
		}},
		{name: "linear_bias", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("Linear", nil, h, p(g, "w", 5, opV), p(g, "b", 5))
		}},
		{name: "linear_shared", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			w := p(g, "w", opV, opV)
			x := g.Op1("Tanh", nil, g.Op1("Linear", nil, h, w))
			return g.Op1("Linear", nil, x, w)
		}},
		{name: "tied_embedding", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("Linear", nil, h, g.Lookup("emb"))
		}},
		{name: "linear_computed_weight", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("Linear", nil, h, g.Op1("Tanh", nil, p(g, "w", 6, opV)))
		}},
		{name: "matmul_transB", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("MatMul", ir.Attrs{"transB": true}, h, h)
		}},
		{name: "matmul_transA", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			ht := g.Op1("Transpose", ir.Attrs{"perm": []int{0, 2, 1}}, h)
			return g.Op1("MatMul", ir.Attrs{"transA": true}, ht, ht)
		}},
		{name: "matmul_both", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			ht := g.Op1("Transpose", ir.Attrs{"perm": []int{0, 2, 1}}, h)
			return g.Op1("MatMul", ir.Attrs{"transA": true, "transB": true}, ht, h)
		}},
		{name: "matmul_param", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			w := g.Op1("BroadcastTo", ir.Attrs{"shape": []int{B, 3, opV}}, p(g, "w", 1, 3, opV))
			return g.Op1("MatMul", ir.Attrs{"transB": true}, h, w)
		}},
		{name: "binary", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			x := g.Op1("Add", nil, h, p(g, "a", opV))
			x = g.Op1("Mul", nil, x, g.Scalar(1.5))
			x = g.Op1("Sub", nil, x, p(g, "c", T, 1))
			return g.Op1("Div", nil, x, g.Op1("Add", nil, g.Op1("Exp", nil, p(g, "d", opV)), g.Scalar(1)))
		}},
		{name: "scale", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			x := g.Op1("Scale", ir.Attrs{"alpha": 2.5, "beta": -0.5}, h)
			x = g.Op1("Scale", ir.Attrs{"alpha": 0.3}, x)
			x = g.Op1("Scale", ir.Attrs{"beta": 0.7}, x)
			return g.Op1("Scale", nil, x)
		}},
		{name: "unary", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			a := g.Op1("Neg", nil, g.Op1("Exp", nil, h))
			b := g.Op1("Log", nil, g.Op1("Sigmoid", nil, h))
			c := g.Op1("Tanh", nil, g.Op1("ReLU", nil, h))
			return g.Op1("Add", nil, g.Op1("Add", nil, a, b), c)
		}},
		{name: "gelu_op", opts: onnx.Options{GELU: onnx.GELUOp}, f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("GELU", nil, g.Op1("Scale", ir.Attrs{"alpha": 3.0}, h))
		}},
		{name: "gelu_erf", opts: onnx.Options{GELU: onnx.GELUErf}, f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("GELU", nil, g.Op1("Scale", ir.Attrs{"alpha": 3.0}, h))
		}},
		{name: "clamp", emb: specialEmb(), f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("Clamp", ir.Attrs{"lo": -0.3, "hi": 0.4}, h)
		}},
		{name: "clamp_lo", emb: specialEmb(), f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("Clamp", ir.Attrs{"lo": -0.3}, h)
		}},
		{name: "clamp_hi", emb: specialEmb(), f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("Clamp", ir.Attrs{"hi": 0.2}, h)
		}},
		{name: "clamp_none", emb: specialEmb(), f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("Clamp", nil, h)
		}},
		{name: "nan_to_num", emb: specialEmb(), f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("NanToNum", ir.Attrs{"nan": 0.5, "posinf": 4.0, "neginf": -4.0}, h)
		}},
		{name: "nan_to_num_defaults", emb: specialEmb(), f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("NanToNum", nil, h)
		}},
		{name: "reduce_sum_keep", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("ReduceSum", ir.Attrs{"axes": []int{-1}, "keepdims": true}, h)
		}},
		{name: "reduce_mean", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("ReduceMean", ir.Attrs{"axes": []int{2}}, h)
		}},
		{name: "reduce_all", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			s := g.Op1("ReduceSum", nil, h)
			m := g.Op1("ReduceMean", ir.Attrs{"axes": []int{0, 1}, "keepdims": true}, h)
			return g.Op1("Add", nil, g.Op1("Add", nil, h, s), m)
		}},
		{name: "softmax", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("Softmax", nil, g.Op1("Scale", ir.Attrs{"alpha": 4.0}, h))
		}},
		{name: "softmax_guard", opts: onnx.Options{GuardSoftmax: true}, f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			c := make([]float64, T*opV)
			for j := 0; j < opV; j++ {
				c[j] = math.Inf(-1)
			}
			c[opV+3] = math.Inf(-1)
			return g.Op1("Softmax", nil, g.Op1("Add", nil, h, g.Const("mask", ir.Shape{T, opV}, c)))
		}},
		{name: "causal_attention", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			s := g.Op1("MatMul", ir.Attrs{"transB": true}, h, h)
			s = g.Op1("Scale", ir.Attrs{"alpha": 1 / math.Sqrt(opV)}, s)
			pr := g.Op1("Softmax", nil, g.Op1("CausalMask", nil, s))
			return g.Op1("MatMul", nil, pr, h)
		}},
		{name: "fused_attention", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			h4 := g.Op1("Reshape", ir.Attrs{"shape": []int{B, 1, T, opV}}, h)
			bias := make([]float64, T*T)
			for i := range bias {
				bias[i] = 0.1 * float64(i%5)
			}
			o := g.Op1("FusedAttention", ir.Attrs{"scale": 0.5, "causal": true}, h4, h4, h4, g.Const("attn_bias", ir.Shape{T, T}, bias))
			return g.Op1("Reshape", ir.Attrs{"shape": []int{B, T, opV}}, o)
		}},
		{name: "concat", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			sl := g.Op1("Slice", ir.Attrs{"axis": -1, "start": 1, "end": 4}, h)
			return g.Op1("Concat", ir.Attrs{"axis": -1}, sl, h, g.Op1("Scale", ir.Attrs{"alpha": 2.0}, sl))
		}},
		{name: "fused_attention_rank", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			// q and k widened by broadcast constants (a rank-folded prior), v narrower.
			h4 := g.Op1("Reshape", ir.Attrs{"shape": []int{B, 1, T, opV}}, h)
			ext := func(name string, off float64) *ir.Value {
				d := make([]float64, T*3)
				for i := range d {
					d[i] = off + 0.2*float64(i%7)
				}
				return g.Op1("BroadcastTo", ir.Attrs{"shape": []int{B, 1, T, 3}}, g.Const(name, ir.Shape{T, 3}, d))
			}
			q := g.Op1("Concat", ir.Attrs{"axis": 3}, h4, ext("qe", -0.3))
			k := g.Op1("Concat", ir.Attrs{"axis": 3}, h4, ext("ke", 0.1))
			v := g.Op1("Slice", ir.Attrs{"axis": 3, "start": 0, "end": 5}, h4)
			o := g.Op1("FusedAttention", ir.Attrs{"scale": 0.5, "causal": true}, q, k, v)
			return g.Op1("Reshape", ir.Attrs{"shape": []int{B, T, 5}}, o)
		}},
		{name: "causal_fill", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("CausalMask", ir.Attrs{"fill": -5.0}, g.Op1("MatMul", ir.Attrs{"transB": true}, h, h))
		}},
		{name: "causal_nan", emb: specialEmb(), f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("CausalMask", ir.Attrs{"fill": -5.0}, g.Op1("MatMul", ir.Attrs{"transB": true}, h, h))
		}},
		{name: "layer_norm", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("LayerNorm", ir.Attrs{"eps": 1e-5}, h, p(g, "ln.weight", opV), p(g, "ln.bias", opV))
		}},
		{name: "layer_norm_default_eps", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("LayerNorm", nil, g.Op1("Scale", ir.Attrs{"alpha": 1e-3}, h), p(g, "ln.weight", opV), p(g, "ln.bias", opV))
		}},
		{name: "gaussian_membership", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("GaussianMembership", nil, h, p(g, "centers", 4, opV), p(g, "log_sigma", 4))
		}},
		{name: "gaussian_membership_nan", emb: specialEmb(), f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("GaussianMembership", nil, h, p(g, "centers", 4, opV), p(g, "log_sigma", 4))
		}},
		{name: "gaussian_membership_rank2", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			z := g.Op1("Reshape", ir.Attrs{"shape": []int{B * T, opV}}, h)
			mu := g.Op1("GaussianMembership", nil, z, p(g, "centers", 3, opV), p(g, "log_sigma", 3))
			return g.Op1("Reshape", ir.Attrs{"shape": []int{B, T, 3}}, mu)
		}},
		{name: "sinkhorn_param", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			P := g.Op1("Sinkhorn", ir.Attrs{"iters": 3}, g.Op1("Exp", nil, p(g, "S", 4, 5)))
			P = g.Op1("BroadcastTo", ir.Attrs{"shape": []int{B, T, 20}}, g.Op1("Reshape", ir.Attrs{"shape": []int{1, 1, 20}}, P))
			return g.Op1("Add", nil, P, g.Op1("Linear", nil, h, p(g, "w", 20, opV)))
		}},
		{name: "sinkhorn_data", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			x := g.Op1("Reshape", ir.Attrs{"shape": []int{B * T, opV}}, g.Op1("Exp", nil, h))
			x = g.Op1("Sinkhorn", ir.Attrs{"iters": 6}, x)
			return g.Op1("Reshape", ir.Attrs{"shape": []int{B, T, opV}}, x)
		}},
		{name: "zscore", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("ZScore", nil, h)
		}},
		{name: "stop_gradient", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("Mul", nil, g.Op1("StopGradient", nil, h), h)
		}},
		{name: "stop_gradient_output", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("StopGradient", nil, h)
		}},
		{name: "flat_logits", f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("Reshape", ir.Attrs{"shape": []int{B * T, opV}}, g.Op1("Tanh", nil, h))
		}},
	}
}

// tieEmb is an embedding with tied entries in rows 4 to 7 (no NaN: the
// ir op leaves the order of NaN entries unspecified).
func tieEmb() []float64 {
	w := weightSet{}.get(&ir.Value{Name: "emb", Shape: ir.Shape{opV, opV}})
	for r := 4; r < opV; r++ {
		for j := 0; j < opV; j++ {
			w[r*opV+j] = float64(float32(0.25 * float64((j*r)%3)))
		}
	}
	w[7*opV+7] = math.Inf(1)
	w[6*opV+0] = math.Inf(-1)
	return w
}

// elementwiseCases are the test cases of every exported op of
// ir.Elementwise (EwSpec.Cases): the op over the embeddings, and for a
// binary op a parameter row as its second operand (exp of one where the
// case wants positive inputs).
func elementwiseCases() []opCase {
	var out []opCase
	for _, s := range ir.Elementwise {
		if !ir.Ops[s.Name].Exported() {
			continue
		}
		for i, c := range s.Cases {
			out = append(out, opCase{name: fmt.Sprintf("ew_%s_%d", s.Name, i), f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
				in := []*ir.Value{h}
				if c.Positive {
					in[0] = g.Op1("Exp", nil, h)
				}
				if s.NumIn() == 2 {
					y := g.Param("y", ir.Shape{opV})
					if c.Positive {
						y = g.Op1("Exp", nil, y)
					}
					in = append(in, y)
				}
				return g.Op1(s.Name, c.Attrs, in...)
			}})
		}
	}
	return out
}

func topKCases() []opCase {
	var out []opCase
	for _, k := range []int{0, 1, 3, 8, 9} {
		out = append(out, opCase{name: "topk_mask_k" + string(rune('0'+k)), emb: tieEmb(), f: func(g *ir.Graph, h *ir.Value, B, T int) *ir.Value {
			return g.Op1("TopKMask", ir.Attrs{"k": k}, h)
		}})
	}
	return out
}

// TestOps lowers one small graph per op (and per lowering variant), runs it
// in onnxruntime and compares with the float64 reference interpreter.
func TestOps(t *testing.T) {
	requireORT(t)
	cases := opCases()
	cases = append(cases[:len(cases):len(cases)], topKCases()...)
	cases = append(cases, elementwiseCases()...)
	const B, T = 2, 5
	ids := [][]int32{{0, 1, 2, 3, 4}, {5, 6, 7, 4, 3}}
	covered := map[ir.OpName]bool{}
	for _, c := range cases {
		if c.f == nil {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			ws := weightSet{overrides: map[string][]float64{}}
			if c.emb != nil {
				ws.overrides["emb"] = c.emb
			}
			build := opGraph(c)
			for _, n := range build(B, T).Nodes {
				covered[n.Op] = true
			}
			dir := t.TempDir()
			export(t, dir, exportSpec{build: build, lengths: []int{T}, batch: B, vocab: opV, eos: 0, weights: ws, opts: c.opts})
			m, err := runtime.Open(dir, runtime.Options{Threads: 1, AllowNonFiniteWeights: true}) // NaN/Inf weights on purpose
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			got, err := m.Logits(context.Background(), ids)
			if err != nil {
				t.Fatal(err)
			}
			want := evalGraph(build(B, T), ws.get, ids)
			if len(want.shape) == 2 { // [B·T,V]
				want.shape = []int{B, T, opV}
			}
			tol := c.tol
			if tol == 0 {
				tol = 2e-5
			}
			for b := range ids {
				checkLogits(t, c.name, got[b], want, b, tol)
			}
		})
	}
	for op, def := range ir.Ops {
		if onnx.Lowered(op) && !def.TrainingOnly && !covered[op] {
			t.Errorf("lowered op %s has no case in TestOps", op)
		}
	}
}
