package data

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"

	"github.com/rpac-dev/rpac/ir"
)

// Batch is a [B,T] pair of inputs and next-token targets, row-major:
// X[b*T+t] is token t of row b and Y[b*T+t] the token that follows it.
type Batch struct {
	B, T int
	X, Y []int32
}

// NewBatch allocates a [B,T] batch.
func NewBatch(b, t int) Batch {
	return Batch{B: b, T: t, X: make([]int32, b*t), Y: make([]int32, b*t)}
}

// BatchSize returns the paper's batch size for a token budget per step:
// max(1, tokensPerStep / T).
func BatchSize(tokensPerStep, T int) int {
	if T <= 0 {
		return 1
	}
	return max(1, tokensPerStep/T)
}

// RNGState is the serialisable state of a TrainBatcher's PCG generator.
type RNGState struct {
	Hi uint64 `json:"hi"`
	Lo uint64 `json:"lo"`
}

// TrainBatcher draws training batches as the paper's RandomChunkDataset:
// each row is a random contiguous chunk, x = ids[i:i+T], y = ids[i+1:i+T+1],
// with i uniform in [0, len(ids)-T-1], drawn from a seeded PCG generator.
type TrainBatcher struct {
	ids  []int32
	t, b int
	// align > 1 makes chunks start at multiples of align (SetAlign).
	align int
	// keep, when set, marks the targets to keep; the others become
	// ir.IgnoreTarget (SetTargetMask).
	keep []bool
	pcg  *rand.PCG
	rng  *rand.Rand
}

// NewTrainBatcher returns a batcher over ids for context T and batch
// BatchSize(tokensPerStep, T), seeded with seed.
func NewTrainBatcher(ids []int32, T, tokensPerStep int, seed uint64) (*TrainBatcher, error) {
	if T <= 0 {
		return nil, fmt.Errorf("training batches: context length T = %d, must be positive", T)
	}
	if tokensPerStep <= 0 {
		return nil, fmt.Errorf("training batches: tokens per step = %d, must be positive", tokensPerStep)
	}
	if len(ids) < T+1 {
		return nil, fmt.Errorf("training batches: the data has %d tokens, fewer than context T = %d plus 1 "+
			"(one chunk needs T+1 = %d tokens): use a shorter context or more data", len(ids), T, T+1)
	}
	pcg := rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)
	return &TrainBatcher{ids: ids, t: T, b: BatchSize(tokensPerStep, T), pcg: pcg, rng: rand.New(pcg)}, nil
}

// SetAlign makes every chunk start at a multiple of align (uniform among
// such starts): with a generated corpus of sequences of align tokens, each
// chunk then begins at a sequence's start. align ≤ 1 (the default) allows
// every start. It fails when no aligned chunk fits.
func (tb *TrainBatcher) SetAlign(align int) error {
	if align > 1 && len(tb.ids) < tb.t+1 {
		return fmt.Errorf("training batches: no chunk of %d tokens fits", tb.t+1)
	}
	tb.align = align
	return nil
}

// SetTargetMask keeps the target ids[p] of a batch only where keep[p] is
// set (keep aligned with the ids, e.g. AnswerStream.Answers) and makes the
// others ir.IgnoreTarget; nil keeps every target.
func (tb *TrainBatcher) SetTargetMask(keep []bool) error {
	if keep != nil && len(keep) != len(tb.ids) {
		return fmt.Errorf("training batches: a target mask of %d entries for %d tokens", len(keep), len(tb.ids))
	}
	tb.keep = keep
	return nil
}

// BatchSize returns B.
func (tb *TrainBatcher) BatchSize() int { return tb.b }

// ContextLen returns T.
func (tb *TrainBatcher) ContextLen() int { return tb.t }

// Next returns a new batch.
func (tb *TrainBatcher) Next() Batch {
	bt := NewBatch(tb.b, tb.t)
	tb.NextInto(&bt)
	return bt
}

// NextInto fills bt with the next batch, reallocating its slices only when
// they have the wrong length.
func (tb *TrainBatcher) NextInto(bt *Batch) {
	n := tb.b * tb.t
	bt.B, bt.T = tb.b, tb.t
	if len(bt.X) != n {
		bt.X = make([]int32, n)
	}
	if len(bt.Y) != n {
		bt.Y = make([]int32, n)
	}
	for r := range tb.b {
		var i int
		if tb.align > 1 {
			i = tb.align * tb.rng.IntN((len(tb.ids)-tb.t-1)/tb.align+1)
		} else {
			i = tb.rng.IntN(len(tb.ids) - tb.t)
		}
		copy(bt.X[r*tb.t:(r+1)*tb.t], tb.ids[i:i+tb.t])
		y := bt.Y[r*tb.t : (r+1)*tb.t]
		copy(y, tb.ids[i+1:i+tb.t+1])
		if tb.keep != nil {
			for j, k := range tb.keep[i+1 : i+tb.t+1] {
				if !k {
					y[j] = ir.IgnoreTarget
				}
			}
		}
	}
}

// State returns the generator's state; SetState with it resumes the exact
// sequence of batches.
func (tb *TrainBatcher) State() (RNGState, error) {
	b, err := tb.pcg.MarshalBinary() // "pcg:" + hi + lo, big-endian
	if err != nil || len(b) != 20 || string(b[:4]) != "pcg:" {
		return RNGState{}, fmt.Errorf("training batches: unexpected PCG state encoding %q (err %v)", b, err)
	}
	return RNGState{Hi: binary.BigEndian.Uint64(b[4:]), Lo: binary.BigEndian.Uint64(b[12:])}, nil
}

// SetState restores a state returned by State.
func (tb *TrainBatcher) SetState(s RNGState) error {
	b := make([]byte, 0, 20)
	b = append(b, "pcg:"...)
	b = binary.BigEndian.AppendUint64(b, s.Hi)
	b = binary.BigEndian.AppendUint64(b, s.Lo)
	if err := tb.pcg.UnmarshalBinary(b); err != nil {
		return fmt.Errorf("training batches: restoring the RNG state: %w", err)
	}
	return nil
}

// EvalChunks are the sequential, non-overlapping evaluation chunks of the
// paper's SequentialChunkDataset: chunk i has x = ids[i*T : i*T+T] and
// y = ids[i*T+1 : i*T+T+1]. Only full chunks exist.
type EvalChunks struct {
	ids []int32
	t   int
}

// NumChunks returns the number of full chunks of context T in n tokens:
// (n-1)/T.
func NumChunks(n, T int) int {
	if T <= 0 || n < 1 {
		return 0
	}
	return (n - 1) / T
}

// NewEvalChunks returns the chunks of ids for context T; it fails when not
// even one chunk fits.
func NewEvalChunks(ids []int32, T int) (*EvalChunks, error) {
	if T <= 0 {
		return nil, fmt.Errorf("evaluation chunks: context length T = %d, must be positive", T)
	}
	if len(ids) < T+1 {
		return nil, fmt.Errorf("evaluation chunks: the data has %d tokens, fewer than context T = %d plus 1 "+
			"(one chunk needs T+1 = %d tokens): use a shorter context or more data", len(ids), T, T+1)
	}
	return &EvalChunks{ids: ids, t: T}, nil
}

// ContextLen returns T.
func (c *EvalChunks) ContextLen() int { return c.t }

// NumChunks returns the number of full chunks.
func (c *EvalChunks) NumChunks() int { return NumChunks(len(c.ids), c.t) }

// Start returns the offset in ids of chunk i's first input token (i*T).
func (c *EvalChunks) Start(i int) int { return i * c.t }

// Chunk returns chunk i's inputs and targets; the slices alias the ids.
func (c *EvalChunks) Chunk(i int) (x, y []int32) {
	s := i * c.t
	return c.ids[s : s+c.t], c.ids[s+1 : s+c.t+1]
}

// All iterates over every full chunk in order, yielding its index and its
// inputs and targets packed in a [1,T] Batch that aliases the ids.
func (c *EvalChunks) All() iter.Seq2[int, Batch] {
	return func(yield func(int, Batch) bool) {
		for i := range c.NumChunks() {
			x, y := c.Chunk(i)
			if !yield(i, Batch{B: 1, T: c.t, X: x, Y: y}) {
				return
			}
		}
	}
}

// EvalBatcher groups EvalChunks into batches of B consecutive chunks and, as
// DataLoader(drop_last=True), drops the last incomplete batch.
type EvalBatcher struct {
	chunks *EvalChunks
	b      int
}

// NewEvalBatcher returns the evaluation batches of ids for context T and
// batch size B; it fails when not even one full batch fits.
func NewEvalBatcher(ids []int32, T, B int) (*EvalBatcher, error) {
	c, err := NewEvalChunks(ids, T)
	if err != nil {
		return nil, err
	}
	return c.Batcher(B)
}

// Batcher returns the chunks grouped in batches of B.
func (c *EvalChunks) Batcher(B int) (*EvalBatcher, error) {
	if B <= 0 {
		return nil, fmt.Errorf("evaluation batches: batch size %d, must be positive", B)
	}
	if n := c.NumChunks(); n < B {
		return nil, fmt.Errorf("evaluation batches: the data has %d tokens, which make %d chunks of context T = %d, "+
			"fewer than one batch of %d (needs at least %d tokens): use a smaller batch, a shorter context or more data",
			len(c.ids), n, c.t, B, B*c.t+1)
	}
	return &EvalBatcher{chunks: c, b: B}, nil
}

// Chunks returns the underlying chunks.
func (eb *EvalBatcher) Chunks() *EvalChunks { return eb.chunks }

// BatchSize returns B.
func (eb *EvalBatcher) BatchSize() int { return eb.b }

// NumBatches returns the number of full batches: NumChunks / B.
func (eb *EvalBatcher) NumBatches() int { return eb.chunks.NumChunks() / eb.b }

var errBatchIndex = errors.New("evaluation batches: batch index out of range")

// BatchInto fills bt with batch k (chunks k*B .. k*B+B-1).
func (eb *EvalBatcher) BatchInto(k int, bt *Batch) error {
	if k < 0 || k >= eb.NumBatches() {
		return fmt.Errorf("%w: %d, have %d", errBatchIndex, k, eb.NumBatches())
	}
	t := eb.chunks.t
	n := eb.b * t
	bt.B, bt.T = eb.b, t
	if len(bt.X) != n {
		bt.X = make([]int32, n)
	}
	if len(bt.Y) != n {
		bt.Y = make([]int32, n)
	}
	for r := range eb.b {
		x, y := eb.chunks.Chunk(k*eb.b + r)
		copy(bt.X[r*t:], x)
		copy(bt.Y[r*t:], y)
	}
	return nil
}

// All iterates over the full batches in order. The yielded Batch is reused
// between iterations: copy it to keep it.
func (eb *EvalBatcher) All() iter.Seq2[int, Batch] {
	return func(yield func(int, Batch) bool) {
		bt := NewBatch(eb.b, eb.chunks.t)
		for k := range eb.NumBatches() {
			_ = eb.BatchInto(k, &bt)
			if !yield(k, bt) {
				return
			}
		}
	}
}
