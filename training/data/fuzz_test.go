package data

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// FuzzTokenizer: any text encodes, within a time limit, to ids inside the
// vocabulary that decode back to the text (invalid UTF-8 read as U+FFFD),
// as the codec encodes it when it has no DEL (which the codec drops).
func FuzzTokenizer(f *testing.F) {
	for _, s := range []string{"", " = Valkyria Chronicles III = \n", "\xff\xfe\x00", "日本語 テキスト", "  \t\n\n",
		"\x7f" + strings.Repeat("a", 200), strings.Repeat("\xff", 100), "it's  \u00a0\u3000 x"} {
		f.Add(s)
	}
	tok := NewTokenizer()
	f.Fuzz(func(t *testing.T, s string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		ids, err := tok.EncodeContext(ctx, s, 0)
		if err != nil {
			t.Fatalf("%d bytes did not encode within a second: %v", len(s), err)
		}
		for _, id := range ids {
			if id < 0 || int(id) >= tok.VocabSize() {
				t.Fatalf("id %d outside [0,%d) for %q", id, tok.VocabSize(), s)
			}
		}
		if got := tok.Decode(ids); got != validRunes(s) {
			t.Fatalf("Decode(Encode(%q)) = %q", s, got)
		}
		if !strings.Contains(s, "\x7f") {
			if want, err := tok.encode(s); err == nil && !slices.Equal(ids, want) {
				t.Fatalf("Encode(%q) = %v, the codec gives %v", s, ids, want)
			}
		}
	})
}
