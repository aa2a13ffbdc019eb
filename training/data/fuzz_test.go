package data

import "testing"

// FuzzTokenizer: any text encodes without a panic to ids inside the
// vocabulary.
func FuzzTokenizer(f *testing.F) {
	for _, s := range []string{"", " = Valkyria Chronicles III = \n", "\xff\xfe\x00", "日本語 テキスト", "  \t\n\n"} {
		f.Add(s)
	}
	tok := NewTokenizer()
	f.Fuzz(func(t *testing.T, s string) {
		for _, id := range tok.Encode(s) {
			if id < 0 || int(id) >= tok.VocabSize() {
				t.Fatalf("id %d outside [0,%d) for %q", id, tok.VocabSize(), s)
			}
		}
	})
}
