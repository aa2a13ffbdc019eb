package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
)

// sparseSafetensors writes a safetensors file whose header declares one
// F32 tensor of n values, its data a hole (no disk used).
func sparseSafetensors(t *testing.T, path string, n int64) {
	t.Helper()
	hdr := []byte(`{"w":{"dtype":"F32","shape":[` + itoa(int(n)) + `],"data_offsets":[0,` + itoa(int(4*n)) + `]}}`)
	for len(hdr)%8 != 0 {
		hdr = append(hdr, ' ')
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	binary.Write(f, binary.LittleEndian, uint64(len(hdr)))
	f.Write(hdr)
	if err := f.Truncate(8 + int64(len(hdr)) + 4*n); err != nil {
		t.Skip("no sparse files here:", err)
	}
}

// TestLoadWeightsFileBounded: a bare safetensors file declaring more than
// this process can hold is refused from its header, before its data is
// read or any of it allocated.
func TestLoadWeightsFileBounded(t *testing.T) {
	if memoryLimit() == 0 {
		t.Skip("available memory unknown")
	}
	path := filepath.Join(t.TempDir(), "huge.safetensors")
	sparseSafetensors(t, path, 1<<40/4) // 1 TiB
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	_, _, err := LoadWeightsFile(path)
	goruntime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "more than the") {
		t.Fatalf("a 1 TiB tensor: %v", err)
	}
	if a := after.TotalAlloc - before.TotalAlloc; a > 16<<20 {
		t.Fatalf("refusing it allocated %d MiB", a>>20)
	}
}

// TestLoadSizeFirst: a tensor file whose size differs from checkpoint.json
// is refused before it is read, and checkpoint.json's own fields are held
// to their ranges.
func TestLoadSizeFirst(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := Save(dir, sampleCheckpoint(1)); err != nil {
		t.Fatal(err)
	}
	sparseSafetensors(t, filepath.Join(dir, ModelFile), 2<<30) // 8 GiB
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	_, err := Load(dir)
	goruntime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "the file was modified") {
		t.Fatalf("an 8 GiB model file: %v", err)
	}
	if a := after.TotalAlloc - before.TotalAlloc; a > 16<<20 {
		t.Fatalf("refusing it allocated %d MiB", a>>20)
	}

	good, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mod  func(m map[string]any)
		want string
	}{
		{func(m map[string]any) {
			m["files"].(map[string]any)["extra.bin"] = map[string]any{"size": 1, "sha256": strings.Repeat("0", 64)}
		}, "extra.bin"},
		{func(m map[string]any) { m["files"].(map[string]any)[ModelFile].(map[string]any)["size"] = -1 }, "size -1"},
		{func(m map[string]any) { m["files"].(map[string]any)[ModelFile].(map[string]any)["size"] = 1 << 50 }, "outside"},
		{func(m map[string]any) { m["files"].(map[string]any)[StateFile].(map[string]any)["size"] = 1 << 30 }, "limit"},
		{func(m map[string]any) { m["files"].(map[string]any)[OptimFile].(map[string]any)["sha256"] = "xyz" }, "64 hex"},
		{func(m map[string]any) { m["version"] = -1 }, "version -1"},
	} {
		var m map[string]any
		json.Unmarshal(good, &m)
		c.mod(m)
		b, _ := json.Marshal(m)
		os.WriteFile(filepath.Join(dir, ManifestFile), b, 0o644)
		if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), ManifestFile) {
			t.Errorf("got %v, want an error naming %s and mentioning %q", err, ManifestFile, c.want)
		}
	}
}
