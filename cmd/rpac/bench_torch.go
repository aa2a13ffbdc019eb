package main

import (
	"fmt"
	"strings"

	"github.com/rpac-dev/rpac/bench/torch"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/urfave/cli/v2"
)

func benchTorchExportCommand() *cli.Command {
	return &cli.Command{
		Name:  "torch-export",
		Usage: "write a checkpoint, a fixed batch and rpac's loss on it for bench/torch/rpac_torch.py (the PyTorch implementation)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "out", Required: true, Usage: "folder to write (checkpoint/, batch.safetensors, rpac.json)"},
			&cli.StringFlag{Name: "preset", Value: "tiny", Usage: "preset (" + strings.Join(model.PresetNames(), ", ") + "); its weights seeded by --seed"},
			&cli.StringFlag{Name: "model", Value: "fuzzy", Usage: "fuzzy or baseline"},
			&cli.StringFlag{Name: "checkpoint", Usage: "take the config and weights of this checkpoint instead of --preset's seeded ones"},
			&cli.IntFlag{Name: "context", Usage: "T of the fixed batch (default: the preset's first context)"},
			&cli.IntFlag{Name: "batch", Value: 2, Usage: "sequences in the fixed batch"},
			&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the weights and the batch"},
		},
		Action: benchTorchExport,
	}
}

func benchTorchExport(c *cli.Context) error {
	p, err := model.LookupPreset(c.String("preset"))
	if err != nil {
		return err
	}
	cfg, store := &p.Config, kernels.NewStore(ir.FP32)
	if dir := c.String("checkpoint"); dir != "" {
		if cfg, store, err = torch.LoadCheckpoint(dir); err != nil {
			return err
		}
	} else if cfg.Model, err = model.ParseKind(c.String("model")); err != nil {
		return err
	}
	T := c.Int("context")
	if T == 0 {
		T = min(p.Contexts[0], cfg.MaxLen)
	}
	if T < 1 || c.Int("batch") < 1 {
		return fmt.Errorf("--context %d and --batch %d must be positive", T, c.Int("batch"))
	}
	b := torch.RandomBatch(cfg.Vocab, c.Int("batch"), T, c.Uint64("seed"))
	if err := b.Check(cfg.Vocab); err != nil {
		return err
	}
	res, err := torch.Export(c.String("out"), p.Name, cfg, store, b, c.Uint64("seed"))
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "bench torch-export: %s %s, batch %d×%d, rpac loss %.7f (fp32, CPU, eval with batch statistics); %s\n",
		res.Preset, res.Config.Model, res.B, res.T, res.Loss, c.String("out"))
	return nil
}
