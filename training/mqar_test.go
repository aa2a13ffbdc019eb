package training

import (
	"context"
	"encoding/json"
	"math"
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
