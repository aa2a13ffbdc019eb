package data

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rpac-dev/rpac/internal/logging"
)

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// testArchive builds a small zip laid out like the official one and the spec
// describing it.
func testArchive(t *testing.T) ([]byte, *ArchiveSpec, map[string]string) {
	t.Helper()
	contents := map[string]string{
		"wiki.train.raw": " \n = Train = \n the train text . \n",
		"wiki.valid.raw": " \n = Valid = \n the valid text . \n",
		"wiki.test.raw":  " \n = Test = \n the test text . \n",
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	spec := &ArchiveSpec{Name: "tiny-wikitext.zip"}
	for _, name := range []string{"wiki.train.raw", "wiki.valid.raw", "wiki.test.raw"} {
		w, err := zw.Create("wikitext-2-raw/" + name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(contents[name]))
		spec.Files = append(spec.Files, FileSpec{Name: name, Member: "wikitext-2-raw/" + name,
			Size: int64(len(contents[name])), SHA256: sha([]byte(contents[name]))})
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	spec.Size, spec.SHA256 = int64(buf.Len()), sha(buf.Bytes())
	return buf.Bytes(), spec, contents
}

// serve serves body at /<name> and counts requests.
func serve(t *testing.T, name string, body []byte) (*httptest.Server, *atomic.Int32) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path != "/"+name {
			http.NotFound(w, r)
			return
		}
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func noEnv(string) string { return "" }

// assertEmpty fails if dir holds anything.
func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left behind in %s: %s", dir, e.Name())
	}
}

func TestLocateDownload(t *testing.T) {
	body, spec, contents := testArchive(t)
	srv, hits := serve(t, spec.Name, body)
	parent := t.TempDir()
	cache := filepath.Join(parent, "wikitext-2-raw-v1")
	var progress bytes.Buffer
	var lastDone, lastTotal int64
	l := Locator{Getenv: noEnv, CacheDir: cache, BaseURL: srv.URL + "/", Archive: spec, Log: logging.New(&progress, logging.Text, nil),
		OnProgress: func(done, total int64) { lastDone, lastTotal = done, total }}
	dir, err := l.Locate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if dir != cache {
		t.Fatalf("Locate = %s, want %s", dir, cache)
	}
	for name, want := range contents {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != want {
			t.Errorf("%s: %q, %v", name, got, err)
		}
	}
	if lastDone != spec.Size || lastTotal != spec.Size {
		t.Errorf("progress callback ended at %d/%d, want %d", lastDone, lastTotal, spec.Size)
	}
	if !strings.Contains(progress.String(), "wikitext-2: downloading") || strings.Count(progress.String(), "(100%)") != 1 ||
		!strings.HasSuffix(progress.String(), "wikitext-2: files ready in "+cache+"\n") {
		t.Errorf("progress lines: %q", progress.String())
	}
	// Only the cache directory remains next to it: no temporary files.
	entries, _ := os.ReadDir(parent)
	if len(entries) != 1 {
		t.Errorf("parent holds %d entries, want only the cache dir", len(entries))
	}
	// A second Locate finds the cache and does not download.
	if _, err := l.Locate(context.Background()); err != nil || hits.Load() != 1 {
		t.Errorf("second Locate: %v, %d requests", err, hits.Load())
	}
	// The files load (they are not the official ones, so allow that).
	ids, err := LoadWikiText2With(dir, "train", byteEncoder{}, LoadOptions{NoCache: true, AllowModified: true,
		Logger: discardLogger()})
	if err != nil || len(ids.IDs) == 0 {
		t.Fatalf("loading the downloaded split: %v", err)
	}
}

func TestDownloadIntoPartialCache(t *testing.T) {
	body, spec, contents := testArchive(t)
	srv, _ := serve(t, spec.Name, body)
	cache := t.TempDir() // exists, holds a stale valid file and an unrelated one
	os.WriteFile(filepath.Join(cache, "wiki.valid.raw"), []byte("stale\n"), 0o644)
	os.WriteFile(filepath.Join(cache, "notes.txt"), []byte("keep me"), 0o644)
	l := Locator{Getenv: noEnv, CacheDir: cache, BaseURL: srv.URL, Archive: spec}
	if _, err := l.Locate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(cache, "wiki.valid.raw")); string(b) != contents["wiki.valid.raw"] {
		t.Errorf("stale file not replaced: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(cache, "notes.txt")); string(b) != "keep me" {
		t.Errorf("unrelated file touched")
	}
}

func TestDownloadRejects(t *testing.T) {
	body, spec, _ := testArchive(t)

	wrongArchiveHash := *spec
	wrongArchiveHash.SHA256 = strings.Repeat("0", 64)

	wrongMember := *spec
	wrongMember.Files = append([]FileSpec(nil), spec.Files...)
	wrongMember.Files[2].SHA256 = strings.Repeat("1", 64)

	wrongSize := *spec
	wrongSize.Size++

	missingMember := *spec
	missingMember.Files = append([]FileSpec(nil), spec.Files...)
	missingMember.Files[0].Member = "wikitext-2-raw/absent.raw"

	tests := []struct {
		name string
		spec *ArchiveSpec
		path string // served name; "" = spec.Name
		want []string
	}{
		{"archive checksum", &wrongArchiveHash, "", []string{"checksum mismatch", strings.Repeat("0", 64), "--data-dir"}},
		{"member checksum", &wrongMember, "", []string{"wiki.test.raw", "checksum mismatch"}},
		{"size", &wrongSize, "", []string{"announces", "different file"}},
		{"missing member", &missingMember, "", []string{"no member wikitext-2-raw/absent.raw"}},
		{"not found", spec, "other.zip", []string{"404", "--data-dir"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := tc.path
			if name == "" {
				name = tc.spec.Name
			}
			srv, _ := serve(t, name, body)
			parent := t.TempDir()
			cache := filepath.Join(parent, "wikitext-2-raw-v1")
			l := Locator{Getenv: noEnv, CacheDir: cache, BaseURL: srv.URL, Archive: tc.spec}
			_, err := l.Locate(context.Background())
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			assertEmpty(t, parent)
		})
	}
}

func TestDownloadTruncatedBody(t *testing.T) {
	body, spec, _ := testArchive(t)
	// No Content-Length, body cut short.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Transfer-Encoding", "chunked")
		w.Write(body[:len(body)/2])
		w.(http.Flusher).Flush()
	}))
	defer srv.Close()
	parent := t.TempDir()
	l := Locator{Getenv: noEnv, CacheDir: filepath.Join(parent, "c"), BaseURL: srv.URL, Archive: spec}
	_, err := l.Locate(context.Background())
	if err == nil || !strings.Contains(err.Error(), "bytes, the official archive has") {
		t.Fatalf("error %v", err)
	}
	assertEmpty(t, parent)
}

func TestLocateOrder(t *testing.T) {
	withFiles := writeSplits(t, map[string]string{"wiki.valid.raw": "v\n"})
	other := writeSplits(t, map[string]string{"wiki.test.raw": "t\n"})
	noSplits := t.TempDir()
	fullCache := writeSplits(t, map[string]string{"wiki.train.raw": "a\n", "wiki.valid.raw": "b\n", "wiki.test.raw": "c\n"})
	file := filepath.Join(withFiles, "wiki.valid.raw")
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == EnvDataDir {
				return v
			}
			return ""
		}
	}
	tests := []struct {
		name    string
		l       Locator
		want    string
		wantErr []string
	}{
		{"explicit wins over env", Locator{DataDir: withFiles, Getenv: env(other), NoDownload: true}, withFiles, nil},
		{"env when no explicit", Locator{Getenv: env(other), CacheDir: fullCache, NoDownload: true}, other, nil},
		{"cache when neither", Locator{Getenv: noEnv, CacheDir: fullCache, NoDownload: true}, fullCache, nil},
		{"explicit missing", Locator{DataDir: filepath.Join(withFiles, "nope"), Getenv: env(other)}, "",
			[]string{"--data-dir", "does not exist"}},
		{"explicit is a file", Locator{DataDir: file}, "", []string{"--data-dir", "is a file"}},
		{"explicit without splits", Locator{DataDir: noSplits}, "", []string{"--data-dir", "holds none of"}},
		{"env missing", Locator{Getenv: env(filepath.Join(other, "nope"))}, "", []string{"$RPAC_DATA", "does not exist"}},
		{"partial cache, no download", Locator{Getenv: noEnv, CacheDir: other, NoDownload: true}, "",
			[]string{"lacks wiki.train.raw", "downloading is off"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.l.Locate(context.Background())
			if tc.wantErr == nil {
				if err != nil || got != tc.want {
					t.Fatalf("Locate = %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Locate = %q, want an error", got)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestLocateUnreadableDir(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("permissions do not apply to root")
	}
	dir := writeSplits(t, map[string]string{"wiki.valid.raw": "v\n"})
	os.Chmod(dir, 0o000)
	defer os.Chmod(dir, 0o755)
	_, err := Locate(dir)
	if err == nil || !strings.Contains(err.Error(), "permissions") {
		t.Fatalf("error %v", err)
	}
}

func TestLocateFunc(t *testing.T) {
	dir := writeSplits(t, map[string]string{"wiki.test.raw": "t\n"})
	if got, err := Locate(dir); err != nil || got != dir {
		t.Fatalf("Locate(%q) = %q, %v", dir, got, err)
	}
}

func TestKnownFiles(t *testing.T) {
	for _, s := range Splits {
		name, err := SplitFileName(s)
		if err != nil {
			t.Fatal(err)
		}
		f, ok := KnownFile(name)
		if !ok || len(f.SHA256) != 64 || f.Size <= 0 || f.Member != "wikitext-2-raw/"+name {
			t.Errorf("%s: %+v", name, f)
		}
	}
	if _, ok := KnownFile("wiki.train.tokens"); ok {
		t.Error("unexpected known file")
	}
	// The shared copies match the compiled-in checksums and the SHA256SUMS file.
	dir := wikiDataDir(t, "wiki.valid.raw", "wiki.test.raw")
	sums, _ := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	for _, name := range []string{"wiki.valid.raw", "wiki.test.raw"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		f, _ := KnownFile(name)
		if sha(b) != f.SHA256 || int64(len(b)) != f.Size {
			t.Errorf("%s: sha %s size %d, compiled-in %s %d", name, sha(b), len(b), f.SHA256, f.Size)
		}
		if len(sums) > 0 && !strings.Contains(string(sums), f.SHA256+"  "+name) {
			t.Errorf("SHA256SUMS lacks %s %s", f.SHA256, name)
		}
	}
}
