package training

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/rpac-dev/rpac/training/data"
)

// TestMQARRecorded: the MQAR shape and seed survive the run's record of its
// options (with the CLI's default SWA zone "0,inf", which JSON cannot hold),
// and the dataset they name is the corpus, with answers and alignment.
func TestMQARRecorded(t *testing.T) {
	mq := data.MQARConfig{SeqLen: 64, Pairs: 4, Vocab: 128, MinDist: 2, MaxDist: 40}
	o := Options{Dataset: "mqar", Seed: 9, MQAR: mq, Control: Controls{SWAZoneHi: math.Inf(1)}}
	raw := marshalOptions(o)
	var rec recordedOptions
	if err := json.Unmarshal(raw, &rec); err != nil || rec.MQAR != mq || rec.Seed != 9 || rec.Dataset != "mqar" {
		t.Fatalf("recorded %s: %+v (%v)", raw, rec, err)
	}
	r := &Run{options: rec}
	r.State.Dataset = "mqar"
	spec := r.DataSpec("", "", "")
	ds, err := LoadDataset(context.Background(), spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := data.NewMQARCorpus(9, MQARTrainTokens, MQAREvalTokens, mq)
	if ds.Vocab != 128 || ds.Align != 64 || ds.Answers == nil || len(ds.Eval) != len(want.Eval.IDs) || ds.Eval[100] != want.Eval.IDs[100] {
		t.Fatalf("dataset: vocab %d, align %d, answers %v, %d eval tokens", ds.Vocab, ds.Align, ds.Answers != nil, len(ds.Eval))
	}
	for i := range ds.Train {
		if ds.Train[i] != want.Train.IDs[i] {
			t.Fatalf("train token %d differs from the corpus of the recorded seed", i)
		}
	}
}

// TestMQARBreakdownLogged: every evaluation of an MQAR run records recall by
// distance bucket and by pair slot in metrics.jsonl, and both add up to the
// recall figure of the same record.
func TestMQARBreakdownLogged(t *testing.T) {
	out := t.TempDir()
	o := microOptions(out)
	o.Dataset, o.MQAR, o.Config.Vocab = "mqar", data.MQARConfig{SeqLen: 32, Pairs: 3, Vocab: 32}, 32
	if _, err := Train(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	type cell struct{ Correct, Total int }
	evals := 0
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var rec struct {
			ValCE   *float64 `json:"val_ce"`
			Acc     float64  `json:"recall_acc"`
			N       int      `json:"recall_n"`
			ByDist  []cell   `json:"recall_by_dist"`
			BySlot  []cell   `json:"recall_by_slot"`
			ByOrder []cell   `json:"recall_by_order"`
		}
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatal(err)
		}
		if rec.ValCE == nil {
			continue
		}
		evals++
		if len(rec.BySlot) != 3 || len(rec.ByOrder) != 3 || len(rec.ByDist) != len(data.DistanceEdges(32))-1 {
			t.Fatalf("breakdown of %d slots and %d buckets: %s", len(rec.BySlot), len(rec.ByDist), line)
		}
		for _, cells := range [][]cell{rec.ByDist, rec.BySlot, rec.ByOrder} {
			var sum cell
			for _, c := range cells {
				sum.Correct, sum.Total = sum.Correct+c.Correct, sum.Total+c.Total
			}
			if sum.Total != rec.N || rec.N == 0 || math.Abs(float64(sum.Correct)/float64(sum.Total)-rec.Acc) > 1e-12 {
				t.Fatalf("breakdown %+v does not add up to recall %g of %d: %s", sum, rec.Acc, rec.N, line)
			}
		}
	}
	if evals != 2 {
		t.Fatalf("%d evaluations, want 2", evals)
	}
}

// TestAnswerLossRun: an MQAR run with the answer-only loss trains (its
// first loss is about log of the vocabulary, over the answers alone),
// records the choice, still evaluates CE on every token; a corpus without
// answer positions is refused.
func TestAnswerLossRun(t *testing.T) {
	out := t.TempDir()
	o := microOptions(out)
	o.Dataset, o.MQAR, o.Config.Vocab, o.Loss = "mqar", data.MQARConfig{SeqLen: 32, Pairs: 3, Vocab: 32}, 32, LossAnswers
	res, err := Train(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if math.IsNaN(res.FinalValCE) || res.FinalValCE <= 0 || res.FinalRecallN == 0 {
		t.Fatalf("val CE %g, %d answers", res.FinalValCE, res.FinalRecallN)
	}
	if math.Abs(res.InitialLoss-math.Log(32)) > 1.5 {
		t.Fatalf("first loss %g, want about log 32 = %.2f", res.InitialLoss, math.Log(32))
	}
	st, err := os.ReadFile(filepath.Join(out, "checkpoint", "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(bytes.ReplaceAll(st, []byte(" "), nil), []byte(`"Loss":"answers"`)) {
		t.Fatalf("state.json does not record the loss: %s", st)
	}
	r := &run{o: Options{Loss: LossAnswers}, ds: &Dataset{Name: "wikitext2"}}
	tb, _ := data.NewTrainBatcher(make([]int32, 100), 8, 64, 1)
	if err := r.maskTargets(tb); err == nil {
		t.Fatal("the answer-only loss was accepted on a corpus without answers")
	}
	if _, err := ParseLossTargets("tokens"); err == nil {
		t.Fatal("an unknown loss was accepted")
	}
}
