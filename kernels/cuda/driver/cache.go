package driver

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// CacheDir is where compiled kernels are kept: $RPAC_CUDA_CACHE, else
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

// Image is one kernel source compiled by NVRTC: a cubin for a real
// architecture (sm_NN) or PTX for a virtual one (compute_NN).
type Image struct {
	Kind string // "cubin" or "ptx"
	Arch string // sm_NN or compute_NN
	Data []byte
}

// imageKind is the kind of image NVRTC makes for arch.
func imageKind(arch string) (string, error) {
	switch {
	case strings.HasPrefix(arch, "sm_"):
		return "cubin", nil
	case strings.HasPrefix(arch, "compute_"):
		return "ptx", nil
	}
	return "", fmt.Errorf("architecture %q: want sm_NN (cubin) or compute_NN (PTX)", arch)
}

// CachePath is where the image of source src for arch lives in the cache:
// CacheDir()/nvrtc-MAJOR.MINOR/ARCH/HASH.{cubin,ptx}, HASH covering the
// source and NVRTC's options. The NVRTC version, the architecture and the
// kind (which the architecture implies) all key it, so a cubin and PTX, or
// the images of two NVRTC versions, never stand in for one another.
func (n *NVRTC) CachePath(src, arch string) (string, error) {
	kind, err := imageKind(arch)
	if err != nil {
		return "", err
	}
	major, minor := n.Version()
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", kind, strings.Join(compileOptions(arch), "\x00"))
	h.Write([]byte(src))
	sum := h.Sum(nil)
	return filepath.Join(CacheDir(), fmt.Sprintf("nvrtc-%d.%d", major, minor), arch, hex.EncodeToString(sum[:16])+"."+kind), nil
}

// CompileCached returns the image of kernel source name (text src) for
// arch (a cubin for sm_NN, PTX for compute_NN), from the on-disk cache
// when the same source was compiled before for arch by the same NVRTC
// version, else compiling it and storing the result (atomically). hit
// says which.
func (n *NVRTC) CompileCached(name, src, arch string) (img Image, hit bool, err error) {
	kind, err := imageKind(arch)
	if err != nil {
		return Image{}, false, err
	}
	path, err := n.CachePath(src, arch)
	if err != nil {
		return Image{}, false, err
	}
	img = Image{Kind: kind, Arch: arch}
	if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
		img.Data = b
		return img, true, nil
	}
	if kind == "cubin" {
		img.Data, err = n.CompileCUBIN(name, src, arch)
	} else {
		var ptx string
		ptx, err = n.CompilePTX(name, src, arch)
		img.Data = []byte(ptx)
	}
	if err != nil {
		return Image{}, false, err
	}
	// a read-only cache only costs the next compile
	_ = writeAtomic(filepath.Dir(path), path, img.Data)
	return img, false, nil
}

// DeviceImage returns the image of kernel source name (text src) for a
// device: a cubin for its sm_NN, or, when that cannot be had (an NVRTC
// without nvrtcGetCUBIN or that does not know the architecture, or
// RPAC_CUDA_PTX=1), PTX for its compute_NN, which the driver compiles
// itself. cubinErr says why the cubin was not used (nil when it was).
func (n *NVRTC) DeviceImage(name, src string, dev DeviceInfo) (img Image, hit bool, cubinErr, err error) {
	if os.Getenv("RPAC_CUDA_PTX") == "1" {
		cubinErr = fmt.Errorf("RPAC_CUDA_PTX=1")
	} else if dev.SM == "" {
		cubinErr = fmt.Errorf("the device's real architecture is unknown")
	} else {
		img, hit, cubinErr = n.CompileCached(name, src, dev.SM)
		if cubinErr == nil {
			return img, hit, nil, nil
		}
	}
	img, hit, err = n.CompileCached(name, src, dev.Arch)
	return img, hit, cubinErr, err
}

func writeAtomic(dir, path string, b []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".img-*")
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

// LoadedImage says how one kernel source was loaded into a context.
type LoadedImage struct {
	Source string `json:"source"`
	Kind   string `json:"kind"` // "cubin" or "ptx"
	Arch   string `json:"arch"` // sm_NN or compute_NN
	Cached bool   `json:"cached"`
	// Fallback says why PTX was loaded instead of a cubin ("" for a cubin).
	Fallback string `json:"fallback,omitempty"`
}

func (l LoadedImage) String() string {
	s := l.Kind + " " + l.Arch
	if l.Cached {
		s += ", cached"
	}
	if l.Fallback != "" {
		s += "; cubin not used: " + firstLine(l.Fallback)
	}
	return s
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// Source is one kernel source: its name, its complete translation unit
// and the kernels it defines.
type Source struct {
	Name    string
	Text    string
	Entries []string
}

// LoadKernels compiles (or reads from the cache) every kernel source for
// the context's device, a cubin for its sm_NN with PTX as the fallback
// (also when the driver refuses the cubin), and loads it. c.Images says
// what was loaded.
func (c *Context) LoadKernels(n *NVRTC, srcs []Source) error {
	c.Images = c.Images[:0]
	for _, s := range srcs {
		li, err := c.LoadSource(n, s.Name, s.Text, s.Entries)
		if err != nil {
			return err
		}
		c.Images = append(c.Images, li)
	}
	return nil
}

// LoadSource compiles src (or reads it from the cache) for the context's
// device, a cubin for its sm_NN with PTX as the fallback (also when the
// driver refuses the cubin), loads it and registers its kernels.
func (c *Context) LoadSource(n *NVRTC, name, src string, kernels []string) (LoadedImage, error) {
	img, hit, cubinErr, err := n.DeviceImage(name, src, c.Dev)
	if err != nil {
		if cubinErr != nil {
			return LoadedImage{}, fmt.Errorf("%w (the cubin for %s failed first: %v)", err, c.Dev.SM, cubinErr)
		}
		return LoadedImage{}, err
	}
	err = c.LoadImage(img.Data, kernels)
	if err != nil && img.Kind == "cubin" {
		cubinErr = fmt.Errorf("the driver refused the cubin: %w", err)
		img, hit, err = n.CompileCached(name, src, c.Dev.Arch)
		if err == nil {
			err = c.LoadImage(img.Data, kernels)
		}
	}
	if err != nil {
		return LoadedImage{}, fmt.Errorf("%s (%s %s): %w", name, img.Kind, img.Arch, err)
	}
	li := LoadedImage{Source: name, Kind: img.Kind, Arch: img.Arch, Cached: hit}
	if cubinErr != nil {
		li.Fallback = cubinErr.Error()
	}
	return li, nil
}

// Loaded says whether every one of kernels is loaded.
func (c *Context) Loaded(kernels []string) bool {
	c.lock.Lock()
	defer c.lock.Unlock()
	for _, k := range kernels {
		if _, ok := c.fns[k]; !ok {
			return false
		}
	}
	return true
}
