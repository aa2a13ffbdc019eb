package data

import (
	"bytes"
	"crypto/sha256"
	"github.com/rpac-dev/rpac/internal/fuzzlimit"
	"testing"
)

// FuzzTokenCache: any token cache file decodes to an error or to ids that
// encode back to the same bytes; a count that does not match the file's
// size is refused before anything is allocated for it.
func FuzzTokenCache(f *testing.F) {
	sum := sha256.Sum256([]byte("source"))
	const name = "gpt2"
	valid := encodeCache(sum, name, 2, []int32{1, 2, 3, 50256})
	f.Add(valid)
	f.Add(valid[:len(valid)-1])
	f.Add(encodeCache(sum, name, 0, nil))
	huge := append([]byte{}, valid...)
	huge[len(cacheMagic)+32+2+len(name)+8] = 0xff // count far beyond the file
	f.Add(huge)
	f.Add([]byte(cacheMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		defer fuzzlimit.Start().Check(t) // a slow input fails like a crash
		rows, ids, err := decodeCache(b, sum, name)
		if err == nil {
			if rows < 0 || rows > len(ids) {
				t.Fatalf("%d rows of %d ids", rows, len(ids))
			}
			if again := encodeCache(sum, name, rows, ids); !bytes.Equal(again, b) {
				t.Fatal("a decoded cache does not encode back to its bytes")
			}
		}
	})
}
