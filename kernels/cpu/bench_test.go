package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

func randF32(n int, scale float64, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(scale * r.NormFloat64())
	}
	return x
}

func benchProgram(b *testing.B, g *ir.Graph, feeds map[string]*kernels.Tensor, bytes int64) {
	b.Helper()
	p, err := New(ir.FP32).Compile(g, nil, kernels.NewStore(ir.FP32))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	if err := p.Run(feeds, 1); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(bytes)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := p.Run(feeds, uint64(i)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCrossEntropy: GPT-2 vocabulary, 2048 rows (one step's tokens).
func BenchmarkCrossEntropy(b *testing.B) {
	const N, V = 2048, 50257
	logits := &kernels.Tensor{Shape: ir.Shape{N, V}, F32: randF32(N*V, 2, 1)}
	tg := make([]int32, N)
	for i := range tg {
		tg[i] = int32((i * 7919) % V)
	}
	targets := kernels.IntTensor(ir.Shape{N}, tg)
	for _, withGrad := range []bool{false, true} {
		name := "fwd"
		if withGrad {
			name = "fwd+grad"
		}
		b.Run(name, func(b *testing.B) {
			g := ir.New("ce")
			lv := g.Input("logits", ir.Shape{N, V}, ir.F32)
			tv := g.Input("targets", ir.Shape{N}, ir.I32)
			ce := g.Apply("CrossEntropy", ir.Attrs{"label_smoothing": 0.015}, lv, tv)
			g.SetOutput("loss", ce[0])
			bytes := int64(N * V * 4)
			if withGrad {
				g.SetOutput("dlogits", g.Op1("CrossEntropyGrad", ir.Attrs{"label_smoothing": 0.015}, g.Scalar(1.0/N), lv, tv))
				bytes *= 3
			}
			benchProgram(b, g, map[string]*kernels.Tensor{"logits": logits, "targets": targets}, bytes)
		})
	}
	// As in training: logits computed in the graph (here a copy of the
	// input, included in the time) and read only by the loss and its
	// gradient, so the forward leaves exp(x - max) in place.
	b.Run("fwd+grad/in-place", func(b *testing.B) {
		g := ir.New("ce")
		lv := g.Op1("StopGradient", nil, g.Input("logits", ir.Shape{N, V}, ir.F32))
		tv := g.Input("targets", ir.Shape{N}, ir.I32)
		ce := g.Apply("CrossEntropy", ir.Attrs{"label_smoothing": 0.015}, lv, tv)
		g.SetOutput("loss", ce[0])
		g.SetOutput("dlogits", g.Op1("CrossEntropyGrad", ir.Attrs{"label_smoothing": 0.015}, g.Scalar(1.0/N), lv, tv))
		benchProgram(b, g, map[string]*kernels.Tensor{"logits": logits, "targets": targets}, int64(N*V*4*3))
	})
	b.Run("grad-only", func(b *testing.B) {
		g := ir.New("ceg")
		lv := g.Input("logits", ir.Shape{N, V}, ir.F32)
		tv := g.Input("targets", ir.Shape{N}, ir.I32)
		g.SetOutput("dlogits", g.Op1("CrossEntropyGrad", ir.Attrs{"label_smoothing": 0.015}, g.Scalar(1.0/N), lv, tv))
		benchProgram(b, g, map[string]*kernels.Tensor{"logits": logits, "targets": targets}, int64(N*V*8))
	})
}

// BenchmarkLayerNorm: the paper's d=510 over 2048 tokens.
func BenchmarkLayerNorm(b *testing.B) {
	const N, D = 2048, 510
	feeds := map[string]*kernels.Tensor{
		"x":  {Shape: ir.Shape{N, D}, F32: randF32(N*D, 1, 2)},
		"dy": {Shape: ir.Shape{N, D}, F32: randF32(N*D, 1, 3)},
		"g":  {Shape: ir.Shape{D}, F32: randF32(D, 1, 4)},
		"b":  {Shape: ir.Shape{D}, F32: randF32(D, 1, 5)},
	}
	b.Run("fwd", func(b *testing.B) {
		g := ir.New("ln")
		x, gv, bv := g.Input("x", ir.Shape{N, D}, ir.F32), g.Input("g", ir.Shape{D}, ir.F32), g.Input("b", ir.Shape{D}, ir.F32)
		g.SetOutput("y", g.Op1("LayerNorm", nil, x, gv, bv))
		benchProgram(b, g, feeds, N*D*8)
	})
	b.Run("grad", func(b *testing.B) {
		g := ir.New("lng")
		x, gv, dy := g.Input("x", ir.Shape{N, D}, ir.F32), g.Input("g", ir.Shape{D}, ir.F32), g.Input("dy", ir.Shape{N, D}, ir.F32)
		outs := g.Apply("LayerNormGrad", nil, dy, x, gv)
		g.SetOutput("dx", outs[0])
		g.SetOutput("dg", outs[1])
		benchProgram(b, g, feeds, N*D*12)
	})
}

// BenchmarkSoftmax: causal attention scores [B,H,T,T] = [4,6,512,512].
func BenchmarkSoftmax(b *testing.B) {
	const B, H, T = 4, 6, 512
	n := B * H * T * T
	x := randF32(n, 2, 6)
	for m := 0; m < B*H; m++ {
		for i := 0; i < T; i++ {
			for j := i + 1; j < T; j++ {
				x[m*T*T+i*T+j] = float32(math.Inf(-1))
			}
		}
	}
	feeds := map[string]*kernels.Tensor{
		"x":  {Shape: ir.Shape{B, H, T, T}, F32: x},
		"dy": {Shape: ir.Shape{B, H, T, T}, F32: randF32(n, 1, 7)},
	}
	b.Run("fwd", func(b *testing.B) {
		g := ir.New("sm")
		xv := g.Input("x", ir.Shape{B, H, T, T}, ir.F32)
		g.SetOutput("y", g.Op1("Softmax", nil, xv))
		benchProgram(b, g, feeds, int64(n*8))
	})
	b.Run("mask+fwd", func(b *testing.B) {
		g := ir.New("msm")
		xv := g.Input("x", ir.Shape{B, H, T, T}, ir.F32)
		g.SetOutput("y", g.Op1("Softmax", nil, g.Op1("CausalMask", nil, xv)))
		benchProgram(b, g, feeds, int64(n*8))
	})
	b.Run("grad", func(b *testing.B) {
		g := ir.New("smg")
		xv := g.Input("x", ir.Shape{B, H, T, T}, ir.F32)
		dy := g.Input("dy", ir.Shape{B, H, T, T}, ir.F32)
		g.SetOutput("dx", g.Op1("SoftmaxGrad", nil, dy, xv))
		benchProgram(b, g, feeds, int64(n*12))
	})
}

// BenchmarkGELU: the FFN hidden activation, [2048, 4·510].
func BenchmarkGELU(b *testing.B) {
	const N, D = 2048, 2040
	feeds := map[string]*kernels.Tensor{
		"x":  {Shape: ir.Shape{N, D}, F32: randF32(N*D, 1.5, 8)},
		"dy": {Shape: ir.Shape{N, D}, F32: randF32(N*D, 1, 9)},
	}
	b.Run("fwd", func(b *testing.B) {
		g := ir.New("gelu")
		g.SetOutput("y", g.Op1("GELU", nil, g.Input("x", ir.Shape{N, D}, ir.F32)))
		benchProgram(b, g, feeds, N*D*8)
	})
	b.Run("grad", func(b *testing.B) {
		g := ir.New("gelug")
		x, dy := g.Input("x", ir.Shape{N, D}, ir.F32), g.Input("dy", ir.Shape{N, D}, ir.F32)
		g.SetOutput("dx", g.Op1("GELUGrad", nil, dy, x))
		benchProgram(b, g, feeds, N*D*12)
	})
}

// BenchmarkAddBroadcast: residual-style [B,T,D] + [D] and [B,T,D]·[B,T,1].
func BenchmarkAddBroadcast(b *testing.B) {
	const N, D = 2048, 510
	feeds := map[string]*kernels.Tensor{
		"x":   {Shape: ir.Shape{4, 512, D}, F32: randF32(N*D, 1, 10)},
		"row": {Shape: ir.Shape{D}, F32: randF32(D, 1, 11)},
		"col": {Shape: ir.Shape{4, 512, 1}, F32: randF32(N, 1, 12)},
	}
	b.Run("trailing", func(b *testing.B) {
		g := ir.New("add")
		g.SetOutput("y", g.Op1("Add", nil, g.Input("x", ir.Shape{4, 512, D}, ir.F32), g.Input("row", ir.Shape{D}, ir.F32)))
		benchProgram(b, g, feeds, N*D*8)
	})
	b.Run("per-row", func(b *testing.B) {
		g := ir.New("mul")
		g.SetOutput("y", g.Op1("Mul", nil, g.Input("x", ir.Shape{4, 512, D}, ir.F32), g.Input("col", ir.Shape{4, 512, 1}, ir.F32)))
		benchProgram(b, g, feeds, N*D*8)
	})
}

// BenchmarkLMHead: the tied LM head, loss and gradient of one tiny-preset
// step (2048 rows, D=128, GPT-2 vocabulary): Linear + CrossEntropy and
// their gradients against LMHeadCrossEntropy at several chunk sizes.
func BenchmarkLMHead(b *testing.B) {
	const N, D, V = 2048, 128, 50257
	feeds := map[string]*kernels.Tensor{
		"x": {Shape: ir.Shape{N, D}, F32: randF32(N*D, 1, 1)},
		"w": {Shape: ir.Shape{V, D}, F32: randF32(V*D, 0.02, 2)},
		"t": kernels.IntTensor(ir.Shape{N}, make([]int32, N)),
	}
	for i := range feeds["t"].I32 {
		feeds["t"].I32[i] = int32(i * 7919 % V)
	}
	graph := func(chunk int) *ir.Graph {
		g := ir.New("head")
		x := g.Input("x", ir.Shape{N, D}, ir.F32)
		w := g.Input("w", ir.Shape{V, D}, ir.F32)
		tv := g.Input("t", ir.Shape{N}, ir.I32)
		one := g.Scalar(1.0 / N)
		if chunk < 0 {
			a := ir.Attrs{"label_smoothing": 0.015}
			l := g.Op1("Linear", nil, x, w)
			g.SetOutput("loss", g.Apply("CrossEntropy", a, l, tv)[0])
			dl := g.Op1("CrossEntropyGrad", a, one, l, tv)
			g.SetOutput("dx", g.Op1("LinearGradX", nil, dl, w))
			g.SetOutput("dw", g.Op1("LinearGradW", nil, dl, x))
			return g
		}
		a := ir.Attrs{"label_smoothing": 0.015, "chunk": chunk}
		g.SetOutput("loss", g.Apply("LMHeadCrossEntropy", a, x, w, tv)[0])
		d := g.Apply("LMHeadCrossEntropyGrad", a, one, x, w, tv)
		g.SetOutput("dx", d[0])
		g.SetOutput("dw", d[1])
		return g
	}
	b.Run("unfused", func(b *testing.B) { benchProgram(b, graph(-1), feeds, 0) })
	for _, c := range []int{64, 128, 256, 512, 1024, 2048} {
		b.Run(fmt.Sprintf("chunk=%d", c), func(b *testing.B) { benchProgram(b, graph(c), feeds, 0) })
	}
}

// BenchmarkUnary: cheap elementwise ops over [2048, 510] in float32.
func BenchmarkUnary(b *testing.B) {
	const N, D = 2048, 510
	feeds := map[string]*kernels.Tensor{
		"x":  {Shape: ir.Shape{N, D}, F32: randF32(N*D, 1.5, 8)},
		"dy": {Shape: ir.Shape{N, D}, F32: randF32(N*D, 1, 9)},
	}
	for _, c := range []struct {
		op ir.OpName
		a  ir.Attrs
	}{{"Scale", ir.Attrs{"alpha": 0.5}}, {"ReLU", nil}, {"Tanh", nil}, {"ReLUGrad", nil}} {
		b.Run(string(c.op), func(b *testing.B) {
			g := ir.New(string(c.op))
			x := g.Input("x", ir.Shape{N, D}, ir.F32)
			in := []*ir.Value{x}
			if c.op == ir.OpReLUGrad {
				in = []*ir.Value{g.Input("dy", ir.Shape{N, D}, ir.F32), x}
			}
			g.SetOutput("y", g.Op1(c.op, c.a, in...))
			benchProgram(b, g, feeds, N*D*8)
		})
	}
}
