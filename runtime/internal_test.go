package runtime

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// fakeRunner computes causal "logits" from the ids in plain Go:
// logits[r,t,v] = (Σ_{s≤t} ids[r,s]) · (v+1). It records every input.
type fakeRunner struct {
	B, L, V int
	mu      sync.Mutex
	inputs  [][]int64
}

func (f *fakeRunner) run(ctx context.Context, fill func([]int64), read func([]float32)) error {
	ids := make([]int64, f.B*f.L)
	fill(ids)
	f.mu.Lock()
	f.inputs = append(f.inputs, ids)
	f.mu.Unlock()
	out := make([]float32, f.B*f.L*f.V)
	for r := 0; r < f.B; r++ {
		s := int64(0)
		for t := 0; t < f.L; t++ {
			s += ids[r*f.L+t]
			for v := 0; v < f.V; v++ {
				out[(r*f.L+t)*f.V+v] = float32(s) * float32(v+1)
			}
		}
	}
	read(out)
	return nil
}

func (f *fakeRunner) close() error { return nil }

func fakeModel(V, eos int, B int, lengths ...int) (*Model, map[int]*fakeRunner) {
	m := &Model{man: Manifest{Format: ManifestFormat, Lengths: lengths, VocabSize: V, EOS: eos}}
	runners := map[int]*fakeRunner{}
	for _, L := range m.man.SortedLengths() {
		r := &fakeRunner{B: B, L: L, V: V}
		runners[L] = r
		m.graphs = append(m.graphs, graph{length: L, batch: B, r: r})
	}
	return m, runners
}

func TestForEachPadsAndChunks(t *testing.T) {
	const V, eos = 5, 4
	m, runners := fakeModel(V, eos, 2, 8, 3)
	batch := [][]int32{{1, 2, 3, 0, 1}, {2}, {0, 1}, {3, 3, 3}, {1, 1, 1, 1, 1, 1, 1, 1}}
	got, err := m.Logits(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, seq := range batch {
		if got[i].Len != len(seq) || len(got[i].Data) != len(seq)*V {
			t.Fatalf("seq %d: %d rows", i, got[i].Len)
		}
		s := 0
		for tt, id := range seq {
			s += int(id)
			for v := 0; v < V; v++ {
				if w := float32(s * (v + 1)); got[i].Row(tt)[v] != w {
					t.Fatalf("seq %d logits[%d,%d] = %v, want %v", i, tt, v, got[i].Row(tt)[v], w)
				}
			}
		}
	}
	// Length 3 holds seqs 1, 2, 3 (two runs of batch 2, the second with a
	// padding row); length 8 holds seqs 0 and 4 (one run).
	want3 := "[[2 4 4 0 1 4] [3 3 3 4 4 4]]"
	if got := fmt.Sprint(runners[3].inputs); got != want3 {
		t.Fatalf("length-3 inputs %s, want %s", got, want3)
	}
	want8 := "[[1 2 3 0 1 4 4 4 1 1 1 1 1 1 1 1]]"
	if got := fmt.Sprint(runners[8].inputs); got != want8 {
		t.Fatalf("length-8 inputs %s, want %s", got, want8)
	}
}

func TestValidateInputs(t *testing.T) {
	m, _ := fakeModel(5, 4, 1, 4, 2)
	for _, c := range []struct {
		batch [][]int32
		want  string
	}{
		{[][]int32{{1, 5}}, "token id 5 is outside the vocabulary [0,5)"},
		{[][]int32{{0}, {-2}}, "sequence 1 position 0: token id -2"},
		{[][]int32{{1, 1, 1, 1, 1}}, "5 tokens; the exported lengths are [2 4], so at most 4 fit"},
		{[][]int32{nil}, "sequence 0 is empty"},
	} {
		_, err := m.Logits(context.Background(), c.batch)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.batch, err, c.want)
		}
	}
}

func TestSample(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	nan := float32(math.NaN())
	if id, _ := sample([]float32{1, 3, 3, 2}, 0, rng); id != 1 {
		t.Fatalf("greedy tie: %d, want the lower id 1", id)
	}
	if id, _ := sample([]float32{nan, 1, nan, 2}, 0, rng); id != 3 {
		t.Fatalf("greedy with NaN: %d", id)
	}
	if _, err := sample([]float32{nan, nan}, 0, rng); err == nil {
		t.Fatal("all-NaN logits: no error")
	}
	k1, _ := NewSampler(SampleOptions{Temperature: 1, TopK: 1}, 5)
	if id, _ := k1.Next([]float32{0, 5, 1}); id != 1 {
		t.Fatalf("TopK 1: %d", id)
	}
	// Frequencies follow softmax(logits / T).
	row := []float32{0, float32(math.Log(2)), float32(math.Log(3)), float32(math.Log(4))}
	counts := make([]int, 4)
	const n = 40000
	for i := 0; i < n; i++ {
		id, _ := sample(row, 1, rng)
		counts[id]++
	}
	for i, c := range counts {
		want := float64(i+1) / 10
		if math.Abs(float64(c)/n-want) > 0.01 {
			t.Fatalf("frequency of %d = %v, want %v", i, float64(c)/n, want)
		}
	}
	// TopK 2 keeps ids 3 and 2 only, in ratio 4:3.
	counts = make([]int, 4)
	k2, _ := NewSampler(SampleOptions{Temperature: 1, TopK: 2}, 6)
	for i := 0; i < n; i++ {
		id, _ := k2.Next(row)
		counts[id]++
	}
	if counts[0]+counts[1] != 0 || math.Abs(float64(counts[3])/n-4.0/7) > 0.01 {
		t.Fatalf("TopK 2 counts %v", counts)
	}
}

func TestGenerateSlidingWindow(t *testing.T) {
	m, runners := fakeModel(5, 4, 1, 4, 2)
	// The fake logits grow with v whenever the prefix sum is positive, so
	// greedy decoding always picks id 4.
	out, err := m.Generate(context.Background(), []int32{1, 1, 1}, GenerateOptions{MaxNewTokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(out) != "[4 4 4]" {
		t.Fatalf("generated %v", out)
	}
	// Contexts: [1 1 1] (padded to 4), [1 1 1 4], then the last 4 tokens.
	if got := fmt.Sprint(runners[4].inputs); got != "[[1 1 1 4] [1 1 1 4] [1 1 4 4]]" {
		t.Fatalf("inputs %s", got)
	}
	stop, _ := m.Generate(context.Background(), []int32{1}, GenerateOptions{MaxNewTokens: 5, StopAtEOS: true})
	if fmt.Sprint(stop) != "[4]" {
		t.Fatalf("StopAtEOS: %v", stop)
	}
}

func TestManifestValidate(t *testing.T) {
	good := func() Manifest {
		return Manifest{Format: 1, Lengths: []int{4, 8}, VocabSize: 10, EOS: 9, Files: []File{
			{Length: 4, Path: "model_L4.onnx", SHA256: strings.Repeat("ab", 32)},
			{Length: 8, Path: "model_L8.onnx", SHA256: strings.Repeat("cd", 32)},
			{Length: 8, Path: "model_L8.onnx.data", SHA256: strings.Repeat("ef", 32)},
		}}
	}
	m := good()
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		edit func(*Manifest)
		want string
	}{
		{func(m *Manifest) { m.Format = 2 }, "format 2"},
		{func(m *Manifest) { m.Lengths = append(m.Lengths, 4) }, "length 4 twice"},
		{func(m *Manifest) { m.Lengths[0] = 0 }, "not positive"},
		{func(m *Manifest) { m.VocabSize = 0 }, "vocab_size 0"},
		{func(m *Manifest) { m.EOS = -1 }, "eos -1"},
		{func(m *Manifest) { m.Files[0].Length = 5 }, "not among the lengths"},
		{func(m *Manifest) { m.Files[0].Path = "/abs/model.onnx" }, "relative path"},
		{func(m *Manifest) { m.Files[0].Path = "a/../../model.onnx" }, "relative path"},
		{func(m *Manifest) { m.Files[0].SHA256 = "xyz" }, "64 lower-case hex"},
		{func(m *Manifest) { m.Files[0].SHA256 = strings.Repeat("AB", 32) }, "64 lower-case hex"},
		{func(m *Manifest) { m.Files[1].Path = "model_L8.bin" }, "0 .onnx files for length 8"},
		{func(m *Manifest) { m.Files[2].Path = "model_L8.onnx" }, "twice"},
	} {
		m := good()
		c.edit(&m)
		if err := m.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want %q", err, c.want)
		}
	}
}

// TestReadIORejectsGarbage: malformed files are errors, never a hang; the
// 11-byte file whose graph length is near 2^64 (it used to wrap the read
// offset back to 0 and loop forever) included.
func TestReadIORejectsGarbage(t *testing.T) {
	dir := t.TempDir()
	for i, content := range []string{"", "\x0a", "\x3a\xff\xff\xff\xff\x0f", "hello world",
		"\x3a\xf5\xff\xff\xff\xff\xff\xff\xff\xff\x01", "\x3a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"} {
		path := filepath.Join(dir, fmt.Sprint(i))
		os.WriteFile(path, []byte(content), 0o644)
		if _, _, err := readIO(path, true); err == nil {
			t.Errorf("readIO(%q): no error", content)
		}
	}
}

// TestCheckSizes: sizes a crafted file declares are bounded before any
// allocation (a batch of 2^20 used to pass and then exhaust memory).
func TestCheckSizes(t *testing.T) {
	if err := checkSizes("m.onnx", 1, 128, 50257); err != nil {
		t.Fatalf("a real model refused: %v", err)
	}
	for _, c := range []struct {
		B, L, V int64
		want    string
	}{
		{1 << 20, 128, 50257, "batch"},
		{1, 1 << 20, 50257, "length"},
		{1, 128, 1 << 30, "vocabulary"},
		{4096, 1 << 16, 1 << 20, "memory available"},
	} {
		if err := checkSizes("m.onnx", c.B, c.L, c.V); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("B=%d L=%d V=%d: %v, want an error about the %s", c.B, c.L, c.V, err, c.want)
		}
	}
}

// TestVerifyFilesRefusesLinks: a listed file that is a symbolic link (which
// could point out of the export folder) is refused even when its hash
// matches.
func TestVerifyFilesRefusesLinks(t *testing.T) {
	outside, dir := t.TempDir(), t.TempDir()
	target := filepath.Join(outside, "secret.onnx")
	os.WriteFile(target, []byte("model bytes"), 0o644)
	f, err := NewFile(outside, "secret.onnx", 16)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "secret.onnx")); err != nil {
		t.Fatal(err)
	}
	m := &Manifest{Files: []File{f}}
	if err := m.VerifyFiles(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("a symlinked model file: %v", err)
	}
	if err := m.VerifyFiles(outside); err != nil {
		t.Fatalf("the real file: %v", err)
	}
}

// TestVerifyFilesContext: a cancelled context stops the file checks.
func TestVerifyFilesContext(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "m.onnx"), []byte("x"), 0o644)
	f, err := NewFile(dir, "m.onnx", 16)
	if err != nil {
		t.Fatal(err)
	}
	m := &Manifest{Files: []File{f}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.VerifyFilesContext(ctx, dir); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	if err := m.VerifyFiles(dir); err != nil {
		t.Fatal(err)
	}
}

// TestReadIORefusesNonFiniteWeights: a float32 initializer holding NaN or
// +Inf (a diverged run) is refused, naming it; −Inf (a mask) is allowed.
func TestReadIORefusesNonFiniteWeights(t *testing.T) {
	msg := func(field int, b []byte) []byte { return append([]byte{byte(field<<3 | 2), byte(len(b))}, b...) }
	tensor := func(name string, bits uint32) []byte {
		raw := []byte{byte(bits), byte(bits >> 8), byte(bits >> 16), byte(bits >> 24)}
		t := append([]byte{2<<3 | 0, 1}, msg(8, []byte(name))...) // data_type FLOAT, name
		return append(t, msg(9, raw)...)                          // raw_data
	}
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		bits uint32
		bad  bool
	}{{"w_nan", 0x7fc00000, true}, {"w_inf", 0x7f800000, true}, {"mask", 0xff800000, false}, {"w", 0x3f800000, false}} {
		path := filepath.Join(dir, c.name+".onnx")
		os.WriteFile(path, msg(7, msg(5, tensor(c.name, c.bits))), 0o644)
		_, _, err := readIO(path, true)
		if got := errors.Is(err, errNonFinite); got != c.bad || (c.bad && !strings.Contains(err.Error(), c.name)) {
			t.Errorf("%s: %v", c.name, err)
		}
		if _, _, err := readIO(path, false); errors.Is(err, errNonFinite) {
			t.Errorf("%s: refused without the scan: %v", c.name, err)
		}
	}
}

// TestReadIORefusesNegInfOutsideMasks: −Inf is allowed in a one-element
// tensor and in the strict upper triangle of a causal mask, refused in any
// other tensor (a weight); a float attribute must be finite, but for −Inf in
// a Constant's value_float.
func TestReadIORefusesNegInfOutsideMasks(t *testing.T) {
	const ninf, nan, one = 0xff800000, 0x7fc00000, 0x3f800000
	msg := func(field int, b []byte) []byte { return append([]byte{byte(field<<3 | 2), byte(len(b))}, b...) }
	f32 := func(bits ...uint32) (raw []byte) {
		for _, u := range bits {
			raw = append(raw, byte(u), byte(u>>8), byte(u>>16), byte(u>>24))
		}
		return raw
	}
	tensor := func(name string, dims []byte, bits ...uint32) []byte {
		t := []byte{2<<3 | 0, 1} // data_type FLOAT
		for _, d := range dims {
			t = append(t, 1<<3|0, d)
		}
		t = append(t, msg(8, []byte(name))...)
		return msg(5, append(t, msg(9, f32(bits...))...)) // an initializer
	}
	attr := func(name string, bits uint32) []byte {
		a := append(msg(1, []byte(name)), append([]byte{2<<3 | 5}, f32(bits)...)...) // name, f
		return msg(1, msg(5, a))                                                     // a node holding it
	}
	dir := t.TempDir()
	for _, c := range []struct {
		name  string
		graph []byte
		bad   bool
	}{
		{"scalar fill", tensor("fill", []byte{1}, ninf), false},
		{"causal mask", tensor("attn.causal_mask.T2", []byte{2, 2}, one, ninf, one, one), false},
		{"causal mask [1,1,2,3]", tensor("m", []byte{1, 1, 2, 3}, one, one, ninf, one, one, one), false},
		{"lower triangle", tensor("m_low", []byte{2, 2}, one, one, ninf, one), true},
		{"tok_emb", tensor("tok_emb", []byte{2, 3}, one, one, one, one, ninf, one), true},
		{"vector", tensor("bias_vec", []byte{3}, one, ninf, one), true},
		{"epsilon NaN", attr("epsilon", nan), true},
		{"epsilon -Inf", attr("epsilon", ninf), true},
		{"value_float NaN", attr("value_float", nan), true},
		{"value_float -Inf", attr("value_float", ninf), false},
		{"epsilon", attr("epsilon", one), false},
	} {
		path := filepath.Join(dir, "m.onnx")
		os.WriteFile(path, msg(7, c.graph), 0o644)
		_, _, err := readIO(path, true)
		if got := errors.Is(err, errNonFinite); got != c.bad {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// TestManifestSizeCap: a manifest larger than MaxManifestBytes is refused
// without being read whole.
func TestManifestSizeCap(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(MaxManifestBytes + 1)
	f.Close()
	if _, err := ReadManifest(dir); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("oversized manifest: %v", err)
	}
}
