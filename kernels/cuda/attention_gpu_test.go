package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// attentionRef is causal attention with an additive bias in float64:
// o, lse and, for the output gradient dO, dq, dk, dv and the bias
// gradient summed over sequences and heads. Layout [BH,T,Hd].
func attentionRef(q, k, v, bias, dO []float32, BH, T, Hd int, scale float64) (o, lse, dq, dk, dv, dbias []float64) {
	o, lse = make([]float64, BH*T*Hd), make([]float64, BH*T)
	dq, dk, dv, dbias = make([]float64, BH*T*Hd), make([]float64, BH*T*Hd), make([]float64, BH*T*Hd), make([]float64, T*T)
	at := func(x []float32, bh, t, d int) float64 { return float64(x[(bh*T+t)*Hd+d]) }
	for bh := 0; bh < BH; bh++ {
		for i := 0; i < T; i++ {
			s := make([]float64, i+1)
			m := math.Inf(-1)
			for j := 0; j <= i; j++ {
				for d := 0; d < Hd; d++ {
					s[j] += at(q, bh, i, d) * at(k, bh, j, d)
				}
				s[j] = s[j]*scale + float64(bias[i*T+j])
				m = math.Max(m, s[j])
			}
			var sum float64
			for j := range s {
				sum += math.Exp(s[j] - m)
			}
			L := m + math.Log(sum)
			lse[bh*T+i] = L
			p := make([]float64, i+1)
			for j := range s {
				p[j] = math.Exp(s[j] - L)
				for d := 0; d < Hd; d++ {
					o[(bh*T+i)*Hd+d] += p[j] * at(v, bh, j, d)
				}
			}
			var Di float64
			for d := 0; d < Hd; d++ {
				Di += at(dO, bh, i, d) * o[(bh*T+i)*Hd+d]
			}
			for j := range s {
				var dp float64
				for d := 0; d < Hd; d++ {
					dp += at(dO, bh, i, d) * at(v, bh, j, d)
					dv[(bh*T+j)*Hd+d] += p[j] * at(dO, bh, i, d)
				}
				ds := p[j] * (dp - Di)
				dbias[i*T+j] += ds
				for d := 0; d < Hd; d++ {
					dq[(bh*T+i)*Hd+d] += ds * at(k, bh, j, d) * scale
					dk[(bh*T+j)*Hd+d] += ds * at(q, bh, i, d) * scale
				}
			}
		}
	}
	return
}

// TestGPUAttention: forward (o, lse) and backward (dq, dk, dv, bias
// gradient) against float64, at the paper's head size 85 and a length that
// is not a multiple of the block.
func TestGPUAttention(t *testing.T) {
	c := gpuContext(t)
	r := rand.New(rand.NewPCG(13, 14))
	const B, H, T, Hd = 2, 3, 67, 85
	BH, n := B*H, B*H*T*Hd
	scale := 1 / math.Sqrt(Hd)
	q, k, v, dO, bias := randF32(r, n, 1), randF32(r, n, 1), randF32(r, n, 1), randF32(r, n, 1), randF32(r, T*T, 0.5)
	o, lse, dq, dk, dv, dbias := attentionRef(q, k, v, bias, dO, BH, T, Hd, scale)
	dQ, dK, dV, dOb, dB := devF32(t, c, q), devF32(t, c, k), devF32(t, c, v), devF32(t, c, dO), devF32(t, c, bias)
	gO, gL, gD := devF32(t, c, make([]float32, n)), devF32(t, c, make([]float32, BH*T)), devF32(t, c, make([]float32, BH*T))
	gdq, gdk, gdv, gdb := devF32(t, c, make([]float32, n)), devF32(t, c, make([]float32, n)), devF32(t, c, make([]float32, n)), devF32(t, c, make([]float32, T*T))
	grid, block := [3]uint32{T, uint32(BH), 1}, [3]uint32{128, 1, 1}
	sh := uint32(4 * (32 + T))
	none := []any{uint64(0), uint64(0), float32(0)} // no dropout
	if err := c.Launch("attention_fwd_f32", grid, block, sh, append([]any{gO.Ptr, gL.Ptr, dQ.Ptr, dK.Ptr, dV.Ptr, dB.Ptr, int32(T), int32(Hd), int32(0), float32(scale)}, none...)...); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "attention o", hostF32(t, c, gO, n), o, 1e-5)
	closeTo(t, "attention lse", hostF32(t, c, gL, BH*T), lse, 1e-5)
	if err := c.Launch("attention_bwd_dq_f32", grid, block, sh, append([]any{gdq.Ptr, gD.Ptr, dQ.Ptr, dK.Ptr, dV.Ptr, gO.Ptr, dOb.Ptr,
		gL.Ptr, dB.Ptr, int32(T), int32(Hd), int32(0), float32(scale)}, none...)...); err != nil {
		t.Fatal(err)
	}
	if err := c.Launch("attention_bwd_dkdv_f32", grid, block, uint32(4*2*T), append([]any{gdk.Ptr, gdv.Ptr, dQ.Ptr, dK.Ptr, dV.Ptr, dOb.Ptr,
		gL.Ptr, gD.Ptr, dB.Ptr, int32(T), int32(Hd), int32(0), float32(scale)}, none...)...); err != nil {
		t.Fatal(err)
	}
	if err := c.Launch("attention_bwd_dbias_f32", [3]uint32{T, 1, 1}, block, 0, append([]any{gdb.Ptr, dQ.Ptr, dK.Ptr, dV.Ptr, dOb.Ptr,
		gL.Ptr, gD.Ptr, dB.Ptr, int32(BH), int32(T), int32(Hd), int32(0), float32(scale)}, none...)...); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "attention dq", hostF32(t, c, gdq, n), dq, 1e-4)
	closeTo(t, "attention dk", hostF32(t, c, gdk, n), dk, 1e-4)
	closeTo(t, "attention dv", hostF32(t, c, gdv, n), dv, 1e-4)
	closeTo(t, "attention dbias", hostF32(t, c, gdb, T*T), dbias, 1e-4)
}

// TestAttentionReference checks the float64 reference itself (no GPU): its
// gradients of Σ o·dO match central finite differences.
func TestAttentionReference(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	const BH, T, Hd = 2, 5, 3
	n := BH * T * Hd
	scale := 1 / math.Sqrt(Hd)
	q, k, v, dO, bias := randF32(r, n, 1), randF32(r, n, 1), randF32(r, n, 1), randF32(r, n, 1), randF32(r, T*T, 0.5)
	_, _, dq, dk, dv, dbias := attentionRef(q, k, v, bias, dO, BH, T, Hd, scale)
	loss := func() float64 {
		o, _, _, _, _, _ := attentionRef(q, k, v, bias, dO, BH, T, Hd, scale)
		var s float64
		for i := range o {
			s += o[i] * float64(dO[i])
		}
		return s
	}
	const h = 1e-2 // float32 inputs: a step float32 can represent well
	for _, c := range []struct {
		name string
		x    []float32
		g    []float64
	}{{"q", q, dq}, {"k", k, dk}, {"v", v, dv}, {"bias", bias, dbias}} {
		for i := range c.x {
			x0 := c.x[i]
			c.x[i] = x0 + h
			up := loss()
			c.x[i] = x0 - h
			down := loss()
			c.x[i] = x0
			fd := (up - down) / (float64(float32(x0+h)) - float64(float32(x0-h)))
			if math.Abs(fd-c.g[i]) > 2e-3*math.Max(1, math.Abs(fd)) {
				t.Errorf("d%s[%d]: reference %.6f, finite differences %.6f", c.name, i, c.g[i], fd)
			}
		}
	}
}

// TestGPUAttentionTensorCores: flash.cu's kernels launched directly
// against float64 (o, lse, dq, dk, dv, bias gradient): the paper's head
// size 85 and a head of 5 (padded to 16), lengths that are multiples of
// neither 64 nor 32, fewer bias-gradient partial sums than (sequence,
// head) pairs (so some blocks take two). Bounds: bf16 inputs with fp32
// accumulation (attnErrors; lse to 1e-2).
func TestGPUAttentionTensorCores(t *testing.T) {
	c := gpuContext(t)
	for _, s := range []struct{ B, H, T, Hd, G int }{{2, 3, 67, 85, 4}, {1, 3, 37, 5, 2}} {
		t.Run(fmt.Sprintf("T%d_Hd%d", s.T, s.Hd), func(t *testing.T) {
			unbind, err := (&gpu{ctx: c}).bind() // subtests run on other threads
			if err != nil {
				t.Fatal(err)
			}
			defer unbind()
			checkFlashKernels(t, c, s.B*s.H, s.T, s.Hd, s.G)
		})
	}
}

// checkFlashKernels runs flash.cu's kernels on random inputs with a bias
// and no dropout and compares every output with attentionRef.
func checkFlashKernels(t *testing.T, c *driver.Context, BH, T, Hd, G int) {
	r := rand.New(rand.NewPCG(13, uint64(Hd)))
	n := BH * T * Hd
	scale := 1 / math.Sqrt(float64(Hd))
	q, k, v, dO, bias := randF32(r, n, 1), randF32(r, n, 1), randF32(r, n, 1), randF32(r, n, 1), randF32(r, T*T, 0.5)
	o, lse, dq, dk, dv, dbias := attentionRef(q, k, v, bias, dO, BH, T, Hd, scale)
	dQ, dK, dV, dOb, dB := devF32(t, c, q), devF32(t, c, k), devF32(t, c, v), devF32(t, c, dO), devF32(t, c, bias)
	gO, gL, gD := devF32(t, c, make([]float32, n)), devF32(t, c, make([]float32, BH*T)), devF32(t, c, make([]float32, BH*T))
	gdq, gdk, gdv, gdb := devF32(t, c, make([]float32, n)), devF32(t, c, make([]float32, n)), devF32(t, c, make([]float32, n)), devF32(t, c, make([]float32, T*T))
	part := devF32(t, c, make([]float32, G*T*T))
	tiles, block := uint32((T+63)/64), [3]uint32{128, 1, 1}
	none := []any{uint64(0), uint64(0), float32(0)} // no dropout
	launch := func(name string, grid [3]uint32, args ...any) {
		if err := c.Launch(name, grid, block, 0, append(args, none...)...); err != nil {
			t.Fatal(err)
		}
	}
	pairs := [3]uint32{tiles, uint32(BH), 1}
	launch("attention_fwd_bf16", pairs, gO.Ptr, gL.Ptr, dQ.Ptr, dK.Ptr, dV.Ptr, dB.Ptr, int32(T), int32(Hd), int32(0), float32(scale))
	launch("attention_bwd_dq_bf16", [3]uint32{tiles, uint32(G), 1}, gdq.Ptr, gD.Ptr, part.Ptr, dQ.Ptr, dK.Ptr, dV.Ptr, gO.Ptr, dOb.Ptr,
		gL.Ptr, dB.Ptr, int32(BH), int32(T), int32(Hd), int32(0), float32(scale))
	launch("attention_bwd_dkdv_bf16", pairs, gdk.Ptr, gdv.Ptr, dQ.Ptr, dK.Ptr, dV.Ptr, dOb.Ptr,
		gL.Ptr, gD.Ptr, dB.Ptr, int32(T), int32(Hd), int32(0), float32(scale))
	if err := c.Launch("attention_dbias_reduce_f32", grid1D, block1D, 0, gdb.Ptr, part.Ptr, int32(G), int32(T)); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		name string
		got  []float32
		want []float64
		tol  float64
	}{
		{"o", hostF32(t, c, gO, n), o, tcAttnWorst}, {"lse", hostF32(t, c, gL, BH*T), lse, 1e-2},
		{"dq", hostF32(t, c, gdq, n), dq, tcAttnWorst}, {"dk", hostF32(t, c, gdk, n), dk, tcAttnWorst},
		{"dv", hostF32(t, c, gdv, n), dv, tcAttnWorst}, {"dbias", hostF32(t, c, gdb, T*T), dbias, tcAttnWorst},
	} {
		worst, l2 := attnErrors(x.got, x.want)
		t.Logf("%s: worst %.2e, L2 %.2e", x.name, worst, l2)
		if worst > x.tol || l2 > tcAttnL2 {
			t.Errorf("%s: worst %.3g (bound %g), L2 %.3g (bound %g)", x.name, worst, x.tol, l2, tcAttnL2)
		}
	}
}
