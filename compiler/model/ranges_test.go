package model

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestConfigRanges: every numeric field of a --config file is held to its
// documented range (docs/FILES.md), so a hostile loop count or size is
// refused by name instead of hanging or exhausting memory.
func TestConfigRanges(t *testing.T) {
	p, _ := LookupPreset("tiny")
	for _, c := range []struct {
		json, want string
	}{
		{`{"sinkhorn_iters": 1000000000}`, "sinkhorn_iters 1000000000"},
		{`{"sinkhorn_iters": 101}`, "sinkhorn_iters 101"},
		{`{"pos_beta": 1e300}`, "pos_beta"},
		{`{"kappa_init": -1e9}`, "kappa_init"},
		{`{"ent_floor_alpha": -1}`, "ent_floor_alpha"},
		{`{"ent_floor_eta": 1e30}`, "ent_floor_eta"},
		{`{"tau_align": 1e300}`, "tau_align"},
		{`{"bias_clip": 1e300}`, "bias_clip"},
		{`{"vocab": 4000000, "d_model": 65536, "heads": 1}`, "parameters"},
		{`{"layers": 1024, "d_model": 8192, "experts": 1024, "ff_mult": 256, "heads": 1}`, "parameters"},
		{`{"max_len": 1000000}`, "max_len 1000000"},
		{`{"layers": 1000000}`, "layers 1000000"},
	} {
		path := filepath.Join(t.TempDir(), "c.json")
		os.WriteFile(path, []byte(c.json), 0o644)
		start := time.Now()
		_, err := Resolve(p.Config, path, Overrides{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error mentioning %q", c.json, err, c.want)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s: refusing took %v", c.json, d)
		}
	}
	// The edges of the ranges are accepted.
	path := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(path, []byte(`{"sinkhorn_iters": 100, "pos_beta": -1000, "kappa_init": 1000, "ent_floor_eta": 0}`), 0o644)
	if _, err := Resolve(p.Config, path, Overrides{}); err != nil {
		t.Fatal(err)
	}
	// A config file is small: a large one is refused unread.
	big := filepath.Join(t.TempDir(), "big.json")
	f, _ := os.Create(big)
	f.Truncate(1 << 30)
	f.Close()
	if _, err := Resolve(p.Config, big, Overrides{}); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("a 1 GiB config file: %v", err)
	}
}
