package runtime

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzReadIO: the ONNX input/output reader returns (an error or a result)
// on any bytes, never panics or loops.
func FuzzReadIO(f *testing.F) {
	for _, s := range []string{"", "\x3a\x00", "\x3a\xf5\xff\xff\xff\xff\xff\xff\xff\xff\x01", "\x3a\x04\x5a\x02\x0a\x00",
		"\x3a\x0c\x5a\x0a\x0a\x09input_ids", "\x08\x07\x3a\x02\x62\x00"} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(dir, "m.onnx")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		readIO(path, true)
	})
}

// FuzzManifest: manifest parsing and validation never panic.
func FuzzManifest(f *testing.F) {
	for _, s := range []string{`{}`, `{"format": 1, "lengths": [16]}`, `{"format":1,"lengths":[16,32],"vocab_size":512,"eos":0,"models":[{"length":16,"path":"m.onnx","sha256":"00","size":1}]}`,
		`{"lengths": [-1]}`, `{"vocab_size": 99999999999}`, `[`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		parseManifest("manifest.json", b)
	})
}
