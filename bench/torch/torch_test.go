package torch

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/training/checkpoint"
)

// torchPython is a python3 that imports torch (Debian's python3-torch is
// /usr/bin/python3's), or the test skips; under CI=true it fails.
func torchPython(t *testing.T) string {
	t.Helper()
	var tried []string
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		path, err := exec.LookPath(py)
		if err != nil {
			continue
		}
		if exec.Command(path, "-c", "import torch").Run() == nil {
			return path
		}
		tried = append(tried, path)
	}
	msg := "no python3 with torch (apt-get install python3-torch); tried " + strings.Join(tried, ", ")
	if os.Getenv("CI") == "true" {
		t.Fatal("CI=true and " + msg)
	}
	t.Skip(msg)
	return ""
}

// torchResult is the part of rpac_torch.py's JSON line the tests read.
type torchResult struct {
	Torch       string         `json:"torch"`
	RPACLoss    float64        `json:"rpac_loss"`
	LossDense   float64        `json:"loss_dense"`
	LossRouted  float64        `json:"loss_routed"`
	DiffDense   float64        `json:"diff_dense"`
	DiffRouted  float64        `json:"diff_routed"`
	LossOK      bool           `json:"loss_ok"`
	Eager       map[string]any `json:"eager"`
	EagerRouted map[string]any `json:"eager_routed"`
	Compile     map[string]any `json:"compile"`
}

// sharpened is a store of cfg's model whose seeded weights are moved from
// their initial values, so that the loss depends on each part of the model:
// the token embeddings (the tied head) 25 times as large, every scalar
// parameter (τ_att, pos_β, κ) and bias shifted, the gate and membership
// weights 4 times as large.
func sharpened(t *testing.T, cfg *model.Config, b Batch) *kernels.Store {
	t.Helper()
	mg, err := model.Build(cfg, model.Opts{T: b.T, B: b.B, Mode: model.Eval, BatchStats: true})
	if err != nil {
		t.Fatal(err)
	}
	store := kernels.NewStore(ir.FP32)
	if err := model.InitStore(mg.Specs, store, 11); err != nil {
		t.Fatal(err)
	}
	for _, s := range mg.Specs {
		x := store.Get(s.Name).F32
		switch {
		case s.Name == "tok_emb.weight":
			scaleAll(x, 25, 0)
		case len(s.Shape) == 0 && s.Param, strings.HasSuffix(s.Name, ".bias"):
			scaleAll(x, 1, 0.3)
		case strings.Contains(s.Name, ".gate.") || strings.Contains(s.Name, ".mem.") || strings.Contains(s.Name, "res_gate"):
			scaleAll(x, 4, 0)
		}
	}
	return store
}

func scaleAll(x []float32, a, b float32) {
	for i := range x {
		x[i] = a*x[i] + b
	}
}

// runTorch exports cfg's model (sharpened weights) and a fixed batch, runs
// rpac_torch.py on it and returns its result.
func runTorch(t *testing.T, py string, cfg model.Config, b Batch, timing bool) (Result, torchResult) {
	t.Helper()
	dir := t.TempDir()
	res, err := Export(dir, "tiny", &cfg, sharpened(t, &cfg, b), b, 11)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"rpac_torch.py", dir, "--device", "cpu", "--threads", "2", "--out", filepath.Join(dir, "torch.json")}
	if timing {
		args = append(args, "--context", "32", "--tokens-per-step", "64", "--steps", "1", "--warmup", "1")
	} else {
		args = append(args, "--no-timing")
	}
	cmd := exec.Command(py, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("rpac_torch.py: %v\n%s", err, out)
	}
	js, err := os.ReadFile(filepath.Join(dir, "torch.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tr torchResult
	if err := json.Unmarshal(js, &tr); err != nil {
		t.Fatalf("%v: %s", err, js)
	}
	if strings.Contains(string(out), "torch.compile skipped") != (tr.Compile["skipped"] != nil) {
		t.Errorf("the script must say when it skips torch.compile: output %q, compile %v", out, tr.Compile)
	}
	return res, tr
}

// TestTorchMatchesRPAC: the PyTorch implementation (dense and routed
// experts) computes rpac's loss on a fixed batch from rpac's checkpoint, at
// the tiny preset with the paper's RPA prior, with the legacy bias, and for
// the baseline, each to lossRel of the loss (float32 on both sides; the
// lease compares to 1e-3).
// lossRel bounds the two losses' difference relative to the loss: about 16
// float32 ulps, room for the summation orders of other CPUs' kernels
// (OpenBLAS's and PyTorch's pick per CPU), while a wrong part of the model
// moves the loss by orders of magnitude more (TestTorchDetectsDifference).
const lossRel = 1e-6

func TestTorchMatchesRPAC(t *testing.T) {
	py := torchPython(t)
	tiny, err := model.LookupPreset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	legacy := tiny.Config
	legacy.UseRPA = false
	baseline := tiny.Config
	baseline.Model = model.Baseline
	for _, c := range []struct {
		name string
		cfg  model.Config
	}{{"rpa", tiny.Config}, {"legacy", legacy}, {"baseline", baseline}} {
		t.Run(c.name, func(t *testing.T) {
			b := RandomBatch(c.cfg.Vocab, 2, 64, 5)
			res, tr := runTorch(t, py, c.cfg, b, c.name == "rpa")
			if math.Abs(tr.RPACLoss-res.Loss) > 0 {
				t.Fatalf("rpac.json holds %v, Export returned %v", tr.RPACLoss, res.Loss)
			}
			t.Logf("torch %s: rpac %.7f, dense %.7f (|Δ| %.2g), routed %.7f (|Δ| %.2g)",
				tr.Torch, res.Loss, tr.LossDense, tr.DiffDense, tr.LossRouted, tr.DiffRouted)
			limit := lossRel * math.Abs(res.Loss)
			for _, d := range []float64{tr.DiffDense, tr.DiffRouted} {
				if !(d <= limit) {
					t.Errorf("loss differs from rpac's by %g (limit %.2g: %g of the loss)", d, limit, lossRel)
				}
			}
			if !tr.LossOK {
				t.Error("the script did not find the losses within its tolerance")
			}
			if c.name == "rpa" {
				checkTiming(t, tr)
			}
		})
	}
}

// TestTorchDetectsDifference: the comparison fails when the weights differ
// (a checkpoint whose one scalar the script reads has moved), so that it
// can fail at all.
func TestTorchDetectsDifference(t *testing.T) {
	py := torchPython(t)
	tiny, _ := model.LookupPreset("tiny")
	cfg := tiny.Config
	dir := t.TempDir()
	b := RandomBatch(cfg.Vocab, 2, 64, 5)
	store := kernels.NewStore(ir.FP32)
	if _, err := Export(dir, "tiny", &cfg, store, b, 11); err != nil {
		t.Fatal(err)
	}
	ck, err := checkpoint.LoadParts(filepath.Join(dir, CheckpointDir), false)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ck.Weights {
		if ck.Weights[i].Name == "ln_f.bias" {
			for j := range ck.Weights[i].Data {
				ck.Weights[i].Data[j] += 0.05
			}
		}
	}
	if err := checkpoint.Save(filepath.Join(dir, CheckpointDir), ck); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, "rpac_torch.py", dir, "--device", "cpu", "--no-timing", "--tol", "1e-5").CombinedOutput()
	if err == nil {
		t.Fatalf("rpac_torch.py passed on moved weights:\n%s", out)
	}
	if !strings.Contains(string(out), `"loss_ok": false`) {
		t.Fatalf("want a failed comparison, got:\n%s", out)
	}
}

// checkTiming: the timed steps ran (eager, dense and routed), and
// torch.compile ran or said why not (PyTorch 1.13 has none).
func checkTiming(t *testing.T, tr torchResult) {
	t.Helper()
	for name, r := range map[string]map[string]any{"eager": tr.Eager, "eager_routed": tr.EagerRouted} {
		if v, _ := r["tokens_per_s"].(float64); !(v > 0) {
			t.Errorf("%s tokens/s: %v", name, r)
		}
	}
	if v, ok := tr.Compile["tokens_per_s"].(float64); !(ok && v > 0) && tr.Compile["skipped"] == nil {
		t.Errorf("torch.compile neither ran nor said why: %v", tr.Compile)
	}
}
