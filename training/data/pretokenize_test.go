package data

import (
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestGPT2Split(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"Hello world", []string{"Hello", " world"}},
		{"it's they're we've I'm you'll he'd can't", []string{"it", "'s", " they", "'re", " we", "'ve", " I", "'m", " you", "'ll", " he", "'d", " can", "'t"}},
		{"'S", []string{"'", "S"}},
		{"a  b", []string{"a", " ", " b"}},
		{"a   \n", []string{"a", "   \n"}},
		{" = Title = \n", []string{" =", " Title", " =", " \n"}},
		{"1 @,@ 234", []string{"1", " @,@", " 234"}},
		{"x\x7f's", []string{"x", "\x7f'", "s"}},
		{" \x7f!", []string{" \x7f!"}},
		{"\t\tword", []string{"\t", "\t", "word"}},
	}
	for _, tc := range tests {
		if got := gpt2Split(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("gpt2Split(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestEncodeDEL(t *testing.T) {
	tok := NewTokenizer()
	tests := []struct {
		in   string
		want []int32
	}{
		{"\x7f", []int32{221}},
		{"a\x7fb", []int32{64, 221, 65}},
		{"\x7f's", []int32{221, 6, 82}},
	}
	for _, tc := range tests {
		if got := tok.Encode(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("Encode(%q) = %v, want %v", tc.in, got, tc.want)
		}
		if got := tok.Decode(tok.Encode(tc.in)); got != tc.in {
			t.Errorf("Decode(Encode(%q)) = %q", tc.in, got)
		}
	}
}

// TestExactMatchesCodec checks the package's own pre-tokenizer and merge loop
// against the codec on inputs without DEL.
func TestExactMatchesCodec(t *testing.T) {
	tok := NewTokenizer()
	alphabet := []rune("aAzZ09 '  \t\n\r\x1c\x0b.,;!?@=-()[]\"srtvmld'ÉéßçİıΩωЖж日本語한국어٣\u0300\u00a0\u2009\u3000🙂€½²")
	rng := rand.New(rand.NewPCG(1, 2))
	var inputs []string
	for range 3000 {
		n := rng.IntN(40)
		var sb strings.Builder
		for range n {
			sb.WriteRune(alphabet[rng.IntN(len(alphabet))])
		}
		inputs = append(inputs, sb.String())
	}
	if b, err := os.ReadFile(testDataFile(t, "tiny_wikitext.raw")); err == nil {
		inputs = append(inputs, Rows(string(b))...)
		inputs = append(inputs, string(b))
	}
	for _, s := range inputs {
		want, err := tok.encode(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := tok.encodeExact(s); !slices.Equal(got, want) {
			t.Fatalf("exact encoding of %q = %v, codec gives %v", s, got, want)
		}
	}
}
