package inferbench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
)

// GenerateConfig describes a benchmark of runtime.Generate (greedy) with
// the KV cache against recomputing the full graph for every token, on a
// random-init export of one length.
type GenerateConfig struct {
	Preset            model.Preset
	Model             model.Kind
	Length            int // the exported length T
	Prompt, NewTokens int
	Rounds            int // each times both paths, in alternating order
	Attention         passes.AttentionMode
	Threads           int
	Work              string // folder for the export ("": a temporary one)
}

// Check checks the counts and names of c.
func (c *GenerateConfig) Check() error {
	if c.Prompt < 1 || c.NewTokens < 1 || c.Rounds < 1 || c.Threads < 0 {
		return fmt.Errorf("--prompt, --new-tokens and --rounds must be positive, --threads not negative")
	}
	if c.Prompt+c.NewTokens > c.Length {
		return fmt.Errorf("--prompt %d plus --new-tokens %d exceed --length %d", c.Prompt, c.NewTokens, c.Length)
	}
	if c.Attention != passes.AttentionOp && c.Attention != passes.AttentionPlain {
		return fmt.Errorf("--attention %s: want plain or op", c.Attention)
	}
	return nil
}

// GenerateRound is one timed generation.
type GenerateRound struct {
	Round  int // from 1
	Cached bool
	Time   time.Duration
}

// GenerateResult is the fastest round of each path and whether both
// generated the same tokens.
type GenerateResult struct {
	Cached, Recompute time.Duration
	SameTokens        bool
}

// Generate exports the model, warms both paths up (untimed: sessions open
// on first use) and times them round by round, recompute first in odd
// rounds; onRound sees every timed generation.
func Generate(ctx context.Context, c GenerateConfig, onRound func(GenerateRound)) (*GenerateResult, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	m, prompt, cleanup, err := openGenerate(ctx, &c)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	for _, cached := range []bool{false, true} {
		if _, err := m.Generate(ctx, prompt, runtime.GenerateOptions{MaxNewTokens: 2, Recompute: !cached}); err != nil {
			return nil, err
		}
	}
	times := map[bool][]time.Duration{}
	tokens := map[bool][]int32{}
	for r := range c.Rounds {
		for _, cached := range []bool{r%2 == 1, r%2 == 0} {
			t0 := time.Now()
			out, err := m.Generate(ctx, prompt, runtime.GenerateOptions{MaxNewTokens: c.NewTokens, Recompute: !cached})
			if err != nil {
				return nil, err
			}
			d := time.Since(t0)
			times[cached], tokens[cached] = append(times[cached], d), out
			onRound(GenerateRound{Round: r + 1, Cached: cached, Time: d})
		}
	}
	return &GenerateResult{Cached: slices.Min(times[true]), Recompute: slices.Min(times[false]), SameTokens: slices.Equal(tokens[false], tokens[true])}, nil
}

// openGenerate exports c's model with its KV-cache graphs, opens it and
// draws the prompt; cleanup closes the model and removes a temporary
// export.
func openGenerate(ctx context.Context, c *GenerateConfig) (*runtime.Model, []int32, func(), error) {
	cfg := c.Preset.Config
	cfg.Model = c.Model
	dir, rm := c.Work, func() {}
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "rpac-bench-generate"); err != nil {
			return nil, nil, nil, err
		}
		rm = func() { os.RemoveAll(dir) }
	}
	if _, err := ExportRandom(ctx, export.Options{Config: cfg, Lengths: []int{c.Length}, Attention: c.Attention, KVCache: true, Out: dir}); err != nil {
		rm()
		return nil, nil, nil, err
	}
	m, err := runtime.OpenContext(ctx, dir, runtime.Options{Threads: c.Threads})
	if err != nil {
		rm()
		return nil, nil, nil, err
	}
	return m, randomSeqs(1, c.Length, cfg.Vocab)[0][:c.Prompt], func() { m.Close(); rm() }, nil
}
