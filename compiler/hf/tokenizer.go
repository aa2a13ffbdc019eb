// Package hf writes the files of the Hugging Face layout that describe a
// model's tokenizer and configuration: tokenizer.json (the tokenizers
// library's format), tokenizer_config.json, config.json,
// generation_config.json and onnxruntime-genai's genai_config.json, as
// transformers, transformers.js and onnxruntime-genai read them from a
// local directory; the decoder itself (ModelFile) is compiler/export's. The
// vocabulary comes from the caller (the
// compiler does not know training's tokenizer): see Tokenizer.
package hf

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// File names of the layout.
const (
	TokenizerFile       = "tokenizer.json"
	TokenizerConfigFile = "tokenizer_config.json"
	ConfigFile          = "config.json"
	GenerationFile      = "generation_config.json"
	GenAIConfigFile     = "genai_config.json"
	// ModelFile is the decoder, where transformers.js looks for a model's
	// fp32 graph (onnx/model.onnx; its weights beside it in
	// onnx/model.onnx.data when they are large).
	ModelFile = "onnx/model.onnx"
)

// Tokenizer is a GPT-2 byte-level BPE vocabulary in tiktoken's convention:
// Pieces[id] is the byte string of token id ("" for an id without one) and
// a token's id is its merge rank, the ids 0..255 being single bytes. The
// special token EOS (text EOSText) has no byte string.
type Tokenizer struct {
	Pieces  []string
	EOS     int32
	EOSText string
}

// byteUnicode is GPT-2's map from a byte to the character that stands for
// it in vocab and merges: printable Latin-1 bytes stand for themselves, the
// others for U+0100 upwards in byte order.
func byteUnicode() [256]rune {
	var m [256]rune
	n := 0
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			m[b] = rune(b)
		} else {
			m[b] = rune(256 + n)
			n++
		}
	}
	return m
}

// visible spells a byte string in GPT-2's byte characters.
func visible(m *[256]rune, s string) string {
	rs := make([]rune, len(s))
	for i := 0; i < len(s); i++ {
		rs[i] = m[s[i]]
	}
	return string(rs)
}

// mergeParts merges the bytes of piece by ranks as BPE does (the adjacent
// pair of lowest rank first, leftmost on ties), using only ranks below
// maxRank, and returns the parts left.
func mergeParts(piece string, ranks map[string]int32, maxRank int32) []string {
	parts := make([]string, len(piece))
	for i := range parts {
		parts[i] = piece[i : i+1]
	}
	for len(parts) > 1 {
		best, at := maxRank, -1
		for i := 0; i+1 < len(parts); i++ {
			if r, ok := ranks[parts[i]+parts[i+1]]; ok && r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		parts[at] += parts[at+1]
		parts = append(parts[:at+1], parts[at+2:]...)
	}
	return parts
}

// merges derives the BPE merge list from the ranks: token id r of more
// than one byte is the merge of the two parts that BPE with the ranks
// below r leaves of its bytes. The list is in rank order, each entry the
// two parts in GPT-2's byte characters.
func (t *Tokenizer) merges(m *[256]rune) ([][2]string, error) {
	ranks := make(map[string]int32, len(t.Pieces))
	for id, p := range t.Pieces {
		if p != "" && int32(id) != t.EOS {
			ranks[p] = int32(id)
		}
	}
	var out [][2]string
	for id, p := range t.Pieces {
		if len(p) < 2 || int32(id) == t.EOS {
			continue
		}
		parts := mergeParts(p, ranks, int32(id))
		if len(parts) != 2 {
			return nil, fmt.Errorf("hf: token %d (%q) is not the merge of two lower-ranked tokens (%d parts)", id, p, len(parts))
		}
		out = append(out, [2]string{visible(m, parts[0]), visible(m, parts[1])})
	}
	return out, nil
}

// validate checks the vocabulary's shape: every byte a token, EOS in range.
func (t *Tokenizer) validate() error {
	if t.EOS < 0 || int(t.EOS) >= len(t.Pieces) || t.EOSText == "" {
		return fmt.Errorf("hf: EOS id %d (%q) outside a vocabulary of %d", t.EOS, t.EOSText, len(t.Pieces))
	}
	seen := map[string]bool{}
	for id, p := range t.Pieces {
		if p == "" || int32(id) == t.EOS {
			continue
		}
		if seen[p] {
			return fmt.Errorf("hf: the byte string %q has two ids", p)
		}
		seen[p] = true
	}
	for b := range 256 {
		if !seen[string([]byte{byte(b)})] {
			return fmt.Errorf("hf: byte %#x has no token: not a byte-level vocabulary", b)
		}
	}
	return nil
}

type addedToken struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// byteLevel is the ByteLevel pre-tokenizer, post-processor and decoder
// (GPT-2's regexp split, no prefix space).
type byteLevel struct {
	Type           string `json:"type"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	TrimOffsets    bool   `json:"trim_offsets"`
	UseRegex       bool   `json:"use_regex"`
}

type bpeModel struct {
	Type                    string           `json:"type"`
	Dropout                 *float64         `json:"dropout"`
	UnkToken                *string          `json:"unk_token"`
	ContinuingSubwordPrefix string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         string           `json:"end_of_word_suffix"`
	FuseUnk                 bool             `json:"fuse_unk"`
	ByteFallback            bool             `json:"byte_fallback"`
	IgnoreMerges            bool             `json:"ignore_merges"`
	Vocab                   map[string]int32 `json:"vocab"`
	Merges                  [][2]string      `json:"merges"`
}

type tokenizerJSON struct {
	Version       string       `json:"version"`
	Truncation    any          `json:"truncation"`
	Padding       any          `json:"padding"`
	AddedTokens   []addedToken `json:"added_tokens"`
	Normalizer    any          `json:"normalizer"`
	PreTokenizer  byteLevel    `json:"pre_tokenizer"`
	PostProcessor byteLevel    `json:"post_processor"`
	Decoder       byteLevel    `json:"decoder"`
	Model         bpeModel     `json:"model"`
}

func (t *Tokenizer) eosToken() addedToken {
	return addedToken{ID: t.EOS, Content: t.EOSText, Special: true}
}

// tokenizerJSON is the tokenizers library's description of t.
func (t *Tokenizer) tokenizerJSON() (*tokenizerJSON, error) {
	if err := t.validate(); err != nil {
		return nil, err
	}
	m := byteUnicode()
	merges, err := t.merges(&m)
	if err != nil {
		return nil, err
	}
	vocab := make(map[string]int32, len(t.Pieces))
	for id, p := range t.Pieces {
		if p != "" && int32(id) != t.EOS {
			vocab[visible(&m, p)] = int32(id)
		}
	}
	vocab[t.EOSText] = t.EOS
	bl := byteLevel{Type: "ByteLevel", TrimOffsets: true, UseRegex: true}
	return &tokenizerJSON{Version: "1.0", AddedTokens: []addedToken{t.eosToken()},
		PreTokenizer: bl, PostProcessor: bl, Decoder: bl,
		Model: bpeModel{Type: "BPE", Vocab: vocab, Merges: merges}}, nil
}

// tokenizerConfig is tokenizer_config.json: a GPT-2 tokenizer that adds no
// special token when encoding and leaves spaces alone when decoding, so
// that encode and decode are the inverse of each other as rpac's are.
func (t *Tokenizer) tokenizerConfig() map[string]any {
	return map[string]any{
		"tokenizer_class":              "GPT2Tokenizer",
		"add_bos_token":                false,
		"add_prefix_space":             false,
		"clean_up_tokenization_spaces": false,
		"bos_token":                    t.EOSText,
		"eos_token":                    t.EOSText,
		"unk_token":                    t.EOSText,
		"added_tokens_decoder":         map[string]addedToken{fmt.Sprint(t.EOS): t.eosToken()},
	}
}

// WriteTokenizer writes tokenizer.json and tokenizer_config.json for t
// into dir.
func WriteTokenizer(dir string, t *Tokenizer) error {
	tj, err := t.tokenizerJSON()
	if err != nil {
		return err
	}
	return errors.Join(writeJSON(filepath.Join(dir, TokenizerFile), tj),
		writeJSON(filepath.Join(dir, TokenizerConfigFile), t.tokenizerConfig()))
}

// writeJSON writes v, indented, to path.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err == nil {
		err = os.WriteFile(path, append(b, '\n'), 0o644)
	}
	if err != nil {
		return fmt.Errorf("hf: %s: %w", filepath.Base(path), err)
	}
	return nil
}
