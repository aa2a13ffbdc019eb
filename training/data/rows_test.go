package data

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func TestRows(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"empty", "", nil},
		{"keeps newline", "a\nb\n", []string{"a\n", "b\n"}},
		{"last line without newline", "a\nb", []string{"a\n", "b"}},
		{"drops blank and space rows", "\n \n\t\n a \n", []string{" a \n"}},
		{"python whitespace U+001C..U+001F, NBSP, ideographic space", "\x1c\x1f\n\u00a0\u3000\n x\n", []string{" x\n"}},
		{"CRLF becomes LF", "a\r\n \r\nb\r\n", []string{"a\n", "b\n"}},
		{"lone CR ends a line", "a\rb\n", []string{"a\n", "b\n"}},
		{"zero width space is not whitespace", "\u200b\n", []string{"\u200b\n"}},
		{"invalid UTF-8 is kept", "\xff\n", []string{"\xff\n"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Rows(tc.in); !slices.Equal(got, tc.want) {
				t.Errorf("Rows(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestRowsTinyFixture(t *testing.T) {
	b, err := os.ReadFile(testDataFile(t, "tiny_wikitext.raw"))
	if err != nil {
		t.Fatal(err)
	}
	rows := Rows(string(b))
	if len(rows) != 5 {
		t.Fatalf("got %d rows, want 5: %q", len(rows), rows)
	}
	for _, r := range rows {
		if !strings.HasSuffix(r, " \n") {
			t.Errorf("row %q lost its trailing \" \\n\"", r)
		}
	}
}

// byteEncoder encodes each byte as its value; EOS is 256.
type byteEncoder struct{}

func (byteEncoder) Encode(s string) []int32 {
	out := make([]int32, len(s))
	for i := range len(s) {
		out[i] = int32(s[i])
	}
	return out
}
func (byteEncoder) EOS() int32   { return 256 }
func (byteEncoder) Name() string { return "bytes" }

func TestEncodeRows(t *testing.T) {
	rows := []string{"ab\n", "c\n"}
	want := []int32{'a', 'b', '\n', 256, 'c', '\n', 256}
	if got := EncodeRows(rows, byteEncoder{}, 1); !slices.Equal(got, want) {
		t.Fatalf("EncodeRows = %v, want %v", got, want)
	}
	if got := EncodeRows(nil, byteEncoder{}, 4); len(got) != 0 {
		t.Fatalf("EncodeRows(nil) = %v", got)
	}
}

func TestEncodeRowsWorkersAgree(t *testing.T) {
	var rows []string
	for i := range 1000 {
		rows = append(rows, strings.Repeat("word ", i%17)+"end .\n")
	}
	tok := NewTokenizer()
	one := EncodeRows(rows, tok, 1)
	for _, w := range []int{0, 2, 3, 7, 64} {
		if got := EncodeRows(rows, tok, w); !slices.Equal(got, one) {
			t.Fatalf("workers=%d gives a different stream", w)
		}
	}
	eos := 0
	for _, id := range one {
		if id == GPT2EOS {
			eos++
		}
	}
	if eos != len(rows) {
		t.Fatalf("%d EOS for %d rows", eos, len(rows))
	}
}
