package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/rpac-dev/rpac/training/metrics"
)

// crashArgs is a small run that checkpoints at every evaluation.
func crashArgs(out string) []string {
	return []string{"train", "--dataset", "synthetic", "--d-model", "32", "--layers", "2", "--heads", "2", "--context", "32",
		"--tokens-per-step", "128", "--steps", "24", "--eval-every", "2", "--eval-batches", "1", "--all", "--contexts", "16,32",
		"--seed", "5", "--out", out}
}

// TestKilledRunsResumeExactly: a run killed with SIGKILL at many moments,
// including inside each stage of a checkpoint save, and resumed each time,
// ends with the same weights, optimizer state and controller state, bit for
// bit, as the run that was never interrupted.
func TestKilledRunsResumeExactly(t *testing.T) {
	if testing.Short() {
		t.Skip("kills real training processes")
	}
	ref := filepath.Join(t.TempDir(), "ref")
	if got, code := rpac(t, crashArgs(ref)...); code != 0 {
		t.Fatalf("unbroken run: exit %d:\n%s", code, got)
	}
	want := checkpointFiles(t, ref)

	run := filepath.Join(t.TempDir(), "run")
	kills := 0
	// Kills inside the save's stages, then at growing delays.
	stages := []string{"wrote model.safetensors", "synced temp", "moved old", "moved new"}
	resumeArgs := func() []string {
		args := crashArgs(run)
		if _, err := os.Stat(filepath.Join(run, "checkpoint")); err == nil {
			args = append(args, "--resume")
		} else if _, err := os.Stat(filepath.Join(run, "checkpoint.prev")); err == nil {
			args = append(args, "--resume")
		}
		return args
	}
	finished := false
	for attempt := 0; attempt < 40; attempt++ {
		args := resumeArgs()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "RPAC_DATA=", "XDG_CACHE_HOME="+t.TempDir())
		if attempt < len(stages) {
			cmd.Env = append(cmd.Env, checkpoint.CrashEnv+"="+stages[attempt])
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		var err error
		if attempt < len(stages) {
			err = <-done // it kills itself inside the save
		} else {
			select {
			case err = <-done:
			case <-time.After(time.Duration(60+45*(attempt-len(stages))) * time.Millisecond):
				cmd.Process.Signal(syscall.SIGKILL)
				err = <-done
			}
		}
		if err == nil {
			if attempt < len(stages) {
				t.Fatalf("the run was meant to die in save stage %q and finished", stages[attempt])
			}
			finished = true
			break
		}
		kills++
	}
	if !finished {
		// On a slow or busy machine every timed kill can land before the
		// end: the last resume runs to completion, so the comparison does
		// not depend on the CPU's speed.
		if got, code := rpac(t, resumeArgs()...); code != 0 {
			t.Fatalf("final resume after %d kills: exit %d:\n%s", kills, code, got)
		}
	}
	if kills < len(stages)+1 {
		t.Fatalf("only %d kills happened; the test did not exercise resuming", kills)
	}
	got := checkpointFiles(t, run)
	for name, w := range want {
		g, ok := got[name]
		if !ok || len(g) != len(w) {
			t.Fatalf("%s: missing or of another size after %d kills", name, kills)
		}
		for i := range w {
			if g[i] != w[i] {
				t.Fatalf("%s[%d]: %v after %d kills and resumes, %v unbroken", name, i, g[i], kills, w[i])
			}
		}
	}
	// metrics.jsonl holds each step once, although the first kill came
	// before the first checkpoint and the later ones after steps that were
	// then trained again.
	recs, err := metrics.ReadJSONL(filepath.Join(run, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range recs {
		var key string
		switch r.Kind() {
		case metrics.KindEval:
			key = fmt.Sprint("eval ", r.Step)
		case metrics.KindStep, metrics.KindSkipped:
			key = fmt.Sprint("step ", r.Step)
		default:
			continue
		}
		if seen[key] {
			t.Fatalf("metrics.jsonl holds %s twice after %d kills", key, kills)
		}
		seen[key] = true
	}
	if !seen["step 24"] || !seen["step 1"] {
		t.Fatalf("metrics.jsonl lacks steps 1 or 24: %v", seen)
	}
	t.Logf("%d kills (%d inside saves), final state identical to the unbroken run", kills, len(stages))
}

// checkpointFiles loads a run's weights and optimizer state by name.
func checkpointFiles(t *testing.T, run string) map[string][]float32 {
	t.Helper()
	ck, err := checkpoint.Load(filepath.Join(run, "checkpoint"))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string][]float32{}
	for _, w := range append(ck.Weights, ck.Optim...) {
		m[w.Name] = w.Data
	}
	return m
}
