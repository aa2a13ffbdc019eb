package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rpac-cli")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "rpac")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		panic(string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func rpac(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "RPAC_DATA=", "XDG_CACHE_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// TestBadInput: bad input gets a clear message and a non-zero exit, never a
// panic, and leaves no run directory behind.
func TestBadInput(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown preset", []string{"train", "--preset", "huge", "--dataset", "synthetic"}, "unknown preset"},
		{"non-numeric steps", []string{"train", "--steps", "ten", "--dataset", "synthetic"}, "steps"},
		{"missing data dir", []string{"train", "--data-dir", "/nonexistent/wt2"}, "/nonexistent/wt2"},
		{"negative context", []string{"train", "--context", "-5", "--dataset", "synthetic"}, "--context"},
		{"unknown model", []string{"train", "--model", "rnn", "--dataset", "synthetic"}, `--model "rnn": want fuzzy or baseline`},
		{"bad eval stats", []string{"train", "--eval-stats", "mixed", "--dataset", "synthetic"}, "eval-stats"},
		{"huge context", []string{"train", "--context", "100000", "--dataset", "synthetic"}, "context 100000"},
		{"negative grad clip", []string{"train", "--grad-clip", "-1", "--dataset", "synthetic"}, "--grad-clip"},
		{"NaN grad clip", []string{"train", "--grad-clip", "NaN", "--dataset", "synthetic"}, "--grad-clip"},
		{"negative dropout", []string{"train", "--dropout", "-0.5", "--dataset", "synthetic"}, "--dropout"},
		{"negative warm-in", []string{"train", "--warm-in", "-5", "--dataset", "synthetic"}, "--warm-in"},
		{"zero lr", []string{"train", "--lr", "0", "--dataset", "synthetic"}, "--lr"},
		{"unknown dump pass", []string{"train", "--dump-ir", "foo", "--dataset", "synthetic"}, "--dump-ir"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "run")
			got, code := rpac(t, append(tc.args, "--out", out)...)
			if code == 0 {
				t.Fatalf("exit 0 for %v:\n%s", tc.args, got)
			}
			if strings.Contains(got, "panic") || strings.Contains(got, "goroutine ") {
				t.Fatalf("panicked:\n%s", got)
			}
			if !strings.Contains(got, tc.want) {
				t.Fatalf("message does not mention %q:\n%s", tc.want, got)
			}
			if _, err := os.Stat(filepath.Join(out, "checkpoint")); err == nil {
				t.Fatal("a failed run left a checkpoint")
			}
		})
	}
}

// TestSyntheticNeedsNoFiles: the synthetic corpus trains with no data files.
func TestSyntheticNeedsNoFiles(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	got, code := rpac(t, "train", "--dataset", "synthetic", "--preset", "tiny", "--steps", "3", "--eval-batches", "2", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, got)
	}
	for _, f := range []string{"metrics.jsonl", "checkpoint/model.safetensors", "checkpoint/state.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatalf("missing %s: %v", f, err)
		}
	}
	if !strings.Contains(got, "trained 3 steps") {
		t.Fatalf("unexpected output:\n%s", got)
	}
}
