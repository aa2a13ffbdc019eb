package serve

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/rpac-dev/rpac/runtime"
)

// Engine runs the model for batched decoding. A sequence lives in a slot
// from Open to Release; Step advances many sequences, each at its own
// position, with one model call. The server calls Step from one goroutine
// at a time, never with a slot that is not open, and never Releases a slot
// while a Step that holds it is running; Open and Release may be called
// from any goroutine.
type Engine interface {
	// Capacity is the number of slots: the most sequences open at once.
	Capacity() int
	// Context is the most tokens one sequence may hold (prompt and
	// generated tokens together).
	Context() int
	// Open reserves a slot for a new, empty sequence that will hold at
	// most need tokens (prompt and generated, need <= Context); it returns
	// an error when every slot is taken. An engine over an export of
	// several lengths runs the sequence at the smallest that holds need,
	// as runtime.Model.Generate does.
	Open(need int) (slot int, err error)
	// Step appends tokens[i] (the prompt on a sequence's first step, then
	// one sampled token per step) to the sequence in slots[i] and returns,
	// for each, the logits of the token that follows (VocabSize values the
	// caller may keep). The slots of one call are distinct. An error ends
	// every sequence of the call (the server releases their slots).
	Step(ctx context.Context, slots []int, tokens [][]int32) ([][]float32, error)
	// Release frees a slot and forgets its sequence.
	Release(slot int)
}

// Model is what the server needs of an exported model: *runtime.Model
// implements it.
type Model interface {
	// Each runs a batch of sequences and hands each one's logits to fn
	// (valid while fn runs); see runtime.Model.Each.
	Each(ctx context.Context, batch [][]int32, fn func(i int, l runtime.Logits) error) error
	// LengthFor is the smallest exported length that holds n tokens.
	LengthFor(n int) (int, error)
	MaxLength() int
	VocabSize() int
	EOS() int32
}

// windowEngine decodes without a cache: every step runs each sequence's
// whole window, right-padded with EOS to the sequence's length (the
// smallest exported length that holds its prompt and generated tokens,
// fixed at Open), through the model; a step of n sequences costs one
// onnxruntime call per length among them, per graph batch. It is the
// engine for exports without KV-cache graphs.
type windowEngine struct {
	m   Model
	ctx int

	mu   sync.Mutex
	seqs [][]int32
	lens []int // 0: free slot
}

// NewWindowEngine returns an Engine with capacity slots over m that
// recomputes each sequence's whole context at every step (Context is
// m.MaxLength()).
func NewWindowEngine(m Model, capacity int) (Engine, error) {
	if capacity < 1 {
		return nil, fmt.Errorf("serve: engine capacity %d: want at least 1", capacity)
	}
	return &windowEngine{m: m, ctx: m.MaxLength(), seqs: make([][]int32, capacity), lens: make([]int, capacity)}, nil
}

func (e *windowEngine) Capacity() int { return len(e.lens) }
func (e *windowEngine) Context() int  { return e.ctx }

func (e *windowEngine) Open(need int) (int, error) {
	L, err := e.m.LengthFor(max(need, 1))
	if err != nil {
		return 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, l := range e.lens {
		if l == 0 {
			e.lens[i] = L
			e.seqs[i] = e.seqs[i][:0]
			return i, nil
		}
	}
	return 0, errors.New("serve: every engine slot is taken")
}

func (e *windowEngine) Release(slot int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if slot >= 0 && slot < len(e.lens) {
		e.lens[slot] = 0
	}
}

func (e *windowEngine) Step(ctx context.Context, slots []int, tokens [][]int32) ([][]float32, error) {
	if len(slots) != len(tokens) {
		return nil, fmt.Errorf("serve: %d slots but %d token lists", len(slots), len(tokens))
	}
	e.mu.Lock()
	windows := make([][]int32, len(slots))
	ns := make([]int, len(slots))
	for i, s := range slots {
		if s < 0 || s >= len(e.lens) || e.lens[s] == 0 {
			e.mu.Unlock()
			return nil, fmt.Errorf("serve: slot %d is not open", s)
		}
		if len(tokens[i]) == 0 {
			e.mu.Unlock()
			return nil, fmt.Errorf("serve: step of slot %d has no tokens", s)
		}
		L := e.lens[s]
		ns[i] = len(e.seqs[s]) + len(tokens[i])
		if ns[i] > L {
			e.mu.Unlock()
			return nil, fmt.Errorf("serve: slot %d would hold %d tokens, more than its length of %d", s, ns[i], L)
		}
		w := make([]int32, 0, L)
		w = append(append(w, e.seqs[s]...), tokens[i]...)
		for len(w) < L { // causal graphs: the padding never reaches row ns-1
			w = append(w, e.m.EOS())
		}
		windows[i] = w
	}
	e.mu.Unlock()
	out := make([][]float32, len(slots))
	err := e.m.Each(ctx, windows, func(i int, l runtime.Logits) error {
		out[i] = append([]float32(nil), l.Row(ns[i]-1)...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	for i, s := range slots {
		e.seqs[s] = windows[i][:ns[i]]
	}
	e.mu.Unlock()
	return out, nil
}
