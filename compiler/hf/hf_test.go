package hf

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// byteVocab is a byte-level vocabulary: ids 0..255 the bytes in byte
// order, then extra, then the EOS.
func byteVocab(extra ...string) *Tokenizer {
	var p []string
	for b := range 256 {
		p = append(p, string([]byte{byte(b)}))
	}
	p = append(p, extra...)
	return &Tokenizer{Pieces: append(p, ""), EOS: int32(len(p)), EOSText: "<eos>"}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

// TestWriteTokenizer: the merges are derived from the ranks (each token
// the merge of the two parts BPE with the lower ranks leaves), bytes are
// spelled in GPT-2's byte characters, the EOS is an added special token.
func TestWriteTokenizer(t *testing.T) {
	tok := byteVocab("ab", "abab", " ab", "\nab")
	dir := t.TempDir()
	if err := WriteTokenizer(dir, tok); err != nil {
		t.Fatal(err)
	}
	var tj tokenizerJSON
	readJSON(t, filepath.Join(dir, TokenizerFile), &tj)
	want := [][2]string{{"a", "b"}, {"ab", "ab"}, {"Ġ", "ab"}, {"Ċ", "ab"}}
	if !reflect.DeepEqual(tj.Model.Merges, want) {
		t.Errorf("merges %q, want %q", tj.Model.Merges, want)
	}
	v := tj.Model.Vocab
	if len(v) != 261 || v["Ġ"] != ' ' || v["!"] != '!' || v["Ā"] != 0 || v["Ġab"] != 258 || v["<eos>"] != 260 {
		t.Errorf("vocab of %d: Ġ %d ! %d Ā %d Ġab %d <eos> %d", len(v), v["Ġ"], v["!"], v["Ā"], v["Ġab"], v["<eos>"])
	}
	if tj.Model.Type != "BPE" || tj.PreTokenizer.Type != "ByteLevel" || tj.PreTokenizer.AddPrefixSpace || tj.Decoder.Type != "ByteLevel" {
		t.Errorf("model %q pre-tokenizer %+v decoder %+v", tj.Model.Type, tj.PreTokenizer, tj.Decoder)
	}
	if len(tj.AddedTokens) != 1 || tj.AddedTokens[0] != (addedToken{ID: 260, Content: "<eos>", Special: true}) {
		t.Errorf("added tokens %+v", tj.AddedTokens)
	}
	var cfg map[string]any
	readJSON(t, filepath.Join(dir, TokenizerConfigFile), &cfg)
	if cfg["eos_token"] != "<eos>" || cfg["add_bos_token"] != false || cfg["clean_up_tokenization_spaces"] != false {
		t.Errorf("tokenizer_config %v", cfg)
	}
}

// TestWriteTokenizerRefuses: a vocabulary that is not byte-level BPE.
func TestWriteTokenizerRefuses(t *testing.T) {
	missing := byteVocab()
	missing.Pieces[7] = ""
	twice := byteVocab("ab", "ab")
	for _, c := range []struct {
		tok  *Tokenizer
		want string
	}{
		{byteVocab("abc"), "not the merge of two lower-ranked tokens"},
		{missing, "byte 0x7 has no token"},
		{twice, `"ab" has two ids`},
		{&Tokenizer{Pieces: byteVocab().Pieces, EOS: 300, EOSText: "<eos>"}, "EOS id 300"},
	} {
		if err := WriteTokenizer(t.TempDir(), c.tok); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want %q", err, c.want)
		}
	}
}

// TestWriteConfig: GPT-2's fields, the frame length as every position
// limit, the EOS as BOS and EOS; sizes that make no model are refused.
func TestWriteConfig(t *testing.T) {
	dir := t.TempDir()
	if err := WriteConfig(dir, Config{Vocab: 50257, DModel: 64, Layers: 2, Heads: 4, Length: 384, EOS: 50256}); err != nil {
		t.Fatal(err)
	}
	var c, g map[string]any
	readJSON(t, filepath.Join(dir, ConfigFile), &c)
	readJSON(t, filepath.Join(dir, GenerationFile), &g)
	for k, want := range map[string]any{"model_type": "gpt2", "vocab_size": 50257.0, "n_embd": 64.0, "n_layer": 2.0, "n_head": 4.0,
		"n_positions": 384.0, "max_position_embeddings": 384.0, "bos_token_id": 50256.0, "eos_token_id": 50256.0} {
		if c[k] != want {
			t.Errorf("config.json %s = %v, want %v", k, c[k], want)
		}
	}
	if g["max_length"] != 384.0 || g["eos_token_id"] != 50256.0 || g["do_sample"] != false {
		t.Errorf("generation_config.json %v", g)
	}
	var genai struct {
		Model struct {
			Type          string `json:"type"`
			ContextLength int    `json:"context_length"`
			Decoder       struct {
				Filename        string
				HeadSize        int `json:"head_size"`
				Heads           int `json:"num_attention_heads"`
				Layers          int `json:"num_hidden_layers"`
				Inputs, Outputs map[string]string
			}
		}
		Search map[string]any
	}
	readJSON(t, filepath.Join(dir, GenAIConfigFile), &genai)
	d := genai.Model.Decoder
	if genai.Model.Type != "gpt2" || genai.Model.ContextLength != 384 || d.Filename != ModelFile || d.HeadSize != 16 || d.Heads != 4 || d.Layers != 2 ||
		d.Inputs["past_key_names"] != "past_key_values.%d.key" || d.Inputs["attention_mask"] != "attention_mask" ||
		d.Outputs["present_value_names"] != "present.%d.value" || genai.Search["past_present_share_buffer"] != false {
		t.Errorf("genai_config.json %+v", genai)
	}
	for _, bad := range []Config{{Vocab: 10, DModel: 6, Layers: 1, Heads: 4, Length: 8, EOS: 9}, {Vocab: 10, DModel: 8, Layers: 1, Heads: 4, Length: 8, EOS: 10}} {
		if err := WriteConfig(t.TempDir(), bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
