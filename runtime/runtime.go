// Package runtime runs models exported by `rpac export` in onnxruntime. It is
// what services import: it holds no training code and depends only on the
// standard library and github.com/yalue/onnxruntime_go.
//
// An export folder holds one ONNX graph per context length and a
// manifest.json (see Manifest). Open verifies the files against the
// manifest's hashes and opens one onnxruntime session per length; Logits,
// Score and Generate then accept token id sequences of any length up to the
// longest exported one:
//
//	m, err := runtime.Open("export/", runtime.Options{})
//	if err != nil { ... }
//	defer m.Close()
//	out, err := m.Logits(ctx, [][]int32{ids})
//
// A sequence is right-padded with EOS to the smallest exported length that
// holds it and its logits are cut back to its own length; the exported
// graphs are causal, so padding never changes the logits of real positions.
// The graphs have a static batch size; larger batches run in chunks and
// smaller ones are filled with padding rows.
//
// An export written with `rpac export --kv-cache` also holds, per length, a
// prefill and a decode graph: Model.NewDecoder returns a KV cache over them
// (Decoder: Prefill, batched Step, Release), and Generate decodes on it.
//
// The onnxruntime shared library is found through Options.Library, then
// $ORT_LIB, then the cache path of scripts/fetch-onnxruntime.sh. A binary
// built without cgo compiles but Open returns an error saying so.
//
// A Model is safe for concurrent use.
package runtime

import (
	"github.com/rpac-dev/rpac/internal/sysmem"
	"github.com/rpac-dev/rpac/runtime/manifest"

	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// Tokenizer turns text into token ids and back (used by ScoreText and
// GenerateText; the other methods take ids).
type Tokenizer interface {
	Encode(text string) []int32
	Decode(ids []int32) string
}

// Options configure Open.
type Options struct {
	// Provider is the execution provider: "" or "cpu" (default), or "cuda".
	// "cuda" needs an onnxruntime build with the CUDA provider (set ORT_LIB);
	// the library fetched by scripts/fetch-onnxruntime.sh is CPU-only.
	Provider string
	// DeviceID is the CUDA device (Provider "cuda").
	DeviceID int
	// Threads is onnxruntime's intra-op thread count per session
	// (0: onnxruntime's default, one per core).
	Threads int
	// Parallel is how many runs of one length's session may execute at
	// once, each with its own input and output buffers (default 1: calls on
	// the same length wait for each other).
	Parallel int
	// AllowNonFiniteWeights skips the check that refuses a model whose
	// float32 initializers hold NaN or +Inf (a diverged training run);
	// only tests of NaN semantics want it.
	AllowNonFiniteWeights bool
	// Library is the path of libonnxruntime.so (default: $ORT_LIB, then the
	// fetch script's cache path).
	Library string
	// Tokenizer is used by ScoreText and GenerateText.
	Tokenizer Tokenizer
}

// runner executes one exported graph: fill writes the [B,L] input ids,
// read sees the [B,L,V] logits; both are called while the run holds its
// buffers.
type runner interface {
	run(ctx context.Context, fill func(ids []int64), read func(logits []float32)) error
	close() error
}

// backend creates runners and owns the onnxruntime environment reference.
type backend interface {
	newRunner(path string, batch, length, vocab int) (runner, error)
	close() error
}

type graph struct {
	length, batch int
	r             runner
}

// Model is an opened export.
type Model struct {
	dir    string
	man    Manifest
	graphs []graph // by increasing length
	tok    Tokenizer
	be     backend

	mu     sync.RWMutex // runs hold it shared, Close exclusively
	closed bool

	kvMu sync.Mutex        // guards kv
	kv   map[int]*kvGraphs // KV-cache sessions by length, opened on first use
}

// Open opens the export in dir: it reads and validates manifest.json,
// checks every file's size and sha256, and opens one onnxruntime session
// per exported length.
func Open(dir string, opts Options) (*Model, error) {
	return OpenContext(context.Background(), dir, opts)
}

// OpenContext is Open that gives up, with ctx's error, when ctx ends
// (checked between files and between sessions: hashing and loading a large
// export take seconds).
func OpenContext(ctx context.Context, dir string, opts Options) (*Model, error) {
	man, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	switch strings.ToLower(opts.Provider) {
	case "", "cpu", "cuda":
	default:
		return nil, fmt.Errorf("runtime: unknown provider %q (want \"cpu\" or \"cuda\")", opts.Provider)
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 1
	}
	if opts.Threads < 0 {
		return nil, fmt.Errorf("runtime: Threads %d is negative", opts.Threads)
	}
	if err := man.VerifyFilesContext(ctx, dir); err != nil {
		return nil, err
	}
	type plan struct {
		path          string
		length, batch int
	}
	var plans []plan
	for _, L := range man.SortedLengths() {
		f, _ := man.ModelFile(L)
		path := filepath.Join(dir, filepath.FromSlash(f.Path))
		B, err := checkIO(path, L, man.VocabSize, scanOf(dir, man, f, !opts.AllowNonFiniteWeights))
		if err != nil {
			return nil, err
		}
		plans = append(plans, plan{path, L, B})
	}
	if err := checkKVFiles(dir, man, !opts.AllowNonFiniteWeights); err != nil {
		return nil, err
	}
	be, err := openBackend(opts)
	if err != nil {
		return nil, err
	}
	m := &Model{dir: dir, man: *man, tok: opts.Tokenizer, be: be}
	for _, p := range plans {
		if err := ctx.Err(); err != nil {
			m.Close()
			return nil, fmt.Errorf("runtime: opening %s: %w", dir, err)
		}
		r, err := be.newRunner(p.path, p.batch, p.length, man.VocabSize)
		if err != nil {
			m.Close()
			return nil, err
		}
		m.graphs = append(m.graphs, graph{p.length, p.batch, r})
	}
	return m, nil
}

// Check applies every check Open applies to the export in dir (manifest,
// file hashes, links, each graph's declared input and output, size bounds
// and finite weights) without loading onnxruntime.
func Check(ctx context.Context, dir string) error {
	man, err := ReadManifest(dir)
	if err != nil {
		return err
	}
	if err := man.VerifyFilesContext(ctx, dir); err != nil {
		return err
	}
	for _, L := range man.SortedLengths() {
		f, _ := man.ModelFile(L)
		if _, err := checkIO(filepath.Join(dir, filepath.FromSlash(f.Path)), L, man.VocabSize, newScan(dir, man, f)); err != nil {
			return err
		}
	}
	return checkKVFiles(dir, man, true)
}

// scanOf is the tensor check of manifest file f (nil when scan is off).
func scanOf(dir string, man *Manifest, f File, scan bool) *scanConfig {
	if !scan {
		return nil
	}
	return newScan(dir, man, f)
}

// ioError reports a graph file that failed to read or whose tensors were
// refused.
func ioError(path string, err error) error {
	if errors.Is(err, errNonFinite) || errors.Is(err, errBadTensor) {
		return fmt.Errorf("runtime: %s: %w; export it again from a sound checkpoint", path, err)
	}
	return fmt.Errorf("runtime: %s is not a readable ONNX model (%v); export it again", path, err)
}

// checkIO checks a graph's declared input and output against the manifest
// and returns its batch size.
func checkIO(path string, L, V int, sc *scanConfig) (int, error) {
	in, out, err := readIOScan(path, sc)
	if err != nil {
		return 0, ioError(path, err)
	}
	if len(in) != 1 || in[0].Name != "input_ids" || in[0].Elem != onnxInt64 || len(in[0].Dims) != 2 {
		return 0, fmt.Errorf("runtime: %s: want one input input_ids int64 [B,%d], have %s", path, L, describeIO(in))
	}
	B, T := in[0].Dims[0], in[0].Dims[1]
	if B <= 0 || T != int64(L) {
		return 0, fmt.Errorf("runtime: %s: input_ids is %s, want a static [B,%d]", path, describeIO(in), L)
	}
	var logits *ioInfo
	for i := range out {
		if out[i].Name == "logits" {
			logits = &out[i]
		}
	}
	if logits == nil || logits.Elem != onnxFloat || len(logits.Dims) != 3 ||
		logits.Dims[0] != B || logits.Dims[1] != T || logits.Dims[2] != int64(V) {
		return 0, fmt.Errorf("runtime: %s: want output logits float [%d,%d,%d] (vocab_size %d from the manifest), have %s", path, B, L, V, V, describeIO(out))
	}
	if err := checkSizes(path, B, int64(L), int64(V)); err != nil {
		return 0, err
	}
	return int(B), nil
}

// Bounds on what a file may declare: far above any real export, far below
// what would overflow or exhaust memory before a call.
const (
	MaxBatch  = manifest.MaxBatch
	MaxLength = manifest.MaxLength
	MaxVocab  = manifest.MaxVocab
)

// checkSizes bounds the sizes a file declares before anything is allocated:
// the batch, length and vocabulary limits, and one call's logits buffer
// against the memory available.
func checkSizes(path string, B, L, V int64) error {
	switch {
	case B > MaxBatch:
		return fmt.Errorf("runtime: %s declares a batch of %d, more than %d; export it again with a smaller --batch", path, B, MaxBatch)
	case L > MaxLength:
		return fmt.Errorf("runtime: %s declares a length of %d, more than %d", path, L, MaxLength)
	case V > MaxVocab:
		return fmt.Errorf("runtime: %s declares a vocabulary of %d, more than %d", path, V, MaxVocab)
	}
	need := 4 * B * L * V // one call's logits
	if avail, err := sysmem.Available(); err == nil && need > avail/2 {
		return fmt.Errorf("runtime: %s: one call's logits ([%d,%d,%d] float32, %.1f GiB) would take more than half of the %.1f GiB of memory available; export it again with a smaller --batch",
			path, B, L, V, float64(need)/(1<<30), float64(avail)/(1<<30))
	}
	return nil
}

func describeIO(vs []ioInfo) string {
	if len(vs) == 0 {
		return "none"
	}
	parts := make([]string, len(vs))
	for i, v := range vs {
		dims := make([]string, len(v.Dims))
		for j, d := range v.Dims {
			if d < 0 {
				dims[j] = "?"
			} else {
				dims[j] = fmt.Sprint(d)
			}
		}
		parts[i] = fmt.Sprintf("%s type%d [%s]", v.Name, v.Elem, strings.Join(dims, ","))
	}
	return strings.Join(parts, ", ")
}

// Close releases every onnxruntime resource of the model (sessions,
// tensors, the environment reference). It waits for runs in progress.
func (m *Model) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	errs := []error{m.closeKV()}
	for _, g := range m.graphs {
		errs = append(errs, g.r.close())
	}
	m.graphs = nil
	if m.be != nil {
		errs = append(errs, m.be.close())
	}
	return errors.Join(errs...)
}

// Lengths returns the exported context lengths in increasing order.
func (m *Model) Lengths() []int { return m.man.SortedLengths() }

// MaxLength is the longest exported length.
func (m *Model) MaxLength() int {
	l := m.man.SortedLengths()
	return l[len(l)-1]
}

// VocabSize is the number of token ids (and logit columns).
func (m *Model) VocabSize() int { return m.man.VocabSize }

// EOS is the end-of-sequence id (also the padding id).
func (m *Model) EOS() int32 { return int32(m.man.EOS) }

// Manifest returns a copy of the export's manifest.
func (m *Model) Manifest() Manifest {
	c := m.man
	c.Lengths = append([]int(nil), m.man.Lengths...)
	c.Files = append([]File(nil), m.man.Files...)
	if m.man.KVCache != nil {
		k := *m.man.KVCache
		k.Lengths = append([]int(nil), k.Lengths...)
		c.KVCache = &k
	}
	return c
}

// Logits holds the logits of one sequence: row t (the distribution of the
// token after position t) is Data[t*Vocab : (t+1)*Vocab].
type Logits struct {
	Len, Vocab int
	Data       []float32
}

// Row returns the logits at position t.
func (l Logits) Row(t int) []float32 { return l.Data[t*l.Vocab : (t+1)*l.Vocab] }

// Logits runs the model on a batch of id sequences (each at most
// MaxLength long) and returns each sequence's logits.
func (m *Model) Logits(ctx context.Context, batch [][]int32) ([]Logits, error) {
	out := make([]Logits, len(batch))
	V := m.man.VocabSize
	err := m.forEach(ctx, batch, func(i int, logits []float32) error {
		n := len(batch[i])
		out[i] = Logits{Len: n, Vocab: V, Data: append([]float32(nil), logits[:n*V]...)}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// lengthFor is the smallest exported graph that holds n tokens.
func (m *Model) graphFor(n int) *graph {
	for i := range m.graphs {
		if m.graphs[i].length >= n {
			return &m.graphs[i]
		}
	}
	return nil
}

// validate checks a batch against the model's lengths and vocabulary.
func (m *Model) validate(batch [][]int32) error {
	V := int32(m.man.VocabSize)
	maxL := m.MaxLength()
	for i, seq := range batch {
		if len(seq) == 0 {
			return fmt.Errorf("runtime: sequence %d is empty", i)
		}
		if len(seq) > maxL {
			return fmt.Errorf("runtime: sequence %d has %d tokens; the exported lengths are %v, so at most %d fit (export a longer length, or split the input)", i, len(seq), m.Lengths(), maxL)
		}
		for t, id := range seq {
			if id < 0 || id >= V {
				return fmt.Errorf("runtime: sequence %d position %d: token id %d is outside the vocabulary [0,%d)", i, t, id, V)
			}
		}
	}
	return nil
}

// forEach runs the batch and calls fn with each sequence's logits rows
// (at least len(batch[i])·V values, valid while fn runs).
func (m *Model) forEach(ctx context.Context, batch [][]int32, fn func(i int, logits []float32) error) error {
	return m.forEachAt(ctx, batch, 0, fn)
}

// forEachAt is forEach on graphs of at least minLen (at most MaxLength).
func (m *Model) forEachAt(ctx context.Context, batch [][]int32, minLen int, fn func(i int, logits []float32) error) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return errors.New("runtime: the model is closed")
	}
	if err := m.validate(batch); err != nil {
		return err
	}
	groups := map[*graph][]int{}
	var order []*graph
	for i, seq := range batch {
		g := m.graphFor(max(len(seq), min(minLen, m.MaxLength())))
		if groups[g] == nil {
			order = append(order, g)
		}
		groups[g] = append(groups[g], i)
	}
	sort.Slice(order, func(a, b int) bool { return order[a].length < order[b].length })
	V := m.man.VocabSize
	eos := int64(m.man.EOS)
	for _, g := range order {
		idx := groups[g]
		L, B := g.length, g.batch
		for start := 0; start < len(idx); start += B {
			if err := ctx.Err(); err != nil {
				return err
			}
			rows := idx[start:min(start+B, len(idx))]
			var ferr error
			fill := func(ids []int64) {
				for r := 0; r < B; r++ {
					dst := ids[r*L : (r+1)*L]
					n := 0
					if r < len(rows) {
						for t, id := range batch[rows[r]] {
							dst[t] = int64(id)
						}
						n = len(batch[rows[r]])
					}
					for t := n; t < L; t++ {
						dst[t] = eos
					}
				}
			}
			read := func(logits []float32) {
				for r, i := range rows {
					if ferr != nil {
						return
					}
					ferr = fn(i, logits[r*L*V:(r+1)*L*V])
				}
			}
			if err := g.r.run(ctx, fill, read); err != nil {
				return err
			}
			if ferr != nil {
				return ferr
			}
		}
	}
	return nil
}

// ScoreResult is the next-token cross-entropy of a batch.
type ScoreResult struct {
	Tokens     int     // next-token predictions scored
	NLL        float64 // summed negative log-likelihood, nats
	MeanCE     float64 // NLL / Tokens
	Perplexity float64 // exp(MeanCE)
}

// Score returns the mean cross-entropy and perplexity of the next-token
// predictions of every sequence (position t predicts token t+1; each
// sequence is one context of at most MaxLength tokens).
func (m *Model) Score(ctx context.Context, batch [][]int32) (ScoreResult, error) {
	var res ScoreResult
	V := m.man.VocabSize
	err := m.forEach(ctx, batch, func(i int, logits []float32) error {
		if seq := batch[i]; len(seq) > 1 {
			res.NLL += SumNLL(logits, V, seq[1:])
			res.Tokens += len(seq) - 1
		}
		return nil
	})
	if err != nil {
		return ScoreResult{}, err
	}
	if res.Tokens == 0 {
		return ScoreResult{}, errors.New("runtime: nothing to score: every sequence has fewer than two tokens")
	}
	res.MeanCE = res.NLL / float64(res.Tokens)
	res.Perplexity = math.Exp(res.MeanCE)
	return res, nil
}

// ScoreText tokenizes text with Options.Tokenizer and scores it. A text
// longer than MaxLength is scored in windows of MaxLength tokens that
// overlap by one token, so every token after the first is predicted exactly
// once (with the context restarting at each window).
func (m *Model) ScoreText(ctx context.Context, text string) (ScoreResult, error) {
	if m.tok == nil {
		return ScoreResult{}, errors.New("runtime: ScoreText needs a tokenizer: set Options.Tokenizer")
	}
	ids := m.tok.Encode(text)
	if len(ids) < 2 {
		return ScoreResult{}, fmt.Errorf("runtime: text has %d tokens; scoring needs at least two", len(ids))
	}
	L := m.MaxLength()
	var windows [][]int32
	if L < 2 {
		return ScoreResult{}, fmt.Errorf("runtime: the longest exported length is %d; scoring needs at least 2", L)
	}
	for s := 0; s+1 < len(ids); s += L - 1 {
		windows = append(windows, ids[s:min(s+L, len(ids))])
	}
	return m.Score(ctx, windows)
}

// GenerateOptions control sampling.
type GenerateOptions struct {
	MaxNewTokens int
	// Temperature divides the logits; 0 (or less) is greedy decoding
	// (argmax, lower id on ties).
	Temperature float64
	// TopK keeps only the K most likely tokens (0: all).
	TopK int
	// Seed seeds the sampler: the same seed, prompt and options give the
	// same tokens.
	Seed uint64
	// StopAtEOS ends generation after an EOS token (which is returned).
	StopAtEOS bool
	// Recompute runs the full graph for every new token even when the
	// export has KV-cache graphs (for parity checks and benchmarks).
	Recompute bool
}

// Generate samples up to MaxNewTokens tokens after prompt and returns them.
// An empty prompt starts from EOS. A generation runs at one length T, the
// smallest exported length that holds the prompt plus MaxNewTokens
// (LengthFor): with the KV cache when the export has one for T (a prefill
// and one decode step per further token), else by running the full graph
// of length T for every token. When no length holds them, the full graph
// of MaxLength runs and the context slides: the model sees the last
// MaxLength tokens.
func (m *Model) Generate(ctx context.Context, prompt []int32, o GenerateOptions) ([]int32, error) {
	if o.MaxNewTokens < 0 {
		return nil, fmt.Errorf("runtime: MaxNewTokens %d is negative", o.MaxNewTokens)
	}
	if o.TopK < 0 {
		return nil, fmt.Errorf("runtime: TopK %d is negative", o.TopK)
	}
	if math.IsNaN(o.Temperature) || math.IsInf(o.Temperature, 0) {
		return nil, fmt.Errorf("runtime: temperature %v is not a finite number", o.Temperature)
	}
	s, err := NewSampler(SampleOptions{Temperature: o.Temperature, TopK: o.TopK}, o.Seed)
	if err != nil {
		return nil, err
	}
	return m.generate(ctx, prompt, o, s)
}

// generate is Generate drawing each token with s (top_k by its O(V)
// selection).
func (m *Model) generate(ctx context.Context, prompt []int32, o GenerateOptions, s *Sampler) ([]int32, error) {
	seq := append([]int32(nil), prompt...)
	if len(seq) == 0 {
		seq = []int32{m.EOS()}
	}
	// Only the last MaxLength tokens are ever fed; validate the prompt ids.
	for t, id := range seq {
		if id < 0 || int(id) >= m.man.VocabSize {
			return nil, fmt.Errorf("runtime: prompt position %d: token id %d is outside the vocabulary [0,%d)", t, id, m.man.VocabSize)
		}
	}
	draw := s.Next
	T, fitErr := m.LengthFor(len(seq) + min(o.MaxNewTokens, m.MaxLength()+1))
	if fitErr == nil && o.MaxNewTokens > 0 && !o.Recompute && m.man.HasKVCache(T) {
		return m.generateCached(ctx, seq, T, o, draw)
	}
	maxL := m.MaxLength()
	V := m.man.VocabSize
	row := make([]float32, V)
	var out []int32
	for len(out) < o.MaxNewTokens {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		window := seq[max(0, len(seq)-maxL):]
		n := len(window)
		err := m.forEachAt(ctx, [][]int32{window}, T, func(_ int, logits []float32) error {
			copy(row, logits[(n-1)*V:n*V])
			return nil
		})
		if err != nil {
			return out, err
		}
		next, err := draw(row)
		if err != nil {
			return out, err
		}
		seq = append(seq, next)
		out = append(out, next)
		if o.StopAtEOS && next == m.EOS() {
			break
		}
	}
	return out, nil
}

// GenerateText tokenizes prompt with Options.Tokenizer, generates, and
// returns the decoded new tokens.
func (m *Model) GenerateText(ctx context.Context, prompt string, o GenerateOptions) (string, error) {
	if m.tok == nil {
		return "", errors.New("runtime: GenerateText needs a tokenizer: set Options.Tokenizer")
	}
	ids, err := m.Generate(ctx, m.tok.Encode(prompt), o)
	if err != nil {
		return "", err
	}
	return m.tok.Decode(ids), nil
}

// sample draws the next token from a logits row at temperature (argmax,
// lower id on ties, at 0 or less). NaN logits are ignored.
func sample(row []float32, temperature float64, rng *rand.Rand) (int32, error) {
	best, bestV := -1, float32(0)
	for i, x := range row {
		if x != x {
			continue
		}
		if best < 0 || x > bestV {
			best, bestV = i, x
		}
	}
	if best < 0 {
		return 0, errors.New("runtime: the model returned only NaN logits")
	}
	if temperature <= 0 {
		return int32(best), nil
	}
	cand := make([]int, 0, len(row))
	for i, x := range row {
		if x == x {
			cand = append(cand, i)
		}
	}
	mx := float64(bestV)
	if math.IsInf(mx, 0) {
		return int32(best), nil
	}
	w := make([]float64, len(cand))
	var sum float64
	for j, i := range cand {
		w[j] = math.Exp((float64(row[i]) - mx) / temperature)
		sum += w[j]
	}
	u := rng.Float64() * sum
	for j, i := range cand {
		u -= w[j]
		if u < 0 {
			return int32(i), nil
		}
	}
	return int32(cand[len(cand)-1]), nil
}
