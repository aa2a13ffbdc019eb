package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"time"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/runtime/serve"
	"github.com/urfave/cli/v2"
)

func benchServeCommand() *cli.Command {
	return &cli.Command{
		Name: "serve",
		Usage: "load test of rpac serve on loopback: closed-loop clients mixing completions and scores against a random-weight export of a preset; " +
			"p50/p99 latency, throughput, status codes and the process's RSS at start, middle and end",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "preset", Value: "tiny", Usage: "model preset exported with random weights"},
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
	var levels []int
	for _, f := range splitList(c.String("clients")) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return fmt.Errorf("--clients: %q is not a positive integer", f)
		}
		levels = append(levels, n)
	}
	if len(levels) == 0 {
		return errors.New("--clients: no concurrency level")
	}
	lengths, err := export.ParseLengths(c.String("lengths"))
	if err != nil {
		return fmt.Errorf("--lengths: %w", err)
	}
	if err := runtime.Available(); err != nil {
		return err
	}
	p, err := model.LookupPreset(c.String("preset"))
	if err != nil {
		return err
	}
	batch := c.Int("batch")
	if batch == 0 {
		batch = cfg.MaxBatch
	}
	ctx := c.Context
	w := c.App.Writer
	dir, err := os.MkdirTemp("", "rpac-bench-serve")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	st, err := randomStore(&p.Config, lengths[0], 1)
	if err != nil {
		return err
	}
	for _, T := range lengths[1:] { // running statistics at their initial value for every length
		mg, err := model.Build(&p.Config, model.Opts{T: T, B: 1, Mode: model.Eval, Logits: true, NoLoss: true})
		if err != nil {
			return err
		}
		if err := model.InitStore(mg.Specs, st, 1); err != nil {
			return err
		}
	}
	if _, err := export.Export(ctx, export.Options{Config: p.Config, Store: st, Lengths: lengths, Batch: batch,
		KVCache: c.Bool("kv-cache"), Out: dir, Tokenizer: "none", EOS: 0}); err != nil {
		return err
	}
	m, err := runtime.OpenContext(ctx, dir, runtime.Options{Provider: c.String("provider"), Threads: c.Int("threads")})
	if err != nil {
		return err
	}
	defer m.Close()
	cfg.Name = p.Name
	cfg.MaxTokens = max(cfg.MaxTokens, c.Int("gen-tokens"))
	s, err := serve.New(m, cfg)
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

	decoding := "KV cache"
	if !c.Bool("kv-cache") {
		decoding = "recomputing the context"
	}
	fmt.Fprintf(w, "rpac serve load test: %s preset (random weights), lengths %v, decoding on the %s, graph batch %d, max batch %d, max wait %v, queue %d; "+
		"completions of %d prompt ids and %d tokens, every %d-th request a score of %d ids; at most %d requests or %v per level\n",
		p.Name, lengths, decoding, batch, cfg.MaxBatch, cfg.MaxWait, cfg.Queue, c.Int("prompt-len"), c.Int("gen-tokens"),
		c.Int("score-every"), c.Int("score-len"), c.Int("requests"), c.Duration("duration"))
	fmt.Fprintf(w, "%7s %6s %6s %6s %9s %9s %9s %9s %8s %8s %s\n", "clients", "done", "429", "other", "comp p50", "comp p99", "score p50", "score p99", "req/s", "tok/s", "RSS")
	var rss []int64
	readRSS := func() {
		if n, err := serve.RSS(); err == nil {
			rss = append(rss, n)
		}
	}
	url := "http://" + ln.Addr().String()
	top := slices.Max(levels)
	if n := c.Int("warmup"); n != 0 {
		if n < 0 {
			n = top
		}
		if _, err := serve.Load(ctx, serve.LoadOptions{URL: url, Clients: top, Requests: n, Duration: c.Duration("duration"),
			ScoreEvery: c.Int("score-every"), PromptLen: c.Int("prompt-len"), MaxTokens: c.Int("gen-tokens"),
			ScoreLen: c.Int("score-len"), Vocab: p.Config.Vocab}); err != nil {
			return err
		}
	}
	readRSS()
	if path := c.String("cpuprofile"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var base float64
	for i, n := range levels {
		r, err := serve.Load(ctx, serve.LoadOptions{URL: url, Clients: n, Requests: c.Int("requests"),
			Duration: c.Duration("duration"), ScoreEvery: c.Int("score-every"), PromptLen: c.Int("prompt-len"),
			MaxTokens: c.Int("gen-tokens"), ScoreLen: c.Int("score-len"), Vocab: p.Config.Vocab, Seed: uint64(i + 1)})
		if err != nil {
			return err
		}
		readRSS()
		if i == 0 {
			base = r.TokensPerSecond()
		}
		fmt.Fprintf(w, "%7d %6d %6d %6d %9.1f %9.1f %9.1f %9.1f %8.2f %8.1f %.1f MiB  (%.2f× the tokens/s of %d client)\n",
			n, r.Completions+r.Score, r.Codes[429], r.Unexpected(), ms(r.CompletionP50), ms(r.CompletionP99), ms(r.ScoreP50), ms(r.ScoreP99),
			r.RequestsPerSecond(), r.TokensPerSecond(), float64(rss[len(rss)-1])/(1<<20), r.TokensPerSecond()/base, levels[0])
		if u := r.Unexpected(); u > 0 {
			fmt.Fprintf(w, "  %d unexpected answers: %v (transport errors %d)\n", u, r.Codes, r.TransportErrors)
		}
	}
	if len(rss) == len(levels)+1 {
		mib := func(i int) float64 { return float64(rss[i]) / (1 << 20) }
		fmt.Fprintf(w, "RSS (this process: server and clients) at start (after the warm-up), middle, end: %.1f, %.1f, %.1f MiB; latencies in ms\n",
			mib(0), mib(len(rss)/2), mib(len(rss)-1))
	}
	return nil
}
