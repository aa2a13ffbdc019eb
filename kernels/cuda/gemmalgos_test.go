package cuda

import (
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/ir"
)

// TestParseGemmShape: sizes, transposes and the backend's bf16 row padding;
// malformed shapes are errors.
func TestParseGemmShape(t *testing.T) {
	s, err := ParseGemmShape("24576x510x1020:NT", BF16)
	if err != nil {
		t.Fatal(err)
	}
	if s.M != 24576 || s.N != 510 || s.K != 1020 || s.TransA || !s.TransB || s.Batch != 1 {
		t.Errorf("got %+v", s)
	}
	// A is M×K (1,020 → 1,024 bf16 per row), B stored N×K (1,024)
	if s.LDA != 1024 || s.LDB != 1024 || s.LeadingC() != 510 {
		t.Errorf("leading dimensions %d %d %d, want 1024 1024 510", s.LDA, s.LDB, s.LeadingC())
	}
	s, err = ParseGemmShape("3x5x7:TN", F32)
	if err != nil || !s.TransA || s.TransB || s.LeadingA() != 3 || s.LeadingB() != 5 {
		t.Errorf("3x5x7:TN fp32: %+v, %v", s, err)
	}
	s, err = ParseGemmShape("1024x50257x510:NT:50264", BF16)
	if err != nil || s.LeadingC() != 50264 || s.LDB != 512 {
		t.Errorf("with LDC: %+v, %v", s, err)
	}
	for _, bad := range []string{"3x5", "3x5x0", "-1x5x7", "3x5x7:XY", "3x5x7x9", "3x5x7 ", "axbxc", "3x5x7:NN:4", "3x5x7:NN:8:1", "3x5x7:NN:x"} {
		if _, err := ParseGemmShape(bad, BF16); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestSimGemmAlgos: the candidate algorithms of a GEMM are timed and agree
// with the first (on the simulator, which lists one; on a GPU every one the
// heuristic lists must give rank 0's product up to fp32 summation order).
func TestSimGemmAlgos(t *testing.T) {
	parityDevice(t)
	for _, dt := range []DType{BF16, F32} {
		be := gpuBackend(t, ir.FP32)
		for _, spec := range []string{"96x80x72:NT", "65x33x130:TN"} {
			s, err := ParseGemmShape(spec, dt)
			if err != nil {
				t.Fatal(err)
			}
			ts, err := be.TimeGemmAlgos(s, dt, 6, 3)
			if err != nil {
				t.Fatal(err)
			}
			if len(ts) == 0 || len(ts) > 6 {
				t.Fatalf("%s: %d algorithms", spec, len(ts))
			}
			for i, a := range ts {
				if a.Rank != i || !(a.Seconds > 0) {
					t.Errorf("%s: entry %d is %+v", spec, i, a)
				}
				if a.MaxDiff > 1e-4 {
					t.Errorf("%s: algorithm %d differs from the first by %.3g (relative)", spec, a.Rank, a.MaxDiff)
				}
			}
			t.Logf("%s (dtype %d): %d algorithms", spec, dt, len(ts))
		}
	}
}

// TestGemmAlgosNeedsAGPU: on the dry-run device timing is refused with an
// error that says why.
func TestGemmAlgosNeedsAGPU(t *testing.T) {
	be := newBackend(mustFake(t), ir.FP32, CandidateOptions())
	if _, err := be.TimeGemmAlgos(GemmShape{M: 2, N: 2, K: 2}, F32, 1, 1); err == nil || !strings.Contains(err.Error(), "needs a GPU") {
		t.Errorf("dry-run device: %v", err)
	}
}
