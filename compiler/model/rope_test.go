package model_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// rotate applies the rotary embedding to v at position t as the graph does:
// v⊙cos[t] + (v·Rᵀ)⊙sin[t].
func rotate(v []float64, t int, cos, sin, rot []float64) []float64 {
	Hd := len(v)
	out := make([]float64, Hd)
	for i := range Hd {
		var rv float64
		for j := range Hd {
			rv += rot[i*Hd+j] * v[j]
		}
		out[i] = v[i]*cos[t*Hd+i] + rv*sin[t*Hd+i]
	}
	return out
}

func dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// TestRotaryRelative: with the tables and the rotate-half matrix the model
// uses, the score of a query at position t and a key at position s depends
// on t-s only, the rotation keeps the length of a vector, and with an odd
// head dimension the last dimension passes through unchanged.
func TestRotaryRelative(t *testing.T) {
	for _, Hd := range []int{2, 8, 85} {
		const T = 40
		cos, sin := model.RotaryTables(T, Hd, 0)
		rot := model.RotateHalf(Hd)
		r := rand.New(rand.NewPCG(uint64(Hd), 1))
		q, k := make([]float64, Hd), make([]float64, Hd)
		for i := range q {
			q[i], k[i] = r.NormFloat64(), r.NormFloat64()
		}
		for _, c := range []struct{ t, s, shift int }{{5, 2, 30}, {9, 9, 17}, {3, 0, 36}, {39, 1, -1}} {
			a := dot(rotate(q, c.t, cos, sin, rot), rotate(k, c.s, cos, sin, rot))
			b := dot(rotate(q, c.t+c.shift, cos, sin, rot), rotate(k, c.s+c.shift, cos, sin, rot))
			if math.Abs(a-b) > 1e-9 {
				t.Errorf("Hd %d: score(%d,%d) = %.12g but score(%d,%d) = %.12g", Hd, c.t, c.s, a, c.t+c.shift, c.s+c.shift, b)
			}
		}
		for _, pos := range []int{0, 7, 39} {
			rq := rotate(q, pos, cos, sin, rot)
			if d := math.Abs(dot(rq, rq) - dot(q, q)); d > 1e-9 {
				t.Errorf("Hd %d position %d: |v|² changed by %g", Hd, pos, d)
			}
			if Hd%2 == 1 && rq[Hd-1] != q[Hd-1] {
				t.Errorf("Hd %d position %d: the odd last dimension turned (%g to %g)", Hd, pos, q[Hd-1], rq[Hd-1])
			}
			if pos == 0 {
				for i := range q {
					if rq[i] != q[i] {
						t.Fatalf("Hd %d: position 0 is not the identity", Hd)
					}
				}
			}
		}
		// pair i turns at base^(-i/h): at position 1 the first pair by 1 radian
		if h := Hd / 2; math.Abs(sin[1*Hd]-math.Sin(1)) > 1e-15 || math.Abs(cos[1*Hd+h-1]-math.Cos(math.Pow(10000, -float64(h-1)/float64(h)))) > 1e-15 {
			t.Errorf("Hd %d: frequencies off", Hd)
		}
	}
}

// TestRoPEWired: a model with rope gives the logits of the same weights
// without it at position 0 (where every rotation is the identity) and other
// logits after it; rope_base is checked.
func TestRoPEWired(t *testing.T) {
	plain := microConfig(model.Baseline)
	plain.Dropout = 0
	rope := plain
	rope.RoPE = true
	fd := feeds(rand.New(rand.NewPCG(8, 9)), plain.Vocab, 1, 8)
	logits := func(cfg model.Config) []float64 { return evalLogits(t, cfg, 1, 8, fd, 3, nil) }
	a, b := logits(plain), logits(rope)
	V := plain.Vocab
	for i := 0; i < V; i++ {
		if math.Abs(a[i]-b[i]) > 1e-12 {
			t.Fatalf("position 0, logit %d: %g without rope, %g with", i, a[i], b[i])
		}
	}
	var diff float64
	for i := V; i < len(a); i++ {
		diff = math.Max(diff, math.Abs(a[i]-b[i]))
	}
	if diff < 1e-6 {
		t.Fatalf("rope changed no logit after position 0 (max |Δ| %g)", diff)
	}
	for _, base := range []float64{1, -5, math.NaN(), 2e9} {
		c := rope
		c.RoPEBase = base
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "rope_base") {
			t.Errorf("rope_base %g: %v", base, err)
		}
	}
	c := rope
	c.DModel, c.Heads = 4, 4
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "rope needs") {
		t.Errorf("head dimension 1 with rope: %v", err)
	}
}

// TestPosInitNone: pos_init "none" builds no position embedding (D·max_len
// fewer parameters); with rope the logits still depend on the order of the
// tokens: in one layer the last position attends to the set of tokens
// before it, so swapping two earlier tokens changes its logits with rope
// and cannot without (nor without positions at all).
func TestPosInitNone(t *testing.T) {
	base := microConfig(model.Baseline)
	base.Dropout = 0
	none := base
	none.PosInit = "none"
	count := func(c model.Config) int {
		mg, err := model.Build(&c, model.Opts{T: 8, B: 1, Mode: model.Eval, Logits: true, NoLoss: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range mg.Specs {
			if s.Name == "pos_emb.weight" && c.PosInit == "none" {
				t.Fatalf("pos_init none built %s", s.Name)
			}
		}
		return model.CountParams(mg.Specs)
	}
	if a, b := count(base), count(none); a-b != base.DModel*base.MaxLen {
		t.Fatalf("%d parameters with the position embedding, %d without (want %d fewer)", a, b, base.DModel*base.MaxLen)
	}
	lastLogits := func(c model.Config, ids []int32) []float64 {
		T := len(ids)
		fd := map[string]*kernels.Tensor{"input_ids": kernels.IntTensor([]int{1, T}, ids)}
		return evalLogits(t, c, 1, T, fd, 5, nil)[(T-1)*c.Vocab:]
	}
	a, b := []int32{1, 2, 3, 4, 5, 6}, []int32{2, 1, 3, 4, 5, 6}
	swapDiff := func(c model.Config) float64 {
		x, y := lastLogits(c, a), lastLogits(c, b)
		var d float64
		for i := range x {
			d = math.Max(d, math.Abs(x[i]-y[i]))
		}
		return d
	}
	none.Layers = 1
	if d := swapDiff(none); d > 1e-12 {
		t.Fatalf("no positions, no rope: swapping two earlier tokens moved the last logits by %g", d)
	}
	none.RoPE = true
	if d := swapDiff(none); d < 1e-6 {
		t.Fatalf("rope without a position embedding: swapping two earlier tokens moved the last logits by only %g", d)
	}
}

// TestSmearKeys: with the mixing weight σ(a) near 1 a smeared model gives
// the logits of the same weights without smearing; at its initial a = 0
// (half the key before) it gives others, from the second position on.
func TestSmearKeys(t *testing.T) {
	plain := microConfig(model.Baseline)
	plain.Dropout = 0
	smear := plain
	smear.SmearKeys = true
	var weights map[string]*kernels.Tensor // the plain model's, shared
	fd := feeds(rand.New(rand.NewPCG(2, 3)), plain.Vocab, 2, 7)
	run := func(cfg model.Config, a float64) []float64 {
		return evalLogits(t, cfg, 2, 7, fd, 4, func(st *kernels.Store) {
			if weights == nil {
				weights = st.Tensors
			}
			n := 0
			for name, x := range st.Tensors {
				if strings.HasSuffix(name, ".smear") {
					for i := range x.F64 {
						x.F64[i] = a
					}
					n++
				} else {
					copy(x.F64, weights[name].F64)
				}
			}
			if cfg.SmearKeys && n != cfg.Layers {
				t.Fatalf("%d smear parameters, want one per layer (%d)", n, cfg.Layers)
			}
		})
	}
	want := run(plain, 0)
	maxDiff := func(a, b []float64) float64 {
		var d float64
		for i := range a {
			d = math.Max(d, math.Abs(a[i]-b[i]))
		}
		return d
	}
	if d := maxDiff(run(smear, 40), want); d > 1e-9 {
		t.Fatalf("σ(a) ≈ 1: logits differ from the unsmeared model's by %g", d)
	}
	if d := maxDiff(run(smear, 0), want); d < 1e-6 {
		t.Fatalf("a = 0: logits equal the unsmeared model's (max |Δ| %g)", d)
	}
}

// evalLogits builds cfg's eval graph for the ids fd feeds ([B,T]),
// initialises its weights with seed, lets edit (when set) change them, and
// returns the logits.
func evalLogits(t *testing.T, cfg model.Config, B, T int, fd map[string]*kernels.Tensor, seed uint64, edit func(*kernels.Store)) []float64 {
	t.Helper()
	mg, err := model.Build(&cfg, model.Opts{T: T, B: B, Mode: model.Eval, Logits: true, NoLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	st := kernels.NewStore(ir.FP64)
	if err := model.InitStore(mg.Specs, st, seed); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(st)
	}
	prog := compile(t, mg.Graph, st, ir.FP64)
	if err := prog.Run(fd, 0); err != nil {
		t.Fatal(err)
	}
	return prog.Output("logits").Float64s()
}
