package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/rpac-dev/rpac/internal/fileio"
	"github.com/rpac-dev/rpac/runtime/manifest"
)

// The Hugging Face export (`rpac export --format hf`): its decoder
// onnx/model.onnx takes input_ids, attention_mask, position_ids and
// past_key_values.{i}.key|value and returns logits at every new position and
// present.{i}.key|value, the past with the new tokens appended (Optimum's
// layout, docs/EXPORT.md). HFModel runs it as transformers.js does: the
// cache grows by the tokens of each call, the attention mask by as many
// ones. It is how Go checks and times that layout; rpac's own Decoder
// (fixed slots) serves rpac's exports.

// HF layout file names (compiler/hf writes them).
const (
	HFModelFile  = "onnx/model.onnx"
	HFConfigFile = "config.json"
)

// maxHFConfig bounds config.json.
const maxHFConfig = 1 << 20

// HFModel is an opened Hugging Face export's decoder.
type HFModel struct {
	be   backend
	sess kvSession
	// Layers, Heads, HeadSize and Vocab are read from the decoder's
	// declared inputs and outputs; Length (max_position_embeddings) from
	// config.json: the most positions a sequence may hold.
	Layers, Heads, HeadSize, Vocab, Length int

	mu     sync.RWMutex
	closed bool
}

// hfIO returns the decoder's input and output names in run order.
func hfIO(layers int) (in, out []string) {
	in = []string{KVInputIDs, manifest.HFAttentionMask, KVPositionIDs}
	out = []string{KVLogits}
	for l := 0; l < layers; l++ {
		in = append(in, fmt.Sprintf(manifest.HFPastKey, l), fmt.Sprintf(manifest.HFPastValue, l))
		out = append(out, fmt.Sprintf(manifest.HFPresentKey, l), fmt.Sprintf(manifest.HFPresentValue, l))
	}
	return in, out
}

// hfShape reads the layers, heads, head size and vocabulary from the
// decoder's declared inputs and outputs, and checks their names.
func hfShape(path string) (layers, heads, hd, vocab int, err error) {
	in, out, err := readIO(path, false)
	if err != nil {
		return 0, 0, 0, 0, ioError(path, err)
	}
	bad := func() error {
		return fmt.Errorf("runtime: %s is not an Optimum-layout decoder (inputs %s, outputs %s); export it with rpac export --format hf", path, describeIO(in), describeIO(out))
	}
	byName := map[string]ioInfo{}
	for _, v := range append(append([]ioInfo(nil), in...), out...) {
		byName[v.Name] = v
	}
	lg, ok := byName[KVLogits]
	k0, ok0 := byName[fmt.Sprintf(manifest.HFPastKey, 0)]
	if !ok || !ok0 || len(lg.Dims) != 3 || lg.Dims[2] < 1 || len(k0.Dims) != 4 || k0.Dims[1] < 1 || k0.Dims[3] < 1 {
		return 0, 0, 0, 0, bad()
	}
	layers = (len(in) - 3) / 2
	names, outs := hfIO(layers)
	if len(in) != len(names) || len(out) != len(outs) || layers < 1 {
		return 0, 0, 0, 0, bad()
	}
	for _, n := range append(names, outs...) {
		if _, ok := byName[n]; !ok {
			return 0, 0, 0, 0, bad()
		}
	}
	return layers, int(k0.Dims[1]), int(k0.Dims[3]), int(lg.Dims[2]), nil
}

// OpenHF opens the decoder of the Hugging Face export in dir (Options'
// Provider, Threads and Library apply).
func OpenHF(dir string, opts Options) (*HFModel, error) {
	var cfg struct {
		Length int `json:"max_position_embeddings"`
	}
	b, err := fileio.ReadBounded(filepath.Join(dir, HFConfigFile), maxHFConfig, func(st fs.FileInfo) error {
		if st.Size() > maxHFConfig {
			return fmt.Errorf("%d bytes, more than %d", st.Size(), maxHFConfig)
		}
		return nil
	})
	if err == nil {
		err = json.Unmarshal(b, &cfg)
	}
	if err != nil || cfg.Length < 1 {
		return nil, fmt.Errorf("runtime: %s: %v (want max_position_embeddings > 0)", filepath.Join(dir, HFConfigFile), err)
	}
	path := filepath.Join(dir, filepath.FromSlash(HFModelFile))
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("runtime: %w", err)
	}
	layers, heads, hd, vocab, err := hfShape(path)
	if err != nil {
		return nil, err
	}
	be, err := openBackend(opts)
	if err != nil {
		return nil, err
	}
	kb, ok := be.(kvBackend)
	if !ok {
		be.close()
		return nil, errors.New("runtime: this backend cannot run cache graphs")
	}
	in, out := hfIO(layers)
	sess, err := kb.newKVSession(path, in, out)
	if err != nil {
		be.close()
		return nil, err
	}
	return &HFModel{be: be, sess: sess, Layers: layers, Heads: heads, HeadSize: hd, Vocab: vocab, Length: cfg.Length}, nil
}

// Close ends the session.
func (m *HFModel) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	return errors.Join(m.sess.close(), m.be.close())
}

// HFSequence is one sequence fed to an HFModel the Hugging Face way: each
// Feed appends its tokens, the attention mask is all ones and the positions
// count on from the cache's length. Not safe for concurrent use.
type HFSequence struct {
	m    *HFModel
	n    int         // tokens in the cache
	past [][]float32 // 2·layers tensors [1, heads, n, head_size]
	next [][]float32 // Feed's present buffers, swapped with past
}

// NewSequence returns an empty sequence.
func (m *HFModel) NewSequence() *HFSequence {
	return &HFSequence{m: m, past: make([][]float32, 2*m.Layers), next: make([][]float32, 2*m.Layers)}
}

// Len is the number of tokens fed so far.
func (s *HFSequence) Len() int { return s.n }

// Feed runs ids (at least one) after the sequence's tokens in one
// onnxruntime call and returns their logits, [len(ids)·Vocab] (row i: after
// ids[i]). A sequence holds at most Length tokens.
func (s *HFSequence) Feed(ctx context.Context, ids []int32) ([]float32, error) {
	m := s.m
	S, P := len(ids), s.n
	if S == 0 {
		return nil, errors.New("runtime: Feed needs at least one token")
	}
	if P+S > m.Length {
		return nil, fmt.Errorf("runtime: %d tokens exceed the export's length %d (max_position_embeddings)", P+S, m.Length)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, errors.New("runtime: the model is closed")
	}
	in64, mask, pos := make([]int64, S), make([]int64, P+S), make([]int64, S)
	for i, id := range ids {
		if id < 0 || int(id) >= m.Vocab {
			return nil, fmt.Errorf("runtime: token id %d is outside the vocabulary [0,%d)", id, m.Vocab)
		}
		in64[i], pos[i] = int64(id), int64(P+i)
	}
	for i := range mask {
		mask[i] = 1
	}
	logits := make([]float32, S*m.Vocab)
	in := []tensorArg{{shape: []int64{1, int64(S)}, i64: in64}, {shape: []int64{1, int64(P + S)}, i64: mask}, {shape: []int64{1, int64(S)}, i64: pos}}
	out := []tensorArg{{shape: []int64{1, int64(S), int64(m.Vocab)}, f32: logits}}
	H, hd := int64(m.Heads), int64(m.HeadSize)
	for i := range s.past {
		s.past[i] = grow(s.past[i], P*m.Heads*m.HeadSize)
		s.next[i] = grow(s.next[i], (P+S)*m.Heads*m.HeadSize)
		in = append(in, tensorArg{shape: []int64{1, H, int64(P), hd}, f32: s.past[i]})
		out = append(out, tensorArg{shape: []int64{1, H, int64(P + S), hd}, f32: s.next[i]})
	}
	if err := m.sess.run(ctx, in, out); err != nil {
		return nil, err
	}
	s.past, s.next = s.next, s.past
	s.n += S
	return logits, nil
}
