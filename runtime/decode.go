package runtime

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/rpac-dev/rpac/internal/sysmem"
)

// KV-cached decoding over the prefill and decode graphs of `rpac export
// --kv-cache` (see KVCache). A Decoder holds the keys and values of up to
// Capacity sequences at one exported length T; Prefill runs a prompt into a
// free slot and Step advances any set of slots by one token each, every
// sequence at its own position, in one onnxruntime call. The logits equal
// those of the full graph of length T on the same tokens (the graphs are
// causal and the cache holds exactly what the full graph recomputes).

// tensorArg is one input or output buffer of a KV-cache run.
type tensorArg struct {
	shape []int64
	f32   []float32
	i64   []int64
}

// kvSession runs one KV-cache graph with caller-owned buffers.
type kvSession interface {
	run(ctx context.Context, in, out []tensorArg) error
	close() error
}

// kvBackend is a backend that can open KV-cache graphs.
type kvBackend interface {
	newKVSession(path string, inputs, outputs []string) (kvSession, error)
}

// kvGraphs are the sessions of one length's prefill and decode graphs.
type kvGraphs struct {
	prefill, decode kvSession
}

func (g *kvGraphs) close() error { return errors.Join(g.prefill.close(), g.decode.close()) }

// kvNames returns the graph's input and output names in run order.
func kvNames(k *KVCache, g GraphKind) (in, out []string) {
	in = []string{KVInputIDs}
	if g == GraphDecode {
		in = append(in, KVPositionIDs)
	}
	out = []string{KVLogits}
	for l := 0; l < k.Layers; l++ {
		if g == GraphDecode {
			in = append(in, fmt.Sprintf(KVPastKey, l), fmt.Sprintf(KVPastValue, l))
		}
		out = append(out, fmt.Sprintf(KVPresentKey, l), fmt.Sprintf(KVPresentValue, l))
	}
	return in, out
}

// checkKVIO checks a KV-cache graph's declared inputs and outputs against
// the manifest (names, element types, ranks and the static sizes).
func checkKVIO(path string, k *KVCache, g GraphKind, V int, sc *scanConfig) error {
	in, out, err := readIOScan(path, sc)
	if err != nil {
		return ioError(path, err)
	}
	const any = -2
	seq := int64(any)
	if g == GraphDecode {
		seq = 1
	}
	H, Hd := int64(k.Heads), int64(k.HeadSize)
	want := map[string]ioInfo{
		KVInputIDs: {KVInputIDs, onnxInt64, []int64{any, seq}},
		KVLogits:   {KVLogits, onnxFloat, []int64{any, 1, int64(V)}}, // prefill too: the last position's
	}
	if g == GraphDecode {
		want[KVPositionIDs] = ioInfo{KVPositionIDs, onnxInt64, []int64{any, 1}}
	}
	ins, outs := kvNames(k, g)
	for _, n := range append(ins, outs...) {
		if _, ok := want[n]; !ok {
			want[n] = ioInfo{n, onnxFloat, []int64{any, H, any, Hd}}
		}
	}
	match := func(have []ioInfo, names []string) bool {
		if len(have) != len(names) {
			return false
		}
		byName := map[string]ioInfo{}
		for _, h := range have {
			byName[h.Name] = h
		}
		for _, n := range names {
			h, ok := byName[n]
			w := want[n]
			if !ok || h.Elem != w.Elem || len(h.Dims) != len(w.Dims) {
				return false
			}
			for i, d := range w.Dims {
				if d != any && h.Dims[i] != d {
					return false
				}
			}
		}
		return true
	}
	if !match(in, ins) || !match(out, outs) {
		return fmt.Errorf("runtime: %s is not the %s graph the manifest describes (%d layers, %d heads of %d, vocabulary %d): it has inputs %s and outputs %s; export it again",
			path, g, k.Layers, k.Heads, k.HeadSize, V, describeIO(in), describeIO(out))
	}
	return nil
}

// checkKVFiles checks the declared inputs and outputs of every KV-cache graph.
// With scan, their tensors are checked as the full graphs' are.
func checkKVFiles(dir string, man *Manifest, scan bool) error {
	if man.KVCache == nil {
		return nil
	}
	for _, L := range man.KVCache.Lengths {
		for _, g := range []GraphKind{GraphPrefill, GraphDecode} {
			f, _ := man.GraphFile(L, g)
			if err := checkKVIO(filepath.Join(dir, filepath.FromSlash(f.Path)), man.KVCache, g, man.VocabSize, scanOf(dir, man, f, scan)); err != nil {
				return err
			}
		}
	}
	return nil
}

// kvGraphsFor opens (once) the prefill and decode sessions of length T.
func (m *Model) kvGraphsFor(T int) (*kvGraphs, error) {
	m.kvMu.Lock()
	defer m.kvMu.Unlock()
	if g := m.kv[T]; g != nil {
		return g, nil
	}
	kb, ok := m.be.(kvBackend)
	if !ok {
		return nil, errors.New("runtime: this model's backend cannot run KV-cache graphs")
	}
	open := func(kind GraphKind) (kvSession, error) {
		f, _ := m.man.GraphFile(T, kind)
		in, out := kvNames(m.man.KVCache, kind)
		return kb.newKVSession(filepath.Join(m.dir, filepath.FromSlash(f.Path)), in, out)
	}
	pre, err := open(GraphPrefill)
	if err != nil {
		return nil, err
	}
	dec, err := open(GraphDecode)
	if err != nil {
		pre.close()
		return nil, err
	}
	if m.kv == nil {
		m.kv = map[int]*kvGraphs{}
	}
	g := &kvGraphs{prefill: pre, decode: dec}
	m.kv[T] = g
	return g, nil
}

// closeKV closes the KV-cache sessions (Close holds m.mu).
func (m *Model) closeKV() error {
	m.kvMu.Lock()
	defer m.kvMu.Unlock()
	var errs []error
	for _, g := range m.kv {
		errs = append(errs, g.close())
	}
	m.kv = nil
	return errors.Join(errs...)
}

// KVCacheLengths returns the lengths that have KV-cache graphs (none when
// the export was written without --kv-cache).
func (m *Model) KVCacheLengths() []int {
	if m.man.KVCache == nil {
		return nil
	}
	return append([]int(nil), m.man.KVCache.Lengths...)
}

// LengthFor returns the smallest exported length that holds n tokens: the
// length a generation of prompt + max new tokens runs at.
func (m *Model) LengthFor(n int) (int, error) {
	for _, L := range m.Lengths() {
		if L >= n {
			return L, nil
		}
	}
	return 0, fmt.Errorf("runtime: %d tokens fit none of the exported lengths %v (at most %d); shorten the prompt or the generation, or export a longer length", n, m.Lengths(), m.MaxLength())
}

// Decoder is a KV cache of Capacity sequences at one exported length T with
// the prefill and decode graphs that fill it. Its methods are safe for
// concurrent use; they run one at a time (a mutex), each as one onnxruntime
// call. A Decoder holds Capacity·layers·2·heads·T·head_size float32 values
// and no onnxruntime resources of its own (the Model's sessions serve every
// Decoder of a length; Model.Close ends them all).
type Decoder struct {
	m           *Model
	g           *kvGraphs
	T, capacity int
	layers, H   int
	hd, V       int

	mu    sync.Mutex
	n     []int     // tokens cached per slot; -1: free
	cache []float32 // [slot][layer][key,value][head][T][head_size]
	// Step's buffers, reused from call to call.
	past, present, logits []float32
}

// NewDecoder returns a decoder of capacity sequences at length T, which
// must have KV-cache graphs.
func (m *Model) NewDecoder(T, capacity int) (*Decoder, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, errors.New("runtime: the model is closed")
	}
	k := m.man.KVCache
	if k == nil {
		return nil, errors.New("runtime: this export has no KV-cache graphs; export it again with --kv-cache")
	}
	if !m.man.HasKVCache(T) {
		return nil, fmt.Errorf("runtime: length %d has no KV-cache graphs (it has them for %v)", T, k.Lengths)
	}
	if capacity < 1 || capacity > MaxBatch {
		return nil, fmt.Errorf("runtime: decoder capacity %d is outside 1..%d", capacity, MaxBatch)
	}
	slot := int64(k.Layers) * 2 * int64(k.Heads) * int64(T) * int64(k.HeadSize)
	need := 4 * slot * int64(capacity)
	if avail, err := sysmem.Available(); err == nil && need > avail/2 {
		return nil, fmt.Errorf("runtime: a KV cache of %d sequences at length %d takes %.1f GiB, more than half of the %.1f GiB available; use a smaller capacity",
			capacity, T, float64(need)/(1<<30), float64(avail)/(1<<30))
	}
	g, err := m.kvGraphsFor(T)
	if err != nil {
		return nil, err
	}
	d := &Decoder{m: m, g: g, T: T, capacity: capacity, layers: k.Layers, H: k.Heads, hd: k.HeadSize, V: m.man.VocabSize,
		n: make([]int, capacity), cache: make([]float32, slot*int64(capacity))}
	for i := range d.n {
		d.n[i] = -1
	}
	return d, nil
}

// Length is the decoder's exported length T: a sequence holds at most T
// tokens (prompt and generated).
func (d *Decoder) Length() int { return d.T }

// Capacity is the number of slots.
func (d *Decoder) Capacity() int { return d.capacity }

// Len returns the number of tokens in slot's cache (the position of the
// token the next Step feeds), or an error for a free slot.
func (d *Decoder) Len(slot int) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.checkSlot(slot); err != nil {
		return 0, err
	}
	return d.n[slot], nil
}

// Release frees slot for another sequence.
func (d *Decoder) Release(slot int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.checkSlot(slot); err != nil {
		return err
	}
	d.n[slot] = -1
	return nil
}

func (d *Decoder) checkSlot(slot int) error {
	if slot < 0 || slot >= d.capacity {
		return fmt.Errorf("runtime: slot %d is outside the decoder's %d slots", slot, d.capacity)
	}
	if d.n[slot] < 0 {
		return fmt.Errorf("runtime: slot %d is not in use (Prefill a prompt into a slot first; a released slot cannot step)", slot)
	}
	return nil
}

func (d *Decoder) checkToken(what string, id int32) error {
	if id < 0 || int(id) >= d.V {
		return fmt.Errorf("runtime: %s: token id %d is outside the vocabulary [0,%d)", what, id, d.V)
	}
	return nil
}

// base is the offset of (slot, layer, kv) in the cache.
func (d *Decoder) base(slot, layer, kv int) int {
	return ((slot*d.layers+layer)*2 + kv) * d.H * d.T * d.hd
}

// running takes the model's read lock for a run; the returned func ends it.
// A context that has already ended is its error.
func (d *Decoder) running(ctx context.Context) (func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.m.mu.RLock()
	if d.m.closed {
		d.m.mu.RUnlock()
		return nil, errors.New("runtime: the model is closed")
	}
	return d.m.mu.RUnlock, nil
}

// Prefill runs prompt (1..T tokens) into a free slot and returns the slot
// and the logits after the prompt's last token (a new slice of V values).
func (d *Decoder) Prefill(ctx context.Context, prompt []int32) (int, []float32, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	P := len(prompt)
	if P == 0 {
		return 0, nil, errors.New("runtime: the prompt is empty (start from EOS for an unconditional generation)")
	}
	if P > d.T {
		return 0, nil, fmt.Errorf("runtime: the prompt has %d tokens, more than the decoder's length %d; use a decoder of a longer length (Model.LengthFor)", P, d.T)
	}
	ids := make([]int64, P)
	for t, id := range prompt {
		if err := d.checkToken(fmt.Sprintf("prompt position %d", t), id); err != nil {
			return 0, nil, err
		}
		ids[t] = int64(id)
	}
	slot := -1
	for i, n := range d.n {
		if n < 0 {
			slot = i
			break
		}
	}
	if slot < 0 {
		return 0, nil, fmt.Errorf("runtime: all %d slots of the decoder are in use; Release one first", d.capacity)
	}
	done, err := d.running(ctx)
	if err != nil {
		return 0, nil, err
	}
	defer done()
	kvShape := []int64{1, int64(d.H), int64(P), int64(d.hd)}
	sz := d.H * P * d.hd
	present := make([]float32, 2*d.layers*sz)
	logits := make([]float32, d.V) // the prefill graph's head runs on the last position only
	out := []tensorArg{{shape: []int64{1, 1, int64(d.V)}, f32: logits}}
	for i := 0; i < 2*d.layers; i++ {
		out = append(out, tensorArg{shape: kvShape, f32: present[i*sz : (i+1)*sz]})
	}
	if err := d.g.prefill.run(ctx, []tensorArg{{shape: []int64{1, int64(P)}, i64: ids}}, out); err != nil {
		return 0, nil, err
	}
	for i := 0; i < 2*d.layers; i++ {
		src := present[i*sz : (i+1)*sz]
		dst := d.cache[d.base(slot, i/2, i%2):]
		for h := 0; h < d.H; h++ {
			copy(dst[h*d.T*d.hd:h*d.T*d.hd+P*d.hd], src[h*P*d.hd:(h+1)*P*d.hd])
		}
	}
	d.n[slot] = P
	return slot, logits, nil
}

// Step feeds tokens[i] to the sequence in slots[i] (each at its own
// position, Len(slot)) in one onnxruntime call and returns each sequence's
// next-token logits (new slices of V values). A slot that already holds T
// tokens cannot step.
func (d *Decoder) Step(ctx context.Context, slots []int, tokens []int32) ([][]float32, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(slots) == 0 || len(slots) != len(tokens) {
		return nil, fmt.Errorf("runtime: Step takes one token per slot and at least one slot; have %d slots and %d tokens", len(slots), len(tokens))
	}
	seen := map[int]bool{}
	S := 0
	for i, s := range slots {
		if err := d.checkSlot(s); err != nil {
			return nil, err
		}
		if seen[s] {
			return nil, fmt.Errorf("runtime: slot %d is listed twice in one Step", s)
		}
		seen[s] = true
		if d.n[s] >= d.T {
			return nil, fmt.Errorf("runtime: slot %d holds %d tokens, the decoder's length; it cannot take another (Release it, or decode at a longer length)", s, d.n[s])
		}
		if err := d.checkToken(fmt.Sprintf("slot %d", s), tokens[i]); err != nil {
			return nil, err
		}
		S = max(S, d.n[s]+1)
	}
	done, err := d.running(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	B := len(slots)
	ids, pos := make([]int64, B), make([]int64, B)
	for i, s := range slots {
		ids[i], pos[i] = int64(tokens[i]), int64(d.n[s])
	}
	rows := d.H * S * d.hd // one sequence's values of one cache tensor
	sz := B * rows
	d.past = grow(d.past, 2*d.layers*sz)
	d.present = grow(d.present, 2*d.layers*sz)
	d.logits = grow(d.logits, B*d.V)
	kvShape := []int64{int64(B), int64(d.H), int64(S), int64(d.hd)}
	in := []tensorArg{{shape: []int64{int64(B), 1}, i64: ids}, {shape: []int64{int64(B), 1}, i64: pos}}
	out := []tensorArg{{shape: []int64{int64(B), 1, int64(d.V)}, f32: d.logits}}
	for i := 0; i < 2*d.layers; i++ {
		past := d.past[i*sz : (i+1)*sz]
		for b, s := range slots {
			src := d.cache[d.base(s, i/2, i%2):]
			for h := 0; h < d.H; h++ {
				copy(past[b*rows+h*S*d.hd:b*rows+(h+1)*S*d.hd], src[h*d.T*d.hd:h*d.T*d.hd+S*d.hd])
			}
		}
		in = append(in, tensorArg{shape: kvShape, f32: past})
		out = append(out, tensorArg{shape: kvShape, f32: d.present[i*sz : (i+1)*sz]})
	}
	if err := d.g.decode.run(ctx, in, out); err != nil {
		return nil, err
	}
	// cache_out equals cache but in each sequence's new slot: copy that back.
	for i := 0; i < 2*d.layers; i++ {
		present := d.present[i*sz : (i+1)*sz]
		for b, s := range slots {
			dst := d.cache[d.base(s, i/2, i%2):]
			p := d.n[s]
			for h := 0; h < d.H; h++ {
				o := b*rows + (h*S+p)*d.hd
				copy(dst[(h*d.T+p)*d.hd:(h*d.T+p+1)*d.hd], present[o:o+d.hd])
			}
		}
	}
	res := make([][]float32, B)
	for b, s := range slots {
		d.n[s]++
		res[b] = append([]float32(nil), d.logits[b*d.V:(b+1)*d.V]...)
	}
	return res, nil
}

// grow returns buf resized to n values, reallocating only to grow.
func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}

// generateCached is Generate over a Decoder of length T.
func (m *Model) generateCached(ctx context.Context, seq []int32, T int, o GenerateOptions, sample func([]float32) (int32, error)) ([]int32, error) {
	d, err := m.NewDecoder(T, 1)
	if err != nil {
		return nil, err
	}
	slot, row, err := d.Prefill(ctx, seq)
	if err != nil {
		return nil, err
	}
	var out []int32
	for {
		next, err := sample(row)
		if err != nil {
			return out, err
		}
		out = append(out, next)
		if len(out) == o.MaxNewTokens || (o.StopAtEOS && next == m.EOS()) {
			return out, nil
		}
		rows, err := d.Step(ctx, []int{slot}, []int32{next})
		if err != nil {
			return out, err
		}
		row = rows[0]
	}
}
