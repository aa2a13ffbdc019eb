package training

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/rpac-dev/rpac/training/metrics"
)

func microOptions(out string) Options {
	p, _ := model.LookupPreset("tiny")
	c := p.Config
	c.DModel, c.Layers, c.Heads, c.MaxLen, c.Dropout = 16, 2, 2, 32, 0.1
	return Options{Preset: "tiny", Config: &c, Dataset: "synthetic", Context: 32, TokensPerStep: 128,
		Steps: 6, EvalEvery: 3, EvalBatches: 2, Seed: 3, Out: out, Progress: &bytes.Buffer{}, Dropout: -1, WarmIn: 2}
}

func weights(t *testing.T, dir string) map[string][]float32 {
	t.Helper()
	ck, err := checkpoint.Load(filepath.Join(dir, "checkpoint"))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string][]float32{}
	for _, w := range ck.Weights {
		m[w.Name] = w.Data
	}
	for _, w := range ck.Optim {
		m[w.Name] = w.Data
	}
	return m
}

// TestResumeIsExact: N steps straight and N/2 + resume + N/2 give the same
// weights, optimizer moments and running statistics, bit for bit.
func TestResumeIsExact(t *testing.T) {
	ctx := context.Background()
	a := t.TempDir()
	if _, err := Train(ctx, microOptions(a)); err != nil {
		t.Fatal(err)
	}
	b := t.TempDir()
	o := microOptions(b)
	o.StopAfter = 3
	if _, err := Train(ctx, o); err != nil {
		t.Fatal(err)
	}
	o = microOptions(b)
	o.Resume = true
	res, err := Train(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Steps != 6 {
		t.Fatalf("resumed run ended at step %d, want 6", res.Steps)
	}
	wa, wb := weights(t, a), weights(t, b)
	if len(wa) != len(wb) || len(wa) == 0 {
		t.Fatalf("%d tensors straight, %d resumed", len(wa), len(wb))
	}
	for name, x := range wa {
		y := wb[name]
		for i := range x {
			if x[i] != y[i] {
				t.Fatalf("%s[%d]: straight %v, resumed %v", name, i, x[i], y[i])
			}
		}
	}
	recs, err := metrics.ReadJSONL(filepath.Join(b, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var evals int
	for _, r := range recs {
		if r.Kind() == metrics.KindEval {
			evals++
		}
	}
	if evals != 2 {
		t.Fatalf("resumed run logged %d evaluations, want 2 (steps 3 and 6)", evals)
	}
}

func TestTrainErrors(t *testing.T) {
	ctx := context.Background()
	wt2 := wikiTextDir()
	cases := []struct {
		name string
		mod  func(o *Options)
		want string
	}{
		{"unknown preset", func(o *Options) { o.Preset = "huge"; o.Config = nil }, "unknown preset"},
		{"missing data dir", func(o *Options) { o.Dataset = "wikitext2"; o.DataDir = "/nonexistent/wt2" }, "/nonexistent/wt2"},
		{"unknown dataset", func(o *Options) { o.Dataset = "imagenet" }, "unknown dataset"},
		{"context longer than data", func(o *Options) {
			o.Dataset = "wikitext2"
			o.DataDir = wt2
			o.Context = 400000
			o.TrainSplit, o.EvalSplit = "test", "valid"
		}, "context"},
		{"unknown controller", func(o *Options) { o.Control.Controller = "pid" }, "controller"},
		{"bad game contexts", func(o *Options) { o.Control.Contexts = []int{16, 16} }, "twice"},
		{"bad SWA zone", func(o *Options) { o.Control.SWA, o.Control.SWAZoneLo, o.Control.SWAZoneHi = true, 3, 2 }, "zone"},
		{"resume without checkpoint", func(o *Options) { o.Resume = true }, "no checkpoint"},
		{"bad device", func(o *Options) { o.Device = Device(9) }, "device"},
		{"bf16 on the CPU", func(o *Options) { o.Precision = ir.BF16 }, "needs --device cuda"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "context longer than data" && wt2 == "" {
				skipNoWikiText(t)
			}
			o := microOptions(t.TempDir())
			tc.mod(&o)
			_, err := Train(ctx, o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// wikiTextDir finds the WikiText-2 raw files: $RPAC_DATA, then the shared
// copy beside the repository; "" when there are none.
func wikiTextDir() string {
	for _, dir := range []string{
		os.Getenv("RPAC_DATA"),
		filepath.Join("..", "..", "shared", "data", "wikitext-2-raw-v1"),
		filepath.Join("..", "..", "..", "shared", "data", "wikitext-2-raw-v1"),
	} {
		if dir == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "wiki.valid.raw")); err == nil {
			return dir
		}
	}
	return ""
}

func skipNoWikiText(t *testing.T) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal("WikiText-2 files not found (set RPAC_DATA)")
	}
	t.Skip("WikiText-2 files not found; set RPAC_DATA")
}

// TestCorruptCheckpointOnResume: a truncated or altered checkpoint is a
// clear error and the run directory is left as it was.
func TestCorruptCheckpointOnResume(t *testing.T) {
	ctx := context.Background()
	for _, damage := range []string{"truncate", "flip"} {
		t.Run(damage, func(t *testing.T) {
			dir := t.TempDir()
			o := microOptions(dir)
			o.Steps = 2
			if _, err := Train(ctx, o); err != nil {
				t.Fatal(err)
			}
			f := filepath.Join(dir, "checkpoint", "model.safetensors")
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if damage == "truncate" {
				b = b[:len(b)/2]
			} else {
				b[len(b)-3] ^= 0x55
			}
			if err := os.WriteFile(f, b, 0o644); err != nil {
				t.Fatal(err)
			}
			o = microOptions(dir)
			o.Resume = true
			_, err = Train(ctx, o)
			if err == nil || !strings.Contains(err.Error(), "model.safetensors") {
				t.Fatalf("got %v, want an error naming model.safetensors", err)
			}
			after, _ := os.ReadFile(f)
			if !bytes.Equal(after, b) {
				t.Fatal("the failed resume changed the checkpoint")
			}
		})
	}
}
