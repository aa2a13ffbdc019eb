package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestTrainAnySize: size flags build any model and report its parameter
// count; a bad combination fails with every problem named and writes
// nothing; --config files apply under the flags.
func TestTrainAnySize(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	got, code := rpac(t, "train", "--dataset", "synthetic", "--d-model", "96", "--layers", "3", "--heads", "3", "--steps", "5",
		"--eval-batches", "1", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, got)
	}
	if !regexp.MustCompile(`d_model=96 layers=3 heads=3 .*, \d+ parameters`).MatchString(got) || !strings.Contains(got, "trained 5 steps") {
		t.Fatalf("no model summary with its parameter count:\n%s", got)
	}

	cfgFile := filepath.Join(t.TempDir(), "model.json")
	os.WriteFile(cfgFile, []byte(`{"d_model": 64, "heads": 4, "layers": 1, "dmodel": 3}`), 0o644)
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"indivisible heads", []string{"--d-model", "100", "--heads", "3"}, []string{"d_model 100 is not divisible by heads 3"}},
		{"several problems", []string{"--d-model", "100", "--heads", "3", "--top-k", "5"}, []string{"not divisible", "top_k 5"}},
		{"unknown config field", []string{"--config", cfgFile}, []string{"dmodel", "d_model"}},
		{"missing config", []string{"--config", filepath.Join(t.TempDir(), "none.json")}, []string{"none.json"}},
		{"bad micro-batch", []string{"--micro-batch", "zero"}, []string{"--micro-batch"}},
		{"bad budget", []string{"--mem-budget", "lots"}, []string{"--mem-budget"}},
		{"budget too small", []string{"--mem-budget", "1MiB"}, []string{"does not fit the memory budget", "one sequence"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "run")
			got, code := rpac(t, append([]string{"train", "--dataset", "synthetic", "--steps", "2", "--out", out}, tc.args...)...)
			if code == 0 {
				t.Fatalf("exit 0:\n%s", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Fatalf("message does not mention %q:\n%s", w, got)
				}
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Fatalf("a refused run wrote %s", out)
			}
		})
	}
}

// TestTrainStepsZero: --steps 0 writes the initialised checkpoint, which
// exports.
func TestTrainStepsZero(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	got, code := rpac(t, "train", "--dataset", "synthetic", "--d-model", "32", "--layers", "1", "--heads", "2", "--steps", "0", "--out", out)
	if code != 0 || !strings.Contains(got, "initial checkpoint") {
		t.Fatalf("exit %d:\n%s", code, got)
	}
	if _, err := os.Stat(filepath.Join(out, "checkpoint", "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	if got, code := rpac(t, "inspect", filepath.Join(out, "checkpoint")); code != 0 || !strings.Contains(got, "step 0") {
		t.Fatalf("inspect: exit %d:\n%s", code, got)
	}
}

// TestExportUsesRunData: after training with --data-dir, export --verify
// and then eval of the export find the data through the run, with no
// --data-dir, no $RPAC_DATA and an empty cache (no download).
func TestExportUsesRunData(t *testing.T) {
	env := []string{"ORT_LIB=" + ortLib(t)}
	dir := wikiText(t)
	run := filepath.Join(t.TempDir(), "run")
	got, code := rpac(t, "train", "--dataset", "wikitext2", "--data-dir", dir, "--train-split", "test", "--eval-split", "valid",
		"--d-model", "16", "--layers", "1", "--heads", "2", "--context", "64", "--tokens-per-step", "128", "--steps", "1",
		"--eval-batches", "1", "--out", run)
	if code != 0 {
		t.Fatalf("train: exit %d:\n%s", code, got)
	}
	exp := filepath.Join(t.TempDir(), "e")
	got, code = rpacEnv(t, env, "export", "--run", run, "--lengths", "64,128", "--verify", "--verify-batches", "1",
		"--calib-batches", "1", "--out", exp)
	if code != 0 || !strings.Contains(got, "verify on valid") || strings.Contains(got, "download") {
		t.Fatalf("export: exit %d:\n%s", code, got)
	}
	got, code = rpacEnv(t, env, "eval", "--model", exp, "--max-chunks", "2")
	if code != 0 || !strings.Contains(got, "wikitext2 valid") || strings.Contains(got, "download") {
		t.Fatalf("eval: exit %d:\n%s", code, got)
	}
}

// wikiText finds the WikiText-2 raw files ($RPAC_DATA or the shared copy).
func wikiText(t *testing.T) string {
	t.Helper()
	for _, dir := range []string{os.Getenv("RPAC_DATA"), filepath.Join("..", "..", "..", "shared", "data", "wikitext-2-raw-v1")} {
		if dir == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "wiki.valid.raw")); err == nil {
			abs, _ := filepath.Abs(dir)
			return abs
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("CI=true and the WikiText-2 files are missing (set RPAC_DATA)")
	}
	t.Skip("WikiText-2 files not found; set RPAC_DATA")
	return ""
}

// TestInspectRefusesBrokenCheckpoint: inspect lists what a damaged
// checkpoint holds but exits non-zero, with the reason.
func TestInspectRefusesBrokenCheckpoint(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	if got, code := rpac(t, "train", "--dataset", "synthetic", "--d-model", "32", "--layers", "1", "--heads", "2", "--steps", "0", "--out", out); code != 0 {
		t.Fatalf("train: exit %d:\n%s", code, got)
	}
	state := filepath.Join(out, "checkpoint", "state.json")
	b, _ := os.ReadFile(state)
	os.WriteFile(state, append(b, ' '), 0o644)
	got, code := rpac(t, "inspect", filepath.Join(out, "checkpoint"))
	if code == 0 || !strings.Contains(got, "blocks.0.attn.Wq.weight") || !strings.Contains(got, "state.json") {
		t.Fatalf("inspect of a damaged checkpoint: exit %d:\n%q", code, got)
	}
}

// TestTrainRunDirLocked: a second `rpac train` on the --out of a running one
// fails at once, naming the first process; once that one is done, resuming
// the finished run trains nothing and says so (no "eval CE 0.0000").
func TestTrainRunDirLocked(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	args := []string{"train", "--dataset", "synthetic", "--d-model", "32", "--layers", "1", "--heads", "2", "--context", "32",
		"--tokens-per-step", "128", "--eval-every", "2", "--eval-batches", "1", "--seed", "3", "--out", out}
	first := exec.Command(bin, append(args, "--steps", "100000")...)
	first.Env = append(os.Environ(), "RPAC_DATA=", "XDG_CACHE_HOME="+t.TempDir())
	var firstOut bytes.Buffer
	first.Stdout, first.Stderr = &firstOut, &firstOut
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		first.Process.Kill()
		first.Wait()
	}()
	lock := filepath.Join(out, "train.lock")
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(lock); err == nil && bytes.Contains(b, []byte(`"pid"`)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first run never locked %s:\n%s", out, firstOut.String())
		}
	}
	for _, extra := range [][]string{{"--steps", "4"}, {"--steps", "4", "--resume"}} {
		got, code := rpac(t, append(args, extra...)...)
		want := fmt.Sprintf("process %d on host", first.Process.Pid)
		if code == 0 || !strings.Contains(got, want) || !strings.Contains(got, "in use") {
			t.Fatalf("second run %v: exit %d, want a refusal naming %q:\n%s", extra, code, want, got)
		}
	}
	first.Process.Kill()
	first.Wait()

	// The lock died with its process: the directory is free again.
	os.RemoveAll(out)
	if got, code := rpac(t, append(args, "--steps", "4")...); code != 0 {
		t.Fatalf("exit %d:\n%s", code, got)
	}
	got, code := rpac(t, append(args, "--steps", "4", "--resume")...)
	if code != 0 || !strings.Contains(got, "already finished at step 4") || strings.Contains(got, "0.0000") || !regexp.MustCompile(`last eval CE \d+\.\d{4}`).MatchString(got) {
		t.Fatalf("resuming a finished run: exit %d:\n%s", code, got)
	}
}
