package fileio

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestReplace: a filled temporary file replaces the target; a fill that
// fails leaves the old file and no temporary file, and its error comes
// back as it is.
func TestReplace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	write := func(s string, fail error) error {
		tmp, err := os.CreateTemp(dir, ".f.tmp-*")
		if err != nil {
			t.Fatal(err)
		}
		return Replace(tmp, path, func(f *os.File) error {
			if _, err := f.WriteString(s); err != nil {
				return err
			}
			return fail
		})
	}
	if err := write("new", nil); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := write("half", boom); err != boom {
		t.Fatalf("error %v, want %v", err, boom)
	}
	if b, _ := os.ReadFile(path); string(b) != "new" {
		t.Fatalf("file holds %q, want %q", b, "new")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("%d entries in the directory, want the file alone", len(ents))
	}
}

// TestReadBounded: check sees the file's Stat and may refuse it; the read
// stops at limit.
func TestReadBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	accept := func(fs.FileInfo) error { return nil }
	if b, err := ReadBounded(path, 4, accept); err != nil || string(b) != "0123" {
		t.Fatalf("read %q, %v; want %q", b, err, "0123")
	}
	refused := errors.New("too large")
	_, err := ReadBounded(path, 100, func(st fs.FileInfo) error {
		if st.Size() != 10 {
			t.Errorf("check saw size %d, want 10", st.Size())
		}
		return refused
	})
	if err != refused {
		t.Fatalf("error %v, want %v", err, refused)
	}
	if _, err := ReadBounded(filepath.Join(t.TempDir(), "none"), 1, accept); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}
