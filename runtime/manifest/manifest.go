package manifest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
)

// FileName is the manifest's file name inside an export folder.
const FileName = "manifest.json"

// FormatVersion is the manifest format this package reads and writes.
const FormatVersion = 1

// Manifest describes an exported model folder: one ONNX graph per context
// length plus the facts a service needs to feed it. `rpac export` writes it;
// Open reads it.
type Manifest struct {
	// Format is FormatVersion.
	Format int `json:"format"`
	// Lengths are the exported context lengths T, one graph each.
	Lengths []int `json:"lengths"`
	// Files lists every file of the export with its hash. The file whose
	// Length is T and whose Path ends in ".onnx" is the graph for T; the
	// only other files are external tensor data, "<graph>.onnx.data" with
	// its graph's Length and Graph (verified, read through the graph; any
	// other file is refused before a byte is hashed).
	Files []File `json:"files"`
	// VocabSize is V: ids must lie in [0,V) and logits have V columns.
	VocabSize int `json:"vocab_size"`
	// Tokenizer names the tokenizer the ids come from (e.g. "gpt2").
	Tokenizer string `json:"tokenizer"`
	// EOS is the end-of-sequence id, also used to right-pad inputs.
	EOS int `json:"eos"`
	// Config is the model configuration (opaque to the runtime).
	Config json.RawMessage `json:"config,omitempty"`
	// Fold records how the export folded training-time machinery, with its
	// statistics (opaque to the runtime).
	Fold json.RawMessage `json:"fold,omitempty"`
	// Model names the model kind (e.g. "fuzzy", "baseline").
	Model string `json:"model"`
	// KVCache describes the KV-cache graphs (`rpac export --kv-cache`):
	// nil when the export has none. See KVCache.
	KVCache *KVCache `json:"kv_cache,omitempty"`
	// Provenance records where the export came from (run, weights, data,
	// tokenizer, splits, commit, fold, precision); nil in manifests written
	// before it existed. Readers use Origin, which falls back to what such
	// a manifest recorded.
	Provenance *Provenance `json:"provenance,omitempty"`
}

// File is one file of an export.
type File struct {
	Length int    `json:"length"`
	Path   string `json:"path"`   // relative to the export folder, slash-separated
	SHA256 string `json:"sha256"` // lower-case hex
	Bytes  int64  `json:"bytes"`
	// Graph says which graph of its length an .onnx file is: GraphFull
	// (omitted; the [B,T] graph), GraphPrefill or GraphDecode. External
	// tensor data files carry their graph's kind.
	Graph GraphKind `json:"graph,omitempty"`
}

// Read reads and validates dir/manifest.json (file hashes are not
// checked here; VerifyFiles does that).
func Read(dir string) (*Manifest, error) {
	path := filepath.Join(dir, FileName)
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("runtime: %s not found: %s is not an exported model folder (write one with `rpac export`)", path, dir)
		}
		return nil, fmt.Errorf("runtime: %w", err)
	}
	if st.Size() > MaxManifestBytes {
		return nil, fmt.Errorf("runtime: %s is %d bytes, more than a manifest's limit of %d; it is not one rpac wrote", path, st.Size(), MaxManifestBytes)
	}
	buf, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("runtime: %w", err)
	}
	return parseManifest(path, buf)
}

// Bounds on what an export may declare: far above any real export, far
// below what would overflow or exhaust memory before a call.
const (
	MaxBatch  = 1 << 12
	MaxLength = 1 << 17
	MaxVocab  = 1 << 22
)

// Bounds on a manifest: far above any real export (a few KiB, a handful of
// lengths and files, files of at most a few GiB).
const (
	MaxManifestBytes   = 4 << 20
	MaxManifestLengths = 64
	MaxManifestFiles   = 1024
	MaxFileBytes       = 1 << 40
	maxPathLen         = 1024
)

// parseManifest decodes and validates a manifest's bytes.
func parseManifest(path string, buf []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(buf, &m); err != nil {
		return nil, fmt.Errorf("runtime: %s is not a valid manifest: %w", path, err)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("runtime: %s: %w", path, err)
	}
	return &m, nil
}

// Write writes m to dir/manifest.json atomically.
func Write(dir string, m *Manifest) error {
	if err := m.Validate(); err != nil {
		return fmt.Errorf("runtime: manifest: %w", err)
	}
	buf, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("runtime: manifest: %w", err)
	}
	buf = append(buf, '\n')
	path := filepath.Join(dir, FileName)
	f, err := os.CreateTemp(dir, "."+FileName+".tmp*")
	if err != nil {
		return fmt.Errorf("runtime: write %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(buf)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("runtime: write %s: %w", path, err)
	}
	return nil
}

// Validate checks the manifest's internal consistency.
func (m *Manifest) Validate() error {
	if m.Format != FormatVersion {
		return fmt.Errorf("manifest format %d is not supported (this runtime reads format %d)", m.Format, FormatVersion)
	}
	if len(m.Lengths) == 0 {
		return errors.New("manifest lists no lengths")
	}
	if len(m.Lengths) > MaxManifestLengths || len(m.Files) > MaxManifestFiles {
		return fmt.Errorf("manifest lists %d lengths and %d files; at most %d and %d", len(m.Lengths), len(m.Files), MaxManifestLengths, MaxManifestFiles)
	}
	seen := map[int]bool{}
	for _, L := range m.Lengths {
		if L <= 0 {
			return fmt.Errorf("manifest length %d is not positive", L)
		}
		if seen[L] {
			return fmt.Errorf("manifest lists length %d twice", L)
		}
		if L > MaxLength {
			return fmt.Errorf("manifest length %d is more than %d", L, MaxLength)
		}
		seen[L] = true
	}
	if m.VocabSize <= 0 || m.VocabSize > MaxVocab {
		return fmt.Errorf("manifest vocab_size %d is outside 1..%d", m.VocabSize, MaxVocab)
	}
	if m.EOS < 0 || m.EOS >= m.VocabSize {
		return fmt.Errorf("manifest eos %d is outside [0,%d)", m.EOS, m.VocabSize)
	}
	models := map[int]int{}
	kv := map[kvKey]int{}
	paths := map[string]bool{}
	for _, f := range m.Files {
		if !seen[f.Length] {
			return fmt.Errorf("manifest file %q has length %d, which is not among the lengths %v", f.Path, f.Length, m.Lengths)
		}
		if f.Path == "" || strings.Contains(f.Path, `\`) || !filepath.IsLocal(filepath.FromSlash(f.Path)) {
			return fmt.Errorf("manifest file path %q must be a relative path inside the model folder", f.Path)
		}
		if len(f.Path) > maxPathLen || path.Clean(f.Path) != f.Path || slices.Contains(strings.Split(f.Path, "/"), "..") {
			return fmt.Errorf("manifest file path %q must be a relative path inside the model folder in its plain form (no \".\" or \"..\" components, no repeated or trailing \"/\", at most %d bytes)", f.Path, maxPathLen)
		}
		if paths[f.Path] {
			return fmt.Errorf("manifest lists file %q twice", f.Path)
		}
		paths[f.Path] = true
		if b, err := hex.DecodeString(f.SHA256); err != nil || len(b) != sha256.Size || strings.ToLower(f.SHA256) != f.SHA256 {
			return fmt.Errorf("manifest file %q: sha256 %q is not 64 lower-case hex digits", f.Path, f.SHA256)
		}
		if f.Bytes < 0 || f.Bytes > MaxFileBytes {
			return fmt.Errorf("manifest file %q: size %d is outside 0..%d bytes", f.Path, f.Bytes, int64(MaxFileBytes))
		}
		if !f.Graph.valid() {
			return fmt.Errorf("manifest file %q: unknown graph %q (want %q, %q or none)", f.Path, f.Graph, GraphPrefill, GraphDecode)
		}
		if strings.HasSuffix(f.Path, ".onnx") {
			models[f.Length]++
			if f.Graph != GraphFull {
				kv[kvKey{f.Length, f.Graph}]++
			}
		}
	}
	for _, L := range m.Lengths {
		if n := models[L] - kv[kvKey{L, GraphPrefill}] - kv[kvKey{L, GraphDecode}]; n != 1 {
			return fmt.Errorf("manifest has %d .onnx files for length %d, want exactly one", n, L)
		}
	}
	if err := m.checkDataFiles(); err != nil {
		return err
	}
	if m.Provenance != nil {
		if err := m.Provenance.validate(); err != nil {
			return err
		}
	}
	return m.validateKV(kv)
}

// DataSuffix ends the name of a graph's external tensor data file: the
// exporter (onnx.WriteExternal, onnx.DataFile) writes the initializers of
// graph "<dir>/<name>.onnx" to "<dir>/<name>.onnx.data" and references
// it by its base name, relative to the graph's folder.
const DataSuffix = ".data"

// checkDataFiles refuses a file that is neither a graph (.onnx) nor the
// external data file of a listed graph of its length and kind: no graph
// reads it, and it is refused here, before anything is hashed (an
// unreferenced file of many GiB would cost a minute to hash).
func (m *Manifest) checkDataFiles() error {
	type graphKey struct {
		path   string
		length int
		graph  GraphKind
	}
	graphs := map[graphKey]bool{}
	for _, f := range m.Files {
		if strings.HasSuffix(f.Path, ".onnx") {
			graphs[graphKey{f.Path, f.Length, f.Graph}] = true
		}
	}
	for _, f := range m.Files {
		if strings.HasSuffix(f.Path, ".onnx") {
			continue
		}
		g, ok := strings.CutSuffix(f.Path, DataSuffix)
		if !ok || !graphs[graphKey{g, f.Length, f.Graph}] {
			kind := "full"
			if f.Graph != GraphFull {
				kind = string(f.Graph)
			}
			return fmt.Errorf("manifest file %q is neither a graph (.onnx) nor the external data (<graph>.onnx%s) of a listed %s graph of length %d: no graph reads it", f.Path, DataSuffix, kind, f.Length)
		}
	}
	return nil
}

// SortedLengths returns the lengths in increasing order.
func (m *Manifest) SortedLengths() []int {
	out := append([]int(nil), m.Lengths...)
	sort.Ints(out)
	return out
}

// ModelFile returns the .onnx file entry of the full graph for length L.
func (m *Manifest) ModelFile(L int) (File, bool) {
	return m.GraphFile(L, GraphFull)
}

// GraphFile returns the .onnx file entry of graph kind g for length L.
func (m *Manifest) GraphFile(L int, g GraphKind) (File, bool) {
	for _, f := range m.Files {
		if f.Length == L && f.Graph == g && strings.HasSuffix(f.Path, ".onnx") {
			return f, true
		}
	}
	return File{}, false
}

// VerifyFiles checks every listed file's size and sha256 under dir, and
// that it is a regular file inside dir reached without a symbolic link (a
// link, to a file or to a directory on the way, could point out of the
// export folder).
func (m *Manifest) VerifyFiles(dir string) error {
	return m.VerifyFilesContext(context.Background(), dir)
}

// VerifyFilesContext is VerifyFiles that stops between files when ctx ends.
//
// Every path is resolved once, inside dir through an os.Root (so no
// component can lead out of the folder, by a link or by a race), its size
// is compared with the manifest's before a byte is read, and each file is
// hashed once: a second entry naming the same file (a hard link) reuses the
// first one's hash.
func (m *Manifest) VerifyFilesContext(ctx context.Context, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("runtime: %w", err)
	}
	defer root.Close()
	type hashed struct {
		st  os.FileInfo
		sum string
	}
	var done []hashed
	for _, f := range m.Files {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("runtime: verifying %s: %w", dir, err)
		}
		rel := filepath.FromSlash(f.Path)
		path := filepath.Join(dir, rel)
		if err := noLinks(root, dir, rel); err != nil {
			return err
		}
		fh, err := root.Open(rel)
		if err != nil {
			return fmt.Errorf("runtime: %w", err)
		}
		sum, err := func() (string, error) {
			defer fh.Close()
			st, err := fh.Stat()
			if err != nil {
				return "", fmt.Errorf("runtime: %w", err)
			}
			if !st.Mode().IsRegular() {
				return "", fmt.Errorf("runtime: %s is not a regular file (a link or a device): an export folder holds its files itself; export it again", path)
			}
			if st.Size() != f.Bytes {
				return "", fmt.Errorf("runtime: %s has %d bytes, the manifest says %d: the export is incomplete or was changed; export it again", path, st.Size(), f.Bytes)
			}
			for _, h := range done {
				if os.SameFile(h.st, st) {
					return h.sum, nil
				}
			}
			h := sha256.New()
			n, err := io.Copy(h, io.LimitReader(fh, f.Bytes+1))
			if err != nil {
				return "", fmt.Errorf("runtime: reading %s: %w", path, err)
			}
			if n != f.Bytes {
				return "", fmt.Errorf("runtime: %s has %d bytes, the manifest says %d: the file changed while it was read; export it again", path, n, f.Bytes)
			}
			sum := hex.EncodeToString(h.Sum(nil))
			done = append(done, hashed{st, sum})
			filesHashed.Add(1)
			return sum, nil
		}()
		if err != nil {
			return err
		}
		if sum != f.SHA256 {
			return fmt.Errorf("runtime: %s has sha256 %s, the manifest says %s: the file is corrupt or was changed; export it again", path, sum, f.SHA256)
		}
	}
	return nil
}

// filesHashed counts the files VerifyFilesContext read (for tests).
var filesHashed atomic.Int64

// noLinks refuses a path under root whose directories are not plain
// directories or whose last component is not a regular file (symbolic
// links included, wherever they point).
func noLinks(root *os.Root, dir, rel string) error {
	parts := strings.Split(rel, string(filepath.Separator))
	for i := range parts {
		sub := filepath.Join(parts[:i+1]...)
		st, err := root.Lstat(sub)
		if err != nil {
			return fmt.Errorf("runtime: %w", err)
		}
		last := i == len(parts)-1
		switch {
		case st.Mode()&os.ModeSymlink != 0:
			return fmt.Errorf("runtime: %s is a symbolic link, not a regular file: an export folder holds its files itself, not links that may lead out of it; export it again", filepath.Join(dir, sub))
		case !last && !st.IsDir():
			return fmt.Errorf("runtime: %s is not a directory", filepath.Join(dir, sub))
		case last && !st.Mode().IsRegular():
			return fmt.Errorf("runtime: %s is not a regular file (a link or a device): an export folder holds its files itself; export it again", filepath.Join(dir, sub))
		}
	}
	return nil
}

// HashFile returns a file's sha256 (lower-case hex) and size.
func HashFile(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// NewFile hashes dir/rel and returns its manifest entry.
func NewFile(dir, rel string, length int) (File, error) {
	sum, n, err := HashFile(filepath.Join(dir, filepath.FromSlash(rel)))
	if err != nil {
		return File{}, fmt.Errorf("runtime: %w", err)
	}
	return File{Length: length, Path: filepath.ToSlash(rel), SHA256: sum, Bytes: n}, nil
}
