package exportjob

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/training/data"
)

// randomStore is cfg's weights from seed with its eval-mode buffers at
// every length of lengths (running statistics at their initial values).
func randomStore(t *testing.T, cfg *model.Config, seed uint64, lengths ...int) *kernels.Store {
	t.Helper()
	st := kernels.NewStore(ir.FP32)
	for _, L := range lengths {
		mg, err := model.Build(cfg, model.Opts{T: L, B: 1, Mode: model.Eval})
		if err != nil {
			t.Fatal(err)
		}
		if err := model.InitStore(mg.Specs, st, seed); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

// hfCase is one prompt of clients/node/hf_generate.mjs with rpac's answers.
type hfCase struct {
	Text      string  `json:"text"`
	IDs       []int32 `json:"ids"`
	Generated []int32 `json:"generated"`
	Logits    string  `json:"logits"` // float32 [tokens, V], little-endian
}

// margin is the gap between the largest and the second largest logit.
func margin(row []float32) float64 {
	a, b := math.Inf(-1), math.Inf(-1)
	for _, x := range row {
		switch v := float64(x); {
		case v > a:
			a, b = v, a
		case v > b:
			b = v
		}
	}
	return a - b
}

// rpacCases generates greedily from each prompt with rpac's KV-cache
// decoder (the export in dir) and writes the logits of the whole sequence
// into dir's files; it returns the cases and the smallest greedy margin.
func rpacCases(t *testing.T, m *runtime.Model, dir string, prompts []string, newTokens int) ([]hfCase, float64) {
	t.Helper()
	ctx := context.Background()
	tok := data.NewTokenizer()
	var cases []hfCase
	low := math.Inf(1)
	for i, text := range prompts {
		ids := tok.Encode(text)
		gen, err := m.Generate(ctx, ids, runtime.GenerateOptions{MaxNewTokens: newTokens, StopAtEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		seq := append(append([]int32(nil), ids...), gen...)
		lg, err := m.Logits(ctx, [][]int32{seq})
		if err != nil {
			t.Fatal(err)
		}
		raw := make([]byte, 0, 4*len(seq)*lg[0].Vocab)
		for p := range seq {
			for _, x := range lg[0].Row(p) {
				raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(x))
			}
			if p >= len(ids)-1 && p < len(seq)-1 {
				low = min(low, margin(lg[0].Row(p)))
			}
		}
		path := filepath.Join(dir, fmt.Sprintf("logits%d.bin", i))
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, hfCase{Text: text, IDs: ids, Generated: gen, Logits: path})
	}
	return cases, low
}

// TestHFTransformersJS: transformers.js loads `rpac export --format hf` of
// a random tiny-preset checkpoint offline (AutoTokenizer,
// AutoModelForCausalLM) and, for three prompts, tokenizes them to rpac's
// ids, generates greedily with its KV cache exactly the 32 tokens rpac's
// KV-cache decoder generates, and computes rpac's logits within 1e-4 both
// in one call and the Hugging Face way (the prompt, then one token a call
// with past_key_values and a growing attention_mask); a sequence past L is
// refused; and its tokenizer gives rpac's ids on WikiText-2's valid split
// (clients/node/hf_generate.mjs and hf_tokenizer.mjs exit non-zero on a
// difference).
func TestHFTransformersJS(t *testing.T) {
	node := nodeClients(t)
	textPath := validText(t)
	if err := runtime.Available(); err != nil {
		requireOrSkip(t, "onnxruntime: %v", err)
	}
	const L, newTokens = 64, 32
	p, err := model.LookupPreset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg := p.Config
	root := t.TempDir()
	job := Job{Options: export.Options{Config: cfg, Store: randomStore(t, &cfg, 7, L), Lengths: []int{L}, Out: filepath.Join(root, "rpac-tiny"),
		Tokenizer: data.GPT2TokenizerName, EOS: int(data.GPT2EOS), Trained: func(string) bool { return true }}, Format: FormatHF, Calibrate: CalibrateNever}
	if _, err := Run(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	own := job
	own.Format, own.Out, own.KVCache = FormatONNX, filepath.Join(root, "own"), true
	if _, err := Run(context.Background(), own); err != nil {
		t.Fatal(err)
	}
	m, err := runtime.Open(own.Out, runtime.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	prompts := []string{"The tower is 324 metres tall,", " = Valkyria Chronicles III = \n", "In 1998, the company said that"}
	cases, low := rpacCases(t, m, root, prompts, newTokens)
	t.Logf("smallest greedy margin of rpac's generations: %.3g", low)
	b, err := json.Marshal(map[string]any{"tolerance": 1e-4, "vocab": cfg.Vocab, "cases": cases})
	if err != nil {
		t.Fatal(err)
	}
	casesPath := filepath.Join(root, "cases.json")
	if err := os.WriteFile(casesPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	runNode(t, node, "hf_generate.mjs", job.Out, casesPath)
	checkTokenizerJS(t, node, job.Out, textPath)
}
