package serve

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rpac-dev/rpac/runtime"
)

// errFull is returned when a bounded queue has no room (HTTP 429).
var errFull = errors.New("the server's queue is full; retry later")

// errClosed is returned for work that arrives after Close (HTTP 503).
var errClosed = errors.New("the server is shutting down")

// collect gathers a batch: it blocks for the first item, then takes more
// until the batch holds max items, enough(batch) holds, or wait has passed
// since the first item arrived. It returns nil when stop is closed.
func collect[T any](in <-chan T, stop <-chan struct{}, max int, wait time.Duration, enough func(n int) bool) []T {
	var batch []T
	select {
	case x := <-in:
		batch = append(batch, x)
	case <-stop:
		return nil
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for len(batch) < max && !enough(len(batch)) {
		select {
		case x := <-in:
			batch = append(batch, x)
		case <-timer.C:
			return batch
		case <-stop:
			return batch
		}
	}
	return batch
}

// stepReq asks the decoder to append tokens to the sequence in slot and
// return its next-token logits on done (buffered: the decoder never
// blocks on it).
type stepReq struct {
	slot   int
	tokens []int32
	done   chan stepRes
}

type stepRes struct {
	logits []float32
	err    error
}

// decoder batches the steps of open sequences into Engine.Step calls: a
// step runs once every open sequence has asked for its next token, or
// when the batch is full, or maxWait after its first request, whichever
// comes first. A sequence that is late (busy writing to its client)
// joins the next step.
type decoder struct {
	eng      Engine
	maxBatch int
	maxWait  time.Duration
	in       chan *stepReq
	slots    chan struct{} // one token per free engine slot
	open     atomic.Int64  // sequences holding a slot
	waiting  atomic.Int64  // requests waiting for a slot
	queue    int64         // most requests that may wait for a slot
	metrics  *metrics
	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{}
}

func newDecoder(eng Engine, maxBatch int, maxWait time.Duration, queue int, m *metrics) *decoder {
	ctx, cancel := context.WithCancel(context.Background())
	d := &decoder{eng: eng, maxBatch: maxBatch, maxWait: maxWait, queue: int64(queue), metrics: m,
		in: make(chan *stepReq, eng.Capacity()), slots: make(chan struct{}, eng.Capacity()),
		ctx: ctx, cancel: cancel, done: make(chan struct{})}
	for range eng.Capacity() {
		d.slots <- struct{}{}
	}
	go d.loop()
	return d
}

// acquire opens a sequence, waiting for a free slot in the bounded queue:
// errFull when the queue is full, the context's error when it ends first.
func (d *decoder) acquire(ctx context.Context) (*sequence, error) {
	select {
	case <-d.slots:
	default:
		if d.waiting.Add(1) > d.queue {
			d.waiting.Add(-1)
			return nil, errFull
		}
		d.metrics.queueDepth.Inc()
		select {
		case <-d.slots:
		case <-ctx.Done():
			d.waiting.Add(-1)
			d.metrics.queueDepth.Dec()
			return nil, ctx.Err()
		case <-d.ctx.Done():
			d.waiting.Add(-1)
			d.metrics.queueDepth.Dec()
			return nil, errClosed
		}
		d.waiting.Add(-1)
		d.metrics.queueDepth.Dec()
	}
	slot, err := d.eng.Open()
	if err != nil {
		d.slots <- struct{}{}
		return nil, err
	}
	d.open.Add(1)
	d.metrics.active.Inc()
	return &sequence{d: d, slot: slot, res: make(chan stepRes, 1)}, nil
}

// sequence is one open sequence; its methods are called from one goroutine.
type sequence struct {
	d    *decoder
	slot int
	res  chan stepRes
	done bool
}

// step appends tokens and returns the next-token logits. It waits for
// the step it joined (or for the loop to end), so the slot is never
// released under a running step.
func (s *sequence) step(tokens []int32) ([]float32, error) {
	select {
	case <-s.d.ctx.Done():
		return nil, errClosed
	default:
	}
	s.d.in <- &stepReq{slot: s.slot, tokens: tokens, done: s.res} // room for one per slot
	select {
	case r := <-s.res:
		return r.logits, r.err
	case <-s.d.done:
		return nil, errClosed
	}
}

// release frees the slot.
func (s *sequence) release() {
	if s.done {
		return
	}
	s.done = true
	s.d.eng.Release(s.slot)
	s.d.open.Add(-1)
	s.d.metrics.active.Dec()
	s.d.slots <- struct{}{}
}

func (d *decoder) loop() {
	defer close(d.done)
	for {
		batch := collect(d.in, d.ctx.Done(), d.maxBatch, d.maxWait, func(n int) bool { return int64(n) >= d.open.Load() })
		if batch == nil {
			return
		}
		d.run(batch)
	}
}

func (d *decoder) run(batch []*stepReq) {
	slots := make([]int, len(batch))
	tokens := make([][]int32, len(batch))
	for i, r := range batch {
		slots[i], tokens[i] = r.slot, r.tokens
	}
	d.metrics.batchSize.WithLabelValues("decode").Observe(float64(len(batch)))
	logits, err := d.eng.Step(d.ctx, slots, tokens)
	for i, r := range batch {
		if err != nil {
			r.done <- stepRes{err: err}
		} else {
			r.done <- stepRes{logits: logits[i]}
		}
	}
}

// close stops the loop after the step in flight; sequences waiting for a
// step get errClosed.
func (d *decoder) close() {
	d.cancel()
	<-d.done
}

// scoreJob runs one sequence through the model; fn sees its logits on the
// scorer's goroutine.
type scoreJob struct {
	ctx  context.Context
	seq  []int32
	fn   func(l runtime.Logits) error
	done chan error
}

// scorer batches whole-sequence runs (scores, KServe inference) into
// Model.Each calls: it waits up to maxWait after the first job for up to
// maxBatch jobs.
type scorer struct {
	m        Model
	maxBatch int
	maxWait  time.Duration
	in       chan *scoreJob
	metrics  *metrics
	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{}
	mu       sync.RWMutex // held for reading by submitters, for writing by close
	closed   bool
}

func newScorer(m Model, maxBatch int, maxWait time.Duration, queue int, mt *metrics) *scorer {
	ctx, cancel := context.WithCancel(context.Background())
	s := &scorer{m: m, maxBatch: maxBatch, maxWait: maxWait, in: make(chan *scoreJob, queue), metrics: mt,
		ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go s.loop()
	return s
}

// run submits the jobs (all or none: errFull when the queue has no room
// for them) and waits for them.
func (s *scorer) run(ctx context.Context, seqs [][]int32, fn func(i int, l runtime.Logits) error) error {
	jobs := make([]*scoreJob, len(seqs))
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return errClosed
	}
	if len(seqs) > cap(s.in)-len(s.in) {
		s.mu.RUnlock()
		return errFull
	}
	for i, seq := range seqs {
		jobs[i] = &scoreJob{ctx: ctx, seq: seq, fn: func(l runtime.Logits) error { return fn(i, l) }, done: make(chan error, 1)}
		select {
		case s.in <- jobs[i]:
			s.metrics.queueDepth.Inc()
		default: // another submitter took the room: fail the rest
			jobs[i].done <- errFull
		}
	}
	s.mu.RUnlock()
	var first error
	for _, j := range jobs {
		if err := <-j.done; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (s *scorer) loop() {
	defer close(s.done)
	for {
		batch := collect(s.in, s.ctx.Done(), s.maxBatch, s.maxWait, func(int) bool { return false })
		if batch == nil {
			return
		}
		s.metrics.queueDepth.Sub(float64(len(batch)))
		s.runBatch(batch)
	}
}

func (s *scorer) runBatch(batch []*scoreJob) {
	var live []*scoreJob
	for _, j := range batch {
		if err := j.ctx.Err(); err != nil {
			j.done <- err
			continue
		}
		live = append(live, j)
	}
	if len(live) == 0 {
		return
	}
	s.metrics.batchSize.WithLabelValues("score").Observe(float64(len(live)))
	seqs := make([][]int32, len(live))
	for i, j := range live {
		seqs[i] = j.seq
	}
	errs := make([]error, len(live))
	err := s.m.Each(s.ctx, seqs, func(i int, l runtime.Logits) error {
		errs[i] = live[i].fn(l)
		return nil
	})
	for i, j := range live {
		if err != nil {
			j.done <- err
		} else {
			j.done <- errs[i]
		}
	}
}

// close refuses new jobs, then fails the queued ones and stops the loop.
func (s *scorer) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	<-s.done
	for {
		select {
		case j := <-s.in:
			s.metrics.queueDepth.Dec()
			j.done <- errClosed
		default:
			return
		}
	}
}
