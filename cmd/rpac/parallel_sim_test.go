package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The data-parallel tests run `rpac train --device cuda-sim` jobs of one
// and two ranks (the simulator's NCCL stand-in between the ranks'
// processes) when RPAC_CUDA_SIM=1 (.ci/run's simulator stage).

func needSim(t *testing.T) {
	t.Helper()
	if os.Getenv("RPAC_CUDA_SIM") != "1" {
		t.Skip("a data-parallel job on the CUDA simulator: RPAC_CUDA_SIM=1")
	}
}

// simRun runs rpac with the user's caches (the simulator and its kernel
// cache are built once).
func simRun(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "RPAC_DATA=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("rpac %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// parallelArgs is a small run on the simulator: a global batch of
// tokens/context sequences in micro-batches of one.
func parallelArgs(out string, steps int, extra ...string) []string {
	args := []string{"train", "--device", "cuda-sim", "--precision", "fp32", "--dataset", "synthetic", "--d-model", "32", "--layers", "2",
		"--heads", "2", "--micro-batch", "1", "--steps", strconv.Itoa(steps), "--eval-every", "5", "--eval-batches", "1", "--seed", "3", "--out", out}
	return append(args, extra...)
}

// stepRecords reads the training steps' records of a run's metrics.jsonl.
func stepRecords(t *testing.T, dir string) []map[string]any {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		if _, ok := m["train_ce"]; ok {
			delete(m, "time")
			delete(m, "tok_per_s")
			recs = append(recs, m)
		}
	}
	return recs
}

// compareRuns checks that two runs' step records agree: every field
// equal, the numbers within rel (0: bit for bit).
func compareRuns(t *testing.T, a, b []map[string]any, rel float64) {
	t.Helper()
	if len(a) != len(b) || len(a) == 0 {
		t.Fatalf("%d and %d step records", len(a), len(b))
	}
	for i := range a {
		for k, va := range a[i] {
			vb := b[i][k]
			fa, okA := va.(float64)
			fb, okB := vb.(float64)
			if okA && okB && math.Abs(fa-fb) <= rel*math.Abs(fa) {
				continue
			}
			if fmt.Sprint(va) != fmt.Sprint(vb) {
				t.Errorf("step %v: %s = %v on one rank, %v on two", a[i]["step"], k, va, vb)
			}
		}
	}
}

// TestSimDataParallelEquivalence: a two-rank job and a one-rank run of the
// same global batch give the same losses, gradient norms and evaluations
// over 20 steps: bit for bit when each rank runs one of the batch's two
// micro-batches, and to float rounding with the paper's controllers
// (Guardian, the context game, EMA, SWA-select) and two micro-batches per
// rank, where every decision is the same.
func TestSimDataParallelEquivalence(t *testing.T) {
	needSim(t)
	for _, c := range []struct {
		name  string
		rel   float64
		extra []string
	}{
		{"two micro-batches", 0, []string{"--context", "32", "--tokens-per-step", "64"}},
		{"controllers", 1e-4, []string{"--tokens-per-step", "64", "--all", "--contexts", "16,32"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			one, two := filepath.Join(t.TempDir(), "one"), filepath.Join(t.TempDir(), "two")
			t0 := time.Now()
			simRun(t, parallelArgs(one, 20, c.extra...)...)
			t1 := time.Now()
			out := simRun(t, append(parallelArgs(two, 20, c.extra...), "--nproc-per-node", "2")...)
			t.Logf("one rank %v, two ranks %v", t1.Sub(t0).Round(time.Second), time.Since(t1).Round(time.Second))
			if !strings.Contains(out, "[rank 1] ") {
				t.Errorf("rank 1's output is not in the job's:\n%s", out)
			}
			compareRuns(t, stepRecords(t, one), stepRecords(t, two), c.rel)
			if _, err := os.Stat(filepath.Join(two, "checkpoint")); err != nil {
				t.Errorf("rank 0 wrote no checkpoint: %v", err)
			}
		})
	}
}

// rankPID finds the pid of rank of the job the launcher pid runs.
func rankPID(launcher, rank int) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(launcher) {
			continue
		}
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		for _, kv := range strings.Split(string(env), "\x00") {
			if kv == "RANK="+strconv.Itoa(rank) {
				return pid
			}
		}
	}
	return 0
}

// TestSimDataParallelRankKilled: a rank killed mid-run ends the job within
// the collective timeout with an error naming it (not a hang), and the run
// directory resumes, here on one rank.
func TestSimDataParallelRankKilled(t *testing.T) {
	needSim(t)
	dir := filepath.Join(t.TempDir(), "run")
	args := append(parallelArgs(dir, 400, "--context", "32", "--tokens-per-step", "64"), "--nproc-per-node", "2", "--collective-timeout", "60s")
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "RPAC_DATA=")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for { // until the first checkpoint
		if _, err := os.Stat(filepath.Join(dir, "checkpoint")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("no checkpoint after 5 minutes:\n%s", out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	victim := rankPID(cmd.Process.Pid, 1)
	if victim == 0 {
		cmd.Process.Kill()
		t.Fatal("rank 1's process not found")
	}
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	err := cmd.Wait()
	if err == nil {
		t.Fatalf("the job succeeded with rank 1 killed:\n%s", out.String())
	}
	if d := time.Since(killed); d > 60*time.Second {
		t.Errorf("the job ended %v after the kill", d)
	}
	if !regexp.MustCompile(fmt.Sprintf(`rank 1 \(pid %d\) was killed by signal killed; the job was ended`, victim)).MatchString(out.String()) {
		t.Errorf("the job's error does not name rank 1:\n%s", out.String())
	}
	before := len(stepRecords(t, dir))
	simRun(t, append(parallelArgs(dir, 400, "--context", "32", "--tokens-per-step", "64"), "--resume", "--stop-after", "2")...)
	if after := len(stepRecords(t, dir)); after < 2 || after > before+2 {
		t.Errorf("%d step records before the resume, %d after it (two more steps)", before, after)
	}
}

// TestSimDataParallelMismatchedFlags: ranks launched with other flags (here
// other step counts) fail at the start, both naming the rank and the figure
// that differ, instead of calling collectives of other sizes.
func TestSimDataParallelMismatchedFlags(t *testing.T) {
	needSim(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	dir := filepath.Join(t.TempDir(), "run")
	var cmds [2]*exec.Cmd
	var outs [2]strings.Builder
	for r := range cmds {
		cmd := exec.Command(bin, parallelArgs(dir, 4+r, "--context", "32", "--tokens-per-step", "64")...)
		cmd.Env = append(os.Environ(), "RPAC_DATA=", "WORLD_SIZE=2", "RANK="+strconv.Itoa(r), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port)
		cmd.Stdout, cmd.Stderr = &outs[r], &outs[r]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = cmd
	}
	for r, cmd := range cmds {
		if err := cmd.Wait(); err == nil {
			t.Errorf("rank %d succeeded", r)
		}
		if want := "rank 1 runs another job than rank 0: its number of steps is 5, rank 0's 4"; !strings.Contains(outs[r].String(), want) {
			t.Errorf("rank %d does not say %q:\n%s", r, want, outs[r].String())
		}
	}
}

// TestSimDataParallelOverlap: a two-rank job with --overlap-allreduce (the
// gradients' buckets all-reduced on a second stream as the backward
// finishes them) computes what the job without it computes, bit for bit,
// over 20 steps; and the ranks report the overlapped all-reduce.
func TestSimDataParallelOverlap(t *testing.T) {
	needSim(t)
	plain, overlapped := filepath.Join(t.TempDir(), "plain"), filepath.Join(t.TempDir(), "overlapped")
	args := func(dir string) []string {
		return append(parallelArgs(dir, 20, "--context", "32", "--tokens-per-step", "64"), "--nproc-per-node", "2")
	}
	simRun(t, args(plain)...)
	out := simRun(t, append(args(overlapped), "--overlap-allreduce")...)
	for _, rank := range []string{"rank 0 of 2", "rank 1 of 2"} {
		if !strings.Contains(out, "data-parallel: "+rank) || !strings.Contains(out, "overlapped with the backward") {
			t.Errorf("no overlapped all-reduce reported for %s:\n%s", rank, out)
		}
	}
	compareRuns(t, stepRecords(t, plain), stepRecords(t, overlapped), 0)
}
