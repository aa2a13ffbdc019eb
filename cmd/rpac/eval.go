package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/training/data"
	"github.com/urfave/cli/v2"
)

func evalCommand() *cli.Command {
	return &cli.Command{
		Name:  "eval",
		Usage: "cross-entropy, perplexity and tokens/s of an exported model (onnxruntime) on a data split",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "model", Usage: "export folder (written by rpac export)", Required: true},
			&cli.StringFlag{Name: "data-dir", Usage: "WikiText-2 raw directory (default: the training run's, else $RPAC_DATA, the user cache, then a download)"},
			&cli.StringFlag{Name: "dataset", Usage: "wikitext2|synthetic|mqar (default: from the model's tokenizer)"},
			&cli.StringFlag{Name: "split", Value: "valid", Usage: "split to evaluate (wikitext2: train|valid|test; synthetic: eval|train)"},
			&cli.IntFlag{Name: "length", Usage: "context length T of the evaluation chunks (default: the longest exported length)"},
			&cli.IntFlag{Name: "batch", Value: 1, Usage: "sequences per onnxruntime call"},
			&cli.IntFlag{Name: "max-chunks", Usage: "evaluate at most N chunks (0: the whole split)"},
			&cli.StringFlag{Name: "provider", Value: "cpu", Usage: "onnxruntime execution provider: cpu|cuda"},
			&cli.IntFlag{Name: "threads", Usage: "onnxruntime intra-op threads (0: one per core)"},
			&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the synthetic corpus (default: the training run's, from the export)"},
		},
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
	m, err := openModel(c.Context, c.String("model"), runtime.Options{Provider: c.String("provider"), Threads: c.Int("threads")})
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
	B := c.Int("batch")
	var nll float64
	var tokens int
	var inModel time.Duration
	t0 := time.Now()
	for start := 0; start < chunks; start += B {
		var seqs [][]int32
		for i := start; i < min(start+B, chunks); i++ {
			seqs = append(seqs, ids[i*T:(i+1)*T])
		}
		t1 := time.Now()
		out, err := m.Logits(c.Context, seqs)
		if err != nil {
			return err
		}
		inModel += time.Since(t1)
		for r, l := range out {
			nll += l.NLL(ids[(start+r)*T+1 : (start+r+1)*T+1])
			tokens += T
		}
	}
	el := time.Since(t0).Seconds()
	ce := nll / float64(tokens)
	report(c, evaluatedEvent{Data: name, T: T, Chunks: chunks, Tokens: tokens, CE: ce, ModelTokPerS: float64(tokens) / inModel.Seconds(),
		TokPerS: float64(tokens) / el, Runtime: runtime.LoadedVersion(), Provider: c.String("provider")})
	return nil
}

// loadSplit reads the token ids of --split for an export whose provenance
// is prov: its tokenizer says which data its ids come from, and its run's
// data directory and synthetic corpus (options and seed) are the defaults.
func loadSplit(c *cli.Context, prov *runtime.Provenance) ([]int32, string, error) {
	tokenizer := prov.Tokenizer
	ds := c.String("dataset")
	if ds == "" {
		switch tokenizer {
		case data.GPT2TokenizerName:
			ds = "wikitext2"
		case "synthetic", "mqar":
			ds = tokenizer
		default:
			return nil, "", fmt.Errorf("the export's tokenizer %q is not one this build knows (%s, synthetic or mqar); pass --dataset to say which data its ids come from", tokenizer, data.GPT2TokenizerName)
		}
	}
	split := c.String("split")
	switch ds {
	case "wikitext2":
		if _, err := data.SplitFileName(split); err != nil {
			return nil, "", err
		}
		dir := c.String("data-dir")
		if _, err := os.Stat(prov.DataDir); dir == "" && prov.DataDir != "" && err == nil {
			dir = prov.DataDir
		}
		loc := data.Locator{DataDir: dir, Log: logger(c)}
		dir, err := loc.Locate(c.Context)
		if err != nil {
			return nil, "", err
		}
		ids, err := data.LoadWikiText2(dir, split, data.NewTokenizer())
		if err != nil {
			return nil, "", err
		}
		return ids, "wikitext2 " + split, nil
	case "synthetic":
		var cfg data.SyntheticConfig
		if js := prov.Synthetic; len(js) > 0 {
			if err := json.Unmarshal(js, &cfg); err != nil {
				return nil, "", fmt.Errorf("the export's manifest records a bad synthetic corpus %s: %v", js, err)
			}
		}
		seed := c.Uint64("seed")
		if len(prov.Synthetic) > 0 && !c.IsSet("seed") {
			seed = prov.Seed
		}
		corp, err := data.NewSyntheticCorpus(int64(seed), 1<<20, 1<<16, cfg)
		if err != nil {
			return nil, "", err
		}
		switch split {
		case "eval", "valid":
			return corp.Eval.IDs, "synthetic eval", nil
		case "train":
			return corp.Train.IDs, "synthetic train", nil
		}
		return nil, "", fmt.Errorf("--split %q: the synthetic corpus has eval and train", split)
	case "mqar":
		var cfg data.MQARConfig
		if js := prov.MQAR; len(js) > 0 {
			if err := json.Unmarshal(js, &cfg); err != nil {
				return nil, "", fmt.Errorf("the export's manifest records a bad MQAR corpus %s: %v", js, err)
			}
		}
		seed := c.Uint64("seed")
		if len(prov.MQAR) > 0 && !c.IsSet("seed") {
			seed = prov.Seed
		}
		corp, err := data.NewMQARCorpus(int64(seed), 1<<22, 1<<18, cfg)
		if err != nil {
			return nil, "", err
		}
		switch split {
		case "eval", "valid":
			return corp.Eval.IDs, "mqar eval", nil
		case "train":
			return corp.Train.IDs, "mqar train", nil
		}
		return nil, "", fmt.Errorf("--split %q: the MQAR corpus has eval and train", split)
	}
	return nil, "", fmt.Errorf("--dataset %q: want wikitext2, synthetic or mqar", ds)
}
