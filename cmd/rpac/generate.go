package main

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/training/data"
	"github.com/urfave/cli/v2"
)

func generateCommand() *cli.Command {
	return &cli.Command{
		Name:  "generate",
		Usage: "sample text from an exported model (onnxruntime)",
		Flags: append([]cli.Flag{
			exportFolderFlag(),
			&cli.StringFlag{Name: "prompt", Usage: "prompt text (GPT-2 tokenizer)"},
			&cli.StringFlag{Name: "ids", Usage: "prompt as comma-separated token ids (instead of --prompt)"},
			&cli.IntFlag{Name: "max-new-tokens", Value: 50},
			&cli.Float64Flag{Name: "temperature", Value: 0.8, Usage: "0: greedy"},
			&cli.IntFlag{Name: "top-k", Value: 40, Usage: "sample among the K most likely tokens (0: all)"},
			&cli.Uint64Flag{Name: "seed", Value: 1},
			&cli.BoolFlag{Name: "stop-at-eos", Usage: "stop after an end-of-sequence token"},
			&cli.BoolFlag{Name: "recompute", Usage: "run the full graph for every token even when the export has KV-cache graphs (--kv-cache)"},
		}, sessionFlags()...),
		Action: generateAction,
	}
}

func generateAction(c *cli.Context) error {
	if c.Args().Len() > 0 {
		return fmt.Errorf("unexpected arguments: %v (quote the prompt: --prompt \"...\")", c.Args().Slice())
	}
	if c.Int("max-new-tokens") < 0 || c.Int("top-k") < 0 || c.Int("threads") < 0 {
		return errors.New("--max-new-tokens, --top-k and --threads must not be negative")
	}
	if t := c.Float64("temperature"); t < 0 || math.IsNaN(t) || math.IsInf(t, 0) {
		return fmt.Errorf("--temperature %v: want a finite number >= 0", t)
	}
	if c.IsSet("prompt") && c.IsSet("ids") {
		return errors.New("give --prompt or --ids, not both")
	}
	man, err := runtime.ReadManifest(c.String("model"))
	if err != nil {
		return err
	}
	var tok runtime.Tokenizer
	if man.Tokenizer == data.GPT2TokenizerName {
		tok = data.NewTokenizer()
	}
	prompt, err := generatePrompt(c, man, tok)
	if err != nil {
		return err
	}
	m, err := openModel(c.Context, c.String("model"), sessionOptions(c, tok))
	if err != nil {
		return err
	}
	defer m.Close()
	out, err := m.Generate(c.Context, prompt, runtime.GenerateOptions{MaxNewTokens: c.Int("max-new-tokens"),
		Temperature: c.Float64("temperature"), TopK: c.Int("top-k"), Seed: c.Uint64("seed"), StopAtEOS: c.Bool("stop-at-eos"), Recompute: c.Bool("recompute")})
	if err != nil {
		return err
	}
	printGenerated(c, tok, out)
	return nil
}

// generatePrompt is the prompt's ids: --ids, or --prompt encoded with the
// model's tokenizer, each inside the model's vocabulary.
func generatePrompt(c *cli.Context, man *runtime.Manifest, tok runtime.Tokenizer) ([]int32, error) {
	var prompt []int32
	switch {
	case c.IsSet("ids"):
		for _, f := range splitList(c.String("ids")) {
			id, err := strconv.ParseInt(f, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("--ids: %q is not a token id", f)
			}
			prompt = append(prompt, int32(id))
		}
	case tok != nil:
		prompt = tok.Encode(c.String("prompt"))
	case c.String("prompt") != "":
		return nil, fmt.Errorf("the model's tokenizer is %q, which this build cannot encode text with; give the prompt as --ids", man.Tokenizer)
	}
	for i, id := range prompt {
		if id < 0 || int(id) >= man.VocabSize {
			return nil, fmt.Errorf("prompt token %d: id %d is outside the model's vocabulary [0,%d)", i, id, man.VocabSize)
		}
	}
	return prompt, nil
}

// printGenerated prints the prompt and its continuation as text, or the
// new ids (and their text when the model has a tokenizer) for --ids.
func printGenerated(c *cli.Context, tok runtime.Tokenizer, out []int32) {
	w := c.App.Writer
	if tok != nil && !c.IsSet("ids") {
		fmt.Fprintf(w, "%s%s\n", c.String("prompt"), tok.Decode(out))
		return
	}
	parts := make([]string, len(out))
	for i, id := range out {
		parts[i] = strconv.Itoa(int(id))
	}
	fmt.Fprintln(w, strings.Join(parts, " "))
	if tok != nil {
		fmt.Fprintf(w, "%s\n", tok.Decode(out))
	}
}
