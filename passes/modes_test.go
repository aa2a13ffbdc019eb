package passes_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/passes"
)

// TestModeSpelling: the fold modes and attention lowerings parse from the
// flags' spellings, refuse others with the valid values, and keep their
// spelling in JSON (manifests written before the types read back).
func TestModeSpelling(t *testing.T) {
	for s, want := range map[string]passes.FoldMode{"rpa": passes.FoldRPAMode, "rank": passes.FoldRankMode,
		"rank-approx": passes.FoldRankApproxMode, "none": passes.FoldNoneMode} {
		if f, err := passes.ParseFold(s); err != nil || f != want || f.String() != s {
			t.Errorf("ParseFold(%q) = %v, %v", s, f, err)
		}
	}
	for s, want := range map[string]passes.AttentionMode{"op": passes.AttentionOp, "op8": passes.AttentionOpPadded,
		"plain": passes.AttentionPlain, "none": passes.AttentionNone} {
		if a, err := passes.ParseAttention(s); err != nil || a != want || a.String() != s {
			t.Errorf("ParseAttention(%q) = %v, %v", s, a, err)
		}
	}
	if _, err := passes.ParseFold("half"); err == nil || !strings.Contains(err.Error(), `--fold "half": want rpa, rank, rank-approx or none`) {
		t.Errorf("ParseFold(half): %v", err)
	}
	if _, err := passes.ParseAttention("flash"); err == nil || !strings.Contains(err.Error(), `--attention "flash": want op, op8, plain or none`) {
		t.Errorf("ParseAttention(flash): %v", err)
	}
	var rec struct {
		Mode      passes.FoldMode      `json:"mode"`
		Attention passes.AttentionMode `json:"attention"`
	}
	if err := json.Unmarshal([]byte(`{"mode":"rank-approx","attention":"plain"}`), &rec); err != nil ||
		rec.Mode != passes.FoldRankApproxMode || rec.Attention != passes.AttentionPlain {
		t.Fatalf("read %+v, %v", rec, err)
	}
	if b, err := json.Marshal(rec); err != nil || string(b) != `{"mode":"rank-approx","attention":"plain"}` {
		t.Errorf("wrote %s, %v", b, err)
	}
	if err := json.Unmarshal([]byte(`{"mode":"dense"}`), &rec); err == nil {
		t.Error("an unknown fold mode read")
	}
}
