package main

import (
	"fmt"
	"math"
	"strings"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/training"
	"github.com/urfave/cli/v2"
)

func trainCommand() *cli.Command {
	return &cli.Command{
		Name:  "train",
		Usage: "train a model (fuzzy RPA transformer or baseline)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "preset", Value: "tiny", Usage: "model size: " + strings.Join(model.PresetNames(), "|")},
			&cli.StringFlag{Name: "model", Value: "fuzzy", Usage: "fuzzy|baseline"},
			&cli.StringFlag{Name: "dataset", Value: "wikitext2", Usage: "wikitext2|synthetic"},
			&cli.StringFlag{Name: "data-dir", Usage: "WikiText-2 raw directory (else $RPAC_DATA, the user cache, then a download)"},
			&cli.StringFlag{Name: "train-split", Value: "train", Usage: "split to train on (train|valid|test)"},
			&cli.StringFlag{Name: "eval-split", Value: "valid", Usage: "split to evaluate on"},
			&cli.IntFlag{Name: "context", Usage: "context length T (default: the preset's)"},
			&cli.IntFlag{Name: "tokens-per-step", Usage: "tokens per optimizer step; batch = tokens/T (default: the preset's)"},
			&cli.IntFlag{Name: "steps", Usage: "optimizer steps (default: from --epochs or the preset)"},
			&cli.Float64Flag{Name: "epochs", Usage: "passes over the training split (alternative to --steps)"},
			&cli.IntFlag{Name: "eval-every", Value: 0, Usage: "evaluate and checkpoint every N steps (0: only at the end)"},
			&cli.IntFlag{Name: "eval-batches", Value: 0, Usage: "limit each evaluation to N batches (0: the whole split)"},
			&cli.StringFlag{Name: "eval-stats", Value: "running", Usage: "RPA statistics in evaluation: running (causal) | batch (the paper's listing)"},
			&cli.Uint64Flag{Name: "seed", Value: 1},
			&cli.StringFlag{Name: "out", Usage: "run directory (checkpoint, metrics.jsonl)", Required: true},
			&cli.BoolFlag{Name: "resume", Usage: "continue the run in --out"},
			&cli.StringFlag{Name: "device", Value: "cpu", Usage: "cpu"},
			&cli.Float64Flag{Name: "lr", Usage: "peak learning rate (default: the preset's)"},
			&cli.Float64Flag{Name: "dropout", Value: -1, Usage: "dropout (default: the preset's)"},
			&cli.IntFlag{Name: "warm-in", Value: -1, Usage: "bias warm-in steps (default: the preset's)"},
			&cli.Float64Flag{Name: "grad-clip", Value: 1.0, Usage: "global gradient-norm clip"},
			&cli.StringFlag{Name: "dump-ir", Usage: "print the training graph after the named pass (" + strings.Join(passes.Names(passes.TrainPipeline), ", ") + ", or all)"},
		},
		Action: func(c *cli.Context) error {
			if c.Args().Len() > 0 {
				return fmt.Errorf("unexpected arguments: %v", c.Args().Slice())
			}
			for _, n := range []string{"context", "tokens-per-step", "steps", "eval-every", "eval-batches"} {
				if c.Int(n) < 0 {
					return fmt.Errorf("--%s must not be negative (got %d)", n, c.Int(n))
				}
			}
			if c.Float64("epochs") < 0 || math.IsNaN(c.Float64("epochs")) {
				return fmt.Errorf("--epochs must not be negative")
			}
			o := training.Options{
				Preset: c.String("preset"), Model: c.String("model"), Dataset: c.String("dataset"),
				DataDir: c.String("data-dir"), TrainSplit: c.String("train-split"), EvalSplit: c.String("eval-split"),
				Context: c.Int("context"), TokensPerStep: c.Int("tokens-per-step"), Steps: c.Int("steps"),
				Epochs: c.Float64("epochs"), EvalEvery: c.Int("eval-every"), EvalBatches: c.Int("eval-batches"),
				EvalStats: c.String("eval-stats"), Seed: c.Uint64("seed"), Out: c.String("out"), Resume: c.Bool("resume"),
				Device: c.String("device"), LR: c.Float64("lr"), Dropout: c.Float64("dropout"), WarmIn: c.Int("warm-in"),
				GradClip: c.Float64("grad-clip"), DumpIR: c.String("dump-ir"), Log: logger(c), Progress: c.App.ErrWriter,
			}
			res, err := training.Train(c.Context, o)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "trained %d steps: train CE %.4f -> %.4f, final %s CE %.4f (ppl %.1f), %.0f tokens/s; run in %s\n",
				res.Steps, res.InitialLoss, res.FinalLoss, "eval", res.FinalValCE, math.Exp(res.FinalValCE), res.TokensPerS, res.Out)
			return nil
		},
	}
}
