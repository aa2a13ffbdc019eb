package export_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
)

// TestMetadataProps: the typed metadata renders the keys earlier exports
// wrote (plus "provenance"), in both the export's and Triton's form.
func TestMetadataProps(t *testing.T) {
	prov := &runtime.Provenance{Weights: "ema", Checkpoint: "/r/checkpoint", Step: 9, DataDir: "/d"}
	md := export.Metadata{Lengths: []int{8, 24}, Length: 8, Batch: "1", VocabSize: 64, Tokenizer: "gpt2", EOS: 3,
		Model: model.Fuzzy, Config: json.RawMessage(`{"a":1}`), Fold: &export.Fold{Mode: passes.FoldRPAMode, Attention: passes.AttentionOp},
		Quantize: onnx.QuantizeInt8, DType: ir.FP32, Provenance: prov}
	p := md.Props()
	want := map[string]string{"lengths": "8,24", "length": "8", "batch": "1", "vocab_size": "64", "tokenizer": "gpt2",
		"eos": "3", "model": "fuzzy", "config": `{"a":1}`, "fold": `{"mode":"rpa","attention":"op"}`,
		"quantize": "int8", "int8_weight_max": p["int8_weight_max"],
		"weights": "ema", "source": "/r/checkpoint", "step": "9", "data_dir": "/d"}
	pj := p["provenance"]
	delete(p, "provenance")
	if !reflect.DeepEqual(p, want) || p["int8_weight_max"] == "" {
		t.Fatalf("props\n%v\nwant\n%v", p, want)
	}
	var back runtime.Provenance
	if err := json.Unmarshal([]byte(pj), &back); err != nil || !reflect.DeepEqual(&back, prov) {
		t.Fatalf("provenance %s (%v)", pj, err)
	}
	// Triton's form: fold and attention as plain strings, a named batch
	// dimension and max_batch_size, no lengths; no provenance given.
	tr := export.Metadata{Length: 8, Batch: "batch", MaxBatch: 4, VocabSize: 64, Tokenizer: "t", EOS: 0, Model: model.Baseline,
		Config: json.RawMessage(`{}`), FoldMode: passes.FoldNoneMode, Attention: passes.AttentionPlain}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range tr.Props() {
			if !yield(k) {
				return
			}
		}
	})
	if want := []string{"attention", "batch", "config", "eos", "fold", "length", "max_batch_size", "model", "tokenizer", "vocab_size"}; !slices.Equal(keys, want) {
		t.Fatalf("triton keys %v, want %v", keys, want)
	}
	// A KV-cache graph: no batch, its graph kind.
	kv := md
	kv.Batch, kv.Graph = "", runtime.GraphDecode
	if kp := kv.Props(); kp["graph"] != "decode" || kp["batch"] != "" {
		t.Fatalf("kv props %v", kp)
	}
}

// TestExportWritesProvenance: Export completes the caller's provenance
// with its own settings and writes the same record into the manifest and
// every file's metadata, and the legacy keys where earlier readers look.
func TestExportWritesProvenance(t *testing.T) {
	cfg := smallCfg(model.Fuzzy)
	st := smallStore(t, &cfg, lengths...)
	dir := t.TempDir()
	in := &runtime.Provenance{Run: "/r", Checkpoint: "/r/checkpoint", Weights: "last", Step: 5, Dataset: "wikitext2",
		TrainSplit: "train", EvalSplit: "valid", Commit: "abc"}
	if _, err := export.Export(context.Background(), export.Options{Config: cfg, Store: st, Lengths: lengths,
		Out: dir, Tokenizer: "test", EOS: 3, Provenance: in}); err != nil {
		t.Fatal(err)
	}
	man, err := runtime.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := *in
	want.Tokenizer, want.EOS = "test", 3
	want.Fold, want.Attention, want.Precision, want.Quantize = "rpa", "op", "fp32", ""
	if !reflect.DeepEqual(man.Provenance, &want) || !reflect.DeepEqual(man.Origin(), &want) {
		t.Fatalf("manifest provenance %+v, want %+v", man.Provenance, want)
	}
	var fold export.Fold
	if err := json.Unmarshal(man.Fold, &fold); err != nil || fold.Meta["weights"] != "last" || fold.Meta["step"] != "5" {
		t.Fatalf("fold meta %v (%v)", fold.Meta, err)
	}
	for _, T := range lengths {
		m, err := onnx.Read(filepath.Join(dir, export.FileName(T)))
		if err != nil {
			t.Fatal(err)
		}
		meta := onnx.Inspect(m).Metadata
		var p runtime.Provenance
		if err := json.Unmarshal([]byte(meta["provenance"]), &p); err != nil || !reflect.DeepEqual(&p, &want) {
			t.Fatalf("L=%d: metadata provenance %s (%v)", T, meta["provenance"], err)
		}
		if meta["weights"] != "last" || meta["source"] != "/r/checkpoint" || meta["step"] != "5" {
			t.Fatalf("L=%d: legacy keys %v", T, meta)
		}
	}
}
