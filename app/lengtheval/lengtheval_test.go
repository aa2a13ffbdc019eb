package lengtheval

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/training"
	"github.com/rpac-dev/rpac/training/data"
)

// requireORT skips without onnxruntime, except under CI=true, where a
// missing library fails the test.
func requireORT(t *testing.T) {
	t.Helper()
	if err := runtime.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and %v", err)
		}
		t.Skipf("%v", err)
	}
}

// TestScore: a small fuzzy run trained at T = 32 is scored at 32 (its
// trained length: the folded export in onnxruntime gives the training
// evaluation's CE over the same chunks) and at 64 (calibrated: a finite
// CE over the chunks asked for); the export is removed afterwards.
func TestScore(t *testing.T) {
	requireORT(t)
	dir := t.TempDir()
	p, _ := model.LookupPreset("tiny")
	c := p.Config
	c.DModel, c.Layers, c.Heads, c.MaxLen, c.Dropout = 16, 2, 2, 64, 0
	res, err := training.Train(context.Background(), training.Options{Preset: "tiny", Config: &c, Dataset: "synthetic", Context: 32,
		TokensPerStep: 128, Steps: 4, EvalEvery: 4, EvalBatches: 2, FinalEvalBatches: -1, Seed: 5, Out: dir,
		Progress: &bytes.Buffer{}, Dropout: -1, WarmIn: 2})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Score(context.Background(), dir, training.WeightsLast, Options{Lengths: []int{32, 64}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].T != 32 || got[1].T != 64 {
		t.Fatalf("scored %+v", got)
	}
	if d := math.Abs(got[0].CE - res.FinalValCE); d > 1e-4 {
		t.Errorf("CE at the trained length %.6f, the training evaluation's %.6f: off by %.2g", got[0].CE, res.FinalValCE, d)
	}
	if math.IsNaN(got[1].CE) || got[1].CE <= 0 || got[1].Tokens%64 != 0 || got[1].Tokens == 0 {
		t.Errorf("at 64: %+v", got[1])
	}
	bounded, err := Score(context.Background(), dir, training.WeightsLast, Options{Lengths: []int{32, 64}, Tokens: 200})
	if err != nil || bounded[0].Tokens != 6*32 || bounded[1].Tokens != 3*64 {
		t.Errorf("the first 200 tokens at 32 and 64: %+v %v", bounded, err)
	}
	if _, err := os.Stat(filepath.Join(dir, exportDir)); !os.IsNotExist(err) {
		t.Errorf("the export is left in the run: %v", err)
	}
	if _, err := Score(context.Background(), dir, training.WeightsLast, Options{Lengths: []int{128}}); err == nil {
		t.Error("a length above the model's max_len was accepted")
	}
}

// TestScoreMQAR: a run on the MQAR corpus is scored on MQAR sequences of
// each length: at its trained length (32) onnxruntime gives the training
// evaluation's CE and recall over the same sequences; at 64 (twice the
// sequence, distances up to 64) a CE and a recall over the answers of the
// sequences scored.
func TestScoreMQAR(t *testing.T) {
	requireORT(t)
	dir := t.TempDir()
	p, _ := model.LookupPreset("mqar")
	c := p.Config
	c.Model, c.Vocab, c.DModel, c.Layers, c.Heads, c.MaxLen, c.SmearKeys = model.Baseline, 32, 16, 2, 2, 64, true
	res, err := training.Train(context.Background(), training.Options{Preset: "mqar", Config: &c, Dataset: "mqar",
		MQAR: data.MQARConfig{SeqLen: 32, Pairs: 3, Vocab: 32}, Context: 32, TokensPerStep: 256, Steps: 6, EvalEvery: 6,
		EvalBatches: 2, FinalEvalBatches: -1, Seed: 3, Out: dir, Progress: &bytes.Buffer{}, Dropout: -1, WarmIn: 2})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Score(context.Background(), dir, training.WeightsLast, Options{Lengths: []int{32, 64}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Recall == nil || got[1].Recall == nil {
		t.Fatalf("scored %+v", got)
	}
	if d := math.Abs(got[0].CE - res.FinalValCE); d > 1e-4 {
		t.Errorf("CE at the trained length %.6f, the training evaluation's %.6f", got[0].CE, res.FinalValCE)
	}
	if *got[0].Recall != res.FinalRecall || got[0].RecallN != res.FinalRecallN {
		t.Errorf("recall at the trained length %.4f over %d answers, the training evaluation's %.4f over %d",
			*got[0].Recall, got[0].RecallN, res.FinalRecall, res.FinalRecallN)
	}
	// 3 answers a sequence, half as many sequences of 64
	if got[1].Tokens != got[0].Tokens/64*64 || got[1].RecallN != 3*got[1].Tokens/64 || math.IsNaN(got[1].CE) {
		t.Errorf("at 64: %+v, at 32: %+v", got[1], got[0])
	}
}
