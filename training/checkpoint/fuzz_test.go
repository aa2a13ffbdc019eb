package checkpoint

import (
	"github.com/rpac-dev/rpac/internal/fuzzlimit"
	"os"
	"path/filepath"
	"testing"
)

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
		defer fuzzlimit.Start().Check(t) // a slow input fails like a crash
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
	})
}
