package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	cexport "github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/runtime"
)

// requireORT skips a test that needs onnxruntime when it is missing,
// except under CI=true, where that is a failure.
func requireORT(t testing.TB) {
	t.Helper()
	if err := runtime.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and %v", err)
		}
		t.Skipf("%v", err)
	}
}

// tinyExport writes an export of a small causal language model (one
// attention layer with a tied head) at the given lengths and static batch,
// with vocabulary 16 and EOS 15, and returns its folder.
func tinyExport(t testing.TB, lengths []int, batch int) string {
	t.Helper()
	const V, D, maxT = fakeV, 8, 64
	dir := t.TempDir()
	man := &runtime.Manifest{Format: runtime.ManifestFormat, VocabSize: V, EOS: fakeEOS, Tokenizer: "test", Model: "test"}
	weights := func(v *ir.Value) ([]float32, error) {
		r := rand.New(rand.NewPCG(uint64(len(v.Name)), uint64(v.Name[0])))
		out := make([]float32, v.Shape.Numel())
		for i := range out {
			out[i] = float32(r.NormFloat64())
		}
		return out, nil
	}
	for _, T := range lengths {
		g := ir.New(fmt.Sprintf("tiny_T%d", T))
		p := func(name string, s ...int) *ir.Value { return g.Param(name, ir.Shape(s)) }
		ids := g.Input("input_ids", ir.Shape{batch, T}, ir.I32)
		E := p("tok_emb.weight", V, D)
		x := g.Op1("Gather", nil, E, ids)
		x = g.Op1("Add", nil, x, g.Op1("Slice", ir.Attrs{"axis": 0, "start": 0, "end": T}, p("pos_emb.weight", maxT, D)))
		q := g.Op1("Reshape", ir.Attrs{"shape": []int{batch, 1, T, D}}, g.Op1("Linear", nil, x, p("Wq.weight", D, D)))
		k := g.Op1("Reshape", ir.Attrs{"shape": []int{batch, 1, T, D}}, g.Op1("Linear", nil, x, p("Wk.weight", D, D)))
		v := g.Op1("Reshape", ir.Attrs{"shape": []int{batch, 1, T, D}}, g.Op1("Linear", nil, x, p("Wv.weight", D, D)))
		s := g.Op1("Scale", ir.Attrs{"alpha": 1 / math.Sqrt(D)}, g.Op1("MatMul", ir.Attrs{"transB": true}, q, k))
		o := g.Op1("MatMul", nil, g.Op1("Softmax", nil, g.Op1("CausalMask", nil, s)), v)
		x = g.Op1("Add", nil, x, g.Op1("Reshape", ir.Attrs{"shape": []int{batch, T, D}}, o))
		x = g.Op1("LayerNorm", ir.Attrs{"eps": 1e-5}, x, p("ln.weight", D), p("ln.bias", D))
		g.SetOutput("logits", g.Op1("Linear", nil, x, E))
		m, err := onnx.Lower(g, weights, onnx.Options{})
		if err != nil {
			t.Fatalf("lower T=%d: %v", T, err)
		}
		name := fmt.Sprintf("model_L%d.onnx", T)
		if err := onnx.Write(filepath.Join(dir, name), m); err != nil {
			t.Fatal(err)
		}
		f, err := runtime.NewFile(dir, name, T)
		if err != nil {
			t.Fatal(err)
		}
		man.Lengths = append(man.Lengths, T)
		man.Files = append(man.Files, f)
	}
	if err := runtime.WriteManifest(dir, man); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestWindowEngineOnnxruntime: over a real export, the server's greedy
// and seeded completions are runtime.Model.Generate's, batched or not, and
// its score is runtime.Model.Score's.
func TestWindowEngineOnnxruntime(t *testing.T) {
	requireORT(t)
	dir := tinyExport(t, []int{8, 32}, 4)
	m, err := runtime.Open(dir, runtime.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := New(m, Config{Tokenizer: letters{}, MaxBatch: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h := s.Handler()
	prompts := [][]int32{{1, 2, 3}, {4}, {7, 7, 7, 7, 7, 7, 7}, {0, 9, 3, 3, 1}, {12, 5}}
	want := make([][]int32, len(prompts))
	for i, p := range prompts {
		want[i], err = m.Generate(context.Background(), p, runtime.GenerateOptions{MaxNewTokens: 20, Temperature: 0.9, Seed: uint64(i)})
		if err != nil {
			t.Fatal(err)
		}
		if k := indexOf(want[i], fakeEOS); k >= 0 {
			want[i] = want[i][:k] // the server stops at EOS and leaves it out
		}
	}
	got := make([]string, len(prompts))
	done := make(chan struct{})
	for i, p := range prompts {
		go func() {
			defer func() { done <- struct{}{} }()
			body := fmt.Sprintf(`{"prompt": %s, "max_tokens": 20, "temperature": 0.9, "seed": %d}`, strings.ReplaceAll(fmt.Sprint(p), " ", ","), i)
			rec := recorder(h, http.MethodPost, "/v1/completions", body)
			got[i] = rec
		}()
	}
	for range prompts {
		<-done
	}
	for i := range prompts {
		if !strings.Contains(got[i], `"token_ids":`+strings.ReplaceAll(fmt.Sprint(want[i]), " ", ",")) {
			t.Errorf("prompt %v: server answered %s, Generate drew %v", prompts[i], got[i], want[i])
		}
	}
	ids := []int32{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7}
	res, err := m.Score(context.Background(), [][]int32{ids})
	if err != nil {
		t.Fatal(err)
	}
	body := recorder(h, http.MethodPost, "/v1/score", `{"ids": `+strings.ReplaceAll(fmt.Sprint(ids), " ", ",")+`}`)
	var sr scoreResponse
	if err := json.Unmarshal([]byte(body), &sr); err != nil {
		t.Fatalf("score answer %s: %v", body, err)
	}
	if sr.Tokens != res.Tokens || math.Abs(sr.CE-res.MeanCE) > 1e-9 || math.Abs(sr.Perplexity-res.Perplexity) > 1e-9*res.Perplexity {
		t.Errorf("score %+v, runtime says CE %v perplexity %v over %d tokens", sr, res.MeanCE, res.Perplexity, res.Tokens)
	}
	// KServe's derived outputs are the model's logits, selected.
	rows := [][]int32{{3, 1, 4, 1, 5}, {9, 2, 6, 5, 3}}
	targets := [][]int32{{1, 4, 1, 5, 9}, {2, 6, 5, 3, 5}}
	logits, err := m.Logits(context.Background(), rows)
	if err != nil {
		t.Fatal(err)
	}
	body = recorder(h, http.MethodPost, "/v2/models/rpac/infer", `{"inputs": [
		{"name": "input_ids", "shape": [2, 5], "datatype": "INT64", "data": [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]]},
		{"name": "target_ids", "shape": [2, 5], "datatype": "INT64", "data": [[1, 4, 1, 5, 9], [2, 6, 5, 3, 5]]}],
		"outputs": [{"name": "last_logits"}, {"name": "top_k_ids", "parameters": {"top_k": 3}}, {"name": "target_logprobs"}]}`)
	var ir struct {
		Outputs []struct {
			Name string
			Data []float64
		}
	}
	if err := json.Unmarshal([]byte(body), &ir); err != nil || len(ir.Outputs) != 3 {
		t.Fatalf("infer answer %.300s: %v", body, err)
	}
	V := m.VocabSize()
	for b, l := range logits {
		last := l.Row(4)
		for v := range V {
			if got := ir.Outputs[0].Data[b*V+v]; float32(got) != last[v] { // the shortest text of a float32 reads back exactly
				t.Fatalf("last_logits[%d,%d] = %v, the model's %v", b, v, got, last[v])
			}
		}
		for tt := range 5 {
			row := l.Row(tt)
			top := ir.Outputs[1].Data[(b*5+tt)*3 : (b*5+tt)*3+3]
			for j := 1; j < 3; j++ {
				if row[int(top[j])] > row[int(top[j-1])] {
					t.Errorf("top_k_ids[%d,%d] = %v: not in decreasing order of logit", b, tt, top)
				}
			}
			for v := range V {
				if row[v] > row[int(top[2])] && v != int(top[0]) && v != int(top[1]) {
					t.Errorf("top_k_ids[%d,%d] = %v leaves out id %d", b, tt, top, v)
				}
			}
			want := runtime.LogProb(row, int(targets[b][tt]))
			if got := ir.Outputs[2].Data[b*5+tt]; math.Abs(got-want) > 1e-6 {
				t.Errorf("target_logprobs[%d,%d] = %v, want %v", b, tt, got, want)
			}
		}
	}
}

// recorder runs one request through h and returns the body.
func recorder(h http.Handler, method, path, body string) string {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	return rec.Body.String()
}

func indexOf(s []int32, x int32) int {
	for i, v := range s {
		if v == x {
			return i
		}
	}
	return -1
}

// kvExport writes an export of a small fuzzy model (random weights,
// vocabulary 61, EOS 0) with KV-cache graphs at lengths ls.
func kvExport(t *testing.T, ls ...int) string {
	t.Helper()
	p, _ := model.LookupPreset("tiny")
	cfg := p.Config
	cfg.Vocab, cfg.DModel, cfg.Heads, cfg.Layers, cfg.MaxLen, cfg.Experts, cfg.TopK = 61, 24, 3, 2, 32, 3, 2
	st := kernels.NewStore(ir.FP32)
	for _, T := range ls {
		mg, err := model.Build(&cfg, model.Opts{T: T, B: 1, Mode: model.Eval})
		if err != nil {
			t.Fatal(err)
		}
		if err := model.InitStore(mg.Specs, st, 3); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	if _, err := cexport.Export(context.Background(), cexport.Options{Config: cfg, Store: st, Lengths: ls,
		KVCache: true, Out: dir, Tokenizer: "test", EOS: 0}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestKVEngineOnnxruntime: on an export with KV-cache graphs the server
// decodes on the cache (by default), and its completions, five at once at
// different positions and lengths, are runtime.Model.Generate's.
func TestKVEngineOnnxruntime(t *testing.T) {
	requireORT(t)
	m, err := runtime.Open(kvExport(t, 16, 32), runtime.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := New(m, Config{MaxBatch: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.cfg.Engine.(*kvEngine); !ok {
		t.Fatalf("the default engine over a KV-cache export is %T", s.cfg.Engine)
	}
	h := s.Handler()
	type job struct {
		prompt []int32
		n      int
		temp   float64
	}
	jobs := []job{{[]int32{1, 2, 3}, 9, 0}, {[]int32{4}, 20, 0.9}, {[]int32{7, 7, 7, 7, 7, 7, 7}, 6, 0.9}, {[]int32{9, 3, 3, 1, 5, 8, 60, 2, 2, 2, 2, 2, 2, 2}, 12, 0}, {[]int32{12, 5}, 25, 1.2}}
	want := make([][]int32, len(jobs))
	for i, j := range jobs {
		want[i], err = m.Generate(context.Background(), j.prompt, runtime.GenerateOptions{MaxNewTokens: j.n, Temperature: j.temp, Seed: uint64(i)})
		if err != nil {
			t.Fatal(err)
		}
		if k := indexOf(want[i], 0); k >= 0 {
			want[i] = want[i][:k]
		}
	}
	got := make([]string, len(jobs))
	done := make(chan struct{})
	for i, j := range jobs {
		go func() {
			defer func() { done <- struct{}{} }()
			body := fmt.Sprintf(`{"prompt": %s, "max_tokens": %d, "temperature": %v, "seed": %d}`, strings.ReplaceAll(fmt.Sprint(j.prompt), " ", ","), j.n, j.temp, i)
			got[i] = recorder(h, http.MethodPost, "/v1/completions", body)
		}()
	}
	for range jobs {
		<-done
	}
	for i := range jobs {
		if !strings.Contains(got[i], `"token_ids":`+strings.ReplaceAll(fmt.Sprint(want[i]), " ", ",")) {
			t.Errorf("job %d: server answered %s, Generate drew %v", i, got[i], want[i])
		}
	}
	// The decoder frees a slot just after it sends the sequence's last
	// token, so the answer can arrive first.
	waitFor(t, "every slot to be released", func() bool { return s.dec.open.Load() == 0 })
	code := recorder(h, http.MethodPost, "/v1/completions", `{"prompt": [1, 2], "max_tokens": 31}`)
	if !strings.Contains(code, "more than the model's context of 32") {
		t.Fatalf("prompt + max_tokens beyond the longest KV length: %s", code)
	}
}
