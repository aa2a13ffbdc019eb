package hf

import (
	"github.com/rpac-dev/rpac/runtime/manifest"
)

// genaiConfig is genai_config.json, onnxruntime-genai's description of the
// decoder (onnx/model.onnx) with Optimum's tensor names. The decoder
// appends the new keys and values to the past (present grows), so the past
// and present buffers are not shared; the search is greedy up to L tokens.
func (c Config) genaiConfig() map[string]any {
	decoder := map[string]any{
		"filename":            ModelFile,
		"session_options":     map[string]any{"log_id": "onnxruntime-genai", "provider_options": []any{}},
		"head_size":           c.HeadSize(),
		"hidden_size":         c.DModel,
		"num_attention_heads": c.Heads,
		"num_key_value_heads": c.Heads,
		"num_hidden_layers":   c.Layers,
		"inputs": map[string]any{
			"input_ids":        manifest.KVInputIDs,
			"attention_mask":   manifest.HFAttentionMask,
			"position_ids":     manifest.KVPositionIDs,
			"past_key_names":   manifest.HFPastKey,
			"past_value_names": manifest.HFPastValue,
		},
		"outputs": map[string]any{
			"logits":              manifest.KVLogits,
			"present_key_names":   manifest.HFPresentKey,
			"present_value_names": manifest.HFPresentValue,
		},
	}
	return map[string]any{
		"model": map[string]any{
			"type":           "gpt2",
			"bos_token_id":   c.EOS,
			"eos_token_id":   c.EOS,
			"pad_token_id":   c.EOS,
			"vocab_size":     c.Vocab,
			"context_length": c.Length,
			"decoder":        decoder,
		},
		"search": map[string]any{
			"do_sample": false, "num_beams": 1, "num_return_sequences": 1, "max_length": c.Length, "min_length": 0,
			"past_present_share_buffer": false, "top_k": 1, "top_p": 1.0, "temperature": 1.0,
			"repetition_penalty": 1.0, "length_penalty": 1.0, "early_stopping": true,
		},
	}
}
