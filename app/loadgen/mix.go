package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rpac-dev/rpac/internal/sysmem"
)

// Kind is the kind of one request of a mixed load test.
type Kind int

// The kinds of a mixed load test: the four well-formed ones, then the
// malformed and the slow requests.
const (
	KindCompletion Kind = iota // POST /v1/completions
	KindStream                 // POST /v1/completions with "stream": true
	KindScore                  // POST /v1/score
	KindInfer                  // POST /v2/models/{name}/infer with an outputs selection
	KindMalformed              // a body that is not a valid request of its route (or an unknown model)
	KindSlow                   // a body sent a byte at a time, never whole within the read timeout
	NumKinds
)

var kindNames = [NumKinds]string{"completion", "stream", "score", "kserve", "malformed", "slow"}

func (k Kind) String() string {
	if k < 0 || k >= NumKinds {
		return fmt.Sprintf("kind(%d)", int(k))
	}
	return kindNames[k]
}

// MixOptions describe a mixed load test: Clients closed-loop clients each
// send a request of a kind drawn at random (a fraction Malformed of them
// malformed, a fraction Slow slow, the rest well-formed in the proportion
// of Weights), wait for its answer and send the next, until Requests have
// been sent (0: no bound) or Duration has passed. Meanwhile it samples the
// resident set size; before and after it counts goroutines, to find what
// the load left behind.
type MixOptions struct {
	// URL is the server's base URL; Model the name in its KServe routes.
	URL, Model string
	Clients    int
	Requests   int // 0: no bound
	Duration   time.Duration
	// Weights of the well-formed kinds, by Kind (all zero: equal weights).
	Weights [KindInfer + 1]int
	// Malformed and Slow are the fractions of malformed and slow requests.
	Malformed, Slow float64
	// PromptLen, MaxTokens: the completions' prompt ids and max_tokens;
	// ScoreLen the ids of a score, InferLen those of a KServe row; TopK the
	// top_k of the KServe outputs that have one.
	PromptLen, MaxTokens, ScoreLen, InferLen, TopK int
	// Vocab bounds the random ids; Seed seeds them.
	Vocab int
	Seed  uint64
	// Timeout and ReadTimeout are the server's (serve.Config.Timeout and
	// ReadTimeout): a request must be answered within Timeout, a slow one
	// cut off within ReadTimeout, both plus Grace (default 1 s). A request
	// unanswered after twice its bound is abandoned.
	Timeout, ReadTimeout, Grace time.Duration
	// Trickle is the time between two bytes of a slow body (default a
	// twentieth of ReadTimeout).
	Trickle time.Duration
	// Settle bounds the wait, after the load, for the goroutines to fall
	// back to their count before it (default 5 s); the RSS is read again
	// at its end.
	Settle time.Duration
	// SampleEvery is the RSS sampling period (default 20 ms).
	SampleEvery time.Duration
	// RSS reads the server's resident set size and Goroutines counts its
	// goroutines (defaults: sysmem.RSS and runtime.NumGoroutine, for a
	// server in this process).
	RSS        func() (int64, error)
	Goroutines func() int
	// Client sends the well-formed and malformed requests (default: a
	// client with keep-alive connections for every load client, whose
	// idle connections are closed after the load).
	Client *http.Client
}

// Classes counts answers by status class.
type Classes struct {
	OK, Client, TooMany, Server int // 2xx, 4xx but 429, 429, 5xx
	// NoAnswer counts transport errors, streams cut without an error
	// event and abandoned requests.
	NoAnswer int
}

// KindResult is what a mixed load test measured for one kind.
type KindResult struct {
	Sent     int
	Codes    map[int]int // answers by HTTP status (a stream's error event counts as its code)
	NoAnswer int
	// Expected counts the answers of the expected class: 2xx for the
	// well-formed kinds, 4xx other than 429 for malformed requests, 408
	// for slow ones. Late counts the answers after their bound.
	Expected, Late int
	// P50, P99 and Max are the latencies of the expected answers (a
	// stream's until [DONE]); FirstP50 and FirstP99 a stream's time to its
	// first event.
	P50, P99, Max      time.Duration
	FirstP50, FirstP99 time.Duration
	Tokens             int // generated tokens in the expected answers of completions and streams
}

// Classes counts the kind's answers by status class.
func (k KindResult) Classes() Classes {
	c := Classes{NoAnswer: k.NoAnswer}
	for code, n := range k.Codes {
		switch {
		case code == http.StatusTooManyRequests:
			c.TooMany += n
		case code >= 200 && code < 300:
			c.OK += n
		case code >= 400 && code < 500:
			c.Client += n
		case code >= 500:
			c.Server += n
		}
	}
	return c
}

// MixResult is what a mixed load test measured.
type MixResult struct {
	Clients int
	Elapsed time.Duration
	Kinds   [NumKinds]KindResult
	// IdleRSS is read before the load, PeakRSS is the largest sample
	// during it, AfterRSS is read when the last request is answered and
	// SettledRSS after the settle period (0 where RSS failed).
	IdleRSS, PeakRSS, AfterRSS, SettledRSS int64
	// GoroutinesBefore is the count before the load (once it is steady),
	// GoroutinesAfter the count after the settle period, SettledIn the
	// time it took to fall back (the whole Settle if it did not).
	GoroutinesBefore, GoroutinesAfter int
	SettledIn                         time.Duration
	// Bound and SlowBound are the times within which a request and a slow
	// request had to be answered.
	Bound, SlowBound time.Duration
}

// Total sums the kinds' classes.
func (r MixResult) Total() Classes {
	var t Classes
	for _, k := range r.Kinds {
		c := k.Classes()
		t.OK += c.OK
		t.Client += c.Client
		t.TooMany += c.TooMany
		t.Server += c.Server
		t.NoAnswer += c.NoAnswer
	}
	return t
}

// Sent is the number of requests sent.
func (r MixResult) Sent() int {
	n := 0
	for _, k := range r.Kinds {
		n += k.Sent
	}
	return n
}

// InTime reports whether every request was answered (or refused) within
// its bound.
func (r MixResult) InTime() bool {
	for _, k := range r.Kinds {
		if k.Late > 0 || k.NoAnswer > 0 {
			return false
		}
	}
	return true
}

// Leaked is the number of goroutines more after the load than before.
func (r MixResult) Leaked() int { return max(0, r.GoroutinesAfter-r.GoroutinesBefore) }

func (o *MixOptions) check() error {
	switch {
	case o.URL == "":
		return errors.New("loadgen: mixed load test: no URL")
	case o.Clients < 1 || o.Requests < 0 || o.Duration <= 0:
		return fmt.Errorf("loadgen: mixed load test: clients %d and duration %v must be positive, requests %d not negative", o.Clients, o.Duration, o.Requests)
	case o.Malformed < 0 || o.Slow < 0 || o.Malformed+o.Slow > 1:
		return fmt.Errorf("loadgen: mixed load test: the malformed (%v) and slow (%v) fractions must be in [0,1] together", o.Malformed, o.Slow)
	case o.PromptLen < 1 || o.MaxTokens < 1 || o.ScoreLen < 2 || o.InferLen < 1 || o.TopK < 1 || o.Vocab < 1:
		return errors.New("loadgen: mixed load test: prompt length, max tokens, infer length, top-k and vocabulary must be positive, the score length at least 2")
	case o.Timeout <= 0 || o.ReadTimeout <= 0:
		return errors.New("loadgen: mixed load test: give the server's timeout and read timeout")
	case o.Model == "" && o.Malformed+o.Slow < 1:
		return errors.New("loadgen: mixed load test: no model name for the KServe route")
	}
	for _, w := range o.Weights {
		if w < 0 {
			return fmt.Errorf("loadgen: mixed load test: weights %v must not be negative", o.Weights)
		}
	}
	return nil
}

func (o *MixOptions) defaults() {
	if o.Weights == ([KindInfer + 1]int{}) {
		o.Weights = [KindInfer + 1]int{1, 1, 1, 1}
	}
	if o.Grace <= 0 {
		o.Grace = time.Second
	}
	if o.Trickle <= 0 {
		o.Trickle = max(time.Millisecond, o.ReadTimeout/20)
	}
	if o.Settle <= 0 {
		o.Settle = 5 * time.Second
	}
	if o.SampleEvery <= 0 {
		o.SampleEvery = 20 * time.Millisecond
	}
	if o.RSS == nil {
		o.RSS = sysmem.RSS
	}
	if o.Goroutines == nil {
		o.Goroutines = goruntime.NumGoroutine
	}
}

// rss reads the RSS (0 when it fails).
func (o *MixOptions) rss() int64 {
	n, err := o.RSS()
	if err != nil {
		return 0
	}
	return n
}

// Mix runs a mixed load test; it stops by itself after Requests requests
// or Duration, whichever comes first, or when ctx ends, and returns once
// the requests in flight are answered (or abandoned) and the settle period
// is over.
func Mix(ctx context.Context, o MixOptions) (MixResult, error) {
	if err := o.check(); err != nil {
		return MixResult{}, err
	}
	o.defaults()
	client := o.Client
	if client == nil {
		client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.Clients}}
		defer client.CloseIdleConnections()
	}
	u, err := url.Parse(o.URL)
	if err != nil || u.Host == "" {
		return MixResult{}, fmt.Errorf("loadgen: mixed load test: URL %q: %v", o.URL, err)
	}
	res := MixResult{Clients: o.Clients, Bound: o.Timeout + o.Grace, SlowBound: o.ReadTimeout + o.Grace}
	for k := range res.Kinds {
		res.Kinds[k].Codes = map[int]int{}
	}
	res.GoroutinesBefore = steadyCount(o.Goroutines, time.Second)
	res.IdleRSS = o.rss()
	peak := o.samplePeak()
	t0 := time.Now()
	o.load(ctx, client, u, &res)
	res.Elapsed = time.Since(t0)
	res.AfterRSS = o.rss()
	res.PeakRSS = max(peak(), res.IdleRSS, res.AfterRSS)

	// Settle: idle connections closed, the goroutines should fall back.
	client.CloseIdleConnections()
	t1 := time.Now()
	for {
		res.GoroutinesAfter = o.Goroutines()
		if res.GoroutinesAfter <= res.GoroutinesBefore || time.Since(t1) >= o.Settle || ctx.Err() != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	res.SettledIn = time.Since(t1)
	if rest := o.Settle - res.SettledIn; rest > 0 { // the RSS after the whole settle period
		select {
		case <-time.After(rest):
		case <-ctx.Done():
		}
	}
	res.SettledRSS = o.rss()
	return res, nil
}

// samplePeak samples the RSS every SampleEvery until the function it
// returns is called, which returns the largest sample.
func (o *MixOptions) samplePeak() func() int64 {
	var peak int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(o.SampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				peak = max(peak, o.rss())
			}
		}
	}()
	return func() int64 {
		close(stop)
		<-sampled
		return peak
	}
}

// load sends the requests and counts their answers in res.
func (o *MixOptions) load(ctx context.Context, client *http.Client, u *url.URL, res *MixResult) {
	lctx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	var (
		mu    sync.Mutex
		lats  [NumKinds][]time.Duration
		first []time.Duration
		// malformedSent numbers the malformed requests.
		malformedSent atomic.Int64
	)
	total := 0
	for _, w := range o.Weights {
		total += w
	}
	closedLoop(lctx, o.Clients, o.Requests, o.Seed, func(rng *rand.Rand, i int) {
		k := o.draw(rng, total)
		bound := res.Bound
		if k == KindSlow {
			bound = res.SlowBound
		}
		// ctx (not lctx): a request sent before the end is answered.
		rctx, rcancel := context.WithTimeout(ctx, 2*bound)
		var a answer
		switch k {
		case KindSlow:
			a = o.slow(rctx, u, rng)
		case KindMalformed: // the mistakes in turn
			path, body := o.malformed(int(malformedSent.Add(1) - 1))
			a = post(rctx, client, o.URL+path, body, false)
		default:
			path, body := o.wellFormed(k, rng, i)
			a = post(rctx, client, o.URL+path, body, k == KindStream)
		}
		rcancel()
		mu.Lock()
		if res.Kinds[k].count(k, a, bound) {
			lats[k] = append(lats[k], a.lat)
			if k == KindStream {
				first = append(first, a.first)
			}
		}
		mu.Unlock()
		if a.code == http.StatusTooManyRequests { // back off a little, as Retry-After asks
			time.Sleep(time.Duration(10+rng.IntN(90)) * time.Millisecond)
		}
	})
	for k := range res.Kinds {
		kr := &res.Kinds[k]
		kr.P50, kr.P99, kr.Max = percentile(lats[k], 50), percentile(lats[k], 99), percentile(lats[k], 100)
	}
	res.Kinds[KindStream].FirstP50, res.Kinds[KindStream].FirstP99 = percentile(first, 50), percentile(first, 99)
}

// count adds the answer a to a request of kind k with the given bound and
// reports whether it was of the expected class.
func (kr *KindResult) count(k Kind, a answer, bound time.Duration) bool {
	kr.Sent++
	if a.code == 0 {
		kr.NoAnswer++
		return false
	}
	kr.Codes[a.code]++
	if a.lat > bound {
		kr.Late++
	}
	if !expected(k, a.code) {
		return false
	}
	kr.Expected++
	kr.Tokens += a.tokens
	return true
}

// steadyCount returns count() once it has not changed for 5 reads 20 ms
// apart (or after at most d).
func steadyCount(count func() int, d time.Duration) int {
	t0 := time.Now()
	n, same := count(), 0
	for same < 5 && time.Since(t0) < d {
		time.Sleep(20 * time.Millisecond)
		m := count()
		if m == n {
			same++
		} else {
			n, same = m, 0
		}
	}
	return n
}

// expected reports whether code is the answer a request of kind k should get.
func expected(k Kind, code int) bool {
	switch k {
	case KindMalformed:
		return code >= 400 && code < 500 && code != http.StatusTooManyRequests
	case KindSlow:
		return code == http.StatusRequestTimeout
	}
	return code >= 200 && code < 300
}

// draw picks a request's kind.
func (o *MixOptions) draw(rng *rand.Rand, total int) Kind {
	x := rng.Float64()
	switch {
	case x < o.Malformed:
		return KindMalformed
	case x < o.Malformed+o.Slow:
		return KindSlow
	case total == 0:
		return KindMalformed
	}
	n := rng.IntN(total)
	for k, w := range o.Weights {
		if n < w {
			return Kind(k)
		}
		n -= w
	}
	return KindCompletion
}
