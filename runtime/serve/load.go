package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
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
