package hf

import (
	"errors"
	"fmt"
	"path/filepath"
)

// Config describes the model for config.json, generation_config.json and
// genai_config.json, GPT-2's fields: one frame length per export (the
// folded prior is exact at that length only), so n_positions and
// max_position_embeddings are L. transformers.js reads the layers and heads
// (n_layer, n_head; a head's size is n_embd / n_head) and sizes the empty
// past from the decoder's declared input shapes.
type Config struct {
	Vocab, DModel, Layers, Heads int
	// Length is L, the frame length of the export.
	Length int
	// EOS is the id of the end-of-text token, also the BOS (GPT-2's).
	EOS int32
}

func (c Config) validate() error {
	if c.Vocab < 1 || c.DModel < 1 || c.Layers < 1 || c.Heads < 1 || c.DModel%c.Heads != 0 || c.Length < 1 {
		return fmt.Errorf("hf: config of vocabulary %d, width %d, %d layers of %d heads, length %d: want positive sizes, width a multiple of the heads",
			c.Vocab, c.DModel, c.Layers, c.Heads, c.Length)
	}
	if c.EOS < 0 || int(c.EOS) >= c.Vocab {
		return fmt.Errorf("hf: EOS id %d outside the vocabulary of %d", c.EOS, c.Vocab)
	}
	return nil
}

// modelConfig is config.json.
func (c Config) modelConfig() map[string]any {
	return map[string]any{
		"model_type":              "gpt2",
		"architectures":           []string{"GPT2LMHeadModel"},
		"vocab_size":              c.Vocab,
		"n_embd":                  c.DModel,
		"n_layer":                 c.Layers,
		"n_head":                  c.Heads,
		"n_positions":             c.Length,
		"n_ctx":                   c.Length,
		"max_position_embeddings": c.Length,
		"bos_token_id":            c.EOS,
		"eos_token_id":            c.EOS,
		"use_cache":               true,
	}
}

// generationConfig is generation_config.json: greedy, at most L tokens.
func (c Config) generationConfig() map[string]any {
	return map[string]any{
		"bos_token_id": c.EOS,
		"eos_token_id": c.EOS,
		"max_length":   c.Length,
		"do_sample":    false,
	}
}

// HeadSize is the size of one attention head.
func (c Config) HeadSize() int { return c.DModel / c.Heads }

// WriteConfig writes config.json, generation_config.json and
// genai_config.json into dir.
func WriteConfig(dir string, c Config) error {
	if err := c.validate(); err != nil {
		return err
	}
	return errors.Join(writeJSON(filepath.Join(dir, ConfigFile), c.modelConfig()),
		writeJSON(filepath.Join(dir, GenerationFile), c.generationConfig()),
		writeJSON(filepath.Join(dir, GenAIConfigFile), c.genaiConfig()))
}
