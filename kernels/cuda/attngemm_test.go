package cuda

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestAGLayout: the GEMM path's work buffer: regions on 256 bytes, in
// order, each as large as its operand; the forward's regions first; the
// paper's shape (32 sequences of 6 heads, T = 768, heads of 85) takes
// 1.62 GB and fits the cap, T = 4,096 at the same batch does not, and a
// program without a backward is held to the forward's share.
func TestAGLayout(t *testing.T) {
	a := &attention{BH: 192, T: 768, Hd: 85}
	l := newAGLayout(a)
	if l.Hp != 88 || l.Tp != 768 {
		t.Fatalf("Hp %d, Tp %d, want 88, 768", l.Hp, l.Tp)
	}
	scores, weights := int64(4*192*768*768), int64(2*192*768*768)
	packed, result := int64(2*192*768*88), int64(4*192*768*88)
	regions := []struct {
		name string
		r    agRegion
		len  int64
	}{{"S", l.S, scores}, {"P", l.P, weights}, {"Q", l.Q, packed}, {"K", l.K, packed}, {"V", l.V, packed}, {"R0", l.R0, result},
		{"DP", l.DP, scores}, {"DS", l.DS, weights}, {"DO", l.DO, packed}, {"R1", l.R1, result}, {"R2", l.R2, result}}
	end := int64(0)
	for _, r := range regions {
		if r.r.off%agAlign != 0 || r.r.off < end || r.r.n != r.len {
			t.Errorf("region %s at %d, %d bytes: want a multiple of %d at or after %d, %d bytes", r.name, r.r.off, r.r.n, agAlign, end, r.len)
		}
		end = r.r.off + r.len
		if r.name == "R0" && l.fwdBytes < end {
			t.Errorf("fwdBytes %d ends before R0 (%d)", l.fwdBytes, end)
		}
	}
	if l.bytes < end || l.bytes > end+agAlign {
		t.Errorf("bytes %d, the regions end at %d", l.bytes, end)
	}
	if l.bytes < 1.61e9 || l.bytes > 1.63e9 || !attnGEMMFits(a, true) {
		t.Errorf("paper shape: %d bytes (fits %v), want about 1.62e9 and fits", l.bytes, attnGEMMFits(a, true))
	}
	if attnGEMMFits(&attention{BH: 192, T: 4096, Hd: 85}, true) {
		t.Error("T = 4,096 at 192 heads fits the GEMM path's cap")
	}
	// an evaluation at twice the batch: the forward's 1.0 GB fits, the
	// backward's 3.2 GB would not
	eval := &attention{BH: 384, T: 768, Hd: 85}
	if !attnGEMMFits(eval, false) || attnGEMMFits(eval, true) {
		t.Errorf("384 pairs at T = 768: forward %d bytes, backward %d; want only the forward within the cap",
			newAGLayout(eval).fwdBytes, newAGLayout(eval).bytes)
	}
	odd := newAGLayout(&attention{BH: 3, T: 37, Hd: 9})
	if odd.Hp != 16 || odd.Tp != 40 {
		t.Errorf("T 37, Hd 9: Hp %d, Tp %d, want 16, 40", odd.Hp, odd.Tp)
	}
}

// TestAGBlocks: the GEMM path's score blocks at T = 300 (128, 128, 44)
// form every score on or below the diagonal exactly once, each block over
// the keys up to its last query.
func TestAGBlocks(t *testing.T) {
	a := &attention{BH: 2, T: 300, Hd: 12}
	l := newAGLayout(a)
	T := a.T
	count := make([]int, T*T)
	for _, c := range agScores(a, l) {
		r0 := int(c.offA / 2 / int64(l.Hp))
		if c.offC != 4*int64(r0*T) || c.s.N != r0+c.s.M || c.s.LDC != T {
			t.Fatalf("scores block at row %d: %+v", r0, c)
		}
		for i := r0; i < r0+c.s.M; i++ {
			for j := range c.s.N {
				count[i*T+j]++
			}
		}
	}
	for i := range T {
		for j := 0; j <= i; j++ {
			if count[i*T+j] != 1 {
				t.Fatalf("score (%d, %d) formed %d times, want once", i, j, count[i*T+j])
			}
		}
	}
	if n := len(agBlocks(768)); n != 6 {
		t.Errorf("T 768: %d blocks, want 6", n)
	}
}

// TestAGUpperZero: the row kernels leave the weights' rows above the
// diagonal to a zeroed buffer only where every attention node of the
// program takes the GEMM path with one layout, and Options.AGLean is on.
func TestAGUpperZero(t *testing.T) {
	gemm := func(T int) *attention { return &attention{BH: 6, T: T, Hd: 16, path: attnGEMM} }
	for _, c := range []struct {
		name  string
		nodes []*attention
		want  bool
	}{
		{"one layout", []*attention{gemm(37), gemm(37), gemm(37)}, true},
		{"two layouts", []*attention{gemm(37), gemm(40)}, false},
		{"a flash node", []*attention{gemm(37), {BH: 6, T: 37, Hd: 16, path: attnFlash}}, false},
		{"no GEMM node", []*attention{{BH: 6, T: 37, Hd: 4, path: attnScalar}}, false},
	} {
		p := &program{be: &Backend{agLean: true}}
		for _, a := range c.nodes {
			p.noteAttnWork(a)
		}
		if p.agUpperZero != c.want || (p.agFull() == 0) != c.want {
			t.Errorf("%s: agUpperZero %v (full %d), want %v", c.name, p.agUpperZero, p.agFull(), c.want)
		}
	}
	off := &program{be: &Backend{}} // Options.AGLean off
	off.noteAttnWork(gemm(37))
	if off.agUpperZero {
		t.Error("AGLean off: agUpperZero")
	}
}

// TestGPUAttnRowsUpperZero: the row kernels with full = 0 into zeroed
// buffers write the bits they write with full = 1 into buffers of garbage
// (every pair of columns up to the diagonal, the zeros above it), lse too;
// normal and differential.
func TestGPUAttnRowsUpperZero(t *testing.T) {
	c := gpuContext(t)
	const BH, T, Tp = 3, 37, 40
	a := &attention{BH: BH, T: T}
	r := rand.New(rand.NewPCG(71, 72))
	S, dP := randF32(r, BH*T*T, 2), randF32(r, BH*T*T, 1)
	D := randF32(r, BH*T, 1)
	weights := BH * T * Tp / 2 // bf16 pairs as float32 words
	garbage := make([]float32, weights)
	for i := range garbage {
		garbage[i] = math.Float32frombits(0x7fc17fc1)
	}
	devS, ddP, dD := devF32(t, c, S), devF32(t, c, dP), devF32(t, c, D)
	const key, thresh, keep = uint64(5), uint64(3 << 30), float32(1 / 0.75) // dropout 0.25
	differentially(t, []string{"attn_softmax_fwd_f32", "attn_softmax_bwd_f32"}, func() {
		var outs [2][]float32
		for full := range 2 {
			fill := make([]float32, weights)
			if full == 1 {
				fill = garbage
			}
			P, Pd, dS := devF32(t, c, fill), devF32(t, c, fill), devF32(t, c, fill)
			lse := devF32(t, c, make([]float32, BH*T))
			if err := c.Launch("attn_softmax_fwd_f32", agRowGrid(a), agRowBlock, 0, P.Ptr, lse.Ptr, devS.Ptr, uint64(0),
				int32(BH), int32(T), int32(Tp), int32(full), key, thresh, keep); err != nil {
				t.Fatal(err)
			}
			if err := c.Launch("attn_softmax_bwd_f32", agWarpGrid(T), agRowBlock, 0, Pd.Ptr, dS.Ptr, uint64(0), devS.Ptr, ddP.Ptr,
				uint64(0), lse.Ptr, dD.Ptr, int32(BH), int32(T), int32(Tp), int32(1), int32(full), key, thresh, keep); err != nil {
				t.Fatal(err)
			}
			out := append(hostF32(t, c, P, weights), hostF32(t, c, lse, BH*T)...)
			out = append(append(out, hostF32(t, c, Pd, weights)...), hostF32(t, c, dS, weights)...)
			outs[full] = out
		}
		if !sameBits(outs[0], outs[1]) {
			t.Error("full = 0 over zeros and full = 1 over garbage wrote different weights")
		}
	})
}
