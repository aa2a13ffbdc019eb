package main

import (
	"fmt"
	"strings"

	"github.com/rpac-dev/rpac/app/inferbench"
	"github.com/rpac-dev/rpac/compiler/model"
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
			&cli.StringFlag{Name: "attention", Value: passes.DefaultAttention.String(), Usage: "attention lowering: plain or op"},
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
	p, err := model.LookupPreset(c.String("preset"))
	if err != nil {
		return err
	}
	cfg := inferbench.GenerateConfig{Preset: p, Length: c.Int("length"), Prompt: c.Int("prompt"),
		NewTokens: c.Int("new-tokens"), Rounds: c.Int("rounds"), Threads: c.Int("threads"), Work: c.String("keep")}
	if cfg.Model, err = model.ParseKind(c.String("model")); err != nil {
		return err
	}
	if cfg.Attention, err = passes.ParseAttention(c.String("attention")); err != nil {
		return err
	}
	if err := cfg.Check(); err != nil {
		return err
	}
	if err := runtime.Available(); err != nil {
		return err
	}
	w := c.App.Writer
	th := "one per core"
	if cfg.Threads > 0 {
		th = fmt.Sprint(cfg.Threads)
	}
	N := cfg.NewTokens
	fmt.Fprintf(w, "onnxruntime %s CPU, threads %s; %s %s, T=%d, attention %s; greedy, %d new tokens after a %d-token prompt (random weights)\n",
		runtime.ORTVersion, th, p.Name, cfg.Model, cfg.Length, cfg.Attention, N, cfg.Prompt)
	fmt.Fprintf(w, "load average (1 min) before: %s\n", inferbench.LoadAvg())
	res, err := inferbench.Generate(c.Context, cfg, func(r inferbench.GenerateRound) {
		fmt.Fprintf(w, "  round %d  %-9s %8.2f s  %8.2f tokens/s\n", r.Round, pathName(r.Cached), r.Time.Seconds(), float64(N)/r.Time.Seconds())
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "best round: KV cache %.2f tokens/s, recompute %.2f tokens/s: %.1f× (prefill included); same tokens: %v\n",
		float64(N)/res.Cached.Seconds(), float64(N)/res.Recompute.Seconds(), res.Recompute.Seconds()/res.Cached.Seconds(), res.SameTokens)
	fmt.Fprintf(w, "load average (1 min) after: %s\n", inferbench.LoadAvg())
	return nil
}

func pathName(cached bool) string {
	if cached {
		return "KV cache"
	}
	return "recompute"
}
