package data

import (
	"context"
	"strings"
	"sync"

	"github.com/tiktoken-go/tokenizer/codec"
)

// GPT-2 BPE facts (tiktoken r50k_base, identical to Hugging Face "gpt2").
const (
	// GPT2VocabSize is the number of token ids, EOS included.
	GPT2VocabSize = 50257
	// GPT2EOS is the id of <|endoftext|>.
	GPT2EOS int32 = 50256
	// GPT2TokenizerName names the tokenizer in caches, checkpoints and manifests.
	GPT2TokenizerName = "gpt2-r50k"
	// GPT2EOSText is how Decode renders GPT2EOS.
	GPT2EOSText = "<|endoftext|>"
)

// TextEncoder is what the WikiText-2 loader needs from a tokenizer.
// [*Tokenizer] implements it.
type TextEncoder interface {
	Encode(s string) []int32
	EOS() int32
	// Name identifies the encoding; it keys the on-disk token cache, so two
	// encoders with the same name must produce the same ids.
	Name() string
}

// Tokenizer is the GPT-2 byte-level BPE (tiktoken r50k_base). Its merge ranks
// are compiled into the binary, so it works offline. A Tokenizer is safe for
// concurrent use; the zero value is ready to use.
type Tokenizer struct {
	codecOnce sync.Once
	codec     *codec.Codec

	piecesOnce sync.Once
	pieces     []string         // id -> bytes of the token; "" for ids without a token
	ranks      map[string]int32 // bytes of a token -> its id (= merge rank)
}

// NewTokenizer returns the GPT-2 tokenizer.
func NewTokenizer() *Tokenizer {
	t := &Tokenizer{}
	t.init()
	return t
}

func (t *Tokenizer) init() {
	t.codecOnce.Do(func() { t.codec = codec.NewR50kBase() })
}

// Name returns GPT2TokenizerName.
func (t *Tokenizer) Name() string { return GPT2TokenizerName }

// VocabSize returns GPT2VocabSize.
func (t *Tokenizer) VocabSize() int { return GPT2VocabSize }

// EOS returns GPT2EOS.
func (t *Tokenizer) EOS() int32 { return GPT2EOS }

// Encode returns the BPE ids of s. Like the paper's
// tok.encode(s, add_special_tokens=False) it adds no EOS; unlike Hugging Face
// it does not turn the literal text "<|endoftext|>" into the EOS id (it is
// encoded as ordinary text; WikiText-2 never contains it).
//
// Input that is not valid UTF-8 is read rune by rune, so each invalid byte
// is encoded as U+FFFD. Encoding takes time close to linear in the length of
// s, whatever s holds: well under a second per MB at worst (invalid UTF-8,
// long runs of one character; BenchmarkEncode1MB), far less for prose.
func (t *Tokenizer) Encode(s string) []int32 {
	ids, _ := t.EncodeContext(context.Background(), s, 0)
	return ids
}

// EncodeContext is Encode under ctx: it returns ctx's error (and the ids so
// far) when ctx ends first. With max > 0 it stops early once the text has
// more than max tokens and returns only the ids it has (more than max of
// them, and no error), so that a caller with a token limit never encodes
// more text than the limit can use.
func (t *Tokenizer) EncodeContext(ctx context.Context, s string, max int) ([]int32, error) {
	t.piecesOnce.Do(t.buildPieces)
	return encodeContext(ctx, s, t.ranks, max)
}

// encode encodes with the tiktoken-go codec (the tests' reference; it
// drops DEL, see pretokenize.go).
func (t *Tokenizer) encode(s string) ([]int32, error) {
	t.init()
	if s == "" {
		return nil, nil
	}
	ids, _, err := t.codec.Encode(s)
	if err != nil {
		return nil, err
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out, nil
}

func (t *Tokenizer) buildPieces() {
	t.init()
	t.pieces = make([]string, GPT2VocabSize)
	for id := range GPT2VocabSize - 1 {
		s, err := t.codec.Decode([]uint{uint(id)})
		if err == nil {
			t.pieces[id] = s
		}
	}
	t.pieces[GPT2EOS] = GPT2EOSText
	t.ranks = make(map[string]int32, GPT2VocabSize)
	for id, p := range t.pieces[:GPT2EOS] {
		if p != "" {
			t.ranks[p] = int32(id)
		}
	}
}

// Pieces returns, for each id, the bytes of its token (a copy): ids below
// GPT2EOS are byte strings whose id is their merge rank (tiktoken's
// convention), GPT2EOS is GPT2EOSText.
func (t *Tokenizer) Pieces() []string {
	t.piecesOnce.Do(t.buildPieces)
	return append([]string(nil), t.pieces...)
}

// Decode returns the text of ids. GPT2EOS decodes to GPT2EOSText; an id
// outside the vocabulary decodes to U+FFFD. Byte sequences that are not valid
// UTF-8 (a slice that splits a character) are returned as they are.
func (t *Tokenizer) Decode(ids []int32) string {
	t.piecesOnce.Do(t.buildPieces)
	var sb strings.Builder
	for _, id := range ids {
		if id < 0 || int(id) >= len(t.pieces) || t.pieces[id] == "" {
			sb.WriteString("\uFFFD")
			continue
		}
		sb.WriteString(t.pieces[id])
	}
	return sb.String()
}
