package checkpoint

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fuzzLimit is how long one fuzz input may take: a slower input is a
// failure (and is saved as a regression case like a crasher).
const fuzzLimit = 2 * time.Second

// FuzzCheckpointManifest: any checkpoint.json parses to an error or a
// manifest within its ranges, and loading a checkpoint under it never
// panics, hangs or reads a file whose size it does not record.
func FuzzCheckpointManifest(f *testing.F) {
	dir := filepath.Join(f.TempDir(), "ckpt")
	if err := Save(dir, sampleCheckpoint(2)); err != nil {
		f.Fatal(err)
	}
	good, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"format":"rpac-checkpoint","version":1,"files":{}}`))
	f.Add([]byte(`{"format":"rpac-checkpoint","version":1,"files":{"model.safetensors":{"size":-5,"sha256":"00"}}}`))
	f.Add([]byte(`{"format":"rpac-checkpoint","version":1,"files":{"model.safetensors":{"size":1099511627776,"sha256":""},"optim.safetensors":{},"state.json":{},"../x":{}}}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, b []byte) {
		start := time.Now()
		m, err := ParseManifest(b)
		if err == nil {
			for name, fi := range m.Files {
				if fi.Size < 0 || fi.Size > MaxFileBytes {
					t.Fatalf("accepted %s of size %d", name, fi.Size)
				}
			}
		}
		if err := os.WriteFile(filepath.Join(dir, ManifestFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		LoadWith(dir, LoadOptions{Optim: true, Finite: true})
		if d := time.Since(start); d > fuzzLimit {
			t.Fatalf("slow input: %v", d)
		}
	})
}
