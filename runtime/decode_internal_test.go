package runtime

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// fakeKV is a KV-cache graph in plain Go over one layer of one head of size
// 1 whose cache holds each position's token id; its logits at a position
// are those of fakeRunner (the running sum of the ids times v+1), computed
// from the cache. It counts its runs.
type fakeKV struct {
	graph GraphKind
	V     int
	mu    sync.Mutex
	runs  int
}

func (f *fakeKV) run(ctx context.Context, in, out []tensorArg) error {
	f.mu.Lock()
	f.runs++
	f.mu.Unlock()
	ids := in[0].i64
	logits, key, val := out[0].f32, out[1].f32, out[2].f32
	if f.graph == GraphPrefill { // logits after the last token only, as the graph has it
		s := int64(0)
		for t, id := range ids {
			s += id
			key[t], val[t] = float32(id), float32(id)
		}
		for v := 0; v < f.V; v++ {
			logits[v] = float32(s) * float32(v+1)
		}
		return nil
	}
	pos, past := in[1].i64, in[2].f32
	S := int(in[2].shape[2])
	copy(key, past)
	copy(val, past)
	for b := range ids {
		p := int(pos[b])
		key[b*S+p], val[b*S+p] = float32(ids[b]), float32(ids[b])
		var s float32
		for j := 0; j <= p; j++ {
			s += key[b*S+j]
		}
		for v := 0; v < f.V; v++ {
			logits[b*f.V+v] = s * float32(v+1)
		}
	}
	return nil
}

func (f *fakeKV) close() error { return nil }

// fakeKVModel is fakeModel with KV-cache graphs at every length.
func fakeKVModel(V, eos int, lengths ...int) (*Model, map[int]*fakeRunner, map[int]*kvGraphs) {
	m, runners := fakeModel(V, eos, 1, lengths...)
	m.man.KVCache = NewKVCache(1, 1, 1, lengths)
	m.kv = map[int]*kvGraphs{}
	for _, L := range lengths {
		m.kv[L] = &kvGraphs{prefill: &fakeKV{graph: GraphPrefill, V: V}, decode: &fakeKV{graph: GraphDecode, V: V}}
	}
	return m, runners, m.kv
}

// TestGenerateUsesCache: with KV-cache graphs Generate runs one prefill and
// one decode step per token after the first, at the smallest length that
// holds prompt and new tokens, never the full graph; the tokens are those
// of the full graph's path; an EOS stops both; without room in any length
// it falls back to the sliding full graph.
func TestGenerateUsesCache(t *testing.T) {
	const V, eos = 5, 4
	ctx := context.Background()
	m, runners, kv := fakeKVModel(V, eos, 4, 16)
	o := GenerateOptions{MaxNewTokens: 6, Temperature: 1, Seed: 3}
	cached, err := m.Generate(ctx, []int32{1, 2}, o)
	if err != nil {
		t.Fatal(err)
	}
	pre, dec := kv[16].prefill.(*fakeKV), kv[16].decode.(*fakeKV)
	if pre.runs != 1 || dec.runs != 5 || len(runners[4].inputs)+len(runners[16].inputs) != 0 {
		t.Fatalf("prefill runs %d, decode runs %d, full-graph runs %d/%d; want 1, 5, 0/0",
			pre.runs, dec.runs, len(runners[4].inputs), len(runners[16].inputs))
	}
	if kv[4].prefill.(*fakeKV).runs != 0 {
		t.Fatal("length 4 ran, which cannot hold 2+6 tokens")
	}
	o.Recompute = true
	full, err := m.Generate(ctx, []int32{1, 2}, o)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(cached) != fmt.Sprint(full) {
		t.Fatalf("cached %v, full graph %v", cached, full)
	}
	if len(runners[16].inputs) != 6 || len(runners[4].inputs) != 0 {
		t.Fatalf("the full-graph path ran %d times at 16 and %d at 4; want 6 and 0 (one length for the whole generation)", len(runners[16].inputs), len(runners[4].inputs))
	}
	// Greedy picks the last id (largest logit when the sum is positive): EOS
	// stops the cached path after one token, without a decode step.
	got, err := m.Generate(ctx, []int32{1}, GenerateOptions{MaxNewTokens: 5, StopAtEOS: true})
	if err != nil || fmt.Sprint(got) != "[4]" || dec.runs != 5 {
		t.Fatalf("greedy with EOS: %v, %v, decode runs %d", got, err, dec.runs)
	}
	// 15 + 2 tokens fit no length: the full graph slides.
	n16 := len(runners[16].inputs)
	if _, err := m.Generate(ctx, make([]int32, 15), GenerateOptions{MaxNewTokens: 2}); err != nil {
		t.Fatal(err)
	}
	if len(runners[16].inputs) != n16+2 || pre.runs != 2 {
		t.Fatalf("too long for the cache: %d full-graph runs, %d prefills", len(runners[16].inputs)-n16, pre.runs)
	}
	if got, err := m.Generate(ctx, []int32{1}, GenerateOptions{}); err != nil || len(got) != 0 {
		t.Fatalf("no new tokens: %v, %v", got, err)
	}
}

func TestManifestKVCache(t *testing.T) {
	good := func() Manifest {
		return Manifest{Format: 1, Lengths: []int{4, 8}, VocabSize: 10, EOS: 9, Files: []File{
			{Length: 4, Path: "model_L4.onnx", SHA256: strings.Repeat("ab", 32)},
			{Length: 8, Path: "model_L8.onnx", SHA256: strings.Repeat("cd", 32)},
			{Length: 8, Path: "model_L8.prefill.onnx", SHA256: strings.Repeat("cd", 32), Graph: GraphPrefill},
			{Length: 8, Path: "model_L8.decode.onnx", SHA256: strings.Repeat("cd", 32), Graph: GraphDecode},
			{Length: 8, Path: "model_L8.decode.onnx.data", SHA256: strings.Repeat("cd", 32), Graph: GraphDecode},
		}, KVCache: NewKVCache(2, 3, 4, []int{8})}
	}
	m := good()
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	if f, ok := m.ModelFile(8); !ok || f.Path != "model_L8.onnx" {
		t.Fatalf("ModelFile(8) = %v, %v", f, ok)
	}
	if f, ok := m.GraphFile(8, GraphDecode); !ok || f.Path != "model_L8.decode.onnx" {
		t.Fatalf("GraphFile(8, decode) = %v, %v", f, ok)
	}
	if !m.HasKVCache(8) || m.HasKVCache(4) {
		t.Fatal("HasKVCache")
	}
	for _, c := range []struct {
		edit func(*Manifest)
		want string
	}{
		{func(m *Manifest) { m.KVCache = nil }, "no kv_cache record"},
		{func(m *Manifest) { m.Files[3].Graph = "verify" }, `unknown graph "verify"`},
		{func(m *Manifest) { m.Files = m.Files[:3] }, "0 decode graphs for length 8"},
		{func(m *Manifest) { m.Files[2].Graph = GraphDecode }, "0 prefill graphs"},
		{func(m *Manifest) { m.KVCache.Lengths = []int{4, 8} }, "prefill graphs for length 4"},
		{func(m *Manifest) { m.KVCache.Lengths = []int{16} }, "length 16 is not an exported length"},
		{func(m *Manifest) { m.KVCache.Lengths = nil }, "which kv_cache does not list"},
		{func(m *Manifest) { m.KVCache.PastKeyNames = "past.%d.k" }, "past.%d.k"},
		{func(m *Manifest) { m.KVCache.PastKeyNames = "past_key_values.%d.key" }, "re-export with `rpac export --kv-cache`"},
		{func(m *Manifest) { m.KVCache.PresentKeyNames = "present.%d.key" }, "re-export with `rpac export --kv-cache`"},
		{func(m *Manifest) { m.KVCache.Layout = "paged" }, `layout "paged"`},
		{func(m *Manifest) { m.KVCache.Heads = 0 }, "0 heads"},
		{func(m *Manifest) { m.Files[1].Graph = GraphPrefill }, "0 .onnx files for length 8"},
	} {
		m := good()
		c.edit(&m)
		if err := m.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want %q", err, c.want)
		}
	}
}
