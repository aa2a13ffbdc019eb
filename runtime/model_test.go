package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/runtime"
)

const (
	lmV    = 13 // vocabulary
	lmD    = 8  // width
	lmH    = 2  // heads
	lmMaxT = 16 // positions
	lmEOS  = 12
)

// tinyLM builds a one-block causal transformer with a tied LM head. With
// rpa set, each length gets its own constant [T,T] attention bias (as a
// folded RPA prior), so the logits depend on the graph's length T.
func tinyLM(rpa bool) func(B, T int) *ir.Graph {
	return func(B, T int) *ir.Graph {
		g := ir.New(fmt.Sprintf("tiny_T%d", T))
		D, H := lmD, lmH
		dh := D / H
		p := func(name string, s ...int) *ir.Value { return g.Param(name, ir.Shape(s)) }
		ids := g.Input("input_ids", ir.Shape{B, T}, ir.I32)
		E := p("tok_emb.weight", lmV, D)
		x := g.Op1("Gather", nil, E, ids)
		x = g.Op1("Add", nil, x, g.Op1("Slice", ir.Attrs{"axis": 0, "start": 0, "end": T}, p("pos_emb.weight", lmMaxT, D)))
		a := g.Op1("LayerNorm", ir.Attrs{"eps": 1e-5}, x, p("ln1.weight", D), p("ln1.bias", D))
		heads := func(v *ir.Value) *ir.Value {
			v = g.Op1("Reshape", ir.Attrs{"shape": []int{B, T, H, dh}}, v)
			return g.Op1("Transpose", ir.Attrs{"perm": []int{0, 2, 1, 3}}, v)
		}
		q := heads(g.Op1("Linear", nil, a, p("attn.Wq.weight", D, D), p("attn.Wq.bias", D)))
		k := heads(g.Op1("Linear", nil, a, p("attn.Wk.weight", D, D)))
		v := heads(g.Op1("Linear", nil, a, p("attn.Wv.weight", D, D), p("attn.Wv.bias", D)))
		s := g.Op1("Scale", ir.Attrs{"alpha": 1 / math.Sqrt(float64(dh))}, g.Op1("MatMul", ir.Attrs{"transB": true}, q, k))
		if rpa {
			bias := make([]float64, T*T)
			for i := 0; i < T; i++ {
				for j := 0; j < T; j++ {
					bias[i*T+j] = 0.5 * math.Cos(float64(i*j+1)/float64(T))
				}
			}
			s = g.Op1("Add", nil, s, g.Const("attn.rpa.B", ir.Shape{T, T}, bias))
		}
		pr := g.Op1("Softmax", nil, g.Op1("CausalMask", nil, s))
		o := g.Op1("MatMul", nil, pr, v)
		o = g.Op1("Reshape", ir.Attrs{"shape": []int{B, T, D}}, g.Op1("Transpose", ir.Attrs{"perm": []int{0, 2, 1, 3}}, o))
		x = g.Op1("Add", nil, x, g.Op1("Linear", nil, o, p("attn.Wo.weight", D, D), p("attn.Wo.bias", D)))
		f := g.Op1("LayerNorm", ir.Attrs{"eps": 1e-5}, x, p("ln2.weight", D), p("ln2.bias", D))
		f = g.Op1("GELU", nil, g.Op1("Linear", nil, f, p("ffn.0.weight", 2*D, D), p("ffn.0.bias", 2*D)))
		x = g.Op1("Add", nil, x, g.Op1("Linear", nil, f, p("ffn.2.weight", D, 2*D), p("ffn.2.bias", D)))
		x = g.Op1("LayerNorm", ir.Attrs{"eps": 1e-5}, x, p("ln_f.weight", D), p("ln_f.bias", D))
		g.SetOutput("logits", g.Op1("Linear", nil, x, E))
		return g
	}
}

var lmWeights = weightSet{scale: 0.8}

func tinyExport(t *testing.T, lengths []int, batch int, mod func(*exportSpec)) string {
	t.Helper()
	dir := t.TempDir()
	s := exportSpec{build: tinyLM(false), lengths: lengths, batch: batch, vocab: lmV, eos: lmEOS, weights: lmWeights}
	if mod != nil {
		mod(&s)
	}
	export(t, dir, s)
	return dir
}

// refLogits evaluates the reference on one sequence with a graph of its own
// length (B=1).
func refLogits(build func(B, T int) *ir.Graph, seq []int32) *tensor {
	return evalGraph(build(1, len(seq)), lmWeights.get, [][]int32{seq})
}

func seqs(lens ...int) [][]int32 {
	out := make([][]int32, len(lens))
	for i, n := range lens {
		out[i] = make([]int32, n)
		for t := range out[i] {
			out[i][t] = int32((7*i + 3*t + t*t) % lmV)
		}
	}
	return out
}

func openT(t *testing.T, dir string, o runtime.Options) *runtime.Model {
	t.Helper()
	m, err := runtime.Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return m
}

// TestLogitsPaddingExact: a batch of 7 sequences of mixed lengths runs on
// graphs of lengths 4, 8 and 16 with batch 2 (padding each to the smallest
// length that holds it, chunking and filling rows); every sequence's logits
// equal the reference computed at its own length.
func TestLogitsPaddingExact(t *testing.T) {
	requireORT(t)
	dir := tinyExport(t, []int{8, 4, 16}, 2, nil)
	m := openT(t, dir, runtime.Options{Threads: 1})
	if got := m.Lengths(); fmt.Sprint(got) != "[4 8 16]" {
		t.Fatalf("Lengths() = %v", got)
	}
	batch := seqs(1, 3, 4, 5, 8, 11, 16)
	got, err := m.Logits(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, seq := range batch {
		checkLogits(t, fmt.Sprintf("seq %d (len %d)", i, len(seq)), got[i], refLogits(tinyLM(false), seq), 0, 1e-4)
	}
}

// TestPaddingDoesNotLeak: with a length-dependent bias the logits of a
// padded sequence are those of the longer graph at the real positions,
// whatever the padding holds.
func TestPaddingDoesNotLeak(t *testing.T) {
	requireORT(t)
	dir := tinyExport(t, []int{8}, 1, func(s *exportSpec) { s.build = tinyLM(true) })
	m := openT(t, dir, runtime.Options{})
	seq := seqs(0, 5)[1]
	got, err := m.Logits(context.Background(), [][]int32{seq})
	if err != nil {
		t.Fatal(err)
	}
	padded := append(append([]int32(nil), seq...), 1, 2, 3)
	want := evalGraph(tinyLM(true)(1, 8), lmWeights.get, [][]int32{padded})
	want.data = want.data[:len(seq)*lmV]
	want.shape = []int{1, len(seq), lmV}
	checkLogits(t, "padded", got[0], want, 0, 1e-4)
}

// TestOpsets runs the tiny model exported at every supported opset.
func TestOpsets(t *testing.T) {
	requireORT(t)
	seq := seqs(0, 6)[1]
	want := refLogits(tinyLM(false), seq)
	for _, opset := range []int64{18, 19, 20, 21, 22, 23, 24, 25, 26} {
		t.Run(fmt.Sprint(opset), func(t *testing.T) {
			dir := tinyExport(t, []int{6}, 1, func(s *exportSpec) { s.opts.Opset = opset })
			m := openT(t, dir, runtime.Options{})
			got, err := m.Logits(context.Background(), [][]int32{seq})
			if err != nil {
				t.Fatal(err)
			}
			checkLogits(t, "logits", got[0], want, 0, 1e-4)
		})
	}
}

// TestExternalData opens an export whose weights live in external data
// files listed in the manifest.
func TestExternalData(t *testing.T) {
	requireORT(t)
	dir := tinyExport(t, []int{4, 8}, 2, func(s *exportSpec) { s.external = true })
	if _, err := os.Stat(filepath.Join(dir, "model_L8.onnx.data")); err != nil {
		t.Fatal(err)
	}
	m := openT(t, dir, runtime.Options{})
	batch := seqs(3, 7)
	got, err := m.Logits(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, seq := range batch {
		checkLogits(t, fmt.Sprint("seq ", i), got[i], refLogits(tinyLM(false), seq), 0, 1e-4)
	}
}

func refNLL(seq []int32) (float64, int) {
	want := refLogits(tinyLM(false), seq)
	var s float64
	for t := 0; t+1 < len(seq); t++ {
		row := want.data[t*lmV : (t+1)*lmV]
		mx := math.Inf(-1)
		for _, x := range row {
			mx = math.Max(mx, x)
		}
		z := 0.0
		for _, x := range row {
			z += math.Exp(x - mx)
		}
		s += math.Log(z) + mx - row[seq[t+1]]
	}
	return s, len(seq) - 1
}

func TestScore(t *testing.T) {
	requireORT(t)
	dir := tinyExport(t, []int{4, 8}, 2, nil)
	m := openT(t, dir, runtime.Options{})
	batch := seqs(1, 4, 6, 8, 2)
	res, err := m.Score(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	var nll float64
	var n int
	for _, seq := range batch {
		s, k := refNLL(seq)
		nll += s
		n += k
	}
	if res.Tokens != n {
		t.Fatalf("scored %d tokens, want %d", res.Tokens, n)
	}
	if math.Abs(res.MeanCE-nll/float64(n)) > 1e-4 || math.Abs(res.Perplexity-math.Exp(nll/float64(n))) > 1e-3*res.Perplexity {
		t.Fatalf("score %+v, reference mean CE %v", res, nll/float64(n))
	}
	if _, err := m.Score(context.Background(), [][]int32{{1}}); err == nil {
		t.Fatal("scoring a single token: no error")
	}
}

// byteTok maps each byte to an id (mod the vocabulary) and back to 'a'+id.
type byteTok struct{}

func (byteTok) Encode(s string) []int32 {
	out := make([]int32, len(s))
	for i := range len(s) {
		out[i] = int32(s[i]) % (lmV - 1)
	}
	return out
}

func (byteTok) Decode(ids []int32) string {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte('a' + id)
	}
	return string(b)
}

func TestScoreTextWindows(t *testing.T) {
	requireORT(t)
	dir := tinyExport(t, []int{4, 8}, 2, nil)
	m := openT(t, dir, runtime.Options{Tokenizer: byteTok{}})
	text := "the quick brown fox jumps"
	ids := byteTok{}.Encode(text)
	res, err := m.ScoreText(context.Background(), text)
	if err != nil {
		t.Fatal(err)
	}
	if res.Tokens != len(ids)-1 {
		t.Fatalf("ScoreText scored %d tokens, want every token after the first (%d)", res.Tokens, len(ids)-1)
	}
	var nll float64
	for s := 0; s+1 < len(ids); s += 7 {
		x, _ := refNLL(ids[s:min(s+8, len(ids))])
		nll += x
	}
	if math.Abs(res.NLL-nll) > 1e-3 {
		t.Fatalf("ScoreText NLL %v, reference %v", res.NLL, nll)
	}
	m2 := openT(t, dir, runtime.Options{})
	if _, err := m2.ScoreText(context.Background(), text); err == nil || !strings.Contains(err.Error(), "Tokenizer") {
		t.Fatalf("ScoreText without tokenizer: %v", err)
	}
}

// TestGenerateGreedy checks greedy decoding against the reference,
// including the sliding window once the context passes the longest length.
func TestGenerateGreedy(t *testing.T) {
	requireORT(t)
	dir := tinyExport(t, []int{4, 8}, 2, nil)
	m := openT(t, dir, runtime.Options{Tokenizer: byteTok{}})
	prompt := seqs(0, 6)[1]
	got, err := m.Generate(context.Background(), prompt, runtime.GenerateOptions{MaxNewTokens: 6})
	if err != nil {
		t.Fatal(err)
	}
	seq := append([]int32(nil), prompt...)
	var want []int32
	for len(want) < 6 {
		w := seq[max(0, len(seq)-8):]
		ref := refLogits(tinyLM(false), w)
		row := ref.data[(len(w)-1)*lmV : len(w)*lmV]
		best := 0
		for i, x := range row {
			if x > row[best] {
				best = i
			}
		}
		seq = append(seq, int32(best))
		want = append(want, int32(best))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("greedy tokens %v, reference %v", got, want)
	}

	// Sampling is reproducible from the seed; TopK 1 is greedy.
	o := runtime.GenerateOptions{MaxNewTokens: 10, Temperature: 1.5, Seed: 42}
	a, err := m.Generate(context.Background(), prompt, o)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := m.Generate(context.Background(), prompt, o)
	if fmt.Sprint(a) != fmt.Sprint(b) || len(a) != 10 {
		t.Fatalf("same seed gave %v and %v", a, b)
	}
	k1, _ := m.Generate(context.Background(), prompt, runtime.GenerateOptions{MaxNewTokens: 6, Temperature: 2, TopK: 1, Seed: 3})
	if fmt.Sprint(k1) != fmt.Sprint(want) {
		t.Fatalf("TopK 1 gave %v, greedy %v", k1, want)
	}
	// Empty prompt starts from EOS.
	if out, err := m.Generate(context.Background(), nil, runtime.GenerateOptions{MaxNewTokens: 2}); err != nil || len(out) != 2 {
		t.Fatalf("empty prompt: %v %v", out, err)
	}
	text, err := m.GenerateText(context.Background(), "abc", runtime.GenerateOptions{MaxNewTokens: 3})
	if err != nil || len(text) != 3 {
		t.Fatalf("GenerateText: %q %v", text, err)
	}
}

func TestConcurrentUse(t *testing.T) {
	requireORT(t)
	dir := tinyExport(t, []int{4, 8}, 2, nil)
	m := openT(t, dir, runtime.Options{Parallel: 2, Threads: 1})
	batch := seqs(2, 5, 8)
	want, err := m.Logits(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := m.Logits(context.Background(), batch)
			if err != nil {
				errs <- err
				return
			}
			for j := range got {
				for k := range got[j].Data {
					if got[j].Data[k] != want[j].Data[k] {
						errs <- fmt.Errorf("seq %d differs under concurrency", j)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one mentioning %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not mention %q", err, p)
		}
	}
}

func TestInputErrors(t *testing.T) {
	requireORT(t)
	dir := tinyExport(t, []int{4, 8}, 2, nil)
	m, err := runtime.Open(dir, runtime.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err = m.Logits(ctx, [][]int32{{1, 2}, {1, lmV, 2}})
	wantErr(t, err, "token id 13", "[0,13)", "sequence 1 position 1")
	_, err = m.Logits(ctx, [][]int32{{-1}})
	wantErr(t, err, "token id -1")
	_, err = m.Logits(ctx, seqs(9))
	wantErr(t, err, "9 tokens", "[4 8]")
	_, err = m.Logits(ctx, [][]int32{{}})
	wantErr(t, err, "empty")
	_, err = m.Generate(ctx, []int32{lmV + 5}, runtime.GenerateOptions{MaxNewTokens: 1})
	wantErr(t, err, "outside the vocabulary")
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = m.Logits(cctx, seqs(3))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err = m.Logits(ctx, seqs(3))
	wantErr(t, err, "closed")
}

// rewriteManifest applies f to the manifest in dir.
func rewriteManifest(t *testing.T, dir string, f func(*runtime.Manifest)) {
	t.Helper()
	man, err := runtime.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	f(man)
	if err := runtime.WriteManifest(dir, man); err != nil {
		t.Fatal(err)
	}
}

// rehash records the current hash of a changed file in the manifest.
func rehash(t *testing.T, dir, name string) {
	t.Helper()
	rewriteManifest(t, dir, func(m *runtime.Manifest) {
		for i, f := range m.Files {
			if f.Path == name {
				nf, err := runtime.NewFile(dir, name, f.Length)
				if err != nil {
					t.Fatal(err)
				}
				nf.Graph = f.Graph
				m.Files[i] = nf
			}
		}
	})
}

func writeRaw(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestOpenErrors covers folders Open must refuse, each with an error that
// says what is wrong. Cases that fail before onnxruntime is loaded run
// without the library.
func TestOpenErrors(t *testing.T) {
	fresh := func(t *testing.T) string { return tinyExport(t, []int{4}, 1, nil) }
	noORT := []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  []string
	}{
		{"no manifest", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, runtime.ManifestName)) }, []string{"manifest.json not found", "rpac export"}},
		{"manifest not json", func(t *testing.T, dir string) { writeRaw(t, filepath.Join(dir, runtime.ManifestName), "{lengths: [4]") }, []string{"not a valid manifest"}},
		{"manifest format", func(t *testing.T, dir string) {
			rewriteManifestRaw(t, dir, func(m map[string]any) { m["format"] = 7 })
		}, []string{"format 7"}},
		{"no lengths", func(t *testing.T, dir string) {
			rewriteManifestRaw(t, dir, func(m map[string]any) { m["lengths"] = []int{} })
		}, []string{"no lengths"}},
		{"eos outside vocab", func(t *testing.T, dir string) {
			rewriteManifestRaw(t, dir, func(m map[string]any) { m["eos"] = lmV })
		}, []string{"eos 13"}},
		{"length without file", func(t *testing.T, dir string) {
			rewriteManifestRaw(t, dir, func(m map[string]any) { m["lengths"] = []int{4, 8} })
		}, []string{"0 .onnx files for length 8"}},
		{"path escapes folder", func(t *testing.T, dir string) {
			rewriteManifestRaw(t, dir, func(m map[string]any) {
				m["files"].([]any)[0].(map[string]any)["path"] = "../model_L4.onnx"
			})
		}, []string{"relative path inside"}},
		{"missing file", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "model_L4.onnx")) }, []string{"model_L4.onnx", "no such file"}},
		{"hash mismatch", func(t *testing.T, dir string) {
			path := filepath.Join(dir, "model_L4.onnx")
			b, _ := os.ReadFile(path)
			b[len(b)/2] ^= 0x55
			os.WriteFile(path, b, 0o644)
		}, []string{"sha256", "export it again"}},
		{"size mismatch", func(t *testing.T, dir string) {
			f, _ := os.OpenFile(filepath.Join(dir, "model_L4.onnx"), os.O_APPEND|os.O_WRONLY, 0)
			f.Write([]byte{0})
			f.Close()
		}, []string{"bytes, the manifest says"}},
		{"corrupt onnx", func(t *testing.T, dir string) {
			writeRaw(t, filepath.Join(dir, "model_L4.onnx"), "this is not a protobuf \xff\xff\xff\xff")
			rehash(t, dir, "model_L4.onnx")
		}, []string{"not a readable ONNX model"}},
		{"truncated onnx", func(t *testing.T, dir string) {
			path := filepath.Join(dir, "model_L4.onnx")
			b, _ := os.ReadFile(path)
			os.WriteFile(path, b[:len(b)-100], 0o644)
			rehash(t, dir, "model_L4.onnx")
		}, []string{"not a readable ONNX model"}},
		{"length disagrees with graph", func(t *testing.T, dir string) {
			os.Rename(filepath.Join(dir, "model_L4.onnx"), filepath.Join(dir, "model_L5.onnx"))
			rewriteManifestRaw(t, dir, func(m map[string]any) {
				m["lengths"] = []int{5}
				f := m["files"].([]any)[0].(map[string]any)
				f["length"], f["path"] = 5, "model_L5.onnx"
			})
		}, []string{"want a static [B,5]"}},
		{"vocab disagrees with graph", func(t *testing.T, dir string) {
			rewriteManifestRaw(t, dir, func(m map[string]any) { m["vocab_size"] = 50 })
		}, []string{"vocab_size 50"}},
		{"library missing", func(t *testing.T, dir string) {
			if errors.Is(runtime.Available(), runtime.ErrNoCgo) {
				t.Skip("built without cgo")
			}
			t.Setenv("ORT_LIB", filepath.Join(dir, "no", "libonnxruntime.so"))
		}, []string{"onnxruntime library not found", "scripts/fetch-onnxruntime.sh", "ORT_LIB"}},
	}
	for _, c := range noORT {
		t.Run(c.name, func(t *testing.T) {
			dir := fresh(t)
			c.setup(t, dir)
			m, err := runtime.Open(dir, runtime.Options{})
			if err == nil {
				m.Close()
			}
			wantErr(t, err, c.want...)
		})
	}
	t.Run("unknown provider", func(t *testing.T) {
		_, err := runtime.Open(fresh(t), runtime.Options{Provider: "tpu"})
		wantErr(t, err, `unknown provider "tpu"`)
	})
	t.Run("onnxruntime rejects graph", func(t *testing.T) {
		requireORT(t)
		dir := fresh(t)
		path := filepath.Join(dir, "model_L4.onnx")
		mp, err := onnx.Read(path)
		if err != nil {
			t.Fatal(err)
		}
		mp.Graph.Node[len(mp.Graph.Node)-1].OpType = "NoSuchOp"
		if err := onnx.Write(path, mp); err != nil {
			t.Fatal(err)
		}
		rehash(t, dir, "model_L4.onnx")
		_, err = runtime.Open(dir, runtime.Options{})
		wantErr(t, err, "onnxruntime cannot load", "model_L4.onnx")
	})
	t.Run("cuda provider missing", func(t *testing.T) {
		requireORT(t)
		_, err := runtime.Open(fresh(t), runtime.Options{Provider: "cuda"})
		wantErr(t, err, "CUDA provider", "ORT_LIB")
	})
}

func TestLibraryPathMessage(t *testing.T) {
	t.Setenv("ORT_LIB", "")
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	_, err := runtime.LibraryPath("")
	wantErr(t, err, "scripts/fetch-onnxruntime.sh", "ORT_LIB")
	if !errors.Is(err, runtime.ErrNoLibrary) {
		t.Fatalf("error %v is not ErrNoLibrary", err)
	}
	lib := filepath.Join(t.TempDir(), "libonnxruntime.so.1")
	writeRaw(t, lib, "")
	t.Setenv("ORT_LIB", lib)
	if p, err := runtime.LibraryPath(""); err != nil || p != lib {
		t.Fatalf("LibraryPath with ORT_LIB: %q %v", p, err)
	}
	t.Setenv("ORT_LIB", "")
	cached := runtime.CachedLibraryPath()
	os.MkdirAll(filepath.Dir(cached), 0o755)
	writeRaw(t, cached, "")
	if p, err := runtime.LibraryPath(""); err != nil || p != cached {
		t.Fatalf("LibraryPath from cache: %q %v", p, err)
	}
}

// rewriteManifestRaw edits the manifest as JSON, so that it can be made
// invalid.
func rewriteManifestRaw(t *testing.T, dir string, f func(map[string]any)) {
	t.Helper()
	path := filepath.Join(dir, runtime.ManifestName)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	f(m)
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	writeRaw(t, path, string(b))
}
