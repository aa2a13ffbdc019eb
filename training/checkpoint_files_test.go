package training

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/rpac-dev/rpac/training/checkpoint"
)

// smallRun trains a 2-step run into a temporary directory and returns its
// checkpoint directory.
func smallRun(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	o := microOptions(dir)
	o.Steps, o.EvalEvery = 2, 2
	if _, err := Train(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "checkpoint")
}

// record writes data as ck/name and records it in checkpoint.json (size
// and sha256 of data, or of hashOf when it is not nil: a sparse file).
func record(t *testing.T, ck, name string, size int64, sum []byte) {
	t.Helper()
	mp := filepath.Join(ck, checkpoint.ManifestFile)
	b, err := os.ReadFile(mp)
	if err != nil {
		t.Fatal(err)
	}
	var m checkpoint.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m.Files[name] = checkpoint.FileInfo{Size: size, SHA256: hex.EncodeToString(sum)}
	b, _ = json.Marshal(m)
	if err := os.WriteFile(mp, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func rewrite(t *testing.T, ck, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(ck, name), data, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	record(t, ck, name, int64(len(data)), sum[:])
}

// TestHugeSparseSafetensors: an 8 GiB sparse model.safetensors whose
// header declares an 8 GiB tensor is refused at once, with almost nothing
// allocated: before any read when checkpoint.json records another size,
// and before its data is read when checkpoint.json was rewritten to match
// (the run's config bounds what the file may hold).
func TestHugeSparseSafetensors(t *testing.T) {
	ck := smallRun(t)
	path := filepath.Join(ck, checkpoint.ModelFile)
	hdr := []byte(`{"tok_emb.weight":{"dtype":"F32","shape":[2147483646],"data_offsets":[0,8589934584]}}`)
	for (len(hdr)+8)%8 != 0 {
		hdr = append(hdr, ' ')
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	binary.Write(f, binary.LittleEndian, uint64(len(hdr)))
	f.Write(hdr)
	if err := f.Truncate(8 + int64(len(hdr)) + 8589934584); err != nil {
		t.Skip("no sparse files here:", err)
	}
	f.Close()

	for _, matching := range []bool{false, true} {
		if matching {
			record(t, ck, checkpoint.ModelFile, 8+int64(len(hdr))+8589934584, make([]byte, 32))
		}
		var before, after goruntime.MemStats
		goruntime.GC()
		goruntime.ReadMemStats(&before)
		start := time.Now()
		_, err := OpenRun(ck)
		goruntime.ReadMemStats(&after)
		if err == nil || !strings.Contains(err.Error(), checkpoint.ModelFile) {
			t.Fatalf("matching manifest %v: %v", matching, err)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
			t.Fatalf("matching manifest %v: refusing the file allocated %d MiB", matching, alloc>>20)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("matching manifest %v: refusing the file took %v", matching, d)
		}
		t.Logf("matching manifest %v: %v", matching, err)
	}
}

// TestCheckpointTensorChecks: a consistent checkpoint (hashes recorded)
// whose model.safetensors holds an integer tensor where a float parameter
// belongs, a tensor of another shape, a tensor the model does not have, or
// a NaN, is refused with the tensor's name; so is an optimizer file with
// an extra tensor.
func TestCheckpointTensorChecks(t *testing.T) {
	type change func(ts []checkpoint.Named) ([]checkpoint.Named, string)
	first := func(ts []checkpoint.Named) string {
		for _, x := range ts {
			if strings.HasSuffix(x.Name, ".weight") && !strings.HasPrefix(x.Name, "ema.") {
				return x.Name
			}
		}
		t.Fatal("no weight")
		return ""
	}
	cases := []struct {
		name, file string
		mod        change
		dtype      string // patch the dtype of the changed tensor in the header
		want       string
	}{
		{"int32 parameter", checkpoint.ModelFile, func(ts []checkpoint.Named) ([]checkpoint.Named, string) { return ts, first(ts) }, "I32", "is I32"},
		{"other shape", checkpoint.ModelFile, func(ts []checkpoint.Named) ([]checkpoint.Named, string) {
			n := first(ts)
			for i := range ts {
				if ts[i].Name == n {
					ts[i].Shape = []int{len(ts[i].Data)}
				}
			}
			return ts, n
		}, "", "shape"},
		{"extra tensor", checkpoint.ModelFile, func(ts []checkpoint.Named) ([]checkpoint.Named, string) {
			return append(ts, checkpoint.Named{Name: "smuggled.weight", Shape: []int{2}, Data: []float32{1, 2}}), "smuggled.weight"
		}, "", "does not have"},
		{"NaN", checkpoint.ModelFile, func(ts []checkpoint.Named) ([]checkpoint.Named, string) {
			n := first(ts)
			for i := range ts {
				if ts[i].Name == n {
					ts[i].Data[1] = float32(math.NaN())
				}
			}
			return ts, n
		}, "", "non-finite"},
		{"extra optimizer tensor", checkpoint.OptimFile, func(ts []checkpoint.Named) ([]checkpoint.Named, string) {
			return append(ts, checkpoint.Named{Name: "adam.m.nothing", Shape: []int{1}, Data: []float32{1}}), "adam.m.nothing"
		}, "", "does not have"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ck := smallRun(t)
			full, err := checkpoint.Load(ck)
			if err != nil {
				t.Fatal(err)
			}
			ts := full.Weights
			if c.file == checkpoint.OptimFile {
				ts = full.Optim
			}
			ts, name := c.mod(ts)
			var buf bytes.Buffer
			if err := checkpoint.WriteSafetensors(&buf, ts, nil); err != nil {
				t.Fatal(err)
			}
			b := buf.Bytes()
			if c.dtype != "" {
				key := []byte(`"` + name + `":{"dtype":"F32"`)
				i := bytes.Index(b, key)
				if i < 0 {
					t.Fatalf("no %s in the header", key)
				}
				copy(b[i+len(key)-4:], c.dtype)
			}
			rewrite(t, ck, c.file, b)
			_, err = openRun(ck, true)
			if err == nil || !strings.Contains(err.Error(), `"`+name+`"`) && !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming %q and saying %q", err, name, c.want)
			}
		})
	}
}

// TestStateRanges: a state.json (hash recorded) with a number outside its
// documented range is refused before the tensors are read, naming the
// field; a loop count such as sinkhorn_iters cannot make a load hang.
func TestStateRanges(t *testing.T) {
	cases := []struct {
		field string
		mod   func(m map[string]any)
	}{
		{"sinkhorn_iters", func(m map[string]any) { m["config"].(map[string]any)["sinkhorn_iters"] = 1e9 }},
		{"layers", func(m map[string]any) { m["config"].(map[string]any)["layers"] = 100000 }},
		{"step", func(m map[string]any) { m["step"] = -3 }},
		{"context", func(m map[string]any) { m["context"] = 1 << 20 }},
		{"batch", func(m map[string]any) { m["batch"] = 0 }},
		{"lengths[0].T", func(m map[string]any) { m["lengths"] = []any{map[string]any{"T": 1 << 30, "batch": 4}} }},
		{"contexts", func(m map[string]any) { m["contexts"] = make([]int, 1000) }},
		{"control.dropout", func(m map[string]any) { m["control"].(map[string]any)["dropout"] = 7 }},
		{"kappa_init", func(m map[string]any) { m["config"].(map[string]any)["kappa_init"] = 1e300 }},
	}
	for _, c := range cases {
		t.Run(c.field, func(t *testing.T) {
			ck := smallRun(t)
			b, err := os.ReadFile(filepath.Join(ck, checkpoint.StateFile))
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			c.mod(m)
			b, _ = json.Marshal(m)
			rewrite(t, ck, checkpoint.StateFile, b)
			start := time.Now()
			_, err = OpenRun(ck)
			if err == nil || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("got %v, want an error naming %s", err, c.field)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("refusing took %v", d)
			}
		})
	}
}
