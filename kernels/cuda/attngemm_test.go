package cuda

import (
	"strings"
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

// TestAttnChoiceEnv: RPAC_CUDA_ATTENTION takes gemm, flash or nothing; any
// other value is refused by the dry run (and New) with the variable named.
func TestAttnChoiceEnv(t *testing.T) {
	for v, want := range map[string]attnChoice{"": attnChooseGEMM, "gemm": attnChooseGEMM, "flash": attnChooseFlash} {
		t.Setenv("RPAC_CUDA_ATTENTION", v)
		got, err := attnChoiceEnv()
		if err != nil || got != want {
			t.Errorf("%q: %v, %v; want %v", v, got, err, want)
		}
		be, err := NewDryRun(GEMMBF16)
		if err != nil || be.attention != want {
			t.Errorf("%q: dry run %v, want the choice %v", v, err, want)
		}
	}
	t.Setenv("RPAC_CUDA_ATTENTION", "tiles")
	if _, err := NewDryRun(GEMMBF16); err == nil || !strings.Contains(err.Error(), "RPAC_CUDA_ATTENTION") {
		t.Errorf("tiles: %v, want a refusal naming RPAC_CUDA_ATTENTION", err)
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
