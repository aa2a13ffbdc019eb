package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
)

// ORTVersion is the onnxruntime release scripts/fetch-onnxruntime.sh fetches.
const ORTVersion = "1.30.0"

// LibraryEnv names the environment variable that points at a
// libonnxruntime shared library (any build: CPU, CUDA).
const LibraryEnv = "ORT_LIB"

// CachedLibraryPath is where scripts/fetch-onnxruntime.sh caches the
// library for the architecture this binary runs on:
// ${XDG_CACHE_HOME:-$HOME/.cache}/rpac/onnxruntime-1.30.0-linux-ARCH/libonnxruntime.so.1,
// ARCH being x64 or arm64 (onnxruntime-node's names), one folder each so an
// arm64 binary never finds the x86-64 library.
func CachedLibraryPath() string {
	dir := os.Getenv("XDG_CACHE_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(home, ".cache")
	}
	return filepath.Join(dir, "rpac", "onnxruntime-"+ORTVersion+"-linux-"+ortArch(goruntime.GOARCH), "libonnxruntime.so.1")
}

// ortArch names a Go architecture as onnxruntime-node's folders do
// (bin/napi-v6/linux/{x64,arm64}); others keep Go's name.
func ortArch(goarch string) string {
	if goarch == "amd64" {
		return "x64"
	}
	return goarch
}

// ErrNoLibrary is wrapped by the error LibraryPath returns when no
// onnxruntime library is found.
var ErrNoLibrary = errors.New("onnxruntime library not found")

// LibraryPath finds the onnxruntime shared library: explicit (when not
// empty), then $ORT_LIB, then the cache path of scripts/fetch-onnxruntime.sh.
func LibraryPath(explicit string) (string, error) {
	check := func(path, from string) (string, error) {
		st, err := os.Stat(path)
		if err != nil {
			return "", fmt.Errorf("runtime: %w: %s (%s) does not exist; run scripts/fetch-onnxruntime.sh or point %s at a libonnxruntime.so", ErrNoLibrary, path, from, LibraryEnv)
		}
		if st.IsDir() {
			return "", fmt.Errorf("runtime: %w: %s (%s) is a folder, not a libonnxruntime.so", ErrNoLibrary, path, from)
		}
		return path, nil
	}
	if explicit != "" {
		return check(explicit, "Options.Library")
	}
	if p := os.Getenv(LibraryEnv); p != "" {
		return check(p, "$"+LibraryEnv)
	}
	cached := CachedLibraryPath()
	if cached != "" {
		if _, err := os.Stat(cached); err == nil {
			return cached, nil
		}
	}
	return "", fmt.Errorf("runtime: %w: %s is not set and %s does not exist; run scripts/fetch-onnxruntime.sh (fetches onnxruntime %s, CPU) or set %s to a libonnxruntime.so", ErrNoLibrary, LibraryEnv, cached, ORTVersion, LibraryEnv)
}

// ErrNoCgo is returned by Open in a binary built without cgo.
var ErrNoCgo = errors.New("runtime: this binary was built without cgo (CGO_ENABLED=0), and onnxruntime needs cgo; rebuild with CGO_ENABLED=1 and a C compiler to run exported models")

// Available reports whether Open can load onnxruntime: nil when this binary
// has cgo and LibraryPath("") finds a library, else the error saying why
// not (ErrNoCgo, or one wrapping ErrNoLibrary).
func Available() error {
	if !cgoEnabled {
		return ErrNoCgo
	}
	_, err := LibraryPath("")
	return err
}
