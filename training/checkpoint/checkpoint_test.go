package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

func sampleCheckpoint(step int) *Checkpoint {
	w := sampleTensors()
	w[0].Data[0] = float32(step)
	return &Checkpoint{
		Weights: w,
		Optim: []Named{
			{Name: "adam.m.blocks.0.attn.Wq.weight", Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, float32(step)}},
			{Name: "adam.v.blocks.0.attn.Wq.weight", Shape: []int{2, 3}, Data: []float32{6, 5, 4, 3, 2, 1}},
		},
		State: json.RawMessage(`{"step":` + itoa(step) + `,"rng":[1,2,3],"config":{"d":510}}`),
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func stepOf(t *testing.T, c *Checkpoint) int {
	t.Helper()
	var s struct{ Step int }
	if err := json.Unmarshal(c.State, &s); err != nil {
		t.Fatal(err)
	}
	return s.Step
}

func TestCheckpointRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "runs", "ckpt")
	want := sampleCheckpoint(7)
	if err := Save(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	sameTensors(t, got.Weights, want.Weights)
	sameTensors(t, got.Optim, want.Optim)
	if !bytes.Equal(got.State, want.State) {
		t.Errorf("state %s, want %s", got.State, want.State)
	}
	// Overwrite and check that nothing is left next to it.
	if err := Save(dir, sampleCheckpoint(8)); err != nil {
		t.Fatal(err)
	}
	got, err = Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s := stepOf(t, got); s != 8 {
		t.Errorf("step %d after overwrite, want 8", s)
	}
	entries, _ := os.ReadDir(filepath.Dir(dir))
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("leftovers next to the checkpoint: %v", names)
	}
	// Nil state saves as an empty object.
	if err := Save(dir, &Checkpoint{}); err != nil {
		t.Fatal(err)
	}
	if got, err = Load(dir); err != nil || string(got.State) != "{}" || len(got.Weights) != 0 {
		t.Fatalf("empty checkpoint: %v %+v", err, got)
	}
}

func TestSaveRejects(t *testing.T) {
	root := t.TempDir()
	foreign := filepath.Join(root, "run")
	os.MkdirAll(foreign, 0o755)
	os.WriteFile(filepath.Join(foreign, "notes.txt"), []byte("keep me"), 0o644)
	if err := Save(foreign, sampleCheckpoint(1)); err == nil || !strings.Contains(err.Error(), "not a checkpoint") {
		t.Errorf("saving over a foreign directory: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(foreign, "notes.txt")); string(b) != "keep me" {
		t.Error("foreign directory was modified")
	}
	bad := sampleCheckpoint(1)
	bad.State = json.RawMessage(`[1,2]`)
	if err := Save(filepath.Join(root, "c"), bad); err == nil || !strings.Contains(err.Error(), "object") {
		t.Errorf("array state: %v", err)
	}
	bad.State = json.RawMessage(`{"a":`)
	if err := Save(filepath.Join(root, "c"), bad); err == nil || !strings.Contains(err.Error(), "bad JSON") {
		t.Errorf("broken state: %v", err)
	}
	bad = sampleCheckpoint(1)
	bad.Weights[0].Data = bad.Weights[0].Data[:2]
	if err := Save(filepath.Join(root, "c"), bad); err == nil {
		t.Error("saving a tensor with a wrong length succeeded")
	}
	if _, err := os.Stat(filepath.Join(root, "c")); !errors.Is(err, os.ErrNotExist) {
		t.Error("a failed save left a checkpoint directory")
	}
	entries, _ := os.ReadDir(root)
	if len(entries) != 1 {
		t.Errorf("a failed save left files: %d entries", len(entries))
	}
}

// rewriteManifest records the current size and hash of name, so that a
// deliberately malformed file passes the integrity check and reaches the
// parser.
func rewriteManifest(t *testing.T, dir, name string) {
	t.Helper()
	mp := filepath.Join(dir, ManifestFile)
	b, err := os.ReadFile(mp)
	if err != nil {
		t.Fatal(err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	m.Files[name] = FileInfo{Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
	b, _ = json.Marshal(m)
	if err := os.WriteFile(mp, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadCorruption(t *testing.T) {
	type corrupt func(t *testing.T, dir string)
	modify := func(name string, f func([]byte) []byte) corrupt {
		return func(t *testing.T, dir string) {
			p := filepath.Join(dir, name)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, f(b), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	truncate := func(name string) corrupt {
		return modify(name, func(b []byte) []byte { return b[:len(b)/2] })
	}
	flip := func(name string) corrupt {
		return modify(name, func(b []byte) []byte { b[len(b)-1] ^= 0x40; return b })
	}
	remove := func(name string) corrupt {
		return func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, name)) }
	}
	consistent := func(name string, f func([]byte) []byte) corrupt {
		return func(t *testing.T, dir string) {
			modify(name, f)(t, dir)
			rewriteManifest(t, dir, name)
		}
	}
	garbageLen := func(b []byte) []byte { binary.LittleEndian.PutUint64(b, 0xdeadbeefcafe); return b }
	overlap := func(b []byte) []byte {
		// The optimizer file holds two [2,3] F32 tensors at [0,24] and
		// [24,48]; move the second one's start into the first.
		return bytes.Replace(b, []byte(`[24,48]`), []byte(`[20,44]`), 1)
	}
	cases := []struct {
		name    string
		corrupt corrupt
		file    string
		want    string
	}{
		{"missing model", remove(ModelFile), ModelFile, "missing file"},
		{"missing optim", remove(OptimFile), OptimFile, "missing file"},
		{"missing state", remove(StateFile), StateFile, "missing file"},
		{"missing manifest", remove(ManifestFile), ManifestFile, "missing file"},
		{"truncated model", truncate(ModelFile), ModelFile, "truncated"},
		{"truncated optim", truncate(OptimFile), OptimFile, "truncated"},
		{"truncated state", truncate(StateFile), StateFile, "truncated"},
		{"truncated manifest", truncate(ManifestFile), ManifestFile, "bad JSON"},
		{"grown model", modify(ModelFile, func(b []byte) []byte { return append(b, 0) }), ModelFile, "size"},
		{"flipped model", flip(ModelFile), ModelFile, "checksum mismatch"},
		{"flipped optim", flip(OptimFile), OptimFile, "checksum mismatch"},
		{"flipped state", flip(StateFile), StateFile, "checksum mismatch"},
		{"garbage header length", consistent(ModelFile, garbageLen), ModelFile, "header length"},
		{"overlapping offsets", consistent(OptimFile, overlap), OptimFile, "overlap"},
		{"safetensors cut short", consistent(ModelFile, func(b []byte) []byte { return b[:len(b)-4] }), ModelFile, "out of bounds"},
		{"bad state JSON", consistent(StateFile, func(b []byte) []byte { return b[:len(b)-1] }), StateFile, "bad JSON"},
		{"state not an object", consistent(StateFile, func([]byte) []byte { return []byte(`"x"`) }), StateFile, "object"},
		{"newer format", modify(ManifestFile, func(b []byte) []byte {
			return bytes.Replace(b, []byte(`"version": 1`), []byte(`"version": 99`), 1)
		}), ManifestFile, "version 99"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ckpt")
			if err := Save(dir, sampleCheckpoint(3)); err != nil {
				t.Fatal(err)
			}
			c.corrupt(t, dir)
			_, err := Load(dir)
			if err == nil {
				t.Fatal("Load succeeded on a corrupt checkpoint")
			}
			if !strings.Contains(err.Error(), c.file) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v\nwant it to mention %q and %q", err, c.file, c.want)
			}
		})
	}

	if _, err := Load(filepath.Join(t.TempDir(), "nope")); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing directory: %v", err)
	}
	if _, _, err := LoadWeightsFile(filepath.Join(t.TempDir(), "nope.safetensors")); err == nil {
		t.Error("missing weights file loaded")
	}
}

func TestCrashSafety(t *testing.T) {
	stages := []struct {
		stage    string
		wantStep int // what Load sees after the crash
	}{
		{"wrote " + ModelFile, 1},
		{"wrote " + OptimFile, 1},
		{"wrote " + StateFile, 1},
		{"synced temp", 1},
		{"moved old", 1}, // dir is gone; Load falls back to dir.prev
		{"moved new", 2},
	}
	defer func() { crashHook = nil }()
	for _, s := range stages {
		t.Run(s.stage, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ckpt")
			crashHook = nil
			if err := Save(dir, sampleCheckpoint(1)); err != nil {
				t.Fatal(err)
			}
			crashHook = func(stage string) bool { return stage == s.stage }
			if err := Save(dir, sampleCheckpoint(2)); !errors.Is(err, errSimulatedCrash) {
				t.Fatalf("Save returned %v, want the simulated crash", err)
			}
			crashHook = nil
			c, err := Load(dir)
			if err != nil {
				t.Fatalf("after a crash at %q: %v", s.stage, err)
			}
			if got := stepOf(t, c); got != s.wantStep {
				t.Fatalf("after a crash at %q loaded step %d, want %d", s.stage, got, s.wantStep)
			}
			// The next save recovers and cleans up.
			if err := Save(dir, sampleCheckpoint(3)); err != nil {
				t.Fatalf("saving after the crash: %v", err)
			}
			if c, err = Load(dir); err != nil || stepOf(t, c) != 3 {
				t.Fatalf("after recovery: %v", err)
			}
			entries, _ := os.ReadDir(filepath.Dir(dir))
			if len(entries) != 1 {
				t.Errorf("%d entries next to the checkpoint after recovery, want 1", len(entries))
			}
		})
	}
	// A crash during the very first save leaves nothing that looks loadable.
	dir := filepath.Join(t.TempDir(), "ckpt")
	crashHook = func(stage string) bool { return stage == "synced temp" }
	if err := Save(dir, sampleCheckpoint(1)); !errors.Is(err, errSimulatedCrash) {
		t.Fatal(err)
	}
	crashHook = nil
	if _, err := Load(dir); err == nil {
		t.Error("loaded a checkpoint that was never completed")
	}
}

func TestStoreRoundTrip(t *testing.T) {
	src := kernels.NewStore(ir.FP64)
	a, _ := src.Ensure("tok_emb.weight", ir.Shape{2, 2})
	a.SetFloat64s([]float64{1, 2, 3, 4})
	b, _ := src.Ensure("blocks.0.attn.tau_att", ir.Shape{})
	b.Set(0, 0.68)
	ts := FromStore(src)
	if len(ts) != 2 || ts[0].Name != "tok_emb.weight" || ts[1].Data[0] != float32(0.68) {
		t.Fatalf("FromStore = %+v", ts)
	}

	dst := kernels.NewStore(ir.FP32)
	dst.Ensure("extra.bias", ir.Shape{3})
	missing, err := IntoStore(dst, ts)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 1 || missing[0] != "extra.bias" {
		t.Errorf("missing = %v", missing)
	}
	if got := dst.Get("tok_emb.weight").F32; got[3] != 4 {
		t.Errorf("copied %v", got)
	}
	wrong := kernels.NewStore(ir.FP32)
	wrong.Ensure("tok_emb.weight", ir.Shape{4})
	if _, err := IntoStore(wrong, ts); err == nil || !strings.Contains(err.Error(), "shape") {
		t.Errorf("shape mismatch: %v", err)
	}
}
