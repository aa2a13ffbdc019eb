package plot

import (
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"

	"gonum.org/v1/plot/plotter"

	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/rpac-dev/rpac/training/data"
	"github.com/rpac-dev/rpac/training/metrics"
)

func TestRateOfChange(t *testing.T) {
	xy := plotter.XYs{{X: 0, Y: 10}, {X: 100, Y: 9}, {X: 200, Y: 8.5}, {X: 200, Y: 1}}
	r := RateOfChange(xy, 1) // alpha 1: no smoothing
	if len(r) != 2 || r[0].X != 100 || r[0].Y != -10 || r[1].Y != -5 {
		t.Fatalf("rate %v, want slopes -10 and -5 per 1000 steps (the repeated x skipped)", r)
	}
	s := RateOfChange(xy, 0.5)
	if s[1].Y != 0.5*-5+0.5*-10 {
		t.Fatalf("smoothed rate %v", s)
	}
}

// TestRunWritesPNGs draws a hand-written run: every figure appears and is a
// valid PNG; a run without Guardian or context game skips those figures.
func TestRunWritesPNGs(t *testing.T) {
	dir := t.TempDir()
	w, err := metrics.Open(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for s := 1; s <= 20; s++ {
		_ = w.Write(&metrics.Record{Step: s, TrainCE: metrics.N(8 - 0.1*float64(s)), LR: metrics.N(1e-3), MuEntropy: metrics.N(1.2), SatFrac: metrics.N(0.1),
			Context: []int{64, 128}[s%2], Chaos: metrics.N(0.9), BiasScale: metrics.N(0.5)})
		if s%5 == 0 {
			_ = w.WriteEval(&metrics.Record{Step: s, ValCE: metrics.N(8 - 0.05*float64(s)), ValCEEMA: metrics.N(8.1 - 0.05*float64(s)),
				TauAtt: []float64{0.68, 0.7}, MuEntropy: metrics.N(1.2), MuEntropyLayers: []float64{1.1, 1.3},
				SatFracLayers: []float64{0.1, 0.2}, ExpertUsage: [][]float64{{0.25, 0.25, 0.3, 0.2}, {0.4, 0.1, 0.3, 0.2}},
				Contexts: []int{64, 128}, QContext: []float64{0.4, 0.6}, GuardianReward: metrics.N(-7.0),
				GuardianAction: []float64{0.1, -0.2, 0.3}, LambdaSat: metrics.N(0.01), SWAJoin: new(s >= 15), ValCESWA: metrics.N(7.2)})
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	T := 8
	b := make([]float32, T*T)
	for i := range b {
		b[i] = float32(math.Sin(float64(i)))
	}
	if err := os.MkdirAll(filepath.Join(dir, "bias"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"early", "late"} {
		ts := []checkpoint.Named{{Name: "blocks.0", Shape: []int{T, T}, Data: b}, {Name: "blocks.1", Shape: []int{T, T}, Data: b}}
		if err := checkpoint.SaveWeightsFile(filepath.Join(dir, "bias", n+".safetensors"), ts, map[string]string{"step": "5"}); err != nil {
			t.Fatal(err)
		}
	}
	files, err := Run(dir, filepath.Join(dir, "plots"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 8 {
		t.Fatalf("wrote %v, want 8 figures", files)
	}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(fh)
		fh.Close()
		if err != nil || img.Bounds().Dx() < 300 {
			t.Fatalf("%s: %v", f, err)
		}
	}
	if _, err := Run(t.TempDir(), t.TempDir()); err == nil {
		t.Error("a directory without metrics.jsonl should be an error")
	}
}

// TestRecall: a run whose evaluations scored recall gets recall.png; the
// comparison of two runs is one PNG; byDistance places each bucket that
// held answers at its geometric middle; a run without recall is refused.
func TestRecall(t *testing.T) {
	dir := t.TempDir()
	w, err := metrics.Open(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	dist := func(c int) *data.RecallBreakdown {
		return &data.RecallBreakdown{ByDist: []data.RecallBucket{{Lo: 1, Hi: 4, Correct: c, Total: 10}, {Lo: 4, Hi: 16, Correct: 5, Total: 10},
			{Lo: 16, Hi: 64, Correct: 0, Total: 0}}}
	}
	for s := 1; s <= 4; s++ {
		_ = w.WriteEval(&metrics.Record{Step: 100 * s, ValCE: metrics.N(2.0), RecallAcc: metrics.N(0.2 * float64(s)), RecallBreakdown: dist(2 * s)})
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	files, err := Run(dir, filepath.Join(dir, "plots"))
	if err != nil || len(files) != 2 || filepath.Base(files[1]) != "recall.png" {
		t.Fatalf("wrote %v (%v), want val_ce.png and recall.png", files, err)
	}
	r, err := ReadRecallRun(dir, "a")
	if err != nil || len(r.Evals) != 4 {
		t.Fatalf("read %d evaluations (%v), want 4", len(r.Evals), err)
	}
	xy := byDistance(&r.Evals[3])
	if len(xy) != 2 || xy[0].X != 2 || xy[0].Y != 0.8 || xy[1].X != 8 || xy[1].Y != 0.5 {
		t.Fatalf("by distance %v, want (2, 0.8) and (8, 0.5)", xy)
	}
	out := filepath.Join(dir, "cmp.png")
	if err := Recall(out, []RecallRun{r, {Label: "b", Evals: r.Evals[:2]}}); err != nil {
		t.Fatal(err)
	}
	if fh, err := os.Open(out); err != nil {
		t.Fatal(err)
	} else if _, err := png.Decode(fh); err != nil {
		t.Fatal(err)
	} else {
		fh.Close()
	}
	// Without distance buckets (the synthetic corpus) only the steps panel.
	plain := RecallRun{Label: "syn", Evals: []metrics.Record{{Step: 1, RecallAcc: metrics.N(0.5)}, {Step: 2, RecallAcc: metrics.N(0.6)}}}
	if err := Recall(filepath.Join(dir, "syn.png"), []RecallRun{plain}); err != nil {
		t.Fatalf("recall without distances: %v", err)
	}
	if _, err := ReadRecallRun(t.TempDir(), "x"); err == nil {
		t.Error("a directory without metrics.jsonl should be an error")
	}
}
