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
	// Open reserves a slot for a new, empty sequence; it returns an error
	// when every slot is taken.
	Open() (slot int, err error)
	// Step appends tokens[i] (the prompt on a sequence's first step, then
	// one sampled token per step) to the sequence in slots[i] and returns,
	// for each, the logits of the token that follows (VocabSize values the
	// caller may keep). The slots of one call are distinct. On error no
	// sequence has advanced.
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
	// NextLogits returns each sequence's logits at its last position.
	NextLogits(ctx context.Context, batch [][]int32) ([][]float32, error)
	MaxLength() int
	VocabSize() int
	EOS() int32
}

// windowEngine decodes without a cache: every step runs each sequence's
// whole window through the model (runtime.Model.NextLogits), so a step of
// n sequences costs one onnxruntime call per exported length among them,
// per graph batch. It is the engine for exports without decode graphs.
type windowEngine struct {
	m   Model
	ctx int

	mu   sync.Mutex
	seqs [][]int32
	used []bool
}

// NewWindowEngine returns an Engine with capacity slots over m that
// recomputes each sequence's whole context at every step (Context is
// m.MaxLength()).
func NewWindowEngine(m Model, capacity int) (Engine, error) {
	if capacity < 1 {
		return nil, fmt.Errorf("serve: engine capacity %d: want at least 1", capacity)
	}
	return &windowEngine{m: m, ctx: m.MaxLength(), seqs: make([][]int32, capacity), used: make([]bool, capacity)}, nil
}

func (e *windowEngine) Capacity() int { return len(e.used) }
func (e *windowEngine) Context() int  { return e.ctx }

func (e *windowEngine) Open() (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, u := range e.used {
		if !u {
			e.used[i] = true
			e.seqs[i] = e.seqs[i][:0]
			return i, nil
		}
	}
	return 0, errors.New("serve: every engine slot is taken")
}

func (e *windowEngine) Release(slot int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if slot >= 0 && slot < len(e.used) {
		e.used[slot] = false
	}
}

func (e *windowEngine) Step(ctx context.Context, slots []int, tokens [][]int32) ([][]float32, error) {
	if len(slots) != len(tokens) {
		return nil, fmt.Errorf("serve: %d slots but %d token lists", len(slots), len(tokens))
	}
	e.mu.Lock()
	windows := make([][]int32, len(slots))
	for i, s := range slots {
		if s < 0 || s >= len(e.used) || !e.used[s] {
			e.mu.Unlock()
			return nil, fmt.Errorf("serve: slot %d is not open", s)
		}
		if len(tokens[i]) == 0 {
			e.mu.Unlock()
			return nil, fmt.Errorf("serve: step of slot %d has no tokens", s)
		}
		if n := len(e.seqs[s]) + len(tokens[i]); n > e.ctx {
			e.mu.Unlock()
			return nil, fmt.Errorf("serve: slot %d would hold %d tokens, more than the context of %d", s, n, e.ctx)
		}
		w := make([]int32, 0, len(e.seqs[s])+len(tokens[i]))
		windows[i] = append(append(w, e.seqs[s]...), tokens[i]...)
	}
	e.mu.Unlock()
	out, err := e.m.NextLogits(ctx, windows)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	for i, s := range slots {
		e.seqs[s] = windows[i]
	}
	e.mu.Unlock()
	return out, nil
}
