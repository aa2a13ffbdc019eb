package training

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/training/dist"
	"github.com/rpac-dev/rpac/training/metrics"
)

// TestRunDirLock: a second run on a directory another process is writing
// fails at once with ErrRunLocked, naming the holder's pid; the lock is
// released when the first run ends.
func TestRunDirLock(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	// another writer of the directory: rank 0 of a data-parallel job
	held, err := lockRunDir(dir, dist.Env{Launcher: dist.Slurm, World: 4, Job: "77"})
	if err != nil {
		t.Fatal(err)
	}
	o := microOptions(dir)
	_, err = Train(ctx, o)
	if !errors.Is(err, ErrRunLocked) || !strings.Contains(err.Error(), fmt.Sprintf("slurm job 77 of 4 ranks (its rank 0: process %d on host", os.Getpid())) {
		t.Fatalf("second writer: got %v, want ErrRunLocked naming the job and pid %d", err, os.Getpid())
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoint")); !os.IsNotExist(err) {
		t.Fatalf("the refused run wrote a checkpoint (%v)", err)
	}
	held.unlock()

	o.StopAfter = 3
	if _, err := Train(ctx, o); err != nil {
		t.Fatalf("after the lock was released: %v", err)
	}
	o = microOptions(dir)
	o.Resume = true
	if _, err := Train(ctx, o); err != nil {
		t.Fatalf("resume after the first run ended: %v", err)
	}
	// A run directory created by the run itself is locked as well.
	fresh := filepath.Join(t.TempDir(), "new")
	o = microOptions(fresh)
	o.Steps = 1
	r, err := newRun(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	if _, err := lockRunDir(fresh, dist.Env{}); !errors.Is(err, ErrRunLocked) {
		t.Fatalf("a new run directory is not locked while the run is open: %v", err)
	}
}

// TestMetricsAfterKillBeforeFirstCheckpoint: metrics.jsonl left by a run
// killed before its first checkpoint is started afresh by the next run, so
// no step appears twice.
func TestMetricsAfterKillBeforeFirstCheckpoint(t *testing.T) {
	dir := t.TempDir()
	stale := `{"kind":"event","time":1,"event":"start"}` + "\n" +
		`{"step":1,"time":2,"loss":9}` + "\n" + `{"step":2,"time":3,"loss":8}` + "\n" + `{"step":3,"ti`
	if err := os.WriteFile(filepath.Join(dir, "metrics.jsonl"), []byte(stale), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Train(context.Background(), microOptions(dir)); err != nil {
		t.Fatal(err)
	}
	recs, err := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	steps := map[string]int{}
	starts := 0
	for _, r := range recs {
		if r.Kind() == metrics.KindStart {
			starts++
		}
		if r.Step > 0 {
			kind := "train"
			if r.Kind() == metrics.KindEval {
				kind = "eval"
			}
			steps[fmt.Sprintf("%s %v", kind, r.Step)]++
		}
	}
	for k, n := range steps {
		if n > 1 {
			t.Errorf("%s appears %d times", k, n)
		}
	}
	if starts != 1 || steps["train 1"] != 1 || steps["train 6"] != 1 {
		t.Fatalf("%d start events, steps %v; want one start and steps 1..6 once", starts, steps)
	}
}

// TestResumeFinishedRun: resuming a run that has reached its last step
// trains nothing and reports the run's last evaluation, not 0.
func TestResumeFinishedRun(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	first, err := Train(ctx, microOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	o := microOptions(dir)
	o.Resume = true
	res, err := Train(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Ran != 0 || res.Steps != 6 {
		t.Fatalf("resumed finished run: ran %d steps to step %d, want 0 to 6", res.Ran, res.Steps)
	}
	if res.FinalValCE != first.FinalValCE || math.IsNaN(res.FinalValCE) || res.FinalValCE == 0 {
		t.Fatalf("resumed finished run reports eval CE %v, the run's last evaluation was %v", res.FinalValCE, first.FinalValCE)
	}
}
