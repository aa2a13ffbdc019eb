package data

import (
	"sync"
	"testing"
)

func TestTokenizerBasics(t *testing.T) {
	tok := NewTokenizer()
	if tok.VocabSize() != 50257 || tok.EOS() != 50256 || tok.Name() != "gpt2-r50k" {
		t.Fatalf("VocabSize %d EOS %d Name %q", tok.VocabSize(), tok.EOS(), tok.Name())
	}
	tests := []struct {
		name string
		text string
		want []int32
	}{
		{"empty", "", nil},
		{"hello world", "Hello world", []int32{15496, 995}},
		{"newline is its own token", "\n", []int32{198}},
		{"leading space merges", " the", []int32{262}},
		{"exclamation", "!", []int32{0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tok.Encode(tc.text)
			if len(got) != len(tc.want) {
				t.Fatalf("Encode(%q) = %v, want %v", tc.text, got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("Encode(%q) = %v, want %v", tc.text, got, tc.want)
				}
			}
		})
	}
}

func TestTokenizerRoundTrip(t *testing.T) {
	tok := NewTokenizer()
	for _, s := range []string{
		" = Valkyria Chronicles III = \n",
		"Senjō no Valkyria 3 : Unrecorded Chronicles ( Japanese : 戦場のヴァルキュリア3 , lit . \n",
		"tabs\tand  double  spaces, numbers 1 @,@ 234 and émoji 🙂\n",
		"\x00 control \x7f bytes",
	} {
		ids := tok.Encode(s)
		for _, id := range ids {
			if id < 0 || id >= GPT2EOS {
				t.Fatalf("Encode(%q) gave id %d outside the BPE range", s, id)
			}
		}
		if got := tok.Decode(ids); got != s {
			t.Errorf("Decode(Encode(%q)) = %q", s, got)
		}
	}
}

func TestTokenizerDecodeSpecial(t *testing.T) {
	tok := NewTokenizer()
	tests := []struct {
		ids  []int32
		want string
	}{
		{[]int32{15496, GPT2EOS, 995}, "Hello<|endoftext|> world"},
		{[]int32{-1}, "\uFFFD"},
		{[]int32{GPT2VocabSize}, "\uFFFD"},
		{nil, ""},
	}
	for _, tc := range tests {
		if got := tok.Decode(tc.ids); got != tc.want {
			t.Errorf("Decode(%v) = %q, want %q", tc.ids, got, tc.want)
		}
	}
}

func TestTokenizerConcurrent(t *testing.T) {
	tok := NewTokenizer()
	want := tok.Encode("The quick brown fox jumps over the lazy dog.\n")
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				got := tok.Encode("The quick brown fox jumps over the lazy dog.\n")
				if len(got) != len(want) {
					errs <- "length differs"
					return
				}
				_ = tok.Decode(got)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

func TestTokenizerZeroValue(t *testing.T) {
	var tok Tokenizer
	if got := tok.Decode(tok.Encode("Hello world")); got != "Hello world" {
		t.Fatalf("zero Tokenizer round trip: %q", got)
	}
	var tok2 Tokenizer
	if got := tok2.Decode([]int32{15496}); got != "Hello" {
		t.Fatalf("zero Tokenizer Decode: %q", got)
	}
}
