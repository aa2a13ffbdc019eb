package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/rpac-dev/rpac/app/inferbench"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/urfave/cli/v2"
)

func benchInferCommand() *cli.Command {
	return &cli.Command{
		Name: "infer",
		Usage: "latency (p50/p95, mean of the fastest half), tokens/s and achieved GFLOP/s of exported models in onnxruntime (CPU), " +
			"the folded prior's cost (fuzzy with against without its folded bias) and the GEMM peak measured in the same run",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "preset", Value: "tiny,paper", Usage: "comma-separated presets (" + strings.Join(model.PresetNames(), ", ") + ")"},
			&cli.StringFlag{Name: "model", Value: "fuzzy,baseline", Usage: "comma-separated: fuzzy, baseline"},
			&cli.StringFlag{Name: "fold", Value: passes.FoldRPAMode.String() + "," + inferbench.FoldNoBias,
				Usage: "comma-separated fold modes for the fuzzy model: rpa (folded bias), rank or rank-approx (the prior as extra query/key components), nobias (the same folded graph with its bias dropped; benchmark only), none (RPA computed in the graph)"},
			&cli.StringFlag{Name: "attention", Value: passes.DefaultAttention.String(), Usage: "comma-separated attention lowerings: plain, op, op8 (op with padded heads)"},
			&cli.StringFlag{Name: "dtype", Value: "fp32", Usage: "comma-separated precisions: fp32, fp16, bf16 (rpac export --dtype), int8 (rpac export --quantize int8)"},
			&cli.StringFlag{Name: "json", Usage: "also write the rows as JSON to this file"},
			&cli.StringFlag{Name: "bench-out", Usage: "also write every timed run in Go's benchmark format to this file (benchstat old.txt new.txt compares two runs)"},
			&cli.IntFlag{Name: "length", Usage: "context length T (default: each preset's first training context)"},
			&cli.IntFlag{Name: "batch", Value: 1, Usage: "sequences per run"},
			&cli.IntFlag{Name: "runs", Value: 60, Usage: "timed runs per model"},
			&cli.IntFlag{Name: "block", Value: 3, Usage: "timed runs per model in one block; blocks alternate between the models (each block after one untimed run)"},
			&cli.BoolFlag{Name: "control", Usage: "also time a second session of the folded model (fold rpa#2) and report its difference from the first: the noise floor of the prior's cost"},
			&cli.IntFlag{Name: "threads", Usage: "onnxruntime intra-op threads (0: one per core)"},
			&cli.StringFlag{Name: "provider", Value: "cpu", Usage: "cpu|cuda"},
			&cli.DurationFlag{Name: "gemm-time", Value: 3 * time.Second, Usage: "time for the GEMM peak measurement (0: skip)"},
			&cli.StringFlag{Name: "keep", Usage: "keep the exported models under this folder"},
		},
		Action: benchInfer,
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// parseList reads a comma-separated list of values of a flag.
func parseList[T any](s string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, f := range splitList(s) {
		v, err := parse(f)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// inferConfig is the benchmark the flags describe.
func inferConfig(c *cli.Context) (inferbench.Config, error) {
	cfg := inferbench.Config{Folds: splitList(c.String("fold")),
		DTypes: splitList(c.String("dtype")), Length: c.Int("length"), Batch: c.Int("batch"), Runs: c.Int("runs"), Block: c.Int("block"),
		Control: c.Bool("control"), Threads: c.Int("threads"), Provider: c.String("provider"), GEMMTime: c.Duration("gemm-time"),
		Work: c.String("keep"), Log: logger(c)}
	var err error
	if cfg.Models, err = parseList(c.String("model"), model.ParseKind); err != nil {
		return cfg, err
	}
	if cfg.Attentions, err = parseList(c.String("attention"), passes.ParseAttention); err != nil {
		return cfg, err
	}
	if err := cfg.Check(); err != nil {
		return cfg, err
	}
	for _, name := range splitList(c.String("preset")) {
		p, err := model.LookupPreset(name)
		if err != nil {
			return cfg, err
		}
		cfg.Presets = append(cfg.Presets, p)
	}
	return cfg, nil
}

func benchInfer(c *cli.Context) error {
	if c.Args().Len() > 0 {
		return fmt.Errorf("unexpected arguments: %v", c.Args().Slice())
	}
	cfg, err := inferConfig(c)
	if err != nil {
		return err
	}
	if err := runtime.Available(); err != nil {
		return err
	}
	if cfg.Work == "" {
		if cfg.Work, err = os.MkdirTemp("", "rpac-bench-infer"); err != nil {
			return err
		}
		defer os.RemoveAll(cfg.Work)
	}
	rep, err := inferbench.Run(c.Context, cfg)
	if err != nil {
		return err
	}
	w := c.App.Writer
	inferbench.PrintRows(w, rep, &cfg)
	if err := writeInferFiles(c, rep); err != nil {
		return err
	}
	inferbench.PrintPriorCosts(w, rep.Costs)
	fmt.Fprintf(w, "load average (1 min) before the timed runs %s, during them %s, after %s (this benchmark itself keeps about %d runnable)\n",
		rep.Load0, inferbench.LoadRange(rep.Loads), rep.Load1, inferbench.Threads(cfg.Threads))
	return nil
}

// writeInferFiles writes --json and --bench-out.
func writeInferFiles(c *cli.Context, rep *inferbench.Report) error {
	for _, f := range []struct {
		flag  string
		write func(*os.File) error
	}{
		{"json", func(f *os.File) error { return inferbench.WriteJSON(f, rep.Rows, c.String("provider")) }},
		{"bench-out", func(f *os.File) error { return inferbench.WriteBenchfmt(f, rep, c.String("provider")) }},
	} {
		path := c.String(f.flag)
		if path == "" {
			continue
		}
		if err := writeFile(path, f.write); err != nil {
			return fmt.Errorf("--%s: %w", f.flag, err)
		}
	}
	return nil
}

func writeFile(path string, write func(*os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
