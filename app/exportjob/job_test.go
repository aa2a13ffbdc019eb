package exportjob

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/training"
)

// TestRunRefuses: the jobs that cannot run are refused before anything is
// exported, each with the flag that would fix it; data is loaded only when
// calibration or verification needs it.
func TestRunRefuses(t *testing.T) {
	p, err := model.LookupPreset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	bufs, err := model.RunningBuffers(&p.Config, 16)
	if err != nil || len(bufs) == 0 {
		t.Fatalf("the tiny preset has no running statistics to calibrate (%v): the test checks nothing", err)
	}
	loaded := 0
	base := Job{Options: export.Options{Config: p.Config, Store: kernels.NewStore(ir.FP32), Lengths: []int{16}, CalibBatches: 2},
		Format: FormatONNX, Calibrate: CalibrateAuto,
		LoadData: func(context.Context) (*Data, error) { loaded++; return nil, errors.New("no data here") }}
	for _, c := range []struct {
		name string
		edit func(*Job)
		want string
	}{
		{"triton verify", func(j *Job) { j.Format, j.Verify = FormatTriton, true }, "--format onnx"},
		{"never calibrate", func(j *Job) { j.Calibrate = CalibrateNever }, "--calibrate is never"},
		{"no calibration batches", func(j *Job) { j.CalibBatches = 0 }, "--calib-batches is 0"},
		{"no loader", func(j *Job) { j.LoadData = nil }, "no LoadData"},
		{"loader fails", func(*Job) {}, "no data here"},
	} {
		j := base
		c.edit(&j)
		if _, err := Run(context.Background(), j); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	if loaded != 1 {
		t.Errorf("the data was loaded %d times, want once (only the job that got that far)", loaded)
	}
	// Every buffer trained and no verification: no data is needed.
	j := base
	j.Trained = func(string) bool { return true }
	if d, err := j.data(context.Background()); d != nil || err != nil || loaded != 1 {
		t.Errorf("a job with nothing to calibrate or verify: data %v, %v, loaded %d", d, err, loaded)
	}
}

func TestFromDataset(t *testing.T) {
	ds := &training.Dataset{Name: "wikitext2", Protocol: "wikitext2-bpe", TrainSplit: "train", Train: []int32{1}, Eval: []int32{2}, EvalName: "valid", Vocab: 9}
	if d := FromDataset(ds); d.Source != "wikitext2 train" || d.EvalName != "valid" || d.Vocab != 9 || len(d.Train) != 1 || len(d.Eval) != 1 {
		t.Errorf("wikitext2: %+v", d)
	}
	ds.Name, ds.Protocol = "mqar", "mqar-64"
	if d := FromDataset(ds); d.Source != "mqar mqar-64" {
		t.Errorf("mqar: source %q", d.Source)
	}
}
