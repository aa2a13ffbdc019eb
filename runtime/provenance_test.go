package runtime

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestProvenanceRoundTrip: a manifest's provenance is written and read back
// unchanged, and Origin returns it.
func TestProvenanceRoundTrip(t *testing.T) {
	dir := t.TempDir()
	want := &Provenance{Run: "/runs/a", Checkpoint: "/runs/a/checkpoint", Weights: "ema", Step: 1200,
		Dataset: "synthetic", DataDir: "/data/wt2", Seed: 7, Synthetic: json.RawMessage(`{"Vocab":64}`),
		TrainSplit: "train", EvalSplit: "valid", Protocol: "train on train, evaluate on valid",
		Tokenizer: "synthetic", EOS: 1, Commit: "0123abcd-dirty",
		Fold: "rpa", Attention: "op", Precision: "fp32", Quantize: "int8"}
	m := &Manifest{Format: ManifestFormat, Lengths: []int{4}, VocabSize: 8, Tokenizer: "synthetic", EOS: 1,
		Files: []File{{Length: 4, Path: "m.onnx", SHA256: strings.Repeat("0", 64), Bytes: 1}}, Provenance: want}
	if err := WriteManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	got, err := ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	// WriteManifest indents the opaque synthetic options; compare them compact.
	var buf bytes.Buffer
	if err := json.Compact(&buf, got.Provenance.Synthetic); err != nil {
		t.Fatal(err)
	}
	got.Provenance.Synthetic = buf.Bytes()
	if !reflect.DeepEqual(got.Provenance, want) {
		t.Fatalf("read back %+v, want %+v", got.Provenance, want)
	}
	if o := got.Origin(); !reflect.DeepEqual(o, want) {
		t.Fatalf("Origin %+v, want %+v", o, want)
	}
	// The string form earlier exports wrote reads back to the same facts.
	legacy := ProvenanceFromMeta(want.LegacyMeta())
	if legacy.Weights != "ema" || legacy.Checkpoint != want.Checkpoint || legacy.Step != 1200 || legacy.DataDir != want.DataDir ||
		legacy.Seed != 7 || string(legacy.Synthetic) != string(want.Synthetic) || legacy.Dataset != "synthetic" {
		t.Fatalf("legacy round trip: %+v", legacy)
	}
	// The manifest's tokenizer and EOS, which the runtime uses, win over a
	// record that disagrees.
	got.Tokenizer, got.EOS = "other", 2
	if o := got.Origin(); o.Tokenizer != "other" || o.EOS != 2 || got.Provenance.Tokenizer != "synthetic" {
		t.Fatalf("Origin tokenizer %q eos %d", o.Tokenizer, o.EOS)
	}
	// A malformed record is refused.
	m.Provenance = &Provenance{Synthetic: json.RawMessage(`[1]`)}
	if err := m.Validate(); err == nil {
		t.Fatal("synthetic options that are not an object were accepted")
	}
}

// TestOldManifestWithoutProvenance: a manifest written before Provenance
// existed still opens; Origin recovers what its fold record's meta says,
// or only the tokenizer and EOS when it has none.
func TestOldManifestWithoutProvenance(t *testing.T) {
	sum := strings.Repeat("0", 64)
	old := `{
  "format": 1,
  "lengths": [16],
  "files": [{"length": 16, "path": "model_L16.onnx", "sha256": "` + sum + `", "bytes": 10}],
  "vocab_size": 50257,
  "tokenizer": "gpt2",
  "eos": 50256,
  "fold": {"mode": "rpa", "attention": "op", "meta": {"weights": "swa", "source": "/r/checkpoint", "step": "300", "data_dir": "/d"}},
  "model": "fuzzy"
}`
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ManifestName), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := ReadManifest(dir)
	if err != nil {
		t.Fatalf("an old manifest does not open: %v", err)
	}
	if m.Provenance != nil {
		t.Fatalf("provenance %+v in a manifest without one", m.Provenance)
	}
	want := &Provenance{Weights: "swa", Checkpoint: "/r/checkpoint", Step: 300, DataDir: "/d", Tokenizer: "gpt2", EOS: 50256}
	if o := m.Origin(); !reflect.DeepEqual(o, want) {
		t.Fatalf("Origin %+v, want %+v", o, want)
	}
	// Without a fold record at all.
	m.Fold = nil
	if o := m.Origin(); !reflect.DeepEqual(o, &Provenance{Tokenizer: "gpt2", EOS: 50256}) {
		t.Fatalf("Origin without fold %+v", o)
	}
}
