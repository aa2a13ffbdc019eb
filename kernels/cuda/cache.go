package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
)

// CacheDir is where compiled PTX is kept: $RPAC_CUDA_CACHE, else
// ${XDG_CACHE_HOME:-~/.cache}/rpac/cuda.
func CacheDir() string {
	if d := os.Getenv("RPAC_CUDA_CACHE"); d != "" {
		return d
	}
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	return filepath.Join(base, "rpac", "cuda")
}

// CompileCached returns the PTX of kernel source name for arch, from the
// on-disk cache when the same source was compiled before by the same NVRTC
// version, else compiling it and storing the result (atomically). hit says
// which.
func (n *NVRTC) CompileCached(name, arch string) (ptx string, hit bool, err error) {
	src, err := Source(name)
	if err != nil {
		return "", false, err
	}
	major, minor := n.Version()
	sum := sha256.Sum256([]byte(src))
	dir := filepath.Join(CacheDir(), fmt.Sprintf("nvrtc-%d.%d", major, minor), arch)
	path := filepath.Join(dir, hex.EncodeToString(sum[:16])+".ptx")
	if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
		return string(b), true, nil
	}
	ptx, err = n.CompilePTX(name, src, arch)
	if err != nil {
		return "", false, err
	}
	if err := writeAtomic(dir, path, []byte(ptx)); err != nil {
		return ptx, false, nil // a read-only cache only costs the next compile
	}
	return ptx, false, nil
}

func writeAtomic(dir, path string, b []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".ptx-*")
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	return os.Rename(f.Name(), path)
}

// LoadKernels compiles (or reads from the cache) every kernel source for
// the context's device and loads it.
func (c *Context) LoadKernels(n *NVRTC) error {
	for _, name := range SourceNames() {
		ptx, _, err := n.CompileCached(name, c.Dev.Arch)
		if err != nil {
			return err
		}
		entries, err := Entries(name)
		if err != nil {
			return err
		}
		if err := c.LoadPTX(ptx, entries); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}
