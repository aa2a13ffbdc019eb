package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rpac-dev/rpac/app/lengtheval"
	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/training"
	"github.com/urfave/cli/v2"
)

func ablateCommand() *cli.Command {
	return &cli.Command{
		Name:  "ablate",
		Usage: "run the paper's stepwise ablation path for N seeds under equal compute; write ablation.md and ablation.csv",
		Description: "Stages: baseline (legacy fuzzy bias, one context, cosine to zero); + context game + Sinkhorn align;\n" +
			"+ Guardian + late-phase schedules (LR floor, EMA, chaos, dropout glide); + SWA-select.\n" +
			"Every run has the same steps and tokens per step and is evaluated at the same length.\n" +
			"Runs go seed by seed through every stage (paired: the stages share each seed, the seed of the data order and the initialisation), and finished runs\n" +
			"(their result.json, made with the same settings) are reused, so an interrupted ablation continues where it stopped.",
		Flags:  append(append(append(ablateFlags(), memoryFlagDefs()...), sizeFlags()...), syntheticFlags()...),
		Action: ablateAction,
	}
}

func ablateFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "preset", Value: "tiny", Usage: "model size: " + strings.Join(model.PresetNames(), "|")},
		&cli.StringFlag{Name: "dataset", Value: "wikitext2", Usage: "wikitext2|synthetic|mqar"},
		lossFlag(),
		&cli.StringFlag{Name: "data-dir", Usage: "WikiText-2 raw directory (else $RPAC_DATA, the user cache, then a download)"},
		&cli.StringFlag{Name: "train-split", Value: "train", Usage: "split to train on"},
		&cli.StringFlag{Name: "eval-split", Value: "valid", Usage: "split to evaluate on"},
		&cli.IntFlag{Name: "seeds", Value: 2, Usage: "runs per stage (seeds --seed, --seed+1, …)"},
		&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "first seed"},
		&cli.IntFlag{Name: "steps", Usage: "steps per run (default: 160 for tiny, else the preset's)"},
		&cli.IntFlag{Name: "tokens-per-step", Usage: "tokens per step (default: the preset's)"},
		&cli.StringFlag{Name: "contexts", Usage: "context game lengths (default: the preset's, or T/2,T)"},
		&cli.IntFlag{Name: "eval-every", Usage: "steps per epoch/evaluation (default: steps/10)"},
		&cli.IntFlag{Name: "eval-batches", Value: 4, Usage: "batches per in-run evaluation (0: the whole split)"},
		&cli.IntFlag{Name: "final-eval-batches", Value: 24, Usage: "batches of the final evaluation that the table reports (0: the whole split)"},
		&cli.Float64Flag{Name: "lr", Usage: "peak learning rate (default: the preset's)"},
		&cli.IntFlag{Name: "warm-in", Value: -1, Usage: "steps over which the attention bias (prior) ramps in, for every stage (default: the preset's)"},
		&cli.Float64Flag{Name: "lr-flat", Usage: "fraction of steps at the peak LR before the cosine, for every stage (default: each stage's own)"},
		&cli.Float64Flag{Name: "lr-floor", Usage: "LR floor as a fraction of the peak, for every stage (default: each stage's own)"},
		&cli.StringFlag{Name: "stages", Usage: "comma-separated stages: baseline,cg_align,guardian_late,swa_select (default: these four), or the comparison stages transformer,fuzzy_legacy,fuzzy_rpa"},
		&cli.BoolFlag{Name: "keep-checkpoints", Usage: "keep each run's checkpoint (tiny: ~140 MB each)"},
		&cli.StringFlag{Name: "eval-lengths", Usage: "also score every run's evaluation split at these context lengths (e.g. 64,128,256; up to the preset's max_len) through the folded export in onnxruntime, lengths it did not train at calibrated as rpac export does; a table per length"},
		&cli.IntFlag{Name: "eval-lengths-tokens", Usage: "--eval-lengths: score the first N tokens of the evaluation split at each length, in ⌊N/T⌋ chunks of T (0: the whole split)"},
		&cli.StringFlag{Name: "out", Usage: "directory for the runs, ablation.md and ablation.csv", Required: true},
	}
}

func ablateAction(c *cli.Context) error {
	if c.Args().Len() > 0 {
		return fmt.Errorf("unexpected arguments: %v", c.Args().Slice())
	}
	if err := checkCounts(c, []string{"seeds", "steps", "tokens-per-step", "eval-every", "eval-batches", "final-eval-batches"}, nil); err != nil {
		return err
	}
	opts, err := ablationOptions(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(opts.Base.Out, 0o755); err != nil {
		return err
	}
	results, err := training.Ablate(c.Context, opts)
	if err != nil {
		return err
	}
	byDist := training.RecallByDistanceTable(results)
	var byLength string
	if opts.AtLengths != nil {
		byLength = training.LengthTable(results, opts.AtLengths.Lengths)
	}
	table, err := training.WriteAblation(opts.Base.Out, ablationHeader(c, opts.Base, results), training.Summarize(results), byDist, byLength)
	if err != nil {
		return err
	}
	for _, t := range []string{table, byDist, byLength} {
		if t != "" {
			fmt.Fprintln(c.App.Writer, t)
		}
	}
	fmt.Fprintf(c.App.Writer, "wrote %s/ablation.md and %s/ablation.csv\n", opts.Base.Out, opts.Base.Out)
	return nil
}

// ablationOptions is the ablation the flags describe.
func ablationOptions(c *cli.Context) (training.AblationOptions, error) {
	preset, err := model.LookupPreset(c.String("preset"))
	if err != nil {
		return training.AblationOptions{}, err
	}
	steps := c.Int("steps")
	if steps == 0 {
		steps = preset.Steps
		if preset.Name == "tiny" {
			steps = 160
		}
	}
	contexts, err := parseInts("contexts", c.String("contexts"))
	if err != nil {
		return training.AblationOptions{}, err
	}
	syn, err := syntheticFromFlags(c)
	if err != nil {
		return training.AblationOptions{}, err
	}
	mq, err := mqarFromFlags(c)
	if err != nil {
		return training.AblationOptions{}, err
	}
	loss, err := training.ParseLossTargets(c.String("loss"))
	if err != nil {
		return training.AblationOptions{}, err
	}
	finalBatches := c.Int("final-eval-batches")
	if finalBatches == 0 {
		finalBatches = -1 // the whole split
	}
	base := training.Options{Synthetic: syn, MQAR: mq, Loss: loss,
		Preset: preset.Name, Dataset: c.String("dataset"), DataDir: c.String("data-dir"),
		TrainSplit: c.String("train-split"), EvalSplit: c.String("eval-split"), Steps: steps,
		TokensPerStep: c.Int("tokens-per-step"), EvalEvery: cmp.Or(c.Int("eval-every"), max(1, steps/10)), EvalBatches: c.Int("eval-batches"),
		FinalEvalBatches: finalBatches, Seed: c.Uint64("seed"), Out: c.String("out"), LR: c.Float64("lr"),
		Dropout: -1, GradClip: 1, ConfigFile: c.String("config"), Sizes: sizesFromFlags(c),
	}
	if base.WarmIn, err = warmInFlag(c); err != nil {
		return training.AblationOptions{}, err
	}
	if err := applyRunFlags(c, &base); err != nil {
		return training.AblationOptions{}, err
	}
	ao := training.AblationOptions{Base: base, Seeds: c.Int("seeds"), Contexts: contexts, Stages: splitList(c.String("stages")),
		KeepCheckpoints: c.Bool("keep-checkpoints"), Log: logger(c), Progress: c.App.ErrWriter}
	if ao.AtLengths, err = lengthEval(c); err != nil {
		return training.AblationOptions{}, err
	}
	if c.IsSet("lr-flat") {
		v := c.Float64("lr-flat")
		ao.LRFlat = &v
	}
	if c.IsSet("lr-floor") {
		v := c.Float64("lr-floor")
		ao.LRFloor = &v
	}
	return ao, nil
}

// ablationHeader is the list above the ablation table.
func ablationHeader(c *cli.Context, base training.Options, results []training.StageResult) []string {
	var total float64
	for _, sr := range results {
		for _, r := range sr.Runs {
			total += r.Seconds
		}
	}
	protocol := fmt.Sprintf("train on %s, evaluate on %s", c.String("train-split"), c.String("eval-split"))
	switch c.String("dataset") {
	case "synthetic":
		protocol = "synthetic corpus"
	case "mqar":
		protocol = "MQAR corpus"
	}
	lines := []string{
		fmt.Sprintf("- command: `rpac %s`", strings.Join(os.Args[1:], " ")),
		fmt.Sprintf("- preset %s, dataset %s (%s), %d seeds from %d, %d steps, eval every %d steps on %d batches, final eval on %s",
			base.Preset, c.String("dataset"), protocol, c.Int("seeds"), c.Uint64("seed"), base.Steps, base.EvalEvery, c.Int("eval-batches"),
			batchesText(c.Int("final-eval-batches"))),
		fmt.Sprintf("- device %s%s", c.String("device"), map[bool]string{true: ", precision " + c.String("precision")}[c.IsSet("precision")]),
		fmt.Sprintf("- equal compute: every run takes the same steps and tokens per step; parameters per stage in the table; total wall time of the runs %s", (time.Duration(total) * time.Second).Round(time.Second)),
		"- Val CE / PPL: mean ± sample std over seeds of the weights each stage reports (last = raw, ema, swa); PPL is averaged per seed",
		"- Δ: the stage's Val CE minus the first (previous) stage's, seed by seed (the stages share each seed), mean ± half the 95% interval (Student's t over the n pairs)",
	}
	if c.String("eval-lengths") != "" {
		text := "the whole split"
		if n := c.Int("eval-lengths-tokens"); n > 0 {
			text = fmt.Sprintf("its first %d tokens", n)
		}
		scored := fmt.Sprintf("on %s of %s in chunks of T tokens", text, c.String("eval-split"))
		if c.String("dataset") == "mqar" {
			scored = fmt.Sprintf("on MQAR sequences of T tokens (the eval stream's seed and pairs, as many tokens as the eval split%s), CE over every token and recall at the answers",
				map[bool]string{true: ", at most " + strconv.Itoa(c.Int("eval-lengths-tokens"))}[c.Int("eval-lengths-tokens") > 0])
		}
		lines = append(lines, fmt.Sprintf("- CE at T: each run's reported weights exported in fp32 with the prior folded into one constant bias per length (lengths the run did not train at calibrated on %d batches of %d sequences of its training split), scored in onnxruntime %s; Δ paired against the first stage",
			export.DefaultCalibBatches, export.DefaultCalibBatch, scored))
	}
	return lines
}

// lengthEval is --eval-lengths: nil without it.
func lengthEval(c *cli.Context) (*training.LengthEval, error) {
	if c.String("eval-lengths") == "" {
		return nil, nil
	}
	lengths, err := export.ParseLengths(c.String("eval-lengths"))
	if err != nil {
		return nil, fmt.Errorf("--eval-lengths: %w", err)
	}
	if c.Int("eval-lengths-tokens") < 0 {
		return nil, fmt.Errorf("--eval-lengths-tokens must not be negative (got %d)", c.Int("eval-lengths-tokens"))
	}
	if err := runtime.Available(); err != nil {
		return nil, fmt.Errorf("--eval-lengths runs the exports in onnxruntime: %w", err)
	}
	o := lengtheval.Options{Lengths: lengths, Tokens: c.Int("eval-lengths-tokens"), Log: logger(c)}
	return &training.LengthEval{Lengths: lengths, Score: func(ctx context.Context, dir string, weights training.WeightSet) ([]training.LengthCE, error) {
		return lengtheval.Score(ctx, dir, weights, o)
	}}, nil
}

func batchesText(n int) string {
	if n == 0 {
		return "the whole split"
	}
	return fmt.Sprintf("%d batches", n)
}
