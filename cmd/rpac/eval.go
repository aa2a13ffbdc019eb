package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/training"
	"github.com/urfave/cli/v2"
)

func evalCommand() *cli.Command {
	return &cli.Command{
		Name:  "eval",
		Usage: "cross-entropy, perplexity and tokens/s of an exported model (onnxruntime) on a data split",
		Flags: append(append([]cli.Flag{
			exportFolderFlag(),
			&cli.StringFlag{Name: "data-dir", Usage: "WikiText-2 raw directory (default: the training run's, else $RPAC_DATA, the user cache, then a download)"},
			&cli.StringFlag{Name: "dataset", Usage: "wikitext2|synthetic|mqar (default: from the model's tokenizer)"},
			&cli.StringFlag{Name: "split", Value: "valid", Usage: "split to evaluate (wikitext2: train|valid|test; synthetic: eval|train)"},
			&cli.IntFlag{Name: "length", Usage: "context length T of the evaluation chunks (default: the longest exported length)"},
			&cli.IntFlag{Name: "batch", Value: 1, Usage: "sequences per onnxruntime call"},
			&cli.IntFlag{Name: "max-chunks", Usage: "evaluate at most N chunks (0: the whole split)"},
		}, sessionFlags()...),
			&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the synthetic corpus (default: the training run's, from the export)"},
		),
		Action: evalAction,
	}
}

// openModel opens an export folder, turning a missing onnxruntime into an
// error that says how to get it.
func openModel(ctx context.Context, dir string, opts runtime.Options) (*runtime.Model, error) {
	if err := runtime.Available(); err != nil {
		return nil, err
	}
	return runtime.OpenContext(ctx, dir, opts)
}

func evalAction(c *cli.Context) error {
	if err := checkEvalFlags(c); err != nil {
		return err
	}
	man, err := runtime.ReadManifest(c.String("model"))
	if err != nil {
		return err
	}
	maxL := man.SortedLengths()[len(man.Lengths)-1]
	T := c.Int("length")
	if T == 0 {
		T = maxL
	}
	if T > maxL {
		return fmt.Errorf("--length %d exceeds the longest exported length %d (lengths %v)", T, maxL, man.SortedLengths())
	}
	m, err := openModel(c.Context, c.String("model"), sessionOptions(c, nil))
	if err != nil {
		return err
	}
	defer m.Close()
	ids, name, err := loadSplit(c, man.Origin())
	if err != nil {
		return err
	}
	chunks := (len(ids) - 1) / T
	if chunks < 1 {
		return fmt.Errorf("the %s split has %d tokens, fewer than one chunk of %d+1", name, len(ids), T)
	}
	if n := c.Int("max-chunks"); n > 0 {
		chunks = min(chunks, n)
	}
	r, err := runtime.Evaluate(c.Context, m, ids, T, chunks, c.Int("batch"))
	if err != nil {
		return err
	}
	report(c, evaluatedEvent{Data: name, T: T, Chunks: chunks, Tokens: r.Tokens, CE: r.MeanCE, ModelTokPerS: float64(r.Tokens) / r.InModel.Seconds(),
		TokPerS: float64(r.Tokens) / r.Elapsed.Seconds(), Runtime: runtime.LoadedVersion(), Provider: c.String("provider")})
	return r.Err() // a CE that is NaN is printed, and fails the command
}

func checkEvalFlags(c *cli.Context) error {
	if c.Args().Len() > 0 {
		return fmt.Errorf("unexpected arguments: %v", c.Args().Slice())
	}
	for _, n := range []string{"length", "max-chunks", "threads"} {
		if c.Int(n) < 0 {
			return fmt.Errorf("--%s must not be negative (got %d)", n, c.Int(n))
		}
	}
	if c.Int("batch") < 1 {
		return errors.New("--batch must be positive")
	}
	return nil
}

// loadSplit reads the token ids of --split for an export whose provenance
// is prov (training.ExportData: its dataset, data directory and corpus);
// --dataset, --data-dir and --seed override it.
func loadSplit(c *cli.Context, prov *runtime.Provenance) ([]int32, string, error) {
	spec, seeded, err := training.ExportData(prov, c.String("dataset"))
	if err != nil {
		return nil, "", err
	}
	if !seeded || c.IsSet("seed") {
		spec.Seed = c.Uint64("seed")
	}
	if d := c.String("data-dir"); d != "" {
		spec.Dir = d
	}
	return training.LoadSplit(c.Context, spec, c.String("split"), logger(c))
}
