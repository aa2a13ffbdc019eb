package cpu

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

func mustCompile(t *testing.T, prec ir.Precision, g *ir.Graph, plan *kernels.Plan, st *kernels.Store) kernels.Program {
	t.Helper()
	if st == nil {
		st = kernels.NewStore(prec)
	}
	p, err := New(prec).Compile(g, plan, st)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return p
}

func mustRun(t *testing.T, p kernels.Program, feeds map[string]*kernels.Tensor, seed uint64) {
	t.Helper()
	if err := p.Run(feeds, seed); err != nil {
		t.Fatalf("run: %v", err)
	}
}

func f64Tensor(shape ir.Shape, data ...float64) *kernels.Tensor {
	t := kernels.NewTensor(ir.FP64, shape)
	copy(t.F64, data)
	return t
}

func floatTensor(prec ir.Precision, shape ir.Shape, data []float64) *kernels.Tensor {
	t := kernels.NewTensor(prec, shape)
	t.SetFloat64s(data)
	return t
}

func randData(r *rand.Rand, n int, scale float64) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = scale * r.NormFloat64()
	}
	return x
}

func near(a, b, tol float64) bool {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.IsNaN(a) && math.IsNaN(b)
	}
	if math.IsInf(a, 0) || math.IsInf(b, 0) {
		return a == b
	}
	return math.Abs(a-b) <= tol*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

// specF64 is an elementwise op's float64 formula (ir.EwSpec.F64), the
// reference of the float32 fast paths.
func specF64(op ir.OpName, x, y float64) float64 {
	return ir.ElementwiseOf(op).F64(x, y, ir.EwParams[float64]{})
}

func TestFastMath(t *testing.T) {
	for x := -12.0; x < 12; x += 0.00391 {
		xf := float64(float32(x))
		for _, c := range []struct {
			name           string
			got, want, abs float64
		}{
			// float32 GELU is accurate in absolute terms (PyTorch's float32
			// GELU is 0 below about -5.5)
			{"gelu", float64(gelu32(float32(x))), specF64(ir.OpGELU, xf, 0), 1e-9 * math.Max(1, math.Abs(xf))},
			{"geluGrad", float64(geluGrad32(float32(x))), specF64(ir.OpGELUGrad, 1, xf), 1e-9},
			{"sigmoid", float64(sigmoid32(float32(x))), specF64(ir.OpSigmoid, xf, 0), 0},
		} {
			if d := math.Abs(c.got - c.want); d > 2e-6*math.Abs(c.want)+c.abs+1e-30 {
				t.Fatalf("%s(%g) = %.9g, want %.9g", c.name, x, c.got, c.want)
			}
		}
	}
}

// refGaussian is a direct transcription of GaussianFuzzy.forward.
func refGaussian(z []float64, D int, c []float64, ls []float64) []float64 {
	R := len(ls)
	N := len(z) / D
	out := make([]float64, N*R)
	for n := 0; n < N; n++ {
		logits := make([]float64, R)
		for r := 0; r < R; r++ {
			var z2 float64
			for d := 0; d < D; d++ {
				diff := z[n*D+d] - c[r*D+d]
				z2 += diff * diff
			}
			inv := math.Min(math.Max(math.Exp(-2*ls[r]), 1e-3), 1e3)
			l := -0.5 * z2 * inv
			if !math.IsNaN(l) {
				l = math.Min(math.Max(l, -30), 30)
			}
			logits[r] = l
		}
		m := math.Inf(-1)
		for _, l := range logits {
			m = math.Max(m, l)
		}
		var s float64
		for _, l := range logits {
			s += math.Exp(l - m)
		}
		for r, l := range logits {
			mu := math.Exp(l-m) / s
			if math.IsNaN(mu) {
				mu = 1 / float64(R)
			}
			out[n*R+r] = mu
		}
	}
	return out
}

func TestGaussianMembershipForward(t *testing.T) {
	const N, D, R = 6, 5, 4
	r := rand.New(rand.NewPCG(3, 4))
	z := randData(r, N*D, 1)
	c := randData(r, R*D, 0.5)
	ls := []float64{0.1, 5, -5, -0.3} // 5 and -5 hit the sigma clamp
	for d := 0; d < D; d++ {
		z[2*D+d] = 40 // far from all centers: logits clamp at -30
	}
	z[4*D+1] = math.NaN() // a NaN row: μ = 1/R
	want := refGaussian(z, D, c, ls)
	for _, prec := range []ir.Precision{ir.FP64, ir.FP32} {
		g := ir.New("gauss")
		zv := g.Input("z", ir.Shape{2, 3, D}, ir.F32)
		cv := g.Input("c", ir.Shape{R, D}, ir.F32)
		lv := g.Input("ls", ir.Shape{R}, ir.F32)
		g.SetOutput("mu", g.Op1("GaussianMembership", nil, zv, cv, lv))
		p := mustCompile(t, prec, g, nil, nil)
		mustRun(t, p, map[string]*kernels.Tensor{
			"z": floatTensor(prec, zv.Shape, z), "c": floatTensor(prec, cv.Shape, c), "ls": floatTensor(prec, lv.Shape, ls),
		}, 0)
		got := p.Output("mu").Float64s()
		tol := 1e-12
		if prec == ir.FP32 {
			tol = 2e-6
		}
		for i := range want {
			if !near(got[i], want[i], tol) {
				t.Errorf("%v: mu[%d] = %.9g, want %.9g", prec, i, got[i], want[i])
			}
		}
		// Row 2: regimes 0, 2, 3 clamp at -30 and tie; regime 1 (sigma
		// clamp 1e-3) stays inside. Row 4 (NaN) is uniform.
		if got[2*R] != got[2*R+2] || got[2*R] != got[2*R+3] || !(got[2*R+1] > 0.99) {
			t.Errorf("%v: clamped row = %v", prec, got[2*R:3*R])
		}
		for r := 0; r < R; r++ {
			if got[4*R+r] != 0.25 {
				t.Errorf("%v: NaN row should be uniform: %v", prec, got[4*R:5*R])
			}
		}
	}
}

func TestCrossEntropyForward(t *testing.T) {
	const N, V = 5, 11
	r := rand.New(rand.NewPCG(5, 6))
	logits := randData(r, N*V, 3)
	logits[7] = 60 // large values: needs the max subtraction
	logits[8] = -80
	tg := []int32{3, 0, 10, 7, 7}
	for _, ls := range []float64{0, 0.2} {
		var wantS, wantP float64
		for n := 0; n < N; n++ {
			row := logits[n*V : (n+1)*V]
			m := math.Inf(-1)
			for _, v := range row {
				m = math.Max(m, v)
			}
			var s float64
			for _, v := range row {
				s += math.Exp(v - m)
			}
			logp := func(v float64) float64 { return v - m - math.Log(s) }
			nll := -logp(row[tg[n]])
			var smooth float64
			for _, v := range row {
				smooth += -logp(v) / V
			}
			wantP += nll
			wantS += (1-ls)*nll + ls*smooth
		}
		for _, prec := range []ir.Precision{ir.FP64, ir.FP32} {
			g := ir.New("ce")
			lv := g.Input("logits", ir.Shape{N, V}, ir.F32)
			tv := g.Input("t", ir.Shape{N}, ir.I32)
			outs := g.Apply("CrossEntropy", ir.Attrs{"label_smoothing": ls}, lv, tv)
			g.SetOutput("s", outs[0])
			g.SetOutput("p", outs[1])
			p := mustCompile(t, prec, g, nil, nil)
			mustRun(t, p, map[string]*kernels.Tensor{"logits": floatTensor(prec, lv.Shape, logits), "t": kernels.IntTensor(tv.Shape, tg)}, 0)
			tol := 1e-12
			if prec == ir.FP32 {
				tol = 1e-6
			}
			if s := p.Output("s").At(0); !near(s, wantS, tol) {
				t.Errorf("ls=%v %v: smoothed sum %.10g, want %.10g", ls, prec, s, wantS)
			}
			if s := p.Output("p").At(0); !near(s, wantP, tol) {
				t.Errorf("ls=%v %v: pure sum %.10g, want %.10g", ls, prec, s, wantP)
			}
		}
	}
}

func runSingle(t *testing.T, prec ir.Precision, op ir.OpName, a ir.Attrs, shape ir.Shape, x []float64) []float64 {
	t.Helper()
	g := ir.New(string(op))
	xv := g.Input("x", shape, ir.F32)
	g.SetOutput("y", g.Op1(op, a, xv))
	p := mustCompile(t, prec, g, nil, nil)
	mustRun(t, p, map[string]*kernels.Tensor{"x": floatTensor(prec, shape, x)}, 0)
	return p.Output("y").Float64s()
}

func TestTopKMask(t *testing.T) {
	cases := []struct {
		k    int
		x    []float64
		want []float64
	}{
		{2, []float64{1, 3, 3, 2}, []float64{0, 1, 1, 0}},
		{2, []float64{2, 2, 2, 2}, []float64{1, 1, 0, 0}},
		{3, []float64{5, 1, 5, 5}, []float64{1, 0, 1, 1}},
		{1, []float64{0, 7, 0, 7}, []float64{0, 1, 0, 0}},
		{1, []float64{math.NaN(), -1, -2, -3}, []float64{0, 1, 0, 0}},
		{4, []float64{1, 2, 3, 4}, []float64{1, 1, 1, 1}},
		{9, []float64{1, 2, 3, 4}, []float64{1, 1, 1, 1}},
	}
	for _, prec := range []ir.Precision{ir.FP64, ir.FP32} {
		for _, c := range cases {
			got := runSingle(t, prec, "TopKMask", ir.Attrs{"k": c.k}, ir.Shape{1, 4}, c.x)
			for i := range got {
				if got[i] != c.want[i] {
					t.Errorf("%v TopKMask(k=%d, %v) = %v, want %v", prec, c.k, c.x, got, c.want)
					break
				}
			}
		}
		// Long rows with many ties take the sorting path.
		const L, k = 50, 20
		r := rand.New(rand.NewPCG(1, 2))
		x := make([]float64, 3*L)
		for i := range x {
			x[i] = float64(r.IntN(6))
		}
		got := runSingle(t, prec, "TopKMask", ir.Attrs{"k": k}, ir.Shape{3, L}, x)
		for row := 0; row < 3; row++ {
			for i := 0; i < L; i++ {
				rank := 0 // entries that beat i
				for j := 0; j < L; j++ {
					a, b := x[row*L+j], x[row*L+i]
					if a > b || (a == b && j < i) {
						rank++
					}
				}
				want := 0.0
				if rank < k {
					want = 1
				}
				if got[row*L+i] != want {
					t.Fatalf("%v long TopKMask row %d entry %d: got %v want %v", prec, row, i, got[row*L+i], want)
				}
			}
		}
	}
}

func TestSoftmaxMaskedRows(t *testing.T) {
	inf := math.Inf(-1)
	for _, prec := range []ir.Precision{ir.FP64, ir.FP32} {
		g := ir.New("sm")
		xv := g.Input("x", ir.Shape{1, 3, 3}, ir.F32)
		g.SetOutput("y", g.Op1("Softmax", nil, g.Op1("CausalMask", nil, xv)))
		p := mustCompile(t, prec, g, nil, nil)
		mustRun(t, p, map[string]*kernels.Tensor{"x": floatTensor(prec, xv.Shape, []float64{5, 1, 2, 0, 0, 9, 1, 2, 3})}, 0)
		got := p.Output("y").Float64s()
		e := math.Exp(1)
		want := []float64{1, 0, 0, 0.5, 0.5, 0, 1 / (1 + e + e*e), e / (1 + e + e*e), e * e / (1 + e + e*e)}
		for i := range want {
			if !near(got[i], want[i], 1e-6) {
				t.Fatalf("%v masked softmax = %v, want %v", prec, got, want)
			}
		}
		got = runSingle(t, prec, "Softmax", nil, ir.Shape{2, 3}, []float64{inf, inf, inf, 0, inf, 0})
		want = []float64{0, 0, 0, 0.5, 0, 0.5}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%v softmax of -Inf rows = %v, want %v", prec, got, want)
			}
		}
	}
}

func TestSinkhornSums(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	for _, tc := range []struct{ R, K, iters int }{{4, 4, 60}, {3, 5, 1}, {4, 4, 1}} {
		x := make([]float64, tc.R*tc.K)
		for i := range x {
			x[i] = math.Exp(r.NormFloat64())
		}
		got := runSingle(t, ir.FP64, "Sinkhorn", ir.Attrs{"iters": tc.iters}, ir.Shape{tc.R, tc.K}, x)
		for j := 0; j < tc.K; j++ {
			var s float64
			for i := 0; i < tc.R; i++ {
				s += got[i*tc.K+j]
			}
			if math.Abs(s-1) > 1e-8 {
				t.Errorf("%+v: column %d sums to %.12g", tc, j, s)
			}
		}
		if tc.R == tc.K && tc.iters > 20 {
			for i := 0; i < tc.R; i++ {
				var s float64
				for j := 0; j < tc.K; j++ {
					s += got[i*tc.K+j]
				}
				if math.Abs(s-1) > 1e-6 {
					t.Errorf("%+v: row %d sums to %.12g", tc, i, s)
				}
			}
		}
	}
	// one iteration by hand
	x := []float64{1, 2, 3, 4}
	got := runSingle(t, ir.FP64, "Sinkhorn", ir.Attrs{"iters": 1}, ir.Shape{2, 2}, x)
	y := []float64{1 / (3 + 1e-9), 2 / (3 + 1e-9), 3 / (7 + 1e-9), 4 / (7 + 1e-9)}
	c0, c1 := y[0]+y[2]+1e-9, y[1]+y[3]+1e-9
	want := []float64{y[0] / c0, y[1] / c1, y[2] / c0, y[3] / c1}
	for i := range want {
		if !near(got[i], want[i], 1e-15) {
			t.Fatalf("Sinkhorn 1 iter = %v, want %v", got, want)
		}
	}
}

func TestZScoreForward(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 11))
	x := randData(r, 30, 2)
	var m float64
	for _, v := range x {
		m += v
	}
	m /= 30
	var ss float64
	for _, v := range x {
		ss += (v - m) * (v - m)
	}
	sd := math.Sqrt(ss / 29) // torch.std is unbiased
	for _, prec := range []ir.Precision{ir.FP64, ir.FP32} {
		got := runSingle(t, prec, "ZScore", nil, ir.Shape{5, 6}, x)
		for i, v := range x {
			if want := (v - m) / (sd + 1e-6); !near(got[i], want, 1e-6) {
				t.Fatalf("%v ZScore[%d] = %g, want %g", prec, i, got[i], want)
			}
		}
	}
}

func TestElementwiseSpecialValues(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	x := []float64{nan, inf, -inf, 2, -3}
	got := runSingle(t, ir.FP64, "NanToNum", ir.Attrs{"nan": 0.5, "posinf": 7.0, "neginf": -7.0}, ir.Shape{5}, x)
	if want := []float64{0.5, 7, -7, 2, -3}; !equalF(got, want) {
		t.Errorf("NanToNum = %v, want %v", got, want)
	}
	got = runSingle(t, ir.FP64, "NanToNum", nil, ir.Shape{5}, x)
	if want := []float64{0, math.MaxFloat64, -math.MaxFloat64, 2, -3}; !equalF(got, want) {
		t.Errorf("NanToNum defaults = %v, want %v", got, want)
	}
	got = runSingle(t, ir.FP32, "NanToNum", nil, ir.Shape{5}, x)
	if want := []float64{0, math.MaxFloat32, -math.MaxFloat32, 2, -3}; !equalF(got, want) {
		t.Errorf("NanToNum f32 defaults = %v, want %v", got, want)
	}
	got = runSingle(t, ir.FP64, "Clamp", ir.Attrs{"lo": -1.0, "hi": 1.0}, ir.Shape{5}, x)
	if !math.IsNaN(got[0]) || got[1] != 1 || got[2] != -1 || got[3] != 1 || got[4] != -1 {
		t.Errorf("Clamp = %v", got)
	}
	got = runSingle(t, ir.FP64, "Clamp", ir.Attrs{"lo": 0.0}, ir.Shape{5}, x)
	if got[1] != inf || got[2] != 0 || got[3] != 2 || got[4] != 0 {
		t.Errorf("Clamp lo only = %v", got)
	}
	got = runSingle(t, ir.FP64, "StopGradient", nil, ir.Shape{5}, x)
	if !equalF(got, x) {
		t.Errorf("StopGradient = %v", got)
	}
	got = runSingle(t, ir.FP64, "Scale", ir.Attrs{"alpha": 2.0, "beta": 1.0}, ir.Shape{2}, []float64{1, -4})
	if !equalF(got, []float64{3, -7}) {
		t.Errorf("Scale = %v", got)
	}
}

func equalF(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !(a[i] == b[i] || math.IsNaN(a[i]) && math.IsNaN(b[i])) {
			return false
		}
	}
	return true
}

func TestRandomOpsDeterministic(t *testing.T) {
	g := ir.New("rnd")
	xv := g.Input("x", ir.Shape{100, 100}, ir.F32)
	d1 := g.Apply("Dropout", ir.Attrs{"p": 0.25}, xv)
	d2 := g.Apply("Dropout", ir.Attrs{"p": 0.25}, xv)
	gn := g.Op1("GumbelNoise", nil, xv)
	// x is all ones: a Dropout's output is its mask
	g.SetOutput("m1", d1[0])
	g.SetOutput("y1", d1[0])
	g.SetOutput("m2", d2[0])
	g.SetOutput("g", gn)
	// DropoutGrad draws the first node's mask again
	g.SetOutput("dg", g.Op1("DropoutGrad", ir.Attrs{"p": 0.25, "stream": d1[0].Def.ID}, xv))
	x := make([]float64, 10000)
	for i := range x {
		x[i] = 1
	}
	for _, prec := range []ir.Precision{ir.FP64, ir.FP32} {
		p := mustCompile(t, prec, g, nil, nil)
		feeds := map[string]*kernels.Tensor{"x": floatTensor(prec, xv.Shape, x)}
		mustRun(t, p, feeds, 42)
		m1, m2, gg := p.Output("m1").Float64s(), p.Output("m2").Float64s(), p.Output("g").Float64s()
		y1 := p.Output("y1").Float64s()
		mustRun(t, p, feeds, 42)
		if !equalF(m1, p.Output("m1").Float64s()) || !equalF(gg, p.Output("g").Float64s()) {
			t.Errorf("%v: same seed gave different randomness", prec)
		}
		if equalF(m1, m2) {
			t.Errorf("%v: two Dropout nodes drew the same mask", prec)
		}
		if !equalF(m1, p.Output("dg").Float64s()) {
			t.Errorf("%v: DropoutGrad drew another mask than its Dropout node", prec)
		}
		mustRun(t, p, feeds, 43)
		if equalF(m1, p.Output("m1").Float64s()) || equalF(gg, p.Output("g").Float64s()) {
			t.Errorf("%v: another seed gave the same randomness", prec)
		}
		kept := 0
		for i, m := range m1 {
			if m != 0 && !near(m, 1/0.75, 1e-6) {
				t.Fatalf("%v: mask value %g", prec, m)
			}
			if m != 0 {
				kept++
			}
			if y1[i] != m {
				t.Fatalf("%v: y = x·mask violated", prec)
			}
		}
		if f := float64(kept) / 10000; math.Abs(f-0.75) > 0.02 {
			t.Errorf("%v: kept fraction %.3f, want 0.75", prec, f)
		}
		// Gumbel(0,1) noise has mean γ ≈ 0.5772.
		var s float64
		for _, v := range gg {
			s += v - 1
		}
		if m := s / 10000; math.Abs(m-0.5772) > 0.05 {
			t.Errorf("%v: Gumbel noise mean %.3f", prec, m)
		}
	}
}

// chainGraph is a mid-size training-like chain: embedding, Linear,
// LayerNorm, GELU, attention-like softmax, logits, cross-entropy, and a
// backward pass through most of it.
func chainGraph() *ir.Graph {
	const B, T, D, V = 2, 24, 48, 300
	g := ir.New("chain")
	ids := g.Input("ids", ir.Shape{B, T}, ir.I32)
	tg := g.Input("targets", ir.Shape{B * T}, ir.I32)
	emb := g.Param("emb", ir.Shape{V, D})
	w1 := g.Param("w1", ir.Shape{D, D})
	b1 := g.Param("b1", ir.Shape{D})
	lg := g.Param("ln.g", ir.Shape{D})
	lb := g.Param("ln.b", ir.Shape{D})
	wo := g.Param("wo", ir.Shape{V, D})
	h := g.Op1("Gather", nil, emb, ids)                  // [B,T,D]
	a := g.Op1("Linear", nil, h, w1, b1)                 // [B,T,D]
	n := g.Op1("LayerNorm", nil, a, lg, lb)              // [B,T,D]
	f := g.Op1("GELU", nil, n)                           // [B,T,D]
	s := g.Op1("MatMul", ir.Attrs{"transB": true}, f, f) // [B,T,T]
	s = g.Op1("Scale", ir.Attrs{"alpha": 0.1}, s)
	att := g.Op1("Softmax", nil, g.Op1("CausalMask", nil, s))
	c := g.Op1("MatMul", nil, att, f) // [B,T,D]
	r := g.Op1("Add", nil, c, h)
	flat := g.Op1("Reshape", ir.Attrs{"shape": []int{B * T, D}}, r)
	logits := g.Op1("Linear", nil, flat, wo)
	ce := g.Apply("CrossEntropy", ir.Attrs{"label_smoothing": 0.1}, logits, tg)
	g.SetOutput("loss", ce[0])
	g.SetOutput("ce", ce[1])
	one := g.Scalar(1)
	dl := g.Op1("CrossEntropyGrad", ir.Attrs{"label_smoothing": 0.1}, one, logits, tg)
	g.SetOutput("dwo", g.Op1("LinearGradW", nil, dl, flat))
	dflat := g.Op1("LinearGradX", nil, dl, wo)
	dr := g.Op1("Reshape", ir.Attrs{"shape": []int{B, T, D}}, dflat)
	datt := g.Op1("MatMul", ir.Attrs{"transB": true}, dr, f)
	ds := g.Op1("CausalMask", ir.Attrs{"fill": 0.0}, g.Op1("SoftmaxGrad", nil, datt, att))
	df := g.Op1("Add", nil, g.Op1("MatMul", ir.Attrs{"transA": true}, att, dr), g.Op1("Scale", ir.Attrs{"alpha": 0.2}, g.Op1("MatMul", nil, ds, f)))
	dn := g.Op1("GELUGrad", nil, df, n)
	lng := g.Apply("LayerNormGrad", nil, dn, a, lg)
	g.SetOutput("dlng", lng[1])
	g.SetOutput("dw1", g.Op1("LinearGradW", nil, lng[0], h))
	g.SetOutput("db1", g.Op1("SumTo", ir.Attrs{"shape": []int{D}}, lng[0]))
	dh := g.Op1("Add", nil, g.Op1("LinearGradX", nil, lng[0], w1), dr)
	g.SetOutput("demb", g.Op1("GatherGrad", ir.Attrs{"vocab": V}, dh, ids))
	return g
}

func chainStore(prec ir.Precision, g *ir.Graph) *kernels.Store {
	st := kernels.NewStore(prec)
	r := rand.New(rand.NewPCG(21, 22))
	for _, v := range g.ValuesOfKind(ir.Param) {
		t, _ := st.Ensure(v.Name, v.Shape)
		data := randData(r, v.Shape.Numel(), 0.3)
		if v.Name == "ln.g" {
			for i := range data {
				data[i] += 1
			}
		}
		t.SetFloat64s(data)
	}
	return st
}

func chainFeeds(g *ir.Graph) map[string]*kernels.Tensor {
	r := rand.New(rand.NewPCG(23, 24))
	ids := g.Lookup("ids")
	tg := g.Lookup("targets")
	a := make([]int32, ids.Shape.Numel())
	b := make([]int32, tg.Shape.Numel())
	for i := range a {
		a[i] = int32(r.IntN(300))
		b[i] = int32(r.IntN(300))
	}
	return map[string]*kernels.Tensor{"ids": kernels.IntTensor(ids.Shape, a), "targets": kernels.IntTensor(tg.Shape, b)}
}

func TestF32MatchesF64(t *testing.T) {
	g := chainGraph()
	res := map[ir.Precision]map[string][]float64{}
	for _, prec := range []ir.Precision{ir.FP64, ir.FP32} {
		p := mustCompile(t, prec, g, nil, chainStore(prec, g))
		mustRun(t, p, chainFeeds(g), 1)
		res[prec] = map[string][]float64{}
		for _, name := range g.OutputNames() {
			res[prec][name] = p.Output(name).Float64s()
		}
	}
	for _, name := range g.OutputNames() {
		a, b := res[ir.FP64][name], res[ir.FP32][name]
		var num, den float64
		for i := range a {
			num += (a[i] - b[i]) * (a[i] - b[i])
			den += a[i] * a[i]
		}
		if rel := math.Sqrt(num / den); rel > 1e-5 || den == 0 {
			t.Errorf("%s: f32 vs f64 relative error %.3g", name, rel)
		}
	}
}

// planFor builds a Plan for g by linear scan: slots freed after last use are
// reused (inPlace: a node's output may take the slot of an input that dies
// there).
func planFor(g *ir.Graph, inPlace bool) *kernels.Plan {
	last := map[int]int{}
	for i, n := range g.Nodes {
		for _, v := range n.Inputs {
			last[v.ID] = i
		}
	}
	for _, v := range g.Outputs {
		last[v.ID] = len(g.Nodes)
	}
	pl := &kernels.Plan{Slot: map[int]int{}}
	var free []int
	for i, n := range g.Nodes {
		var dying []int
		for _, v := range n.Inputs {
			if s, ok := pl.Slot[v.ID]; ok && last[v.ID] == i && !contains(dying, s) {
				dying = append(dying, s)
			}
		}
		if inPlace {
			free = append(free, dying...)
		}
		for _, o := range n.Outputs {
			if o.DType == ir.I32 {
				continue
			}
			need := o.Shape.Numel()
			s := -1
			for k, f := range free {
				if pl.SlotElems[f] >= need {
					s = f
					free = append(free[:k], free[k+1:]...)
					break
				}
			}
			if s < 0 {
				s = len(pl.SlotElems)
				pl.SlotElems = append(pl.SlotElems, need)
			}
			pl.Slot[o.ID] = s
			if _, used := last[o.ID]; !used {
				free = append(free, s) // dead output
			}
		}
		if !inPlace {
			free = append(free, dying...)
		}
	}
	return pl
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func TestPlanSlotReuse(t *testing.T) {
	// A hand-written plan: a and c share slot 0, b and d share slot 1.
	g := ir.New("plan")
	x := g.Input("x", ir.Shape{3, 4}, ir.F32)
	a := g.Op1("Exp", nil, x)
	b := g.Op1("Neg", nil, a)
	c := g.Op1("Add", nil, b, x)
	d := g.Op1("Transpose", ir.Attrs{"perm": []int{1, 0}}, c)
	e := g.Op1("ReduceSum", ir.Attrs{"axes": []int{1}}, d)
	g.SetOutput("d", d)
	g.SetOutput("e", e)
	plan := &kernels.Plan{Slot: map[int]int{a.ID: 0, b.ID: 1, c.ID: 0, d.ID: 1, e.ID: 0}, SlotElems: []int{12, 12}}
	feeds := map[string]*kernels.Tensor{"x": f64Tensor(x.Shape, randData(rand.New(rand.NewPCG(1, 1)), 12, 1)...)}
	ref := mustCompile(t, ir.FP64, g, nil, nil)
	mustRun(t, ref, feeds, 0)
	// Slot 0 holds c, then e (c's last use is the Transpose): e is [4]
	// inside a 12-element slot.
	for _, pl := range []*kernels.Plan{plan,
		// in place: b over a, c over b, d over c (Transpose takes a temporary)
		{Slot: map[int]int{a.ID: 0, b.ID: 0, c.ID: 0, d.ID: 0, e.ID: 1}, SlotElems: []int{12, 4}},
	} {
		p := mustCompile(t, ir.FP64, g, pl, nil)
		for run := 0; run < 2; run++ {
			mustRun(t, p, feeds, 0)
			for _, name := range []string{"d", "e"} {
				if got, want := p.Output(name).Float64s(), ref.Output(name).Float64s(); !equalF(got, want) {
					t.Errorf("plan %v: %s = %v, want %v", pl.Slot, name, got, want)
				}
			}
		}
	}
	// Slots are not zeroed between values: dirty them and run again.
	p := mustCompile(t, ir.FP64, g, plan, nil)
	for _, s := range p.(*program[float64]).slots {
		for i := range s {
			s[i] = math.NaN()
		}
	}
	mustRun(t, p, feeds, 0)
	if got, want := p.Output("e").Float64s(), ref.Output("e").Float64s(); !equalF(got, want) {
		t.Errorf("dirty slots: e = %v, want %v", got, want)
	}
}

func TestPlannedChainMatchesUnplanned(t *testing.T) {
	g := chainGraph()
	ref := mustCompile(t, ir.FP32, g, nil, chainStore(ir.FP32, g))
	mustRun(t, ref, chainFeeds(g), 1)
	for _, inPlace := range []bool{false, true} {
		pl := planFor(g, inPlace)
		p := mustCompile(t, ir.FP32, g, pl, chainStore(ir.FP32, g))
		mustRun(t, p, chainFeeds(g), 1)
		mustRun(t, p, chainFeeds(g), 1)
		for _, name := range g.OutputNames() {
			if got, want := p.Output(name).Float64s(), ref.Output(name).Float64s(); !equalF(got, want) {
				t.Errorf("inPlace=%v: %s differs from the unplanned run", inPlace, name)
			}
		}
	}
}

func TestErrors(t *testing.T) {
	// missing parameter
	g := ir.New("err")
	x := g.Input("x", ir.Shape{2, 3}, ir.F32)
	w := g.Param("layer.weight", ir.Shape{4, 3})
	g.SetOutput("y", g.Op1("Linear", nil, x, w))
	_, err := New(ir.FP32).Compile(g, nil, kernels.NewStore(ir.FP32))
	if err == nil || !strings.Contains(err.Error(), "layer.weight") {
		t.Errorf("missing param: err = %v", err)
	}
	// wrong shape in the store
	st := kernels.NewStore(ir.FP32)
	st.Ensure("layer.weight", ir.Shape{3, 4})
	_, err = New(ir.FP32).Compile(g, nil, st)
	if err == nil || !strings.Contains(err.Error(), "layer.weight") {
		t.Errorf("param shape: err = %v", err)
	}
	// store of the other precision
	st64 := kernels.NewStore(ir.FP64)
	st64.Ensure("layer.weight", ir.Shape{4, 3})
	if _, err = New(ir.FP32).Compile(g, nil, st64); err == nil {
		t.Errorf("precision mismatch: no error")
	}
	// the store is not modified by Compile
	if len(kernels.NewStore(ir.FP32).Tensors) != 0 {
		t.Fatal("unreachable")
	}
	st = kernels.NewStore(ir.FP32)
	st.Ensure("layer.weight", ir.Shape{4, 3})
	p, err := New(ir.FP32).Compile(g, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		feeds map[string]*kernels.Tensor
		want  string
	}{
		{map[string]*kernels.Tensor{}, `"x"`},
		{map[string]*kernels.Tensor{"x": kernels.NewTensor(ir.FP32, ir.Shape{3, 2})}, "shape [3,2]"},
		{map[string]*kernels.Tensor{"x": kernels.IntTensor(ir.Shape{2, 3}, make([]int32, 6))}, "float"},
	} {
		if err := p.Run(tc.feeds, 0); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("feeds %v: err = %v, want mention of %s", tc.feeds, err, tc.want)
		}
	}
	// a feed of the other precision is converted
	if err := p.Run(map[string]*kernels.Tensor{"x": kernels.NewTensor(ir.FP64, ir.Shape{2, 3})}, 0); err != nil {
		t.Errorf("f64 feed to f32 program: %v", err)
	}
	// a parameter removed from the store after compiling
	delete(st.Tensors, "layer.weight")
	if err := p.Run(map[string]*kernels.Tensor{"x": kernels.NewTensor(ir.FP32, ir.Shape{2, 3})}, 0); err == nil || !strings.Contains(err.Error(), "layer.weight") {
		t.Errorf("param gone: err = %v", err)
	}

	// ids out of range: an error, not a panic
	g = ir.New("ids")
	emb := g.Input("emb", ir.Shape{5, 2}, ir.F32)
	id := g.Input("ids", ir.Shape{3}, ir.I32)
	g.SetOutput("y", g.Op1("Gather", nil, emb, id))
	p = mustCompile(t, ir.FP32, g, nil, nil)
	for _, bad := range [][]int32{{0, 5, 1}, {-1, 0, 0}} {
		err := p.Run(map[string]*kernels.Tensor{"emb": kernels.NewTensor(ir.FP32, emb.Shape), "ids": kernels.IntTensor(id.Shape, bad)}, 0)
		if err == nil || !strings.Contains(err.Error(), "outside [0,5)") {
			t.Errorf("ids %v: err = %v", bad, err)
		}
	}
	g = ir.New("ce")
	lv := g.Input("logits", ir.Shape{2, 4}, ir.F32)
	tv := g.Input("t", ir.Shape{2}, ir.I32)
	g.SetOutput("loss", g.Apply("CrossEntropy", nil, lv, tv)[0])
	p = mustCompile(t, ir.FP32, g, nil, nil)
	err = p.Run(map[string]*kernels.Tensor{"logits": kernels.NewTensor(ir.FP32, lv.Shape), "t": kernels.IntTensor(tv.Shape, []int32{1, 4})}, 0)
	if err == nil || !strings.Contains(err.Error(), "target") {
		t.Errorf("target out of range: err = %v", err)
	}
	// a plan slot too small
	g = ir.New("small")
	x = g.Input("x", ir.Shape{4}, ir.F32)
	y := g.Op1("Exp", nil, x)
	g.SetOutput("y", y)
	if _, err := New(ir.FP32).Compile(g, &kernels.Plan{Slot: map[int]int{y.ID: 0}, SlotElems: []int{3}}, nil); err == nil {
		t.Error("small slot: no error")
	}
}

func TestOutputsOfParamsAndInputs(t *testing.T) {
	g := ir.New("out")
	x := g.Input("x", ir.Shape{2}, ir.F32)
	w := g.Param("w", ir.Shape{2})
	g.SetOutput("x", x)
	g.SetOutput("w", w)
	g.SetOutput("s", g.Op1("Add", nil, x, w))
	st := kernels.NewStore(ir.FP64)
	wt, _ := st.Ensure("w", ir.Shape{2})
	wt.F64[0], wt.F64[1] = 10, 20
	p := mustCompile(t, ir.FP64, g, nil, st)
	mustRun(t, p, map[string]*kernels.Tensor{"x": f64Tensor(ir.Shape{2}, 1, 2)}, 0)
	if got := p.Output("s").F64; got[0] != 11 || got[1] != 22 {
		t.Errorf("s = %v", got)
	}
	if got := p.Output("w").F64; got[1] != 20 {
		t.Errorf("w = %v", got)
	}
	if got := p.Output("x").F64; got[1] != 2 {
		t.Errorf("x = %v", got)
	}
	// an input nothing reads needs no feed
	g.Input("unused", ir.Shape{3}, ir.I32)
	p = mustCompile(t, ir.FP64, g, nil, st)
	mustRun(t, p, map[string]*kernels.Tensor{"x": f64Tensor(ir.Shape{2}, 1, 2)}, 0)
	if p.Output("nope") != nil {
		t.Error("unknown output should be nil")
	}
	// parameters updated in the store between runs are seen
	wt.F64[0] = 100
	mustRun(t, p, map[string]*kernels.Tensor{"x": f64Tensor(ir.Shape{2}, 1, 2)}, 0)
	if got := p.Output("s").F64; got[0] != 101 {
		t.Errorf("after update s = %v", got)
	}
}

func TestGELUSlicesSpecialValues(t *testing.T) {
	xs := []float32{float32(math.Inf(-1)), -100, -8, -7.99999, -0.0, 0, 7.99999, 8, 100, float32(math.Inf(1)), float32(math.NaN())}
	y := make([]float32, len(xs))
	dy := make([]float32, len(xs))
	for i := range dy {
		dy[i] = 1
	}
	geluSlice32(y, xs)
	for i, x := range xs {
		want := specF64(ir.OpGELU, float64(x), 0)
		if math.IsInf(float64(x), -1) {
			want = math.NaN() // -Inf·0, as in PyTorch
		}
		if !near(float64(y[i]), want, 1e-6) && !(want == 0 && y[i] == 0) && math.Abs(want) > 1e-12 {
			t.Errorf("GELU(%g) = %g, want %g", x, y[i], want)
		}
	}
	geluGradSlice32(y, dy, xs)
	for i, x := range xs {
		want := specF64(ir.OpGELUGrad, 1, float64(x))
		if math.IsInf(float64(x), 0) {
			want = math.Max(0, math.Copysign(1, float64(x)))
		}
		if !near(float64(y[i]), want, 1e-6) {
			t.Errorf("GELUGrad(%g) = %g, want %g", x, y[i], want)
		}
	}
}

func TestFusedAttention(t *testing.T) {
	if ir.Ops["FusedAttention"] == nil {
		t.Skip("no FusedAttention op in the table")
	}
	inf := math.Inf(-1)
	for _, tc := range []struct {
		name      string
		T, S      int
		mask      bool
		causal    bool
		scale     any
		maskedRow bool
		hv        int // v's head size (0: Hd)
	}{
		{"causal+mask", 5, 5, true, true, 0.3, false, 0},
		{"causal/default-scale", 6, 6, false, true, nil, false, 0},
		{"cross+mask", 4, 7, true, false, 0.5, true, 0},
		{"plain", 3, 4, false, false, 1.0, false, 0},
		{"causal/narrow-v", 6, 6, false, true, 0.4, false, 2},
		{"causal+mask/wide-v", 5, 5, true, true, 0.3, false, 7},
	} {
		const B, H, Hd = 2, 3, 4
		Hv := Hd
		if tc.hv > 0 {
			Hv = tc.hv
		}
		r := rand.New(rand.NewPCG(31, 32))
		g := ir.New("attn")
		q := g.Input("q", ir.Shape{B, H, tc.T, Hd}, ir.F32)
		k := g.Input("k", ir.Shape{B, H, tc.S, Hd}, ir.F32)
		v := g.Input("v", ir.Shape{B, H, tc.S, Hv}, ir.F32)
		feeds := map[string]*kernels.Tensor{
			"q": f64Tensor(q.Shape, randData(r, q.Shape.Numel(), 1)...),
			"k": f64Tensor(k.Shape, randData(r, k.Shape.Numel(), 1)...),
			"v": f64Tensor(v.Shape, randData(r, v.Shape.Numel(), 1)...),
		}
		a := ir.Attrs{"causal": tc.causal}
		scale := 1 / math.Sqrt(Hd)
		if tc.scale != nil {
			a["scale"] = tc.scale
			scale = tc.scale.(float64)
		}
		ins := []*ir.Value{q, k, v}
		var m *ir.Value
		if tc.mask {
			m = g.Input("mask", ir.Shape{tc.T, tc.S}, ir.F32)
			md := randData(r, tc.T*tc.S, 1)
			for i := range md {
				if r.IntN(4) == 0 {
					md[i] = inf
				}
			}
			if tc.maskedRow {
				for j := 0; j < tc.S; j++ {
					md[1*tc.S+j] = inf
				}
			}
			feeds["mask"] = f64Tensor(m.Shape, md...)
			ins = append(ins, m)
		}
		g.SetOutput("fused", g.Op1("FusedAttention", a, ins...))
		s := g.Op1("Scale", ir.Attrs{"alpha": scale}, g.Op1("MatMul", ir.Attrs{"transB": true}, q, k))
		if m != nil {
			s = g.Op1("Add", nil, s, m)
		}
		if tc.causal {
			s = g.Op1("CausalMask", nil, s)
		}
		g.SetOutput("ref", g.Op1("MatMul", nil, g.Op1("Softmax", nil, s), v))
		for _, prec := range []ir.Precision{ir.FP64, ir.FP32} {
			fd := feeds
			if prec == ir.FP32 {
				fd = map[string]*kernels.Tensor{}
				for name, x := range feeds {
					fd[name] = floatTensor(prec, x.Shape, x.F64)
				}
			}
			p := mustCompile(t, prec, g, nil, nil)
			mustRun(t, p, fd, 0)
			got, want := p.Output("fused").Float64s(), p.Output("ref").Float64s()
			tol := 1e-12
			if prec == ir.FP32 {
				tol = 1e-5
			}
			for i := range want {
				if !near(got[i], want[i], tol) {
					t.Fatalf("%s %v: fused[%d] = %g, composed %g", tc.name, prec, i, got[i], want[i])
				}
			}
			if tc.maskedRow && (got[1*Hd] != 0 || got[1*Hd+1] != 0) {
				t.Errorf("%s %v: fully masked row should give zeros: %v", tc.name, prec, got[Hd:2*Hd])
			}
		}
	}
}

func TestCrossEntropyKeepsVisibleLogits(t *testing.T) {
	g := ir.New("ce-out")
	x := g.Input("x", ir.Shape{3, 5}, ir.F32)
	tv := g.Input("t", ir.Shape{3}, ir.I32)
	l := g.Op1("Scale", ir.Attrs{"alpha": 2.0}, x)
	ce := g.Apply("CrossEntropy", nil, l, tv)
	g.SetOutput("logits", l)
	g.SetOutput("loss", ce[0])
	g.SetOutput("d", g.Op1("CrossEntropyGrad", nil, g.Scalar(1), l, tv))
	for _, prec := range []ir.Precision{ir.FP64, ir.FP32} {
		p := mustCompile(t, prec, g, nil, nil)
		xd := randData(rand.New(rand.NewPCG(1, 5)), 15, 1)
		mustRun(t, p, map[string]*kernels.Tensor{"x": floatTensor(prec, x.Shape, xd), "t": kernels.IntTensor(tv.Shape, []int32{0, 4, 2})}, 0)
		got := p.Output("logits").Float64s()
		for i := range xd {
			if !near(got[i], 2*xd[i], 1e-6) {
				t.Fatalf("%v: logits output changed by CrossEntropy: %v", prec, got)
			}
		}
		d := p.Output("d").Float64s()
		for r := 0; r < 3; r++ {
			var s float64
			for j := 0; j < 5; j++ {
				s += d[r*5+j]
			}
			if math.Abs(s) > 1e-6 {
				t.Errorf("%v: gradient row %d sums to %g, want 0", prec, r, s)
			}
		}
	}
}

func TestCrossEntropyInPlaceSelection(t *testing.T) {
	g := chainGraph()
	p := mustCompile(t, ir.FP64, g, nil, chainStore(ir.FP64, g)).(*program[float64])
	n := 0
	for _, c := range p.ce {
		if !c.inPlace {
			t.Error("chain graph: CrossEntropy should work in place")
		}
		n++
	}
	if n != 1 {
		t.Errorf("%d CrossEntropy caches, want 1", n)
	}
	g2 := ir.New("ce-out")
	x := g2.Input("x", ir.Shape{3, 5}, ir.F32)
	tv := g2.Input("t", ir.Shape{3}, ir.I32)
	l := g2.Op1("Scale", nil, x)
	g2.SetOutput("loss", g2.Apply("CrossEntropy", nil, l, tv)[0])
	g2.SetOutput("logits", l)
	p2 := mustCompile(t, ir.FP64, g2, nil, nil).(*program[float64])
	if p2.ce[l.ID].inPlace {
		t.Error("logits that are a graph output must not be overwritten")
	}
}

func TestCrossEntropyNonFinite(t *testing.T) {
	for _, inPlace := range []bool{false, true} {
		for _, prec := range []ir.Precision{ir.FP64, ir.FP32} {
			g := ir.New("ce-nan")
			x := g.Input("x", ir.Shape{2, 3}, ir.F32)
			tv := g.Input("t", ir.Shape{2}, ir.I32)
			l := x
			if inPlace {
				l = g.Op1("Scale", nil, x)
			}
			ce := g.Apply("CrossEntropy", nil, l, tv)
			g.SetOutput("loss", ce[1])
			g.SetOutput("d", g.Op1("CrossEntropyGrad", nil, g.Scalar(1), l, tv))
			p := mustCompile(t, prec, g, nil, nil)
			mustRun(t, p, map[string]*kernels.Tensor{
				"x": floatTensor(prec, x.Shape, []float64{1, math.NaN(), 2, 0, 1, 2}),
				"t": kernels.IntTensor(tv.Shape, []int32{0, 1}),
			}, 0)
			if v := p.Output("loss").At(0); !math.IsNaN(v) {
				t.Errorf("inPlace=%v %v: loss with a NaN logit = %g, want NaN", inPlace, prec, v)
			}
			d := p.Output("d").Float64s()
			if math.IsNaN(d[3]) || math.IsNaN(d[4]) || math.IsNaN(d[5]) {
				t.Errorf("inPlace=%v %v: a NaN in row 0 leaked into row 1: %v", inPlace, prec, d)
			}
		}
	}
}
