// Package fileio holds the file handling that several packages share:
// replacing a file atomically and reading a file of bounded size.
package fileio

import (
	"io"
	"io/fs"
	"os"
)

// Replace finishes tmp, a temporary file created in the directory of path:
// fill writes it, then it is synced, closed and renamed over path, so that
// readers see either the old file or the complete new one. On any error tmp
// is closed and removed, and the first error is returned as it is.
func Replace(tmp *os.File, path string, fill func(*os.File) error) error {
	err := fill(tmp)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// ReadBounded reads the file at path, at most limit bytes, once check has
// accepted what its Stat says (a size over limit, say, is check's to
// refuse). Errors of the file system come as they are.
func ReadBounded(path string, limit int64, check func(fs.FileInfo) error) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := check(st); err != nil {
		return nil, err
	}
	return io.ReadAll(io.LimitReader(f, limit))
}
