package data

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// Rows splits the text of a WikiText-2 file into the dataset's rows: each line
// keeps its trailing "\n" (the last line has none if the file does not end
// with a newline), "\r\n" and lone "\r" count as "\n" (Python's universal
// newlines, which the Hugging Face loader reads the file with), and rows that
// are empty or all whitespace are dropped.
func Rows(text string) []string {
	if strings.IndexByte(text, '\r') >= 0 {
		text = strings.ReplaceAll(text, "\r\n", "\n")
		text = strings.ReplaceAll(text, "\r", "\n")
	}
	var rows []string
	for len(text) > 0 {
		n := strings.IndexByte(text, '\n') + 1
		if n == 0 {
			n = len(text)
		}
		row := text[:n]
		text = text[n:]
		if !isPySpace(row) {
			rows = append(rows, row)
		}
	}
	return rows
}

// isPySpace reports whether s is empty or consists only of characters that
// Python's str.isspace counts as whitespace. That set is Go's unicode.IsSpace
// plus the separators U+001C..U+001F.
func isPySpace(s string) bool {
	for _, r := range s {
		switch {
		case r == utf8.RuneError:
			return false
		case r >= 0x1c && r <= 0x1f:
		case r == ' ', r >= '\t' && r <= '\r', r == 0x85, r == 0xa0, r == 0x1680,
			r >= 0x2000 && r <= 0x200a, r == 0x2028, r == 0x2029, r == 0x202f, r == 0x205f, r == 0x3000:
		default:
			return false
		}
	}
	return true
}

// EncodeRows encodes each row with enc and appends enc.EOS() after it, as the
// paper's encode_split does, spreading the rows over workers goroutines
// (workers <= 0 means runtime.GOMAXPROCS(0)). The result does not depend on
// workers.
func EncodeRows(rows []string, enc TextEncoder, workers int) []int32 {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	const block = 64
	nBlocks := (len(rows) + block - 1) / block
	workers = max(1, min(workers, nBlocks))
	parts := make([][]int32, nBlocks)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				b := int(next.Add(1) - 1)
				if b >= nBlocks {
					return
				}
				var ids []int32
				for _, row := range rows[b*block : min(len(rows), (b+1)*block)] {
					ids = append(ids, enc.Encode(row)...)
					ids = append(ids, enc.EOS())
				}
				parts[b] = ids
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	out := make([]int32, 0, total)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
