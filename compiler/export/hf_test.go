package export_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/hf"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/passes"
)

// TestHF: the Hugging Face export writes the decoder under onnx/ and the
// configuration files, its metadata says which graph it is, its inputs and
// outputs are Optimum's, plain attention spells attention out, a model with
// rotary positions exports too; a model that smears keys is refused.
func TestHF(t *testing.T) {
	for _, c := range cacheCases {
		cfg := c.config()
		const L = 16
		dir := t.TempDir()
		res, err := export.HF(context.Background(), export.Options{Config: cfg, Store: smallStore(t, &cfg, L), Lengths: []int{L}, Attention: c.att,
			Out: dir, Tokenizer: "test", EOS: 3})
		if err != nil {
			t.Fatal(err)
		}
		want := []string{hf.ModelFile, hf.ConfigFile, hf.GenerationFile, hf.GenAIConfigFile}
		if strings.Join(res.Files, " ") != strings.Join(want, " ") || res.Length != L || res.Bytes == 0 ||
			res.Layout != (onnx.KVLayout{Layers: cfg.Layers, Heads: cfg.Heads, HeadSize: cfg.HeadDim(), Length: L}) {
			t.Fatalf("result %+v", res)
		}
		m, err := onnx.Read(filepath.Join(dir, filepath.FromSlash(hf.ModelFile)))
		if err != nil {
			t.Fatal(err)
		}
		s := onnx.Inspect(m)
		if s.Metadata["graph"] != "hf" || s.Metadata["length"] != "16" || s.Metadata["batch"] != "batch_size" {
			t.Errorf("metadata graph %q length %q batch %q", s.Metadata["graph"], s.Metadata["length"], s.Metadata["batch"])
		}
		if n := s.Ops["Attention"]; (c.att == passes.AttentionOp) != (n == cfg.Layers) || (c.att == passes.AttentionPlain && n != 0) {
			t.Errorf("attention %s: %d Attention nodes", c.att, n)
		}
		var in, out []string
		for _, v := range m.Graph.Input {
			in = append(in, v.Name)
		}
		for _, v := range m.Graph.Output {
			out = append(out, v.Name)
		}
		if got := strings.Join(in[:4], " "); got != "input_ids attention_mask position_ids past_key_values.0.key" || len(in) != 3+2*cfg.Layers {
			t.Errorf("inputs %v", in)
		}
		if got := strings.Join(out[:2], " "); got != "logits present.0.key" || len(out) != 1+2*cfg.Layers {
			t.Errorf("outputs %v", out)
		}
	}
	cfg := smallCfg(model.Fuzzy)
	cfg.SmearKeys = true
	o := export.Options{Config: cfg, Store: smallStore(t, &cfg, 8), Lengths: []int{8}, Out: t.TempDir(), EOS: 3}
	if _, err := export.HF(context.Background(), o); err == nil || !strings.Contains(err.Error(), "smear_keys") {
		t.Errorf("smeared keys: %v", err)
	}
}
