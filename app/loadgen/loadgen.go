// Package loadgen is the load generator of rpac bench serve: closed-loop
// HTTP clients against a running rpac server (runtime/serve), each sending
// a request, waiting for its whole answer and sending the next. Run sends
// completions and scores and measures latency and throughput; Mix sends
// every kind of request the server takes, malformed and slow ones among
// them, and checks that each is answered in time with the status it should
// get, that the memory comes back and that no goroutine is left behind.
//
// It speaks to the server over HTTP only and imports nothing of it.
package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options describe a closed-loop load test: Clients goroutines each send a
// request, wait for its answer and send the next, until Requests have been
// sent or Duration has passed.
type Options struct {
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

// Result is what a load test measured.
type Result struct {
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
func (r Result) RequestsPerSecond() float64 {
	return float64(r.Completions+r.Score) / r.Elapsed.Seconds()
}

// TokensPerSecond is the rate of generated tokens.
func (r Result) TokensPerSecond() float64 { return float64(r.Tokens) / r.Elapsed.Seconds() }

// Unexpected counts the answers that are neither 200 nor 429, and the
// requests that got no answer.
func (r Result) Unexpected() int {
	n := r.TransportErrors
	for c, k := range r.Codes {
		if c != http.StatusOK && c != http.StatusTooManyRequests {
			n += k
		}
	}
	return n
}

func (o *Options) check() error {
	switch {
	case o.URL == "":
		return errors.New("loadgen: load test: no URL")
	case o.Clients < 1 || o.Requests < 1 || o.Duration <= 0:
		return fmt.Errorf("loadgen: load test: clients %d, requests %d and duration %v must be positive", o.Clients, o.Requests, o.Duration)
	case o.PromptLen < 1 || o.MaxTokens < 0 || o.Vocab < 1 || o.ScoreEvery < 0:
		return errors.New("loadgen: load test: prompt length and vocabulary must be positive, max tokens and score-every not negative")
	case o.ScoreEvery > 0 && o.ScoreLen < 2:
		return errors.New("loadgen: load test: a score needs at least 2 ids")
	}
	return nil
}

// Run runs the load test; it stops by itself after Requests requests or
// Duration, whichever comes first, or when ctx ends.
func Run(ctx context.Context, o Options) (Result, error) {
	if err := o.check(); err != nil {
		return Result{}, err
	}
	client := o.Client
	if client == nil {
		client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.Clients}}
	}
	lctx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	var (
		mu      sync.Mutex
		res     = Result{Clients: o.Clients, Codes: map[int]int{}}
		latComp []time.Duration
		latScor []time.Duration
	)
	t0 := time.Now()
	closedLoop(lctx, o.Clients, o.Requests, o.Seed, func(rng *rand.Rand, i int) {
		isScore := o.ScoreEvery > 0 && i%o.ScoreEvery == o.ScoreEvery-1
		path, body := o.request(isScore, rng, i)
		// ctx (not lctx): a request sent before the end is answered.
		a := post(ctx, client, o.URL+path, body, false)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case a.code == 0:
			res.TransportErrors++
			return
		case a.code == http.StatusOK && isScore:
			res.Score++
			latScor = append(latScor, a.lat)
		case a.code == http.StatusOK:
			res.Completions++
			res.Tokens += a.tokens
			latComp = append(latComp, a.lat)
		}
		res.Requests++
		res.Codes[a.code]++
	})
	res.Elapsed = time.Since(t0)
	res.CompletionP50, res.CompletionP99 = percentile(latComp, 50), percentile(latComp, 99)
	res.ScoreP50, res.ScoreP99 = percentile(latScor, 50), percentile(latScor, 99)
	return res, nil
}

// request builds one request's path and body from random ids.
func (o *Options) request(score bool, rng *rand.Rand, i int) (string, []byte) {
	if score {
		return "/v1/score", scoreBody(ids(rng, o.Vocab, o.ScoreLen))
	}
	return "/v1/completions", completionBody(ids(rng, o.Vocab, o.PromptLen), o.MaxTokens, i, false)
}

// closedLoop runs clients goroutines, client c drawing from the random
// stream (seed, c), each calling do with the next request's number and
// waiting for it before it takes another, until requests have been taken
// (0: no bound) or ctx ends.
func closedLoop(ctx context.Context, clients, requests int, seed uint64, do func(rng *rand.Rand, i int)) {
	var (
		mu   sync.Mutex
		next int
		wg   sync.WaitGroup
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if (requests > 0 && next >= requests) || ctx.Err() != nil {
			return 0, false
		}
		next++
		return next - 1, true
	}
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			for {
				i, ok := take()
				if !ok {
					return
				}
				do(rng, i)
			}
		}()
	}
	wg.Wait()
}

// ids is n random token ids below vocab, as a JSON array.
func ids(rng *rand.Rand, vocab, n int) string {
	parts := make([]string, n)
	for k := range parts {
		parts[k] = strconv.Itoa(rng.IntN(vocab))
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// completionBody is a /v1/completions request for a prompt of ids.
func completionBody(prompt string, maxTokens, seed int, stream bool) []byte {
	return fmt.Appendf(nil, `{"prompt": %s, "max_tokens": %d, "temperature": 0.8, "top_k": 40, "seed": %d, "stream": %v}`,
		prompt, maxTokens, seed, stream)
}

// scoreBody is a /v1/score request of ids.
func scoreBody(ids string) []byte { return []byte(`{"ids": ` + ids + `}`) }

// answer is the outcome of one request.
type answer struct {
	code   int // 0: no answer
	lat    time.Duration
	first  time.Duration // a stream's first event
	tokens int
}

// usage is the part of a completion's answer that the load tests read.
type usage struct {
	CompletionTokens int `json:"completion_tokens"`
}

// post sends body to url and waits for the whole answer: a completion's
// generated tokens, and with stream a stream's events until [DONE] or its
// error event.
func post(ctx context.Context, client *http.Client, url string, body []byte, stream bool) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
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
	if stream && resp.StatusCode == http.StatusOK {
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
				Status int `json:"status"` // the HTTP status the stream's 200 could not give
			} `json:"error"`
			Usage *usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &v); err != nil {
			return answer{}
		}
		if v.Error != nil {
			a.code = v.Error.Status
			return a
		}
		if v.Usage != nil {
			a.tokens = v.Usage.CompletionTokens
		}
	}
	return answer{}
}

// percentile is the p-th percentile of ds (0 when there are none).
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(a, b int) bool { return s[a] < s[b] })
	k := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, k-1))]
}
