package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// LoadOptions describe a closed-loop load test: Clients goroutines each
// send a request, wait for its answer and send the next, until Requests
// have been sent or Duration has passed.
type LoadOptions struct {
	// URL is the server's base URL, e.g. http://127.0.0.1:8080.
	URL string
	// Clients is the number of concurrent clients.
	Clients int
	// Requests bounds the requests sent (all clients together).
	Requests int
	// Duration bounds the test's time (requests in flight then finish).
	Duration time.Duration
	// ScoreEvery makes every n-th request a /v1/score (0: none).
	ScoreEvery int
	// PromptLen, MaxTokens: the completions' prompt ids and max_tokens.
	PromptLen, MaxTokens int
	// ScoreLen is the ids scored per /v1/score request.
	ScoreLen int
	// Vocab bounds the random ids; Seed seeds them.
	Vocab int
	Seed  uint64
	// Client sends the requests (default: a client with keep-alive
	// connections for every load client).
	Client *http.Client
}

// LoadResult is what a load test measured.
type LoadResult struct {
	Clients            int
	Requests           int         // answered (any status)
	Completions, Score int         // answered with 200, by kind
	Codes              map[int]int // answers by HTTP status
	TransportErrors    int
	Tokens             int // generated tokens in 200 answers
	Elapsed            time.Duration
	// P50 and P99 are latencies of the 200 answers, by kind.
	CompletionP50, CompletionP99 time.Duration
	ScoreP50, ScoreP99           time.Duration
}

// RequestsPerSecond is the rate of 200 answers.
func (r LoadResult) RequestsPerSecond() float64 {
	return float64(r.Completions+r.Score) / r.Elapsed.Seconds()
}

// TokensPerSecond is the rate of generated tokens.
func (r LoadResult) TokensPerSecond() float64 { return float64(r.Tokens) / r.Elapsed.Seconds() }

// Unexpected counts the answers that are neither 200 nor 429, and the
// requests that got no answer.
func (r LoadResult) Unexpected() int {
	n := r.TransportErrors
	for c, k := range r.Codes {
		if c != http.StatusOK && c != http.StatusTooManyRequests {
			n += k
		}
	}
	return n
}

func (o *LoadOptions) check() error {
	switch {
	case o.URL == "":
		return errors.New("serve: load test: no URL")
	case o.Clients < 1 || o.Requests < 1 || o.Duration <= 0:
		return fmt.Errorf("serve: load test: clients %d, requests %d and duration %v must be positive", o.Clients, o.Requests, o.Duration)
	case o.PromptLen < 1 || o.MaxTokens < 0 || o.Vocab < 1 || o.ScoreEvery < 0:
		return errors.New("serve: load test: prompt length and vocabulary must be positive, max tokens and score-every not negative")
	case o.ScoreEvery > 0 && o.ScoreLen < 2:
		return errors.New("serve: load test: a score needs at least 2 ids")
	}
	return nil
}

// Load runs the load test; it stops by itself after Requests requests or
// Duration, whichever comes first, or when ctx ends.
func Load(ctx context.Context, o LoadOptions) (LoadResult, error) {
	if err := o.check(); err != nil {
		return LoadResult{}, err
	}
	client := o.Client
	if client == nil {
		client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.Clients}}
	}
	ctx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	var (
		mu      sync.Mutex
		next    int
		res     = LoadResult{Clients: o.Clients, Codes: map[int]int{}}
		latComp []time.Duration
		latScor []time.Duration
		wg      sync.WaitGroup
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if next >= o.Requests || ctx.Err() != nil {
			return 0, false
		}
		next++
		return next - 1, true
	}
	t0 := time.Now()
	for c := range o.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(o.Seed, uint64(c)))
			for {
				i, ok := take()
				if !ok {
					return
				}
				isScore := o.ScoreEvery > 0 && i%o.ScoreEvery == o.ScoreEvery-1
				path, body := o.request(isScore, rng, i)
				t := time.Now()
				code, tokens, err := send(client, o.URL+path, body)
				d := time.Since(t)
				mu.Lock()
				switch {
				case err != nil:
					res.TransportErrors++
				default:
					res.Requests++
					res.Codes[code]++
					if code == http.StatusOK && isScore {
						res.Score++
						latScor = append(latScor, d)
					} else if code == http.StatusOK {
						res.Completions++
						res.Tokens += tokens
						latComp = append(latComp, d)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(t0)
	res.CompletionP50, res.CompletionP99 = percentile(latComp, 50), percentile(latComp, 99)
	res.ScoreP50, res.ScoreP99 = percentile(latScor, 50), percentile(latScor, 99)
	return res, nil
}

// request builds one request's path and body from random ids.
func (o *LoadOptions) request(score bool, rng *rand.Rand, i int) (string, []byte) {
	ids := func(n int) string {
		parts := make([]string, n)
		for k := range parts {
			parts[k] = strconv.Itoa(rng.IntN(o.Vocab))
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	if score {
		return "/v1/score", []byte(`{"ids": ` + ids(o.ScoreLen) + `}`)
	}
	return "/v1/completions", fmt.Appendf(nil, `{"prompt": %s, "max_tokens": %d, "temperature": 0.8, "top_k": 40, "seed": %d}`, ids(o.PromptLen), o.MaxTokens, i)
}

// send posts body and returns the status and, for a completion, the
// number of generated tokens.
func send(c *http.Client, url string, body []byte) (int, int, error) {
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, err
	}
	var v struct {
		Usage *usage `json:"usage"`
	}
	if resp.StatusCode == http.StatusOK && json.Unmarshal(b, &v) == nil && v.Usage != nil {
		return resp.StatusCode, v.Usage.CompletionTokens, nil
	}
	return resp.StatusCode, 0, nil
}

func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(a, b int) bool { return s[a] < s[b] })
	k := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, k-1))]
}

// RSS is this process's resident set size in bytes (Linux /proc; an error
// elsewhere).
func RSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, fmt.Errorf("serve: reading the resident set size: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("serve: /proc/self/statm reads %q", b)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("serve: /proc/self/statm reads %q", b)
	}
	return pages * int64(os.Getpagesize()), nil
}

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
	// Timeout and ReadTimeout are the server's (Config.Timeout and
	// Config.ReadTimeout): a request must be answered within Timeout, a
	// slow one cut off within ReadTimeout, both plus Grace (default 1 s).
	// A request unanswered after twice its bound is abandoned.
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
	// goroutines (defaults: RSS and runtime.NumGoroutine, for a server in
	// this process).
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
		return errors.New("serve: mixed load test: no URL")
	case o.Clients < 1 || o.Requests < 0 || o.Duration <= 0:
		return fmt.Errorf("serve: mixed load test: clients %d and duration %v must be positive, requests %d not negative", o.Clients, o.Duration, o.Requests)
	case o.Malformed < 0 || o.Slow < 0 || o.Malformed+o.Slow > 1:
		return fmt.Errorf("serve: mixed load test: the malformed (%v) and slow (%v) fractions must be in [0,1] together", o.Malformed, o.Slow)
	case o.PromptLen < 1 || o.MaxTokens < 1 || o.ScoreLen < 2 || o.InferLen < 1 || o.TopK < 1 || o.Vocab < 1:
		return errors.New("serve: mixed load test: prompt length, max tokens, infer length, top-k and vocabulary must be positive, the score length at least 2")
	case o.Timeout <= 0 || o.ReadTimeout <= 0:
		return errors.New("serve: mixed load test: give the server's timeout and read timeout")
	case o.Model == "" && o.Malformed+o.Slow < 1:
		return errors.New("serve: mixed load test: no model name for the KServe route")
	}
	for _, w := range o.Weights {
		if w < 0 {
			return fmt.Errorf("serve: mixed load test: weights %v must not be negative", o.Weights)
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
		o.RSS = RSS
	}
	if o.Goroutines == nil {
		o.Goroutines = goruntime.NumGoroutine
	}
}

// answer is the outcome of one request of a mixed load test.
type answer struct {
	code   int // 0: no answer
	lat    time.Duration
	first  time.Duration // a stream's first event
	tokens int
}

// MixLoad runs a mixed load test; it stops by itself after Requests
// requests or Duration, whichever comes first, or when ctx ends, and
// returns once the requests in flight are answered (or abandoned) and the
// settle period is over.
func MixLoad(ctx context.Context, o MixOptions) (MixResult, error) {
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
		return MixResult{}, fmt.Errorf("serve: mixed load test: URL %q: %v", o.URL, err)
	}
	res := MixResult{Clients: o.Clients, Bound: o.Timeout + o.Grace, SlowBound: o.ReadTimeout + o.Grace}
	for k := range res.Kinds {
		res.Kinds[k].Codes = map[int]int{}
	}
	rss := func() int64 {
		n, err := o.RSS()
		if err != nil {
			return 0
		}
		return n
	}
	res.GoroutinesBefore = steadyCount(o.Goroutines, time.Second)
	res.IdleRSS = rss()

	// The RSS sampler.
	peak := res.IdleRSS
	var peakMu sync.Mutex
	sampleStop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(o.SampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-sampleStop:
				return
			case <-tick.C:
				if n := rss(); n > 0 {
					peakMu.Lock()
					peak = max(peak, n)
					peakMu.Unlock()
				}
			}
		}
	}()

	lctx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	var (
		mu    sync.Mutex
		next  int
		lats  [NumKinds][]time.Duration
		first []time.Duration
		wg    sync.WaitGroup
		// malformedSent numbers the malformed requests.
		malformedSent atomic.Int64
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if (o.Requests > 0 && next >= o.Requests) || lctx.Err() != nil {
			return 0, false
		}
		next++
		return next - 1, true
	}
	total := 0
	for _, w := range o.Weights {
		total += w
	}
	t0 := time.Now()
	for c := range o.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(o.Seed, uint64(c)))
			for {
				i, ok := take()
				if !ok {
					return
				}
				k := o.draw(rng, total)
				bound := res.Bound
				if k == KindSlow {
					bound = res.SlowBound
				}
				// ctx (not lctx): a request sent before the end is answered.
				rctx, rcancel := context.WithTimeout(ctx, 2*bound)
				var a answer
				if k == KindSlow {
					a = o.slow(rctx, u, rng)
				} else {
					if k == KindMalformed { // the mistakes in turn
						i = int(malformedSent.Add(1) - 1)
					}
					a = o.send(rctx, client, k, rng, i)
				}
				rcancel()
				mu.Lock()
				kr := &res.Kinds[k]
				kr.Sent++
				if a.code == 0 {
					kr.NoAnswer++
				} else {
					kr.Codes[a.code]++
					if a.lat > bound {
						kr.Late++
					}
					if expected(k, a.code) {
						kr.Expected++
						kr.Tokens += a.tokens
						lats[k] = append(lats[k], a.lat)
						if k == KindStream {
							first = append(first, a.first)
						}
					}
				}
				mu.Unlock()
				if a.code == http.StatusTooManyRequests { // back off a little, as Retry-After asks
					time.Sleep(time.Duration(10+rng.IntN(90)) * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(t0)
	close(sampleStop)
	<-sampled
	res.AfterRSS = rss()
	res.PeakRSS = max(peak, res.AfterRSS)
	for k := range res.Kinds {
		kr := &res.Kinds[k]
		kr.P50, kr.P99, kr.Max = percentile(lats[k], 50), percentile(lats[k], 99), percentile(lats[k], 100)
	}
	res.Kinds[KindStream].FirstP50, res.Kinds[KindStream].FirstP99 = percentile(first, 50), percentile(first, 99)

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
	res.SettledRSS = rss()
	return res, nil
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

func (o *MixOptions) ids(rng *rand.Rand, n int) string {
	parts := make([]string, n)
	for k := range parts {
		parts[k] = strconv.Itoa(rng.IntN(o.Vocab))
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func (o *MixOptions) inferPath(name string) string {
	return "/v2/models/" + url.PathEscape(name) + "/infer"
}

// wellFormed builds a request of a well-formed kind.
func (o *MixOptions) wellFormed(k Kind, rng *rand.Rand, i int) (string, []byte) {
	switch k {
	case KindScore:
		return "/v1/score", []byte(`{"ids": ` + o.ids(rng, o.ScoreLen) + `}`)
	case KindInfer:
		in := fmt.Sprintf(`{"name": "input_ids", "shape": [1, %d], "datatype": "INT64", "data": %s}`, o.InferLen, o.ids(rng, o.InferLen))
		var body string
		switch i % 3 { // the three kinds of outputs selection
		case 0:
			body = `{"inputs": [` + in + `], "outputs": [{"name": "last_logits"}]}`
		case 1:
			body = fmt.Sprintf(`{"inputs": [%s], "outputs": [{"name": "top_k_ids", "parameters": {"top_k": %d}}, {"name": "top_k_logits", "parameters": {"top_k": %d}}]}`, in, o.TopK, o.TopK)
		default:
			target := fmt.Sprintf(`{"name": "target_ids", "shape": [1, %d], "datatype": "INT64", "data": %s}`, o.InferLen, o.ids(rng, o.InferLen))
			body = `{"inputs": [` + in + `, ` + target + `], "outputs": [{"name": "target_logprobs"}]}`
		}
		return o.inferPath(o.Model), []byte(body)
	}
	return "/v1/completions", fmt.Appendf(nil, `{"prompt": %s, "max_tokens": %d, "temperature": 0.8, "top_k": 40, "seed": %d, "stream": %v}`,
		o.ids(rng, o.PromptLen), o.MaxTokens, i, k == KindStream)
}

// malformed returns the i-th malformed request (MixLoad sends them in
// turn, every one of them once in every NumMalformed).
func (o *MixOptions) malformed(i int) (string, []byte) {
	list := o.malformedList()
	c := list[i%len(list)]
	return c.path, []byte(c.body)
}

// NumMalformed is the number of different malformed requests.
var NumMalformed = len((&MixOptions{}).malformedList())

// malformedList is the malformed requests: each is a client's mistake
// that the server must answer with a 4xx.
func (o *MixOptions) malformedList() []struct{ path, body string } {
	in := func(shape, data string) string {
		return `{"name": "input_ids", "shape": ` + shape + `, "datatype": "INT64", "data": ` + data + `}`
	}
	list := []struct{ path, body string }{
		{"/v1/completions", `{"prompt": [1, 2, `},                                        // truncated JSON
		{"/v1/completions", `{"prompt": {"ids": [1]}, "max_tokens": 2}`},                 // a prompt of the wrong type
		{"/v1/completions", `{"prompt": [1, 2], "max_tokens": -3}`},                      // negative max_tokens
		{"/v1/completions", fmt.Sprintf(`{"prompt": [%d], "max_tokens": 2}`, o.Vocab+7)}, // an id outside the vocabulary
		{"/v1/completions", `{"prompt": [1], "temperature": "hot"}`},                     // a string for a number
		{"/v1/completions", `{"prompt": [1], "max_tokens": 1000000000}`},                 // max_tokens beyond the limit
		{"/v1/completions", `{"prompt": [1]} {"prompt": [2]}`},                           // two JSON values
		{"/v1/score", ``},             // empty body
		{"/v1/score", `{"ids": [1]}`}, // one id
		{"/v1/score", `{"ids": "1 2 3"}`},
		{o.inferPath(o.Model), `{"inputs": [` + in("[2, 3]", "[1, 2]") + `]}`},                                               // data that does not fill the shape
		{o.inferPath(o.Model), `{"inputs": [` + in("[1, 2]", "[1, 2]") + `], "outputs": [{"name": "probs"}]}`},               // an unknown output
		{o.inferPath(o.Model), `{"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "FP32", "data": [1.5, 2]}]}`}, // a float input
		{o.inferPath(o.Model + "-missing"), `{"inputs": [` + in("[1, 2]", "[1, 2]") + `]}`},                                  // another model
		{o.inferPath(o.Model), `{"inputs": [` + in("[1, 2]", "[1, 2]") + `], "outputs": [{"name": "top_k_ids", "parameters": {"top_k": 0}}]}`},
	}
	return list
}

// send posts a well-formed or malformed request and waits for its whole
// answer (a stream's [DONE] or error event).
func (o *MixOptions) send(ctx context.Context, client *http.Client, k Kind, rng *rand.Rand, i int) answer {
	var path string
	var body []byte
	if k == KindMalformed {
		path, body = o.malformed(i)
	} else {
		path, body = o.wellFormed(k, rng, i)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.URL+path, bytes.NewReader(body))
	if err != nil {
		return answer{}
	}
	req.Header.Set("Content-Type", "application/json")
	t := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return answer{}
	}
	defer resp.Body.Close()
	if k == KindStream && resp.StatusCode == http.StatusOK {
		a := readStream(resp.Body, t)
		a.lat = time.Since(t)
		return a
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}
	}
	a := answer{code: resp.StatusCode, lat: time.Since(t)}
	var v struct {
		Usage *usage `json:"usage"`
	}
	if resp.StatusCode == http.StatusOK && json.Unmarshal(b, &v) == nil && v.Usage != nil {
		a.tokens = v.Usage.CompletionTokens
	}
	return a
}

// readStream reads server-sent events until [DONE] (200), an error event
// (its code) or the end of the stream (no answer).
func readStream(r io.Reader, t time.Time) answer {
	var a answer
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if a.first == 0 {
			a.first = time.Since(t)
		}
		if data == "[DONE]" {
			a.code = http.StatusOK
			return a
		}
		var v struct {
			Error *struct {
				Code int `json:"code"`
			} `json:"error"`
			Usage *usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &v); err != nil {
			return answer{}
		}
		if v.Error != nil {
			a.code = v.Error.Code
			return a
		}
		if v.Usage != nil {
			a.tokens = v.Usage.CompletionTokens
		}
	}
	return answer{}
}

// slow sends a request whose body comes a byte every Trickle, on a
// connection of its own, and waits for the answer: the server should cut
// it off with a 408 once its read timeout passes.
func (o *MixOptions) slow(ctx context.Context, u *url.URL, rng *rand.Rand) answer {
	t := time.Now()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return answer{}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	paths := []string{"/v1/completions", "/v1/score", o.inferPath(o.Model)}
	path := paths[rng.IntN(len(paths))]
	// A body that cannot arrive within twice the read timeout.
	n := int(2*o.ReadTimeout/o.Trickle) + 64
	body := append([]byte(`{"ids": [`), bytes.Repeat([]byte("1,"), n)...)
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, u.Host, len(body)); err != nil {
		return answer{}
	}
	done := make(chan struct{})
	trickled := make(chan struct{})
	go func() {
		defer close(trickled)
		tick := time.NewTicker(o.Trickle)
		defer tick.Stop()
		for _, b := range body {
			if _, err := conn.Write([]byte{b}); err != nil {
				return
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	close(done)
	a := answer{}
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		a = answer{code: resp.StatusCode, lat: time.Since(t)}
	}
	conn.Close()
	<-trickled
	return a
}
