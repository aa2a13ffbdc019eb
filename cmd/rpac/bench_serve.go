package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rpac-dev/rpac/app/inferbench"
	"github.com/rpac-dev/rpac/app/loadgen"
	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/internal/sysmem"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/runtime/serve"
	"github.com/rpac-dev/rpac/training/data"
	"github.com/urfave/cli/v2"
)

func benchServeCommand() *cli.Command {
	return &cli.Command{
		Name: "serve",
		Usage: "load test of rpac serve on loopback: closed-loop clients mixing completions and scores against a random-weight export of a preset (or an export folder); " +
			"p50/p99 latency, throughput, status codes and the process's RSS at start, middle and end. " +
			"--mix: clients mixing completions, streams, scores and KServe inferences with malformed and slow requests; per kind p50/p99 and status classes, peak and idle RSS, RSS and goroutines after the load",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "preset", Value: "tiny", Usage: "model preset exported with random weights"},
			&cli.StringFlag{Name: "model", Usage: "serve this export folder (written by rpac export) instead of a random-weight export of --preset"},
			&cli.StringFlag{Name: "lengths", Value: "32,64", Usage: "exported context lengths"},
			&cli.IntFlag{Name: "batch", Usage: "static batch of the exported full graphs (default: --max-batch)"},
			&cli.BoolFlag{Name: "kv-cache", Value: true, Usage: "export KV-cache graphs, so that completions decode on the cache (false: every step recomputes the whole context)"},
			&cli.StringFlag{Name: "clients", Value: "1,8,32", Usage: "comma-separated concurrency levels, run in order"},
			&cli.IntFlag{Name: "requests", Value: 64, Usage: "requests per concurrency level (at most)"},
			&cli.DurationFlag{Name: "duration", Value: 60 * time.Second, Usage: "time per concurrency level (at most)"},
			&cli.IntFlag{Name: "score-every", Value: 4, Usage: "every n-th request is a score (0: completions only)"},
			&cli.IntFlag{Name: "prompt-len", Value: 8, Usage: "prompt ids per completion"},
			&cli.IntFlag{Name: "gen-tokens", Value: 16, Usage: "max_tokens per completion"},
			&cli.IntFlag{Name: "score-len", Value: 32, Usage: "ids per score request"},
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a Go CPU profile of the timed levels to this file"},
			&cli.IntFlag{Name: "warmup", Value: -1, Usage: "untimed requests at the highest concurrency before the first level, so that the start RSS includes onnxruntime's buffers (-1: that many clients)"},
			&cli.BoolFlag{Name: "mix", Usage: "mixed load: completions, streams, scores and KServe inferences (with an outputs selection), with malformed and slow requests among them (--requests 0: --duration alone bounds a level)"},
			&cli.StringFlag{Name: "weights", Value: "1,1,1,1", Usage: "--mix: weights of completions, streams, scores and KServe inferences among the well-formed requests"},
			&cli.Float64Flag{Name: "malformed", Value: 0.05, Usage: "--mix: fraction of malformed requests (each should get a 4xx)"},
			&cli.Float64Flag{Name: "slow", Value: 0.05, Usage: "--mix: fraction of slow requests, whose body trickles in and never arrives within --read-timeout (each should get a 408)"},
			&cli.DurationFlag{Name: "trickle", Usage: "--mix: time between two bytes of a slow body (default: a twentieth of --read-timeout)"},
			&cli.IntFlag{Name: "infer-len", Value: 16, Usage: "--mix: ids per KServe row"},
			&cli.IntFlag{Name: "top-k", Value: 5, Usage: "--mix: top_k of the KServe top_k_ids and top_k_logits outputs"},
			&cli.DurationFlag{Name: "grace", Value: time.Second, Usage: "--mix: time allowed past --timeout (slow requests: --read-timeout) for an answer to count as in time"},
			&cli.DurationFlag{Name: "settle", Value: 10 * time.Second, Usage: "--mix: time after each level for the goroutines to fall back to their count before it; the RSS is read again at its end"},
		}, serveFlags()...),
		Action: benchServe,
	}
}

func benchServe(c *cli.Context) error {
	if c.Args().Len() > 0 {
		return fmt.Errorf("unexpected arguments: %v", c.Args().Slice())
	}
	cfg, err := serveConfig(c)
	if err != nil {
		return err
	}
	levels, err := clientLevels(c.String("clients"))
	if err != nil {
		return err
	}
	if c.Bool("mix") {
		if _, err := mixFlags(c); err != nil {
			return err
		}
	}
	if err := runtime.Available(); err != nil {
		return err
	}
	cfg.MaxTokens = max(cfg.MaxTokens, c.Int("gen-tokens"))
	var bm *benchModel
	if c.String("model") != "" {
		bm, err = openBenchModel(c, &cfg)
	} else {
		bm, err = exportBenchModel(c, &cfg)
	}
	if err != nil {
		return err
	}
	defer bm.close()
	ctx := c.Context
	s, err := serve.New(bm.m, cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- s.Serve(sctx, ln) }()
	defer func() { stop(); <-served }()

	url := "http://" + ln.Addr().String()
	if c.Bool("mix") {
		return benchServeMix(c, url, cfg, bm, levels)
	}
	return benchServeLevels(c, url, cfg, bm, levels)
}

// clientLevels parses --clients.
func clientLevels(s string) ([]int, error) {
	var levels []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--clients: %q is not a positive integer", f)
		}
		levels = append(levels, n)
	}
	if len(levels) == 0 {
		return nil, errors.New("--clients: no concurrency level")
	}
	return levels, nil
}

// benchServeLevels runs the load test at every concurrency level against
// the server at url and prints a line per level.
func benchServeLevels(c *cli.Context, url string, cfg serve.Config, bm *benchModel, levels []int) error {
	if c.Int("requests") < 1 {
		return fmt.Errorf("--requests must be positive (got %d)", c.Int("requests"))
	}
	ctx, w := c.Context, c.App.Writer
	fmt.Fprintf(w, "rpac serve load test: %s, max batch %d, max wait %v, queue %d; "+
		"completions of %d prompt ids and %d tokens, every %d-th request a score of %d ids; at most %d requests or %v per level\n",
		bm.desc, cfg.MaxBatch, cfg.MaxWait, cfg.Queue, c.Int("prompt-len"), c.Int("gen-tokens"),
		c.Int("score-every"), c.Int("score-len"), c.Int("requests"), c.Duration("duration"))
	fmt.Fprintf(w, "%7s %6s %6s %6s %9s %9s %9s %9s %8s %8s %s\n", "clients", "done", "429", "other", "comp p50", "comp p99", "score p50", "score p99", "req/s", "tok/s", "RSS")
	var rss []int64
	readRSS := func() {
		if n, err := sysmem.RSS(); err == nil {
			rss = append(rss, n)
		}
	}
	load := func(clients, requests int, seed uint64) (loadgen.Result, error) {
		return loadgen.Run(ctx, loadgen.Options{URL: url, Clients: clients, Requests: requests, Duration: c.Duration("duration"),
			ScoreEvery: c.Int("score-every"), PromptLen: c.Int("prompt-len"), MaxTokens: c.Int("gen-tokens"),
			ScoreLen: c.Int("score-len"), Vocab: bm.vocab, Seed: seed})
	}
	if n := c.Int("warmup"); n != 0 {
		if _, err := load(slices.Max(levels), cmp.Or(max(n, 0), slices.Max(levels)), 0); err != nil {
			return err
		}
	}
	readRSS()
	if path := c.String("cpuprofile"); path != "" {
		stop, err := startCPUProfile(path)
		if err != nil {
			return err
		}
		defer stop()
	}
	var base float64
	for i, n := range levels {
		r, err := load(n, c.Int("requests"), uint64(i+1))
		if err != nil {
			return err
		}
		readRSS()
		if i == 0 {
			base = r.TokensPerSecond()
		}
		printLevel(w, n, r, rss[len(rss)-1], base, levels[0])
	}
	if len(rss) == len(levels)+1 {
		mib := func(i int) float64 { return float64(rss[i]) / (1 << 20) }
		fmt.Fprintf(w, "RSS (this process: server and clients) at start (after the warm-up), middle, end: %.1f, %.1f, %.1f MiB; latencies in ms\n",
			mib(0), mib(len(rss)/2), mib(len(rss)-1))
	}
	return nil
}

// printLevel prints one concurrency level's line.
func printLevel(w io.Writer, n int, r loadgen.Result, rss int64, base float64, first int) {
	fmt.Fprintf(w, "%7d %6d %6d %6d %9.1f %9.1f %9.1f %9.1f %8.2f %8.1f %.1f MiB  (%.2f× the tokens/s of %d client)\n",
		n, r.Completions+r.Score, r.Codes[429], r.Unexpected(), ms(r.CompletionP50), ms(r.CompletionP99), ms(r.ScoreP50), ms(r.ScoreP99),
		r.RequestsPerSecond(), r.TokensPerSecond(), float64(rss)/(1<<20), r.TokensPerSecond()/base, first)
	if u := r.Unexpected(); u > 0 {
		fmt.Fprintf(w, "  %d unexpected answers: %v (transport errors %d)\n", u, r.Codes, r.TransportErrors)
	}
}

// benchModel is the model a load test serves.
type benchModel struct {
	m     *runtime.Model
	name  string // the name in the KServe routes
	desc  string // for the report's first line
	vocab int
	dir   string // a temporary export to remove ("" for --model)
}

func (b *benchModel) close() {
	b.m.Close()
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// exportBenchModel exports --preset with random weights into a temporary
// folder and opens it.
func exportBenchModel(c *cli.Context, cfg *serve.Config) (*benchModel, error) {
	lengths, err := export.ParseLengths(c.String("lengths"))
	if err != nil {
		return nil, fmt.Errorf("--lengths: %w", err)
	}
	p, err := model.LookupPreset(c.String("preset"))
	if err != nil {
		return nil, err
	}
	batch := c.Int("batch")
	if batch == 0 {
		batch = cfg.MaxBatch
	}
	dir, err := os.MkdirTemp("", "rpac-bench-serve")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*benchModel, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if _, err := inferbench.ExportRandom(c.Context, export.Options{Config: p.Config, Lengths: lengths, Batch: batch,
		KVCache: c.Bool("kv-cache"), Out: dir}); err != nil {
		return fail(err)
	}
	m, err := runtime.OpenContext(c.Context, dir, sessionOptions(c, nil))
	if err != nil {
		return fail(err)
	}
	decoding := "KV cache"
	if !c.Bool("kv-cache") {
		decoding = "recomputing the context"
	}
	cfg.Name = p.Name
	return &benchModel{m: m, name: p.Name, vocab: p.Config.Vocab, dir: dir,
		desc: fmt.Sprintf("%s preset (random weights), lengths %v, decoding on the %s, graph batch %d", p.Name, lengths, decoding, batch)}, nil
}

// openBenchModel opens the export folder --model as rpac serve does.
func openBenchModel(c *cli.Context, cfg *serve.Config) (*benchModel, error) {
	dir := c.String("model")
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	man, err := runtime.ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	if man.Tokenizer == data.GPT2TokenizerName {
		cfg.Tokenizer = data.NewTokenizer()
	}
	m, err := runtime.OpenContext(c.Context, dir, sessionOptions(c, cfg.Tokenizer))
	if err != nil {
		return nil, err
	}
	cfg.Name = filepath.Base(abs)
	decoding := "recomputing the context"
	if kv := m.KVCacheLengths(); len(kv) > 0 {
		decoding = fmt.Sprintf("KV cache (lengths %v)", kv)
	}
	return &benchModel{m: m, name: cfg.Name, vocab: m.VocabSize(),
		desc: fmt.Sprintf("export %s (vocabulary %d, tokenizer %q), lengths %v, decoding on the %s, graph batch %d",
			dir, m.VocabSize(), man.Tokenizer, m.Lengths(), decoding, m.BatchSize())}, nil
}

// benchServeMix runs the mixed load test at each level and prints its
// report.
func benchServeMix(c *cli.Context, url string, cfg serve.Config, bm *benchModel, levels []int) error {
	w := c.App.Writer
	weights, err := mixFlags(c)
	if err != nil {
		return err
	}
	f := splitList(c.String("weights"))
	opts := func(clients, requests int, seed uint64) loadgen.MixOptions {
		return loadgen.MixOptions{URL: url, Model: bm.name, Clients: clients, Requests: requests, Duration: c.Duration("duration"),
			Weights: weights, Malformed: c.Float64("malformed"), Slow: c.Float64("slow"),
			PromptLen: c.Int("prompt-len"), MaxTokens: c.Int("gen-tokens"), ScoreLen: c.Int("score-len"), InferLen: c.Int("infer-len"),
			TopK: c.Int("top-k"), Vocab: bm.vocab, Seed: seed, Timeout: cfg.Timeout, ReadTimeout: cfg.ReadTimeout,
			Grace: c.Duration("grace"), Trickle: c.Duration("trickle"), Settle: c.Duration("settle")}
	}
	trickle := c.Duration("trickle")
	if trickle <= 0 {
		trickle = max(time.Millisecond, cfg.ReadTimeout/20)
	}
	bounds := fmt.Sprintf("at most %v", c.Duration("duration"))
	if n := c.Int("requests"); n > 0 {
		bounds = fmt.Sprintf("at most %d requests or %v", n, c.Duration("duration"))
	}
	fmt.Fprintf(w, "rpac serve mixed load test: %s; max batch %d, max wait %v, queue %d, timeout %v, read timeout %v; "+
		"well-formed requests completion:stream:score:kserve %s, %.0f%% malformed, %.0f%% slow (a byte every %v); "+
		"completions of %d prompt ids and %d tokens, scores of %d ids, KServe rows of %d ids (last_logits | top_k_ids and top_k_logits, top_k %d | target_logprobs); "+
		"%s per level\n",
		bm.desc, cfg.MaxBatch, cfg.MaxWait, cfg.Queue, cfg.Timeout, cfg.ReadTimeout, strings.Join(f, ":"), 100*c.Float64("malformed"), 100*c.Float64("slow"), trickle,
		c.Int("prompt-len"), c.Int("gen-tokens"), c.Int("score-len"), c.Int("infer-len"), c.Int("top-k"), bounds)
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	cold, _ := sysmem.RSS()
	if n := c.Int("warmup"); n != 0 {
		top := slices.Max(levels)
		if n < 0 {
			n = top
		}
		wo := opts(min(top, n), n, 0)
		wo.Malformed, wo.Slow, wo.Settle = 0, 0, time.Millisecond
		if _, err := loadgen.Mix(c.Context, wo); err != nil {
			return err
		}
		fmt.Fprintf(w, "warm-up: %d well-formed requests; RSS (this process: server and clients) %.1f MiB before it\n", n, mib(cold))
	}
	for i, n := range levels {
		r, err := loadgen.Mix(c.Context, opts(n, c.Int("requests"), uint64(i+1)))
		if err != nil {
			return err
		}
		printMixLevel(w, n, r, c.Duration("settle"))
	}
	return nil
}

// printMixLevel prints the report of one level of the mixed load test.
func printMixLevel(w io.Writer, n int, r loadgen.MixResult, settle time.Duration) {
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	fmt.Fprintf(w, "\n%d clients, %.1f s; latencies in ms of the expected answers (2xx; malformed: 4xx; slow: 408), a stream's until [DONE]\n", n, r.Elapsed.Seconds())
	fmt.Fprintf(w, "%-10s %6s %6s %6s %5s %5s %5s %5s %9s %9s %9s\n", "kind", "sent", "2xx", "4xx", "429", "5xx", "none", "late", "p50", "p99", "max")
	late := 0
	for k, kr := range r.Kinds {
		cl := kr.Classes()
		late += kr.Late
		fmt.Fprintf(w, "%-10s %6d %6d %6d %5d %5d %5d %5d %9.1f %9.1f %9.1f", loadgen.Kind(k), kr.Sent, cl.OK, cl.Client, cl.TooMany, cl.Server, cl.NoAnswer, kr.Late, ms(kr.P50), ms(kr.P99), ms(kr.Max))
		switch loadgen.Kind(k) {
		case loadgen.KindStream:
			fmt.Fprintf(w, "  first event p50 / p99 %.1f / %.1f", ms(kr.FirstP50), ms(kr.FirstP99))
		case loadgen.KindMalformed, loadgen.KindSlow:
			fmt.Fprintf(w, "  %v", codeList(kr.Codes))
		}
		fmt.Fprintln(w)
	}
	t := r.Total()
	fmt.Fprintf(w, "%-10s %6d %6d %6d %5d %5d %5d\n", "all", r.Sent(), t.OK, t.Client, t.TooMany, t.Server, t.NoAnswer)
	fmt.Fprintf(w, "RSS (this process: server and clients): idle %.1f MiB, peak %.1f MiB (%.2f× idle), after the load %.1f MiB, after %v %.1f MiB\n",
		mib(r.IdleRSS), mib(r.PeakRSS), float64(r.PeakRSS)/float64(max(1, r.IdleRSS)), mib(r.AfterRSS), settle, mib(r.SettledRSS))
	leak := "none left over"
	if l := r.Leaked(); l > 0 {
		leak = fmt.Sprintf("%d left over", l)
	}
	fmt.Fprintf(w, "goroutines: %d before, %d after the load and %.1f s of settling: %s\n", r.GoroutinesBefore, r.GoroutinesAfter, r.SettledIn.Seconds(), leak)
	verdict := "every request answered or refused in time"
	if none := t.NoAnswer; late+none > 0 {
		verdict = fmt.Sprintf("%d answered late, %d not answered", late, none)
	}
	fmt.Fprintf(w, "bounds: %v (--timeout + --grace), slow requests %v (--read-timeout + --grace): %s; 5xx: %d\n", r.Bound, r.SlowBound, verdict, t.Server)
}

// mixFlags checks the flags of --mix and returns the weights.
func mixFlags(c *cli.Context) ([loadgen.KindInfer + 1]int, error) {
	var weights [loadgen.KindInfer + 1]int
	f := splitList(c.String("weights"))
	if len(f) != len(weights) {
		return weights, fmt.Errorf("--weights: %q: want 4 weights (completions, streams, scores, KServe)", c.String("weights"))
	}
	total := 0
	for i, x := range f {
		n, err := strconv.Atoi(x)
		if err != nil || n < 0 {
			return weights, fmt.Errorf("--weights: %q is not a weight (an integer, at least 0)", x)
		}
		weights[i] = n
		total += n
	}
	m, sl := c.Float64("malformed"), c.Float64("slow")
	switch {
	case total == 0:
		return weights, errors.New("--weights: all zero")
	case m < 0 || sl < 0 || m+sl > 1:
		return weights, fmt.Errorf("--malformed (%v) and --slow (%v) must be fractions that add up to at most 1", m, sl)
	case c.Int("requests") < 0:
		return weights, fmt.Errorf("--requests must not be negative (got %d)", c.Int("requests"))
	case c.Int("infer-len") < 1 || c.Int("top-k") < 1 || c.Int("gen-tokens") < 1 || c.Int("prompt-len") < 1 || c.Int("score-len") < 2:
		return weights, errors.New("--infer-len, --top-k, --gen-tokens and --prompt-len must be positive, --score-len at least 2")
	case c.Duration("grace") < 0 || c.Duration("trickle") < 0 || c.Duration("settle") < 0:
		return weights, errors.New("--grace, --trickle and --settle must not be negative")
	}
	return weights, nil
}

// codeList formats answers by status, in order of status.
func codeList(codes map[int]int) string {
	keys := slices.Sorted(maps.Keys(codes))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d×%d", codes[k], k)
	}
	return strings.Join(parts, " ")
}
