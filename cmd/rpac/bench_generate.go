package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/internal/inferbench"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/urfave/cli/v2"
)

func benchGenerateCommand() *cli.Command {
	return &cli.Command{
		Name: "generate",
		Usage: "tokens/s of runtime.Generate (greedy) with the KV cache against running the full graph for every token, " +
			"on a random-init export of one length, alternating in the same run",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "preset", Value: "paper", Usage: "preset (" + strings.Join(model.PresetNames(), ", ") + ")"},
			&cli.StringFlag{Name: "model", Value: "fuzzy", Usage: "fuzzy or baseline"},
			&cli.IntFlag{Name: "length", Value: 768, Usage: "exported length T (the generation runs at T)"},
			&cli.IntFlag{Name: "prompt", Value: 128, Usage: "prompt tokens"},
			&cli.IntFlag{Name: "new-tokens", Value: 256, Usage: "tokens to generate"},
			&cli.IntFlag{Name: "rounds", Value: 1, Usage: "rounds; each times both paths, in alternating order"},
			&cli.StringFlag{Name: "attention", Value: passes.DefaultAttention, Usage: "attention lowering: plain or op"},
			&cli.IntFlag{Name: "threads", Usage: "onnxruntime intra-op threads (0: one per core)"},
			&cli.StringFlag{Name: "keep", Usage: "keep the export under this folder"},
		},
		Action: benchGenerate,
	}
}

func benchGenerate(c *cli.Context) error {
	if c.Args().Len() > 0 {
		return fmt.Errorf("unexpected arguments: %v", c.Args().Slice())
	}
	T, P, N := c.Int("length"), c.Int("prompt"), c.Int("new-tokens")
	if P < 1 || N < 1 || c.Int("rounds") < 1 || c.Int("threads") < 0 {
		return fmt.Errorf("--prompt, --new-tokens and --rounds must be positive, --threads not negative")
	}
	if P+N > T {
		return fmt.Errorf("--prompt %d plus --new-tokens %d exceed --length %d", P, N, T)
	}
	if a := c.String("attention"); a != passes.AttentionOp && a != passes.AttentionPlain {
		return fmt.Errorf("--attention %q: want plain or op", a)
	}
	if err := runtime.Available(); err != nil {
		return err
	}
	p, err := model.LookupPreset(c.String("preset"))
	if err != nil {
		return err
	}
	cfg := p.Config
	cfg.Model = c.String("model")
	if cfg.Model != "fuzzy" && cfg.Model != "baseline" {
		return fmt.Errorf("--model %q: want fuzzy or baseline", cfg.Model)
	}
	st, err := inferbench.RandomStore(&cfg, T, 1)
	if err != nil {
		return err
	}
	dir := c.String("keep")
	if dir == "" {
		if dir, err = os.MkdirTemp("", "rpac-bench-generate"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	if _, err := export.Export(c.Context, export.Options{Config: cfg, Store: st, Lengths: []int{T}, Attention: c.String("attention"),
		KVCache: true, Out: dir, Tokenizer: "none", EOS: 0}); err != nil {
		return err
	}
	m, err := runtime.OpenContext(c.Context, dir, runtime.Options{Threads: c.Int("threads")})
	if err != nil {
		return err
	}
	defer m.Close()
	rng := rand.New(rand.NewPCG(7, uint64(T)))
	prompt := make([]int32, P)
	for i := range prompt {
		prompt[i] = int32(rng.IntN(cfg.Vocab))
	}
	w := c.App.Writer
	th := "one per core"
	if c.Int("threads") > 0 {
		th = fmt.Sprint(c.Int("threads"))
	}
	fmt.Fprintf(w, "onnxruntime %s CPU, threads %s; %s %s, T=%d, attention %s; greedy, %d new tokens after a %d-token prompt (random weights)\n",
		runtime.ORTVersion, th, p.Name, cfg.Model, T, c.String("attention"), N, P)
	fmt.Fprintf(w, "load average (1 min) before: %s\n", inferbench.LoadAvg())
	// Untimed warm-up of both paths (sessions open on first use).
	for _, cached := range []bool{false, true} {
		if _, err := m.Generate(c.Context, prompt, runtime.GenerateOptions{MaxNewTokens: 2, Recompute: !cached}); err != nil {
			return err
		}
	}
	times := map[bool][]time.Duration{}
	var tokens [2][]int32
	for r := 0; r < c.Int("rounds"); r++ {
		order := []bool{false, true} // recompute first in even rounds
		if r%2 == 1 {
			order = []bool{true, false}
		}
		for _, cached := range order {
			t0 := time.Now()
			out, err := m.Generate(c.Context, prompt, runtime.GenerateOptions{MaxNewTokens: N, Recompute: !cached})
			if err != nil {
				return err
			}
			d := time.Since(t0)
			times[cached] = append(times[cached], d)
			i := 0
			if cached {
				i = 1
			}
			tokens[i] = out
			fmt.Fprintf(w, "  round %d  %-9s %8.2f s  %8.2f tokens/s\n", r+1, pathName(cached), d.Seconds(), float64(N)/d.Seconds())
		}
	}
	best := func(ds []time.Duration) time.Duration { return slices.Min(ds) }
	rc, full := best(times[true]), best(times[false])
	fmt.Fprintf(w, "best round: KV cache %.2f tokens/s, recompute %.2f tokens/s: %.1f× (prefill included); same tokens: %v\n",
		float64(N)/rc.Seconds(), float64(N)/full.Seconds(), full.Seconds()/rc.Seconds(), slices.Equal(tokens[0], tokens[1]))
	fmt.Fprintf(w, "load average (1 min) after: %s\n", inferbench.LoadAvg())
	return nil
}

func pathName(cached bool) string {
	if cached {
		return "KV cache"
	}
	return "recompute"
}
