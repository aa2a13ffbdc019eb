package serve

import (
	"context"
	"errors"
	"fmt"
	goruntime "runtime"
	"slices"
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
// until the batch holds max items or wait has passed since the first item
// arrived. It returns nil when stop is closed.
func collect[T any](in <-chan T, stop <-chan struct{}, max int, wait time.Duration) []T {
	var batch []T
	select {
	case x := <-in:
		batch = append(batch, x)
	case <-stop:
		return nil
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for len(batch) < max {
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

// genRequest is one completion handed to the decoder: its prompt, how
// many tokens to draw and how. The decoder sends every drawn token on
// events (buffered for all of them, so a slow client never holds up a
// step) and ends with an event that has done or err set.
type genRequest struct {
	prompt    []int32
	maxTokens int
	sampler   *runtime.Sampler
	adjust    *logitAdjust // logit_bias and penalties (nil: none)
	logprobs  int          // alternatives to report with each token; -1: no logprobs
	events    chan genEvent
	cancelled atomic.Bool // set by the request's goroutine; the decoder drops the sequence at its next step
}

// genEvent is a drawn token, or the end of the sequence: done with eos
// when it drew EOS (not sent as a token), done alone after maxTokens,
// or err.
type genEvent struct {
	id      int32
	logprob float64        // of id, from the model's logits (when logprobs >= 0)
	top     []tokenLogprob // the most likely tokens (when logprobs >= 0)
	done    bool
	eos     bool
	err     error
}

// cancel stops the sequence at the decoder's next step (the client left,
// or it reached a stop string).
func (g *genRequest) cancel() { g.cancelled.Store(true) }

// seqState is the decoder's view of an open sequence.
type seqState struct {
	req     *genRequest
	slot    int
	pending []int32 // tokens to append at the next step
	drawn   int
}

// decoder runs the decoding loop: each step appends the pending tokens of
// the open sequences with one Engine.Step call, draws each sequence's next
// token and sends it to the sequence's request. Sequences join between
// steps; a step that would take in new sequences waits up to maxWait for
// more to arrive, while the batch has room (dynamic batching).
type decoder struct {
	eng      Engine
	eos      int32
	maxBatch int
	maxWait  time.Duration
	join     chan *seqState
	slots    chan struct{} // one token per free engine slot
	open     atomic.Int64  // sequences holding a slot
	waiting  atomic.Int64  // requests waiting for a slot
	queue    int64         // most requests that may wait for a slot
	timeout  time.Duration // a request's time limit (for messages)
	// backlog is the decoding steps still owed to the sequences that hold
	// a slot or wait for one: max_tokens of each, less the tokens drawn.
	backlog atomic.Int64
	cost    costEstimate // time of one decoding step
	metrics *metrics
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
}

func newDecoder(eng Engine, eos int32, maxBatch int, maxWait time.Duration, queue int, timeout time.Duration, m *metrics) *decoder {
	ctx, cancel := context.WithCancel(context.Background())
	d := &decoder{eng: eng, eos: eos, maxBatch: maxBatch, maxWait: maxWait, queue: int64(queue), timeout: timeout, metrics: m,
		join: make(chan *seqState, eng.Capacity()), slots: make(chan struct{}, eng.Capacity()),
		ctx: ctx, cancel: cancel, done: make(chan struct{})}
	for range eng.Capacity() {
		d.slots <- struct{}{}
	}
	go d.loop()
	return d
}

// start opens a sequence for req, waiting for a free slot in the bounded
// queue: errFull when the queue is full, an *overloadError when it would
// have to wait and is estimated not to end before ctx's deadline,
// errClosed after close, the context's error when it ends first.
func (d *decoder) start(ctx context.Context, req *genRequest) error {
	if d.ctx.Err() != nil {
		return errClosed
	}
	// The steps it owes count before it looks for a slot, so that requests
	// arriving together each see the others' in the backlog.
	owed := int64(req.maxTokens)
	backlog := d.backlog.Add(owed) - owed
	select {
	case <-d.slots:
	default:
		if d.waiting.Add(1) > d.queue {
			d.waiting.Add(-1)
			d.backlog.Add(-owed)
			d.metrics.refused.WithLabelValues("decode", "queue_full").Inc()
			return errFull
		}
		if err := d.admitByDeadline(ctx, req, backlog); err != nil {
			d.waiting.Add(-1)
			d.backlog.Add(-owed)
			d.metrics.refused.WithLabelValues("decode", "deadline").Inc()
			return err
		}
		d.metrics.queueDepth.Inc()
		var err error
		select {
		case <-d.slots:
		case <-ctx.Done():
			err = ctx.Err()
		case <-d.ctx.Done():
			err = errClosed
		}
		d.waiting.Add(-1)
		d.metrics.queueDepth.Dec()
		if err != nil {
			d.backlog.Add(-owed)
			return err
		}
	}
	slot, err := d.eng.Open(len(req.prompt) + req.maxTokens)
	if err != nil {
		d.slots <- struct{}{}
		d.backlog.Add(-owed)
		return err
	}
	d.open.Add(1)
	d.metrics.active.Inc()
	select {
	case d.join <- &seqState{req: req, slot: slot, pending: req.prompt}: // room for every slot
	case <-d.ctx.Done():
		d.release(&seqState{req: req, slot: slot})
		return errClosed
	}
	return nil
}

// admitByDeadline is the deadline-aware admission of a completion that
// must wait for a slot: it waits for the backlog, the steps owed to the
// sequences before it (min(Capacity, maxBatch) of them advancing per
// step), then takes its own max_tokens steps (its prefill draws the
// first), sharing steps in turns when the engine holds more sequences than
// a step takes. Nil before the first step has been timed.
func (d *decoder) admitByDeadline(ctx context.Context, req *genRequest, backlog int64) error {
	c, ok := d.cost.get()
	if !ok {
		return nil
	}
	capacity := int64(d.eng.Capacity())
	per := max(1, min(capacity, int64(d.maxBatch)))
	turns := (capacity + per - 1) / per
	steps := (max(0, backlog) + per - 1) / per
	ahead := time.Duration(steps) * c
	own := time.Duration(int64(req.maxTokens)*turns) * c
	what := fmt.Sprintf("%d decoding steps at about %v each", steps, c.Round(time.Microsecond))
	if e := deadlineRefusal(ctx, d.timeout, ahead, own, what); e != nil {
		return e
	}
	return nil
}

// release frees a sequence's slot and forgets the steps it still owed.
func (d *decoder) release(s *seqState) {
	if s.req != nil {
		d.backlog.Add(-int64(max(0, s.req.maxTokens-s.drawn)))
	}
	d.eng.Release(s.slot)
	d.open.Add(-1)
	d.metrics.active.Dec()
	d.slots <- struct{}{}
}

func (d *decoder) loop() {
	defer close(d.done)
	var active []*seqState
	defer func() {
		for _, s := range active {
			s.req.events <- genEvent{err: errClosed}
			d.release(s)
		}
	}()
	for {
		if len(active) == 0 {
			select {
			case s := <-d.join:
				active = append(active, s)
			case <-d.ctx.Done():
				return
			}
		}
		active = d.admit(active)
		if d.ctx.Err() != nil {
			return
		}
		active = d.step(active)
	}
}

// admit takes in the sequences waiting to join. When every sequence of
// the coming step is new (none is decoding yet) and the batch has room,
// it waits up to maxWait for more to arrive; sequences that are decoding
// are never held up, and later arrivals join the next step.
func (d *decoder) admit(active []*seqState) []*seqState {
	for {
		select {
		case s := <-d.join:
			active = append(active, s)
			continue
		default:
		}
		break
	}
	for _, s := range active {
		if s.drawn > 0 {
			return active
		}
	}
	if len(active) >= d.maxBatch {
		return active
	}
	timer := time.NewTimer(d.maxWait)
	defer timer.Stop()
	for len(active) < d.maxBatch {
		select {
		case s := <-d.join:
			active = append(active, s)
		case <-timer.C:
			return active
		case <-d.ctx.Done():
			return active
		}
	}
	return active
}

// step advances up to maxBatch sequences (cancelled ones are dropped
// first) and returns the sequences still open, the stepped ones last so
// that a longer list takes turns.
func (d *decoder) step(active []*seqState) []*seqState {
	live := active[:0]
	for _, s := range active {
		if s.req.cancelled.Load() {
			s.req.events <- genEvent{err: context.Canceled}
			d.release(s)
			continue
		}
		live = append(live, s)
	}
	active = live
	if len(active) == 0 {
		return active
	}
	batch, rest := active, []*seqState(nil)
	if len(batch) > d.maxBatch {
		batch, rest = active[:d.maxBatch], append([]*seqState(nil), active[d.maxBatch:]...)
	}
	slots := make([]int, len(batch))
	tokens := make([][]int32, len(batch))
	for i, s := range batch {
		slots[i], tokens[i] = s.slot, s.pending
	}
	d.metrics.batchSize.WithLabelValues("decode").Observe(float64(len(batch)))
	t0 := time.Now()
	logits, err := d.eng.Step(d.ctx, slots, tokens)
	if err != nil && d.ctx.Err() != nil {
		err = errClosed
	}
	evs := make([]genEvent, len(batch))
	if err == nil {
		d.drawAll(batch, logits, evs)
		d.cost.observe(time.Since(t0), 1)
		c, _ := d.cost.get()
		d.metrics.cost.WithLabelValues("decode").Set(c.Seconds())
	}
	for i, s := range batch {
		ev := evs[i]
		if err != nil {
			ev = genEvent{err: err}
		}
		if ev.err == nil && !ev.done {
			s.req.events <- ev // a token
			if s.drawn < s.req.maxTokens {
				rest = append(rest, s)
				continue
			}
			ev = genEvent{done: true}
		}
		s.req.events <- ev // the end
		d.release(s)
	}
	return rest
}

// drawAll samples every sequence's next token, on as many goroutines as
// there are processors (the model is idle meanwhile).
func (d *decoder) drawAll(batch []*seqState, logits [][]float32, evs []genEvent) {
	workers := min(goruntime.GOMAXPROCS(0), (len(batch)+3)/4)
	if workers <= 1 {
		for i, s := range batch {
			evs[i] = d.draw(s, logits[i])
		}
		return
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(batch); i += workers {
				evs[i] = d.draw(batch[i], logits[i])
			}
		}()
	}
	wg.Wait()
}

// draw samples a sequence's next token.
func (d *decoder) draw(s *seqState, logits []float32) genEvent {
	var ev genEvent
	var lse float64
	raw := logits
	if s.req.logprobs >= 0 { // from the model's logits, before the adjustment
		lse, ev.top = topLogprobs(logits, s.req.logprobs)
		if s.req.adjust.active() {
			raw = slices.Clone(logits)
		}
	}
	s.req.adjust.apply(logits)
	id, err := s.req.sampler.Next(logits)
	if err != nil {
		return genEvent{err: err}
	}
	s.req.adjust.observe(id)
	s.drawn++
	d.backlog.Add(-1)
	d.metrics.tokens.Inc()
	if id == d.eos {
		return genEvent{done: true, eos: true}
	}
	s.pending = []int32{id}
	ev.id = id
	if s.req.logprobs >= 0 {
		ev.logprob = float64(raw[id]) - lse
	}
	return ev
}

// close stops the loop after the step in flight; open sequences end
// with errClosed.
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

// scoreGroup is one request's jobs not yet taken, in order.
type scoreGroup struct {
	jobs []*scoreJob
}

// scorer batches whole-sequence runs (scores, KServe inference) into
// Model.Each calls: it waits up to maxWait after the first job for up to
// maxBatch jobs. The requests take turns: a batch takes one job from each
// request in the queue in round-robin order (then another from each, while
// there is room), so a request of one window waits for at most the batch in
// flight, however many windows the requests queued before it hold.
type scorer struct {
	m        Model
	maxBatch int
	maxWait  time.Duration
	queue    int           // most jobs queued at once
	timeout  time.Duration // a request's time limit (for messages)
	cost     costEstimate  // time of one sequence of a model call
	metrics  *metrics
	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{}
	wake     chan struct{} // signalled (without blocking) when jobs arrive

	mu     sync.Mutex
	closed bool
	groups []*scoreGroup // requests with jobs queued, in turn order
	queued int           // jobs in groups
	// inflight jobs were taken at inflightSince for the batch in flight.
	inflight      int
	inflightSince time.Time
}

func newScorer(m Model, maxBatch int, maxWait time.Duration, queue int, timeout time.Duration, mt *metrics) *scorer {
	ctx, cancel := context.WithCancel(context.Background())
	s := &scorer{m: m, maxBatch: maxBatch, maxWait: maxWait, queue: queue, timeout: timeout, metrics: mt,
		ctx: ctx, cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1)}
	go s.loop()
	return s
}

// pending is the number of jobs queued.
func (s *scorer) pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queued
}

// run submits the jobs (all or none: errFull when the queue has no room
// for them, an *overloadError when they are estimated not to end before
// ctx's deadline) as one request and waits for them.
func (s *scorer) run(ctx context.Context, seqs [][]int32, fn func(i int, l runtime.Logits) error) error {
	g := &scoreGroup{jobs: make([]*scoreJob, len(seqs))}
	for i, seq := range seqs {
		g.jobs[i] = &scoreJob{ctx: ctx, seq: seq, fn: func(l runtime.Logits) error { return fn(i, l) }, done: make(chan error, 1)}
	}
	jobs := g.jobs
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return errClosed
	case s.queued+len(jobs) > s.queue:
		s.metrics.refused.WithLabelValues("score", "queue_full").Inc()
		s.mu.Unlock()
		return errFull
	}
	if err := s.admitByDeadline(ctx, len(jobs)); err != nil {
		s.metrics.refused.WithLabelValues("score", "deadline").Inc()
		s.mu.Unlock()
		return err
	}
	s.groups = append(s.groups, g)
	s.queued += len(jobs)
	s.metrics.queueDepth.Add(float64(len(jobs)))
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	// The request ends with its context, whether its jobs are queued or in
	// the batch in flight: the scorer drops the queued ones and skips the
	// logits of the others (done is buffered: nobody waits on it).
	var first error
	for _, j := range jobs {
		select {
		case err := <-j.done:
			if err != nil && first == nil {
				first = err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return first
}

// admitByDeadline is the deadline-aware admission of a request of n jobs
// (s.mu held). The requests take turns, one job each per round, so its
// last job waits for up to n jobs of every request queued before it, and
// for what is left of the batch in flight. Nil before the first model call
// has been timed.
func (s *scorer) admitByDeadline(ctx context.Context, n int) error {
	c, ok := s.cost.get()
	if !ok {
		return nil
	}
	jobs := 0
	for _, g := range s.groups {
		jobs += min(len(g.jobs), n)
	}
	ahead := time.Duration(jobs) * c
	if s.inflight > 0 {
		jobs += s.inflight
		ahead += max(0, time.Duration(s.inflight)*c-time.Since(s.inflightSince))
	}
	what := fmt.Sprintf("%d sequences at about %v each", jobs, c.Round(time.Microsecond))
	if e := deadlineRefusal(ctx, s.timeout, ahead, time.Duration(n)*c, what); e != nil {
		return e
	}
	return nil
}

// take removes up to n jobs, one from each request in turn.
func (s *scorer) take(n int) []*scoreJob {
	s.mu.Lock()
	defer s.mu.Unlock()
	var batch []*scoreJob
	last := -1 // the group served last
	for len(batch) < n && s.queued > 0 {
		for gi, g := range s.groups {
			if len(batch) == n {
				break
			}
			for len(g.jobs) > 0 && g.jobs[0].ctx.Err() != nil { // its request is over: no turn
				g.jobs[0].done <- g.jobs[0].ctx.Err()
				g.jobs = g.jobs[1:]
				s.queued--
				s.metrics.queueDepth.Dec()
			}
			if len(g.jobs) > 0 {
				batch = append(batch, g.jobs[0])
				g.jobs = g.jobs[1:]
				s.queued--
				last = gi
			}
		}
	}
	// The next turn begins after the group served last; the requests
	// whose jobs are all taken leave the turn order.
	order := make([]*scoreGroup, 0, len(s.groups))
	for k := range s.groups {
		if g := s.groups[(last+1+k)%len(s.groups)]; len(g.jobs) > 0 {
			order = append(order, g)
		}
	}
	s.groups = order
	s.metrics.queueDepth.Sub(float64(len(batch)))
	s.inflight, s.inflightSince = len(batch), time.Now()
	return batch
}

func (s *scorer) loop() {
	defer close(s.done)
	for {
		// Wait for work, then up to maxWait for a full batch.
		for s.pending() == 0 {
			select {
			case <-s.wake:
			case <-s.ctx.Done():
				return
			}
		}
		if s.pending() < s.maxBatch {
			timer := time.NewTimer(s.maxWait)
		wait:
			for s.pending() < s.maxBatch {
				select {
				case <-s.wake:
				case <-timer.C:
					break wait
				case <-s.ctx.Done():
					timer.Stop()
					return
				}
			}
			timer.Stop()
		}
		s.runBatch(s.take(s.maxBatch))
	}
}

func (s *scorer) runBatch(batch []*scoreJob) {
	defer func() {
		s.mu.Lock()
		s.inflight = 0
		s.mu.Unlock()
	}()
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
	// The model call stops once every request of the batch has ended.
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	var left atomic.Int64
	left.Store(int64(len(live)))
	for _, j := range live {
		stop := context.AfterFunc(j.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	errs := make([]error, len(live))
	t0 := time.Now()
	err := s.m.Each(ctx, seqs, func(i int, l runtime.Logits) error {
		if err := live[i].ctx.Err(); err != nil { // its request is over
			errs[i] = err
			return nil
		}
		errs[i] = live[i].fn(l)
		return nil
	})
	if err == nil && ctx.Err() == nil { // a call cut short says nothing of the cost
		s.cost.observe(time.Since(t0), len(live))
		c, _ := s.cost.get()
		s.metrics.cost.WithLabelValues("score").Set(c.Seconds())
	}
	for i, j := range live {
		if err != nil {
			j.done <- err
		} else {
			j.done <- errs[i]
		}
	}
}

// close refuses new jobs, then stops the loop and fails the queued jobs.
func (s *scorer) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.groups {
		for _, j := range g.jobs {
			j.done <- errClosed
		}
	}
	s.metrics.queueDepth.Sub(float64(s.queued))
	s.groups, s.queued = nil, 0
}
