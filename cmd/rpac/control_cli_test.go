package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestControlFlagErrors: bad values of the controller, context-game, SWA and
// ablation flags are clear errors, never panics.
func TestControlFlagErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown controller", []string{"train", "--dataset", "synthetic", "--controller", "pid"}, "controller"},
		{"bad contexts", []string{"train", "--dataset", "synthetic", "--contexts", "64,abc"}, "--contexts"},
		{"repeated context", []string{"train", "--dataset", "synthetic", "--contexts", "64,64"}, "twice"},
		{"bad swa zone", []string{"train", "--dataset", "synthetic", "--swa", "--swa-zone", "7,6"}, "--swa-zone"},
		{"negative game-every", []string{"train", "--dataset", "synthetic", "--game-every", "-1"}, "game-every"},
		{"ablate unknown stage", []string{"ablate", "--dataset", "synthetic", "--stages", "nope", "--steps", "1"}, "unknown stage"},
		{"ablate no seeds", []string{"ablate", "--dataset", "synthetic", "--seeds", "0"}, "seeds"},
		{"ablate bad loss", []string{"ablate", "--dataset", "synthetic", "--loss", "some", "--steps", "1"}, "loss"},
		{"ablate bad eval lengths", []string{"ablate", "--dataset", "synthetic", "--eval-lengths", "64,x", "--steps", "1"}, "--eval-lengths"},
		{"ablate negative warm-in", []string{"ablate", "--dataset", "synthetic", "--warm-in", "-3", "--steps", "1"}, "--warm-in"},
		{"ablate negative eval tokens", []string{"ablate", "--dataset", "synthetic", "--eval-lengths", "64", "--eval-lengths-tokens", "-2"}, "--eval-lengths-tokens"},
		{"ablate size flags reach the model", []string{"ablate", "--dataset", "synthetic", "--heads", "3", "--steps", "1"}, "not divisible by heads 3"},
		{"ablate config reaches the model", []string{"ablate", "--dataset", "synthetic", "--config", "/nonexistent/cfg.json", "--steps", "1"}, "cfg.json does not exist"},
		{"bench train size flags reach the model", []string{"bench", "train", "--preset", "mqar", "--heads", "3"}, "not divisible by heads 3"},
		{"gemm-algos on the cpu", []string{"bench", "gemm-algos", "--device", "cpu", "--shapes", "8x8x8"}, "cuda or cuda-sim"},
		{"gemm-algos bad shape", []string{"bench", "gemm-algos", "--shapes", "8x8x8,8x8"}, "GEMM shape \"8x8\""},
		{"gemm-algos bad transposes", []string{"bench", "gemm-algos", "--shapes", "8x8x8:NX"}, "NN, NT, TN, TT"},
		{"gemm-algos no algorithms", []string{"bench", "gemm-algos", "--shapes", "8x8x8", "--algos", "0"}, "--algos"},
		{"plot without run", []string{"plot"}, "run directory"},
		{"plot of a non-run", []string{"plot", "/nonexistent/run"}, "metrics.jsonl"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if args[0] == "train" || args[0] == "ablate" {
				args = append(args, "--out", filepath.Join(t.TempDir(), "run"))
			}
			got, code := rpac(t, args...)
			if code == 0 || !strings.Contains(got, tc.want) || strings.Contains(got, "panic") {
				t.Fatalf("exit %d, output:\n%s\nwant an error mentioning %q", code, got, tc.want)
			}
		})
	}
}

// TestTrainAllThenPlot: a short synthetic run with every component on,
// then rpac plot writes the PNGs.
func TestTrainAllThenPlot(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a model")
	}
	run := filepath.Join(t.TempDir(), "run")
	out, code := rpac(t, "train", "--dataset", "synthetic", "--preset", "tiny", "--context", "32", "--tokens-per-step", "64",
		"--steps", "4", "--eval-every", "2", "--eval-batches", "1", "--warm-in", "1", "--all", "--out", run)
	if code != 0 {
		t.Fatalf("train: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, "EMA") || !strings.Contains(out, "parameters") {
		t.Errorf("summary lacks EMA or parameters:\n%s", out)
	}
	out, code = rpac(t, "plot", run)
	if code != 0 {
		t.Fatalf("plot: exit %d\n%s", code, out)
	}
	for _, f := range []string{"val_ce.png", "tau_att.png", "mu_entropy.png", "q_context.png", "expert_usage.png", "bias_heatmaps.png"} {
		if st, err := os.Stat(filepath.Join(run, "plots", f)); err != nil || st.Size() < 1000 {
			t.Errorf("%s: %v", f, err)
		}
	}
}
