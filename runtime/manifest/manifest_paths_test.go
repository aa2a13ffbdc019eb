package manifest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestVerifyFilesRefusesDirectoryLinks: a directory symlink on the way to a
// listed file leads out of the export folder and is refused, even when the
// file it reaches has the listed hash.
func TestVerifyFilesRefusesDirectoryLinks(t *testing.T) {
	outside, dir := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(outside, "m.onnx"), []byte("model bytes"), 0o644)
	f, err := NewFile(outside, "m.onnx", 16)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "d")); err != nil {
		t.Fatal(err)
	}
	f.Path = "d/m.onnx"
	m := &Manifest{Files: []File{f}}
	if err := m.VerifyFiles(dir); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("a file reached through a directory link out of the folder: %v", err)
	}
	// A link that stays inside the folder is refused as well.
	os.Mkdir(filepath.Join(dir, "real"), 0o755)
	os.WriteFile(filepath.Join(dir, "real", "m.onnx"), []byte("model bytes"), 0o644)
	os.Symlink("real", filepath.Join(dir, "alias"))
	f.Path = "alias/m.onnx"
	if err := m.VerifyFiles(dir); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("a file reached through a directory link: %v", err)
	}
	f.Path = "real/m.onnx"
	m.Files[0] = f
	if err := m.VerifyFiles(dir); err != nil {
		t.Fatalf("the real file in a subdirectory: %v", err)
	}
}

// TestManifestPathsPlain: paths with "." or ".." components (which let one
// file be listed under many names and hashed again for each) are refused
// by Validate; a file listed twice by hard links is read once.
func TestManifestPathsPlain(t *testing.T) {
	sum := strings.Repeat("0", 64)
	base := func(paths ...string) *Manifest {
		m := &Manifest{Format: FormatVersion, Lengths: []int{4}, VocabSize: 8, Files: []File{{Length: 4, Path: "m.onnx", SHA256: sum, Bytes: 1}}}
		for _, p := range paths {
			m.Files = append(m.Files, File{Length: 4, Path: p, SHA256: sum, Bytes: 1})
		}
		return m
	}
	if err := base("m.onnx.data").Validate(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"d1/../blob", "./blob", "d//blob", "d/./blob", "blob/", "d/..", "a/b/../../blob"} {
		if err := base(p).Validate(); err == nil || !strings.Contains(err.Error(), "plain form") {
			t.Errorf("path %q: %v", p, err)
		}
	}
	for _, n := range []int64{-1, MaxFileBytes + 1} {
		m := base()
		m.Files[0].Bytes = n
		if err := m.Validate(); err == nil || !strings.Contains(err.Error(), "size") {
			t.Errorf("bytes %d: %v", n, err)
		}
	}

	dir := t.TempDir()
	blob := filepath.Join(dir, "blob")
	os.WriteFile(blob, make([]byte, 1<<16), 0o644)
	f, err := NewFile(dir, "blob", 4)
	if err != nil {
		t.Fatal(err)
	}
	m := &Manifest{Files: []File{f}}
	for i := range 20 {
		name := filepath.Join(dir, "link"+string(rune('a'+i)))
		if err := os.Link(blob, name); err != nil {
			t.Skip("no hard links here:", err)
		}
		g := f
		g.Path = filepath.Base(name)
		m.Files = append(m.Files, g)
	}
	before := filesHashed.Load()
	if err := m.VerifyFiles(dir); err != nil {
		t.Fatal(err)
	}
	if n := filesHashed.Load() - before; n != 1 {
		t.Fatalf("21 names of one file were hashed %d times, want once", n)
	}
}

// TestVerifyFilesSizeFirst: a file whose size differs from the manifest's
// is refused before it is read (a huge sparse file costs nothing).
func TestVerifyFilesSizeFirst(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.onnx")
	os.WriteFile(path, []byte("model bytes"), 0o644)
	f, err := NewFile(dir, "m.onnx", 16)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 64<<30); err != nil { // sparse: no disk used
		t.Skip(err)
	}
	before := filesHashed.Load()
	m := &Manifest{Files: []File{f}}
	if err := m.VerifyFiles(dir); err == nil || !strings.Contains(err.Error(), "bytes, the manifest says") {
		t.Fatalf("a 64 GiB file listed as %d bytes: %v", f.Bytes, err)
	}
	if filesHashed.Load() != before {
		t.Fatal("the oversized file was read")
	}
}

// TestUnreadFileRefusedFirst: a listed file that is neither a graph nor
// the external data file of a graph of its length and kind (what
// onnx.WriteExternal writes: "<graph>.onnx.data" next to the graph) is
// refused when the manifest is read, before any file is hashed: an 8 GiB
// sparse file costs nothing. The data files an export writes, in the
// folder or below it, for full and KV-cache graphs, are accepted.
func TestUnreadFileRefusedFirst(t *testing.T) {
	sum := strings.Repeat("0", 64)
	graphs := []File{
		{Length: 4, Path: "m4.onnx", SHA256: sum, Bytes: 1},
		{Length: 8, Path: "sub/m8.onnx", SHA256: sum, Bytes: 1},
		{Length: 8, Path: "m8.decode.onnx", SHA256: sum, Bytes: 1, Graph: GraphDecode},
		{Length: 8, Path: "m8.prefill.onnx", SHA256: sum, Bytes: 1, Graph: GraphPrefill},
	}
	with := func(extra ...File) *Manifest {
		return &Manifest{Format: FormatVersion, Lengths: []int{4, 8}, VocabSize: 8, Files: append(append([]File(nil), graphs...), extra...),
			KVCache: NewKVCache(1, 1, 1, []int{8})}
	}
	data := func(path string, L int, g GraphKind) File {
		return File{Length: L, Path: path, SHA256: sum, Bytes: 1, Graph: g}
	}
	good := with(data("m4.onnx.data", 4, GraphFull), data("sub/m8.onnx.data", 8, GraphFull), data("m8.decode.onnx.data", 8, GraphDecode))
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []File{
		data("weights.bin", 4, GraphFull),
		data("m4.onnx.data", 8, GraphFull),           // another length's graph
		data("m8.onnx.data", 8, GraphFull),           // the graph is in sub/
		data("sub/m4.onnx.data", 4, GraphFull),       // the graph is not in sub/
		data("m8.decode.onnx.data", 8, GraphFull),    // another kind's graph
		data("m8.prefill.onnx.data", 8, GraphDecode), // another kind's graph
		data("m4.onnx.data.data", 4, GraphFull),      // the data of no graph
		data("m4.onnx.bak", 4, GraphFull),
	} {
		if err := with(f).Validate(); err == nil || !strings.Contains(err.Error(), "no graph reads it") {
			t.Errorf("%s (length %d, graph %q): %v", f.Path, f.Length, f.Graph, err)
		}
	}

	// Opening an export (Read, then VerifyFiles) refuses it before hashing
	// anything, however large.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "m4.onnx"), []byte("g"), 0o644)
	g, err := NewFile(dir, "m4.onnx", 4)
	if err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(dir, "stray.data")
	if err := os.WriteFile(stray, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(stray, 8<<30); err != nil { // sparse: no disk used
		t.Skip(err)
	}
	m := &Manifest{Format: FormatVersion, Lengths: []int{4}, VocabSize: 8, Files: []File{g, {Length: 4, Path: "stray.data", SHA256: sum, Bytes: 8 << 30}}}
	buf, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, FileName), buf, 0o644)
	before, t0 := filesHashed.Load(), time.Now()
	m, err = Read(dir)
	if err == nil {
		err = m.VerifyFiles(dir)
	}
	if err == nil || !strings.Contains(err.Error(), "no graph reads it") {
		t.Fatalf("an unread 8 GiB file: %v", err)
	}
	if n := filesHashed.Load() - before; n != 0 || time.Since(t0) > time.Second {
		t.Fatalf("refused after %v and %d files hashed", time.Since(t0), n)
	}
}
