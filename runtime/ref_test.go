package runtime_test

import (
	"fmt"
	"math"
	"sort"

	"github.com/rpac-dev/rpac/ir"
)

// A float64 reference interpreter of ir graphs, written from the op table's
// Doc strings, to check what onnxruntime computes from the lowered graphs.

type tensor struct {
	shape []int
	data  []float64
}

func numel(s []int) int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

func newTensor(s []int) *tensor {
	return &tensor{shape: append([]int(nil), s...), data: make([]float64, numel(s))}
}

func unravel(i int, s []int, idx []int) {
	for a := len(s) - 1; a >= 0; a-- {
		idx[a] = i % s[a]
		i /= s[a]
	}
}

func ravel(idx, s []int) int {
	o := 0
	for a := range s {
		o = o*s[a] + idx[a]
	}
	return o
}

// bcastMap maps every flat index of out to the flat index of in under numpy
// broadcasting.
func bcastMap(out, in []int) []int {
	m := make([]int, numel(out))
	idx := make([]int, len(out))
	jdx := make([]int, len(in))
	off := len(out) - len(in)
	for i := range m {
		unravel(i, out, idx)
		for a := range in {
			if in[a] == 1 {
				jdx[a] = 0
			} else {
				jdx[a] = idx[a+off]
			}
		}
		m[i] = ravel(jdx, in)
	}
	return m
}

func bcastShape(a, b []int) []int {
	s, err := ir.Broadcast(a, b)
	if err != nil {
		panic(err)
	}
	return s
}

func rowsOf(t *tensor) (int, int) {
	n := t.shape[len(t.shape)-1]
	return len(t.data) / n, n
}

// evalGraph runs g on ids ([B][T]) with weights w and returns the logits.
func evalGraph(g *ir.Graph, w func(*ir.Value) []float64, ids [][]int32) *tensor {
	vals := map[*ir.Value]*tensor{}
	get := func(v *ir.Value) *tensor {
		if t, ok := vals[v]; ok {
			return t
		}
		t := newTensor(v.Shape)
		switch v.Kind {
		case ir.Input:
			for b := range ids {
				for i, id := range ids[b] {
					t.data[b*len(ids[b])+i] = float64(id)
				}
			}
		case ir.Const:
			if v.Data != nil {
				for i, x := range v.Data {
					t.data[i] = float64(float32(x))
				}
				break
			}
			fallthrough
		default:
			copy(t.data, w(v))
		}
		vals[v] = t
		return t
	}
	for _, n := range g.Nodes {
		in := make([]*tensor, len(n.Inputs))
		for i, v := range n.Inputs {
			in[i] = get(v)
		}
		vals[n.Outputs[0]] = evalNode(n, in)
	}
	return vals[g.Outputs["logits"]]
}

// evalElementwise evaluates an op of ir.Elementwise by its float64
// formula, with its parameters as the exported float32 graph holds them.
func evalElementwise(s *ir.EwSpec, n *ir.Node, in []*tensor, out *tensor) *tensor {
	var p ir.EwParams[float64]
	for i, v := range s.Params32(n.Attrs) {
		p[i] = float64(v)
	}
	x, y := in[0], in[0]
	if len(in) > 1 {
		y = in[1]
	}
	ma, mb := bcastMap(out.shape, x.shape), bcastMap(out.shape, y.shape)
	for i := range out.data {
		out.data[i] = s.F64(x.data[ma[i]], y.data[mb[i]], p)
	}
	return out
}

func evalNode(n *ir.Node, in []*tensor) *tensor {
	a := n.Attrs
	out := newTensor(n.Outputs[0].Shape)
	x := in[0]
	unary := func(f func(float64) float64) *tensor {
		for i, v := range x.data {
			out.data[i] = f(v)
		}
		return out
	}
	if s := ir.ElementwiseOf(n.Op); s != nil {
		return evalElementwise(s, n, in, out)
	}
	switch n.Op {
	case ir.OpGather:
		W := in[0]
		D := W.shape[1]
		for i, id := range in[1].data {
			copy(out.data[i*D:(i+1)*D], W.data[int(id)*D:(int(id)+1)*D])
		}
	case ir.OpSlice:
		ax := a.Int("axis", 0)
		if ax < 0 {
			ax += len(x.shape)
		}
		st := a.Int("start", 0)
		idx := make([]int, len(out.shape))
		for i := range out.data {
			unravel(i, out.shape, idx)
			idx[ax] += st
			out.data[i] = x.data[ravel(idx, x.shape)]
		}
	case ir.OpReshape, ir.OpStopGradient:
		copy(out.data, x.data)
	case ir.OpConcat:
		ax := a.Int("axis", 0)
		if ax < 0 {
			ax += len(out.shape)
		}
		idx := make([]int, len(out.shape))
		for i := range out.data {
			unravel(i, out.shape, idx)
			for _, t := range in {
				if idx[ax] < t.shape[ax] {
					out.data[i] = t.data[ravel(idx, t.shape)]
					break
				}
				idx[ax] -= t.shape[ax]
			}
		}
	case ir.OpTranspose:
		p := a.Ints("perm")
		idx := make([]int, len(out.shape))
		jdx := make([]int, len(out.shape))
		for i := range out.data {
			unravel(i, out.shape, idx)
			for k, pk := range p {
				jdx[pk] = idx[k]
			}
			out.data[i] = x.data[ravel(jdx, x.shape)]
		}
	case ir.OpBroadcastTo:
		for i, j := range bcastMap(out.shape, x.shape) {
			out.data[i] = x.data[j]
		}
	case ir.OpSumTo:
		for i, j := range bcastMap(x.shape, out.shape) {
			out.data[j] += x.data[i]
		}
	case ir.OpLinear:
		W := in[1]
		N, K := W.shape[0], W.shape[1]
		rows := len(x.data) / K
		for r := 0; r < rows; r++ {
			for o := 0; o < N; o++ {
				s := 0.0
				for k := 0; k < K; k++ {
					s += x.data[r*K+k] * W.data[o*K+k]
				}
				if len(in) == 3 {
					s += in[2].data[o]
				}
				out.data[r*N+o] = s
			}
		}
	case ir.OpMatMul:
		y := in[1]
		r := len(x.shape)
		ta, tb := a.Bool("transA", false), a.Bool("transB", false)
		M, N := out.shape[r-2], out.shape[r-1]
		K := x.shape[r-1]
		if ta {
			K = x.shape[r-2]
		}
		batches := len(out.data) / (M * N)
		xs, ys := x.shape[r-2]*x.shape[r-1], y.shape[r-2]*y.shape[r-1]
		for bi := 0; bi < batches; bi++ {
			for i := 0; i < M; i++ {
				for j := 0; j < N; j++ {
					s := 0.0
					for k := 0; k < K; k++ {
						var av, bv float64
						if ta {
							av = x.data[bi*xs+k*M+i]
						} else {
							av = x.data[bi*xs+i*K+k]
						}
						if tb {
							bv = y.data[bi*ys+j*K+k]
						} else {
							bv = y.data[bi*ys+k*N+j]
						}
						s += av * bv
					}
					out.data[bi*M*N+i*N+j] = s
				}
			}
		}
	case ir.OpReduceSum, ir.OpReduceMean:
		axes := a.Ints("axes")
		red := map[int]bool{}
		for _, ax := range axes {
			if ax < 0 {
				ax += len(x.shape)
			}
			red[ax] = true
		}
		ks := make([]int, len(x.shape))
		cnt := 1
		for i, d := range x.shape {
			if len(axes) == 0 || red[i] {
				ks[i] = 1
				cnt *= d
			} else {
				ks[i] = d
			}
		}
		for i, j := range bcastMap(x.shape, ks) {
			out.data[j] += x.data[i]
		}
		if n.Op == ir.OpReduceMean {
			for i := range out.data {
				out.data[i] /= float64(cnt)
			}
		}
	case ir.OpSoftmax:
		rows, D := rowsOf(x)
		for r := 0; r < rows; r++ {
			row := x.data[r*D : (r+1)*D]
			mx := math.Inf(-1)
			for _, v := range row {
				mx = math.Max(mx, v)
			}
			if math.IsInf(mx, -1) {
				continue // zeros
			}
			s := 0.0
			for i, v := range row {
				out.data[r*D+i] = math.Exp(v - mx)
				s += out.data[r*D+i]
			}
			for i := range row {
				out.data[r*D+i] /= s
			}
		}
	case ir.OpFusedAttention:
		// softmax(scale·q·kᵀ + mask [+ causal])·v per (batch, head)
		q, k, v := in[0], in[1], in[2]
		Bh := q.shape[0] * q.shape[1]
		T, S, Hd := q.shape[2], k.shape[2], q.shape[3]
		scale := a.Float("scale", 1/math.Sqrt(float64(Hd)))
		causal := a.Bool("causal", false)
		row := make([]float64, S)
		for bh := 0; bh < Bh; bh++ {
			for i := 0; i < T; i++ {
				mx := math.Inf(-1)
				for j := 0; j < S; j++ {
					d := 0.0
					for e := 0; e < Hd; e++ {
						d += q.data[(bh*T+i)*Hd+e] * k.data[(bh*S+j)*Hd+e]
					}
					d *= scale
					if len(in) == 4 {
						d += in[3].data[i*S+j]
					}
					if causal && j > i {
						d = math.Inf(-1)
					}
					row[j] = d
					mx = math.Max(mx, d)
				}
				Hv := v.shape[3]
				for e := 0; e < Hv; e++ {
					out.data[(bh*T+i)*Hv+e] = 0
				}
				if math.IsInf(mx, -1) {
					continue
				}
				sum := 0.0
				for j := range row {
					row[j] = math.Exp(row[j] - mx)
					sum += row[j]
				}
				for j := 0; j < S; j++ {
					for e := 0; e < Hv; e++ {
						out.data[(bh*T+i)*Hv+e] += row[j] / sum * v.data[(bh*S+j)*Hv+e]
					}
				}
			}
		}
	case ir.OpCausalMask:
		fill := a.Float("fill", math.Inf(-1))
		T := x.shape[len(x.shape)-1]
		for i, v := range x.data {
			row, col := (i/T)%T, i%T
			if col > row {
				v = fill
			}
			out.data[i] = v
		}
	case ir.OpLayerNorm:
		eps := a.Float("eps", 1e-5)
		rows, D := rowsOf(x)
		for r := 0; r < rows; r++ {
			row := x.data[r*D : (r+1)*D]
			mean, v := 0.0, 0.0
			for _, e := range row {
				mean += e
			}
			mean /= float64(D)
			for _, e := range row {
				v += (e - mean) * (e - mean)
			}
			v /= float64(D)
			for i, e := range row {
				out.data[r*D+i] = (e-mean)/math.Sqrt(v+eps)*in[1].data[i] + in[2].data[i]
			}
		}
	case ir.OpTopKMask:
		k := a.Int("k", 1)
		rows, D := rowsOf(x)
		for r := 0; r < rows; r++ {
			row := x.data[r*D : (r+1)*D]
			idx := make([]int, D)
			for i := range idx {
				idx[i] = i
			}
			sort.SliceStable(idx, func(p, q int) bool { return row[idx[p]] > row[idx[q]] })
			for _, i := range idx[:min(max(k, 0), D)] {
				out.data[r*D+i] = 1
			}
		}
	case ir.OpGaussianMembership:
		c, ls := in[1], in[2]
		R, D := c.shape[0], c.shape[1]
		rows := len(x.data) / D
		for r := 0; r < rows; r++ {
			logit := make([]float64, R)
			for k := 0; k < R; k++ {
				d2 := 0.0
				for j := 0; j < D; j++ {
					d := x.data[r*D+j] - c.data[k*D+j]
					d2 += d * d
				}
				inv := math.Min(math.Max(math.Exp(-2*ls.data[k]), 1e-3), 1e3)
				logit[k] = math.Min(math.Max(-0.5*d2*inv, -30), 30)
			}
			mx := math.Inf(-1)
			for _, v := range logit {
				mx = math.Max(mx, v)
			}
			s := 0.0
			for k := range logit {
				logit[k] = math.Exp(logit[k] - mx)
				s += logit[k]
			}
			for k := range logit {
				v := logit[k] / s
				if math.IsNaN(v) {
					v = 1 / float64(R)
				}
				out.data[r*R+k] = v
			}
		}
	case ir.OpSinkhorn:
		R, K := x.shape[0], x.shape[1]
		copy(out.data, x.data)
		for it := 0; it < a.Int("iters", 8); it++ {
			for i := 0; i < R; i++ {
				s := 0.0
				for j := 0; j < K; j++ {
					s += out.data[i*K+j]
				}
				for j := 0; j < K; j++ {
					out.data[i*K+j] /= s + 1e-9
				}
			}
			for j := 0; j < K; j++ {
				s := 0.0
				for i := 0; i < R; i++ {
					s += out.data[i*K+j]
				}
				for i := 0; i < R; i++ {
					out.data[i*K+j] /= s + 1e-9
				}
			}
		}
	case ir.OpZScore:
		N := float64(len(x.data))
		mean := 0.0
		for _, v := range x.data {
			mean += v
		}
		mean /= N
		ss := 0.0
		for _, v := range x.data {
			ss += (v - mean) * (v - mean)
		}
		sd := math.Sqrt(ss / (N - 1))
		return unary(func(v float64) float64 { return (v - mean) / (sd + 1e-6) })
	default:
		panic(fmt.Sprintf("reference: no op %s", n.Op))
	}
	return out
}
