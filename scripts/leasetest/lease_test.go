// Package leasetest tests scripts/gpu-lease.sh through its dry mode.
package leasetest

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// lease runs `gpu-lease.sh --dry` (fakes for the GPU commands, sleeping
// sleep seconds each) with a budget of budget seconds and the extra
// environment env; it returns OUT, the commands in the order they ran, the
// parsed lease.json and the exit error.
func lease(t *testing.T, budget, sleep string, env ...string) (string, []string, map[string]any, error) {
	t.Helper()
	for _, tool := range []string{"bash", "python3", "timeout", "awk"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not on PATH: %v", tool, err)
		}
	}
	dir := t.TempDir()
	out, trace := filepath.Join(dir, "out"), filepath.Join(dir, "trace")
	cmd := exec.Command("bash", "../gpu-lease.sh", "--dry", out)
	cmd.Env = append(os.Environ(), "RPAC_LEASE_SECONDS="+budget, "RPAC_LEASE_FAKE_SLEEP="+sleep, "RPAC_LEASE_FAKE_TRACE="+trace)
	cmd.Env = append(cmd.Env, env...)
	log, runErr := cmd.CombinedOutput()
	t.Logf("gpu-lease.sh --dry:\n%s", log)
	tr, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	js, err := os.ReadFile(filepath.Join(out, "lease.json"))
	if err != nil {
		t.Fatalf("no lease.json: %v", err)
	}
	var rep map[string]any
	if err := json.Unmarshal(js, &rep); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, out)
	return out, strings.Split(strings.TrimSpace(string(tr)), "\n"), rep, runErr
}

// checkFiles: OUT holds at most 8 files, none deeper than two folders, each
// named as the device tool returns them.
func checkFiles(t *testing.T, out string) {
	t.Helper()
	var files []string
	name := regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
	filepath.WalkDir(out, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(out, p)
		if rel != "." && !name.MatchString(d.Name()) {
			t.Errorf("%s: a name the device tool does not return", rel)
		}
		if !d.IsDir() {
			files = append(files, rel)
			if strings.Count(rel, string(filepath.Separator)) > 2 {
				t.Errorf("%s: more than two folders down", rel)
			}
		}
		return nil
	})
	if len(files) > 8 || len(files) == 0 {
		t.Errorf("OUT holds %d files %v: the device tool returns at most 8", len(files), files)
	}
}

// stageOf names the lease stage a traced command belongs to.
func stageOf(cmd string) string {
	switch {
	case strings.HasPrefix(cmd, "cuda.test"), strings.HasPrefix(cmd, "training.test"):
		return "smoke"
	case strings.Contains(cmd, "torch"):
		return "torch"
	case strings.Contains(cmd, "--measure"):
		return "measure"
	default:
		return "steps"
	}
}

// TestLeaseDryRun: with time enough the lease runs smoke, steps, torch and
// measure in that order (each setting at T = 384 and 768), writes at most 8
// files and its summary's first lines carry the figures.
func TestLeaseDryRun(t *testing.T) {
	out, cmds, rep, err := lease(t, "330", "0")
	if err != nil {
		t.Fatalf("dry run failed: %v", err)
	}
	var order []string
	for _, c := range cmds {
		if s := stageOf(c); len(order) == 0 || order[len(order)-1] != s {
			order = append(order, s)
		}
	}
	if got := strings.Join(order, " "); got != "smoke steps torch measure" {
		t.Errorf("stages ran as %q; want smoke steps torch measure", got)
	}
	if n := len(rep["steps"].([]any)); n != 5 {
		t.Errorf("%d steps measured; want 5 (T 384 and 768, default and candidate; routed at 384)", n)
	}
	sum, _ := os.ReadFile(filepath.Join(out, "summary.md"))
	head := strings.Join(strings.SplitN(string(sum), "\n", 14)[:13], "\n")
	for _, want := range []string{"| 384 | default | 114.0 | 215,578 | 11.5% | 8.2% |", "| 768 | candidate |", "| 384 | routed |", "rpac/torch: default/eager", "torch.compile 90,000", "predicted/measured (h200, T = 384): default"} {
		if !strings.Contains(head, want) {
			t.Errorf("summary's first lines lack %q:\n%s", want, head)
		}
	}
}

// TestLeaseDryRunBudget: a budget that runs out stops the lease before its
// last stage, which the summary reports as not run; a failing command makes
// the lease fail.
func TestLeaseDryRunBudget(t *testing.T) {
	_, cmds, rep, err := lease(t, "24", "2")
	if err != nil {
		t.Fatalf("dry run failed: %v", err)
	}
	for _, c := range cmds {
		if stageOf(c) == "measure" {
			t.Errorf("measure ran on a spent budget: %s", c)
		}
	}
	if nr, _ := rep["not_run"].([]any); len(nr) == 0 {
		t.Errorf("nothing reported as not run: %v", rep["not_run"])
	}
	if _, _, _, err := lease(t, "330", "0", "RPAC_LEASE_FAKE_FAIL=--cuda-candidate"); err == nil {
		t.Error("the lease passed with a failing step")
	}
}
