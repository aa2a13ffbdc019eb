package serve

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/rpac-dev/rpac/runtime"
)

// kvEngine decodes on the KV cache of an export written with --kv-cache:
// a sequence's first step prefills its prompt into a runtime.Decoder of the
// smallest KV length that holds its prompt and generated tokens (as
// runtime.Model.Generate picks), and every later step feeds one token per
// sequence, all the sequences of one length in one onnxruntime call each
// at its own position.
type kvEngine struct {
	m       *runtime.Model
	lengths []int // KV-cache lengths, increasing

	mu   sync.Mutex
	decs map[int]*runtime.Decoder // by length, made on first use
	seqs []kvSeq
}

// kvSeq is an engine slot: its length and, once prefilled, its slot in
// that length's decoder.
type kvSeq struct {
	T     int // 0: free
	dslot int // -1: not prefilled yet
}

// NewKVEngine returns an Engine with capacity slots over the KV-cache
// graphs of m (an error when the export has none). Context is the longest
// length with KV-cache graphs.
func NewKVEngine(m *runtime.Model, capacity int) (Engine, error) {
	if capacity < 1 {
		return nil, fmt.Errorf("serve: engine capacity %d: want at least 1", capacity)
	}
	ls := m.KVCacheLengths()
	if len(ls) == 0 {
		return nil, errors.New("serve: the export has no KV-cache graphs; export it again with --kv-cache")
	}
	sort.Ints(ls)
	e := &kvEngine{m: m, lengths: ls, decs: map[int]*runtime.Decoder{}, seqs: make([]kvSeq, capacity)}
	for i := range e.seqs {
		e.seqs[i].dslot = -1
	}
	return e, nil
}

func (e *kvEngine) Capacity() int { return len(e.seqs) }
func (e *kvEngine) Context() int  { return e.lengths[len(e.lengths)-1] }

func (e *kvEngine) Open(need int) (int, error) {
	T := 0
	for _, L := range e.lengths {
		if L >= need {
			T = L
			break
		}
	}
	if T == 0 {
		return 0, fmt.Errorf("serve: %d tokens fit none of the KV-cache lengths %v", need, e.lengths)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.decs[T] == nil {
		d, err := e.m.NewDecoder(T, len(e.seqs))
		if err != nil {
			return 0, err
		}
		e.decs[T] = d
	}
	for i := range e.seqs {
		if e.seqs[i].T == 0 {
			e.seqs[i] = kvSeq{T: T, dslot: -1}
			return i, nil
		}
	}
	return 0, errors.New("serve: every engine slot is taken")
}

func (e *kvEngine) Release(slot int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if slot < 0 || slot >= len(e.seqs) || e.seqs[slot].T == 0 {
		return
	}
	if s := e.seqs[slot]; s.dslot >= 0 {
		_ = e.decs[s.T].Release(s.dslot) // the slot is in use: no error
	}
	e.seqs[slot] = kvSeq{dslot: -1}
}

// Step prefills the sequences on their first step (one call each) and
// decodes the others, one call per length.
func (e *kvEngine) Step(ctx context.Context, slots []int, tokens [][]int32) ([][]float32, error) {
	if len(slots) != len(tokens) {
		return nil, fmt.Errorf("serve: %d slots but %d token lists", len(slots), len(tokens))
	}
	e.mu.Lock()
	seqs := make([]kvSeq, len(slots))
	for i, s := range slots {
		if s < 0 || s >= len(e.seqs) || e.seqs[s].T == 0 {
			e.mu.Unlock()
			return nil, fmt.Errorf("serve: slot %d is not open", s)
		}
		seqs[i] = e.seqs[s]
		if seqs[i].dslot >= 0 && len(tokens[i]) != 1 {
			e.mu.Unlock()
			return nil, fmt.Errorf("serve: slot %d is decoding and takes one token per step, not %d", s, len(tokens[i]))
		}
	}
	e.mu.Unlock()
	out := make([][]float32, len(slots))
	groups := map[int][]int{} // length -> indices of decoding sequences
	for i, sq := range seqs {
		if sq.dslot >= 0 {
			groups[sq.T] = append(groups[sq.T], i)
			continue
		}
		dslot, row, err := e.decs[sq.T].Prefill(ctx, tokens[i])
		if err != nil {
			return nil, err
		}
		e.mu.Lock()
		e.seqs[slots[i]].dslot = dslot
		e.mu.Unlock()
		out[i] = row
	}
	for T, idx := range groups {
		ds := make([]int, len(idx))
		toks := make([]int32, len(idx))
		for k, i := range idx {
			ds[k], toks[k] = seqs[i].dslot, tokens[i][0]
		}
		rows, err := e.decs[T].Step(ctx, ds, toks)
		if err != nil {
			return nil, err
		}
		for k, i := range idx {
			out[i] = rows[k]
		}
	}
	return out, nil
}
