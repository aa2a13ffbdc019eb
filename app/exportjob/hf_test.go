package exportjob

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/hf"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/passes"
)

// TestHFTokenizerGPT2: GPT-2's vocabulary gives Hugging Face's gpt2 files:
// 50,000 merges beginning "Ġ t", "Ġ a", "h e", "Ġthe" id 262, the EOS id
// 50256; the synthetic tasks' ids have none.
func TestHFTokenizerGPT2(t *testing.T) {
	dir := t.TempDir()
	files, err := writeHFTokenizer(dir, "gpt2-r50k")
	if err != nil || len(files) != 2 {
		t.Fatalf("files %v, %v", files, err)
	}
	var tj struct {
		Model struct {
			Vocab  map[string]int
			Merges [][2]string
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, files[0]))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &tj); err != nil {
		t.Fatal(err)
	}
	m, v := tj.Model.Merges, tj.Model.Vocab
	if len(m) != 50000 || m[0] != [2]string{"Ġ", "t"} || m[1] != [2]string{"Ġ", "a"} || m[2] != [2]string{"h", "e"} {
		t.Errorf("%d merges, first %q", len(m), m[:min(3, len(m))])
	}
	if len(v) != 50257 || v["Ġthe"] != 262 || v["<|endoftext|>"] != 50256 || v["!"] != 0 {
		t.Errorf("vocab of %d: Ġthe %d, <|endoftext|> %d, ! %d", len(v), v["Ġthe"], v["<|endoftext|>"], v["!"])
	}
	for _, name := range []string{"synthetic", "mqar"} {
		if files, err := writeHFTokenizer(t.TempDir(), name); files != nil || err != nil {
			t.Errorf("%s: %v, %v", name, files, err)
		}
	}
}

// TestRunWritesHFTokenizer: an ONNX export of GPT-2 token ids gets the
// tokenizer files beside its manifest, one of synthetic ids none.
func TestRunWritesHFTokenizer(t *testing.T) {
	p, err := model.LookupPreset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg := p.Config
	cfg.Vocab, cfg.DModel, cfg.Heads, cfg.Layers, cfg.MaxLen = 61, 16, 2, 1, 16
	const T = 8
	mg, err := model.Build(&cfg, model.Opts{T: T, B: 1, Mode: model.Eval})
	if err != nil {
		t.Fatal(err)
	}
	st := kernels.NewStore(ir.FP32)
	if err := model.InitStore(mg.Specs, st, 1); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tokenizer string
		files     []string
	}{{"gpt2-r50k", []string{hf.TokenizerFile, hf.TokenizerConfigFile}}, {"synthetic", nil}} {
		out := t.TempDir()
		j := Job{Options: export.Options{Config: cfg, Store: st, Lengths: []int{T}, Out: out, Tokenizer: c.tokenizer, Trained: func(string) bool { return true }},
			Format: FormatONNX, Calibrate: CalibrateAuto}
		res, err := Run(context.Background(), j)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(res.HFFiles, c.files) {
			t.Errorf("%s: files %v, want %v", c.tokenizer, res.HFFiles, c.files)
		}
		for _, f := range []string{hf.TokenizerFile, hf.TokenizerConfigFile} {
			if _, err := os.Stat(filepath.Join(out, f)); (err == nil) != (c.files != nil) {
				t.Errorf("%s: %s: %v", c.tokenizer, f, err)
			}
		}
	}
}

// TestRunHF: --format hf writes the decoder, the configuration files and
// the tokenizer's, and refuses what the layout cannot hold: several
// lengths, tokens without a tokenizer, --verify, and the options its
// decoder is not written with.
func TestRunHF(t *testing.T) {
	p, err := model.LookupPreset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg := p.Config
	cfg.DModel, cfg.Heads, cfg.Layers, cfg.MaxLen = 16, 2, 1, 16
	const T = 8
	st := kernels.NewStore(ir.FP32)
	for _, L := range []int{T, 2 * T} {
		mg, err := model.Build(&cfg, model.Opts{T: L, B: 1, Mode: model.Eval})
		if err != nil {
			t.Fatal(err)
		}
		if err := model.InitStore(mg.Specs, st, 1); err != nil {
			t.Fatal(err)
		}
	}
	job := func(edit func(j *Job)) Job {
		j := Job{Options: export.Options{Config: cfg, Store: st, Lengths: []int{T}, Out: t.TempDir(), Tokenizer: "gpt2-r50k", EOS: 50256,
			Trained: func(string) bool { return true }}, Format: FormatHF, Calibrate: CalibrateAuto}
		if edit != nil {
			edit(&j)
		}
		return j
	}
	j := job(nil)
	res, err := Run(context.Background(), j)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{hf.ModelFile, hf.ConfigFile, hf.GenerationFile, hf.GenAIConfigFile}
	if res.HF == nil || !reflect.DeepEqual(res.HF.Files, want) || res.HF.Length != T || !reflect.DeepEqual(res.HFFiles, []string{hf.TokenizerFile, hf.TokenizerConfigFile}) {
		t.Fatalf("result %+v, tokenizer files %v; want files %v", res.HF, res.HFFiles, want)
	}
	for _, f := range append(want, res.HFFiles...) {
		if _, err := os.Stat(filepath.Join(j.Out, filepath.FromSlash(f))); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat(filepath.Join(j.Out, "manifest.json")); err == nil {
		t.Error("the Hugging Face layout has a manifest.json")
	}
	for _, c := range []struct {
		name string
		edit func(j *Job)
		want string
	}{
		{"two lengths", func(j *Job) { j.Lengths = []int{T, 2 * T} }, "one frame length"},
		{"synthetic tokens", func(j *Job) { j.Tokenizer = "synthetic" }, "--format hf writes GPT-2's tokenizer files"},
		{"vocabulary", func(j *Job) { j.Config.Vocab = 61 }, "the model's vocabulary has 61 ids, the tokenizer 50257"},
		{"verify", func(j *Job) { j.Verify = true }, "--verify checks a runtime export"},
		{"kv-cache", func(j *Job) { j.KVCache = true }, "drop --kv-cache"},
		{"int8", func(j *Job) { j.Quantize = onnx.QuantizeInt8 }, "drop --quantize and --dtype"},
		{"fp16", func(j *Job) { j.DType = ir.FP16 }, "drop --quantize and --dtype"},
		{"rank fold", func(j *Job) { j.Fold = passes.FoldRankMode }, "--fold rank is not supported"},
		{"op8", func(j *Job) { j.Attention = passes.AttentionOpPadded }, "no op8 lowering"},
	} {
		if _, err := Run(context.Background(), job(c.edit)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", c.name, err, c.want)
		}
	}
}
