package manifest

import (
	"path/filepath"
	"testing"
)

// FuzzManifest: manifest parsing and validation never panic, and an
// accepted manifest lists only plain paths within its bounds.
func FuzzManifest(f *testing.F) {
	for _, s := range []string{`{}`, `{"format": 1, "lengths": [16]}`, `{"format":1,"lengths":[16,32],"vocab_size":512,"eos":0,"models":[{"length":16,"path":"m.onnx","sha256":"00","size":1}]}`,
		`{"lengths": [-1]}`, `{"vocab_size": 99999999999}`, `[`,
		`{"format":1,"lengths":[4],"vocab_size":8,"eos":0,"files":[{"length":4,"path":"m.onnx","sha256":"0000000000000000000000000000000000000000000000000000000000000000","bytes":1},{"length":4,"path":"d1/../m.onnx.data","sha256":"0000000000000000000000000000000000000000000000000000000000000000","bytes":1}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseManifest("manifest.json", b)
		if err != nil {
			return
		}
		if len(m.Files) > MaxManifestFiles || len(m.Lengths) > MaxManifestLengths {
			t.Fatalf("accepted %d files and %d lengths", len(m.Files), len(m.Lengths))
		}
		for _, f := range m.Files {
			if f.Bytes < 0 || f.Bytes > MaxFileBytes || !filepath.IsLocal(f.Path) || filepath.Clean(f.Path) != f.Path {
				t.Fatalf("accepted file %+v", f)
			}
		}
	})
}
