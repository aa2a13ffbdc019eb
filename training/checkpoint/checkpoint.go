// Package checkpoint saves and restores training runs.
//
// A checkpoint is a directory holding four files:
//
//	model.safetensors  parameters and buffers (F32), named by PyTorch module
//	                   paths such as "blocks.3.attn.Wq.weight"
//	optim.safetensors  optimizer state, e.g. "adam.m.<param>", "adam.v.<param>"
//	state.json         a JSON object owned by the caller: step, config, RNG,
//	                   controllers, running statistics
//	checkpoint.json    format version plus the size and sha256 of each file
//
// checkpoint.json is written last. Save builds the new checkpoint in a
// sibling temporary directory, syncs it, moves the old checkpoint aside to
// "<dir>.prev", renames the new one into place and only then removes the old
// one, so a crash at any point leaves a loadable checkpoint: Load falls back to
// "<dir>.prev" when "<dir>" is missing. Load verifies every file against
// checkpoint.json before parsing it and reports corrupt input as an error
// naming the file, never as a panic.
//
// The safetensors reader and writer are also usable on their own
// (ReadSafetensors, WriteSafetensors, LoadWeightsFile, SaveWeightsFile), for
// example to import a PyTorch state dict.
package checkpoint

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/rpac-dev/rpac/internal/fileio"
)

// File names inside a checkpoint directory.
const (
	ModelFile    = "model.safetensors"
	OptimFile    = "optim.safetensors"
	StateFile    = "state.json"
	ManifestFile = "checkpoint.json"
)

// FormatVersion is the version recorded in checkpoint.json. Load refuses
// checkpoints with a larger version.
const FormatVersion = 1

const formatName = "rpac-checkpoint"

// Checkpoint is the content of a checkpoint directory.
type Checkpoint struct {
	// Weights are the model's parameters and buffers.
	Weights []Named
	// Optim is the optimizer state (moments, per-parameter step counts).
	Optim []Named
	// State is a JSON object supplied by the caller; nil saves "{}".
	State json.RawMessage
}

// Manifest is the content of checkpoint.json.
type Manifest struct {
	Format  string              `json:"format"`
	Version int                 `json:"version"`
	Files   map[string]FileInfo `json:"files"`
}

// FileInfo records one file of a checkpoint.
type FileInfo struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// crashHook, when set, is called at named points of Save; returning true
// makes Save stop right there, leaving the file system as a crash would.
var crashHook func(stage string) bool

var errSimulatedCrash = errors.New("simulated crash")

// Save writes c to dir atomically, replacing any checkpoint already there.
// dir's parent is created if needed. An existing dir that is neither empty
// nor a checkpoint is left alone and reported as an error.
func Save(dir string, c *Checkpoint) (err error) {
	if c == nil {
		return errors.New("checkpoint: Save: nil checkpoint")
	}
	if err := validate(c.Weights); err != nil {
		return fmt.Errorf("checkpoint: weights: %w", err)
	}
	if err := validate(c.Optim); err != nil {
		return fmt.Errorf("checkpoint: optimizer state: %w", err)
	}
	state := c.State
	if len(bytes.TrimSpace(state)) == 0 {
		state = json.RawMessage("{}")
	}
	if err := checkObject(state); err != nil {
		return fmt.Errorf("checkpoint: state: %w", err)
	}

	dir = filepath.Clean(dir)
	parent, base := splitPath(dir)
	prev := dir + ".prev"
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	haveOld := false
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("checkpoint: %s exists and is not a directory; choose another checkpoint path", dir)
		}
		ok, err := replaceable(dir)
		if err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		if !ok {
			return fmt.Errorf("checkpoint: %s exists and is not a checkpoint (no %s); refusing to replace it: choose another path or move it away", dir, ManifestFile)
		}
		haveOld = true
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("checkpoint: %w", err)
	}
	removeStaleTemps(parent, base)

	tmp, err := os.MkdirTemp(parent, "."+base+".tmp-")
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	crashed := false
	defer func() {
		if err != nil && !crashed {
			os.RemoveAll(tmp)
		}
	}()
	crash := func(stage string) bool {
		if crashHook != nil && crashHook(stage) {
			crashed = true
			return true
		}
		return false
	}

	man := Manifest{Format: formatName, Version: FormatVersion, Files: map[string]FileInfo{}}
	writers := []struct {
		name  string
		write func(io.Writer) error
	}{
		{ModelFile, func(w io.Writer) error { return WriteSafetensors(w, c.Weights, map[string]string{"format": "pt"}) }},
		{OptimFile, func(w io.Writer) error { return WriteSafetensors(w, c.Optim, nil) }},
		{StateFile, func(w io.Writer) error { _, err := w.Write(state); return err }},
	}
	for _, fw := range writers {
		info, err := writeSynced(filepath.Join(tmp, fw.name), fw.write)
		if err != nil {
			return fmt.Errorf("checkpoint: writing %s: %w", fw.name, err)
		}
		man.Files[fw.name] = info
		if crash("wrote " + fw.name) {
			return errSimulatedCrash
		}
	}
	mj, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	mj = append(mj, '\n')
	if _, err := writeSynced(filepath.Join(tmp, ManifestFile), func(w io.Writer) error { _, err := w.Write(mj); return err }); err != nil {
		return fmt.Errorf("checkpoint: writing %s: %w", ManifestFile, err)
	}
	if err := syncDir(tmp); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if crash("synced temp") {
		return errSimulatedCrash
	}

	if haveOld {
		// A leftover .prev next to a complete dir is stale.
		if err := os.RemoveAll(prev); err != nil {
			return fmt.Errorf("checkpoint: removing stale %s: %w", prev, err)
		}
		if err := os.Rename(dir, prev); err != nil {
			return fmt.Errorf("checkpoint: moving the old checkpoint aside: %w", err)
		}
		if err := syncDir(parent); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		if crash("moved old") {
			return errSimulatedCrash
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if haveOld {
			os.Rename(prev, dir)
		}
		return fmt.Errorf("checkpoint: moving the new checkpoint into place: %w", err)
	}
	if err := syncDir(parent); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if crash("moved new") {
		return errSimulatedCrash
	}
	if err := os.RemoveAll(prev); err != nil {
		return fmt.Errorf("checkpoint: saved %s but could not remove %s: %w", dir, prev, err)
	}
	return syncDir(parent)
}

// Load reads and verifies the checkpoint in dir. If dir is missing but
// "<dir>.prev" holds a checkpoint (a save was interrupted between its two
// renames), that one is loaded and a warning is logged.
func Load(dir string) (*Checkpoint, error) { return LoadWith(dir, LoadOptions{Optim: true}) }

// LoadParts is Load that reads the optimizer state only when withOptim is
// set (export and inspection need the weights and the state alone).
func LoadParts(dir string, withOptim bool) (*Checkpoint, error) {
	return LoadWith(dir, LoadOptions{Optim: withOptim})
}

// LoadOptions control LoadWith.
type LoadOptions struct {
	// Optim reads the optimizer state as well.
	Optim bool
	// Expect, when set, receives state.json (verified) before either
	// safetensors file is read, and returns the schemas the model and the
	// optimizer files must meet (nil: not checked); an error stops the load.
	Expect func(state []byte) (model, optim Schema, err error)
	// Finite refuses a tensor holding NaN or ±Inf, naming it (rpac never
	// writes one: training refuses to save non-finite weights).
	Finite bool
}

// LoadWith is Load with options. Each file is checked against
// checkpoint.json's size before a byte of it is read; the safetensors files
// are streamed (hashed while parsed, never held whole) and their headers
// checked before their data.
func LoadWith(dir string, o LoadOptions) (*Checkpoint, error) {
	dir, err := Resolve(dir)
	if err != nil {
		return nil, err
	}
	return load(dir, o)
}

// Resolve returns the directory Load would read: dir itself, or
// "<dir>.prev" when dir is missing after an interrupted save (logged as a
// warning).
func Resolve(dir string) (string, error) {
	dir = filepath.Clean(dir)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		prev := dir + ".prev"
		if _, perr := os.Stat(filepath.Join(prev, ManifestFile)); perr == nil {
			slog.Warn("checkpoint: directory missing after an interrupted save; loading the previous checkpoint", "dir", dir, "from", prev)
			return prev, nil
		}
		return "", fmt.Errorf("checkpoint: %s does not exist; check the path (or start a new run without resuming)", dir)
	} else if err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	return dir, nil
}

// Bounds on checkpoint files: far above what rpac writes.
const (
	// MaxFileBytes bounds any file a checkpoint.json may list.
	MaxFileBytes = 1 << 40
	// MaxStateBytes bounds state.json (real ones are a few KiB) and
	// MaxManifestBytes checkpoint.json.
	MaxStateBytes    = 64 << 20
	MaxManifestBytes = 1 << 20
)

// validate checks checkpoint.json's fields: the format and version, the
// three files and no other, each with a size in 0..MaxFileBytes (state.json
// in 0..MaxStateBytes) and a sha256 of 64 hex digits.
func (m *Manifest) validate() error {
	if m.Format != formatName {
		return fmt.Errorf("format is %q, want %q", m.Format, formatName)
	}
	if m.Version < 1 || m.Version > FormatVersion {
		return fmt.Errorf("format version %d is not supported (this build reads 1..%d); use a newer rpac", m.Version, FormatVersion)
	}
	for _, name := range []string{ModelFile, OptimFile, StateFile} {
		if _, ok := m.Files[name]; !ok {
			return fmt.Errorf("does not list %s", name)
		}
	}
	for name, f := range m.Files {
		switch name {
		case ModelFile, OptimFile, StateFile:
		default:
			return fmt.Errorf("lists %q, which is not a checkpoint file (want %s, %s and %s)", name, ModelFile, OptimFile, StateFile)
		}
		if f.Size < 0 || f.Size > MaxFileBytes {
			return fmt.Errorf("%s: size %d is outside 0..%d", name, f.Size, int64(MaxFileBytes))
		}
		if b, err := hex.DecodeString(f.SHA256); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("%s: sha256 %q is not 64 hex digits", name, f.SHA256)
		}
	}
	if s := m.Files[StateFile].Size; s > MaxStateBytes {
		return fmt.Errorf("%s: size %d is more than a state file's limit of %d", StateFile, s, MaxStateBytes)
	}
	return nil
}

// ParseManifest decodes and validates checkpoint.json's bytes.
func ParseManifest(b []byte) (*Manifest, error) {
	var man Manifest
	if err := json.Unmarshal(b, &man); err != nil {
		return nil, fmt.Errorf("bad JSON: %v", err)
	}
	if err := man.validate(); err != nil {
		return nil, err
	}
	return &man, nil
}

func load(dir string, o LoadOptions) (*Checkpoint, error) {
	manPath := filepath.Join(dir, ManifestFile)
	mj, err := readBounded(manPath, MaxManifestBytes)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("checkpoint: %s: missing file: not a checkpoint directory, or its save never finished", manPath)
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	man, err := ParseManifest(mj)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %s: %w", manPath, err)
	}

	c := &Checkpoint{}
	state, err := readVerified(filepath.Join(dir, StateFile), man.Files[StateFile])
	if err != nil {
		return nil, err
	}
	if err := checkObject(state); err != nil {
		return nil, fmt.Errorf("checkpoint: %s: %w", filepath.Join(dir, StateFile), err)
	}
	c.State = json.RawMessage(state)
	var schemas [2]Schema
	if o.Expect != nil {
		if schemas[0], schemas[1], err = o.Expect(state); err != nil {
			return nil, err
		}
	}
	for i, f := range []struct {
		name string
		dst  *[]Named
	}{{ModelFile, &c.Weights}, {OptimFile, &c.Optim}} {
		if f.name == OptimFile && !o.Optim {
			continue
		}
		ts, err := readTensors(filepath.Join(dir, f.name), man.Files[f.name], schemas[i], o.Finite)
		if err != nil {
			return nil, err
		}
		*f.dst = ts
	}
	return c, nil
}

// readBounded reads a file of at most limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	return fileio.ReadBounded(path, limit, func(st fs.FileInfo) error {
		if st.Size() > limit {
			return fmt.Errorf("%s is %d bytes, more than the limit of %d for this file", path, st.Size(), limit)
		}
		return nil
	})
}

// openVerified opens path and checks its size against its manifest entry
// before anything is read.
func openVerified(path string, want FileInfo) (*os.File, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("checkpoint: %s: missing file (listed in %s); the checkpoint is incomplete: resume from another one", path, ManifestFile)
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("checkpoint: %s is not a regular file", path)
	}
	if got := st.Size(); got != want.Size {
		f.Close()
		if got < want.Size {
			return nil, fmt.Errorf("checkpoint: %s: truncated: %d bytes, %s records %d; the file was cut short: resume from another checkpoint", path, got, ManifestFile, want.Size)
		}
		return nil, fmt.Errorf("checkpoint: %s: size %d bytes, %s records %d; the file was modified: resume from another checkpoint", path, got, ManifestFile, want.Size)
	}
	return f, nil
}

func checksumError(path, got string, want FileInfo) error {
	return fmt.Errorf("checkpoint: %s: checksum mismatch: sha256 %s, %s records %s; the file is corrupt: resume from another checkpoint", path, got, ManifestFile, want.SHA256)
}

// readVerified reads a small file (state.json) and checks it against its
// manifest entry, its size first.
func readVerified(path string, want FileInfo) ([]byte, error) {
	f, err := openVerified(path, want)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, want.Size+1))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); int64(len(data)) != want.Size || !strings.EqualFold(got, want.SHA256) {
		return nil, checksumError(path, got, want)
	}
	return data, nil
}

// readTensors streams a safetensors file of a checkpoint: its size against
// the manifest (and the schema's largest file) before reading, the header
// against the schema before the data, values finite if asked, and the sha256
// of the whole file computed while it is parsed. A file that fails to parse
// is hashed to its end, so that damage is reported as such.
func readTensors(path string, want FileInfo, schema Schema, finite bool) ([]Named, error) {
	f, err := openVerified(path, want)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ro := readOptions{finite: finite}
	if schema != nil {
		if max := schema.maxFileBytes(); want.Size > max {
			return nil, fmt.Errorf("checkpoint: %s: %d bytes, more than the %d a checkpoint of this model takes; the file does not belong to this run", path, want.Size, max)
		}
		ro.check = schema.check
	} else {
		ro.limit = memoryLimit()
	}
	h := sha256.New()
	r := io.TeeReader(bufio.NewReaderSize(f, 1<<20), h)
	ts, _, perr := readSafetensors(r, want.Size, ro)
	if perr != nil && errors.Is(perr, errSchema) {
		return nil, fmt.Errorf("checkpoint: %s: %w", path, perr)
	}
	if perr != nil {
		if _, err := io.Copy(io.Discard, r); err != nil {
			return nil, fmt.Errorf("checkpoint: %s: %w", path, err)
		}
	}
	if got := hex.EncodeToString(h.Sum(nil)); !strings.EqualFold(got, want.SHA256) {
		return nil, checksumError(path, got, want)
	}
	if perr != nil {
		return nil, fmt.Errorf("checkpoint: %s: %w", path, perr)
	}
	return ts, nil
}

// checkObject reports whether b is one valid JSON object.
func checkObject(b []byte) error {
	if !json.Valid(b) {
		var v any
		err := json.Unmarshal(b, &v)
		return fmt.Errorf("bad JSON: %v", err)
	}
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' {
		return errors.New("bad JSON: want an object")
	}
	return nil
}

// writeSynced creates path, writes it through write while hashing, syncs and
// closes it.
func writeSynced(path string, write func(io.Writer) error) (FileInfo, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return FileInfo{}, err
	}
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	err = write(cw)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return FileInfo{}, err
	}
	return FileInfo{Size: cw.n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// syncDir flushes a directory's entries to disk. File systems that cannot
// sync directories are tolerated.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	d.Close()
	if err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOTSUP) && !errors.Is(err, syscall.EBADF) {
		return fmt.Errorf("syncing directory %s: %w", dir, err)
	}
	return nil
}

// replaceable reports whether dir is a checkpoint or an empty directory.
func replaceable(dir string) (bool, error) {
	if _, err := os.Stat(filepath.Join(dir, ManifestFile)); err == nil {
		return true, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	return len(entries) == 0, nil
}

// removeStaleTemps deletes temporary directories left by interrupted saves
// of the same checkpoint.
func removeStaleTemps(parent, base string) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	prefix := "." + base + ".tmp-"
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), prefix) {
			os.RemoveAll(filepath.Join(parent, e.Name()))
		}
	}
}

func splitPath(p string) (dir, base string) {
	p = filepath.Clean(p)
	return filepath.Dir(p), filepath.Base(p)
}
