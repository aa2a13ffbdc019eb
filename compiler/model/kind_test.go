package model_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
)

// TestKindSpelling: --model and config.json spell the kinds "fuzzy" and
// "baseline"; other names are refused with the valid ones, and a config
// without a model reads as unset (which Validate refuses).
func TestKindSpelling(t *testing.T) {
	for s, want := range map[string]model.Kind{"fuzzy": model.Fuzzy, "baseline": model.Baseline} {
		if k, err := model.ParseKind(s); err != nil || k != want || k.String() != s {
			t.Errorf("ParseKind(%q) = %v, %v", s, k, err)
		}
	}
	for _, bad := range []string{"", "moe", "Fuzzy"} {
		if _, err := model.ParseKind(bad); err == nil || !strings.Contains(err.Error(), "want fuzzy or baseline") {
			t.Errorf("ParseKind(%q): %v", bad, err)
		}
	}
	var c model.Config
	if err := json.Unmarshal([]byte(`{"model":"baseline"}`), &c); err != nil || c.Model != model.Baseline {
		t.Fatalf("config model %v, %v", c.Model, err)
	}
	if b, _ := json.Marshal(c); !strings.Contains(string(b), `"model":"baseline"`) {
		t.Errorf("config written as %s", b)
	}
	c = model.Config{}
	if err := json.Unmarshal([]byte(`{"vocab":3}`), &c); err != nil || c.Model != model.KindUnset {
		t.Errorf("config without a model: %v, %v", c.Model, err)
	}
}
