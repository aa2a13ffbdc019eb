package data

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// writeSplits writes the given split files into a fresh directory.
func writeSplits(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func quietOpts(t *testing.T) (LoadOptions, *bytes.Buffer) {
	var logs bytes.Buffer
	return LoadOptions{CacheDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(&logs, nil))}, &logs
}

func TestLoadWikiText2Errors(t *testing.T) {
	dir := writeSplits(t, map[string]string{"wiki.valid.raw": "x\n", "wiki.test.raw": "y\n"})
	file := filepath.Join(dir, "wiki.valid.raw")
	tests := []struct {
		name  string
		dir   string
		split string
		want  []string // substrings of the error
	}{
		{"unknown split", dir, "validation", []string{`unknown split "validation"`, "train, valid, test"}},
		{"missing split file", dir, "train", []string{"wiki.train.raw", "splits available there: valid, test"}},
		{"missing dir", filepath.Join(dir, "nope"), "valid", []string{"does not exist"}},
		{"dir is a file", file, "valid", []string{"is a file, not a directory"}},
		{"empty dir path", "", "valid", []string{"empty data directory"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts, _ := quietOpts(t)
			_, err := LoadWikiText2With(tc.dir, tc.split, byteEncoder{}, opts)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	empty := t.TempDir()
	if _, err := SplitPath(empty, "valid"); err == nil || !strings.Contains(err.Error(), "splits available there: none") {
		t.Errorf("empty dir: %v", err)
	}
}

func TestLoadWikiText2Checksum(t *testing.T) {
	// A file named like a known split but with other content.
	dir := writeSplits(t, map[string]string{"wiki.valid.raw": " \n = A = \n b c \n"})
	opts, logs := quietOpts(t)
	_, err := LoadWikiText2With(dir, "valid", byteEncoder{}, opts)
	if err == nil || !strings.Contains(err.Error(), "4cd0f6876d07a413") || !strings.Contains(err.Error(), "AllowModified") {
		t.Fatalf("modified file: error %v, want a checksum mismatch naming the expected SHA-256", err)
	}
	opts.AllowModified = true
	e, err := LoadWikiText2With(dir, "valid", byteEncoder{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "modified file") {
		t.Errorf("no warning logged: %q", logs.String())
	}
	want := append(byteEncoder{}.Encode(" = A = \n"), 256)
	want = append(want, append(byteEncoder{}.Encode(" b c \n"), 256)...)
	if e.Rows != 2 || !slices.Equal(e.IDs, want) {
		t.Fatalf("rows %d ids %v, want 2 rows %v", e.Rows, e.IDs, want)
	}
	// Files with other names are not checked.
	p := filepath.Join(t.TempDir(), "mine.raw")
	os.WriteFile(p, []byte("z\n"), 0o644)
	if _, err := EncodeFile(p, byteEncoder{}, LoadOptions{NoCache: true}); err != nil {
		t.Fatal(err)
	}
}

func TestTokenCache(t *testing.T) {
	src, err := os.ReadFile(testDataFile(t, "tiny_wikitext.raw"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tiny.raw")
	os.WriteFile(path, src, 0o644)
	tok := NewTokenizer()
	opts, logs := quietOpts(t)

	first, err := EncodeFile(path, tok, opts)
	if err != nil {
		t.Fatal(err)
	}
	if first.Cached || first.Rows != 5 || first.Tokenizer != "gpt2-r50k" {
		t.Fatalf("first load: cached %v rows %d tokenizer %q", first.Cached, first.Rows, first.Tokenizer)
	}
	if got := tok.Decode(first.IDs); got != strings.Join(Rows(string(src)), "<|endoftext|>")+"<|endoftext|>" {
		t.Fatalf("decoded stream = %q", got)
	}
	files, _ := filepath.Glob(filepath.Join(opts.CacheDir, "*.ids"))
	if len(files) != 1 || !strings.Contains(filepath.Base(files[0]), first.SHA256+".gpt2-r50k") {
		t.Fatalf("cache files %v", files)
	}
	second, err := EncodeFile(path, tok, opts)
	if err != nil || !second.Cached || second.Rows != first.Rows || !slices.Equal(second.IDs, first.IDs) {
		t.Fatalf("second load: err %v cached %v", err, second.Cached)
	}
	// Another tokenizer name is another cache entry.
	third, err := EncodeFile(path, byteEncoder{}, opts)
	if err != nil || third.Cached {
		t.Fatalf("byte encoder: err %v cached %v", err, third.Cached)
	}

	good, _ := os.ReadFile(files[0])
	corruptions := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"truncated", good[:len(good)/2]},
		{"flipped id byte", func() []byte { b := slices.Clone(good); b[len(b)-8] ^= 1; return b }()},
		{"bad magic", func() []byte { b := slices.Clone(good); b[0] = 'X'; return b }()},
		{"garbage", bytes.Repeat([]byte{0xAB}, len(good))},
	}
	for _, c := range corruptions {
		t.Run(c.name, func(t *testing.T) {
			logs.Reset()
			os.WriteFile(files[0], c.data, 0o644)
			e, err := EncodeFile(path, tok, opts)
			if err != nil {
				t.Fatal(err)
			}
			if e.Cached || !slices.Equal(e.IDs, first.IDs) {
				t.Fatalf("corrupt cache used: cached %v", e.Cached)
			}
			if !strings.Contains(logs.String(), "ignoring the token cache") {
				t.Errorf("no warning: %q", logs.String())
			}
			// and it was rewritten
			if b, _ := os.ReadFile(files[0]); !bytes.Equal(b, good) {
				t.Errorf("cache file not rewritten")
			}
		})
	}
	// A cache file larger than its source can give is ignored unread (a
	// sparse 4 GiB file here), then rewritten.
	t.Run("oversized", func(t *testing.T) {
		logs.Reset()
		os.WriteFile(files[0], good, 0o644)
		if err := os.Truncate(files[0], 4<<30); err != nil {
			t.Skip(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		e, err := EncodeFile(path, tok, opts)
		runtime.ReadMemStats(&after)
		if err != nil || e.Cached || !slices.Equal(e.IDs, first.IDs) {
			t.Fatalf("err %v cached %v", err, e != nil && e.Cached)
		}
		if a := after.TotalAlloc - before.TotalAlloc; a > 64<<20 {
			t.Fatalf("the oversized cache file was read: %d MiB allocated", a>>20)
		}
		if !strings.Contains(logs.String(), "ignoring the token cache") {
			t.Errorf("no warning: %q", logs.String())
		}
		if b, _ := os.ReadFile(files[0]); !bytes.Equal(b, good) {
			t.Errorf("cache file not rewritten")
		}
	})
	// No temporary files are left behind.
	all, _ := os.ReadDir(opts.CacheDir)
	for _, f := range all {
		if strings.HasPrefix(f.Name(), ".") {
			t.Errorf("left over %s", f.Name())
		}
	}
}

func TestDecodeCacheRejects(t *testing.T) {
	var sum, other [32]byte
	other[0] = 1
	ids := []int32{1, 2, 50256}
	b := encodeCache(sum, "tok", 1, ids)
	if r, got, err := decodeCache(b, sum, "tok"); err != nil || r != 1 || !slices.Equal(got, ids) {
		t.Fatalf("round trip: %v %v %v", r, got, err)
	}
	if _, _, err := decodeCache(b, other, "tok"); !errors.Is(err, errBadCache) {
		t.Errorf("other source accepted: %v", err)
	}
	if _, _, err := decodeCache(b, sum, "tok2"); !errors.Is(err, errBadCache) {
		t.Errorf("other tokenizer accepted: %v", err)
	}
}

// wikiDataDir returns the directory of the real WikiText-2 files: $RPAC_DATA
// if it holds them, else the workplace's shared copy. Without them the test
// fails when CI=true and is skipped otherwise.
func wikiDataDir(t *testing.T, files ...string) string {
	t.Helper()
	candidates := []string{filepath.Join("..", "..", "..", "shared", "data", "wikitext-2-raw-v1")}
	if d := os.Getenv(EnvDataDir); d != "" {
		candidates = append([]string{d}, candidates...)
	}
	var missing error
	for _, dir := range candidates {
		missing = nil
		for _, f := range files {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				missing = err
				break
			}
		}
		if missing == nil {
			return dir
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true but the WikiText-2 files %v are missing (%v; looked in %v): set $%s to the directory holding them",
			files, missing, candidates, EnvDataDir)
	}
	t.Skipf("WikiText-2 files %v not available (%v); set $%s to run this test", files, missing, EnvDataDir)
	return ""
}

// TestWikiText2Figures checks the paper loader's figures on the real files.
func TestWikiText2Figures(t *testing.T) {
	dir := wikiDataDir(t, "wiki.valid.raw", "wiki.test.raw")
	t.Setenv("XDG_CACHE_HOME", t.TempDir()) // LoadWikiText2's default cache
	tok := NewTokenizer()
	tests := []struct {
		split     string
		rows, ids int
		firstRow  string
	}{
		{"valid", 2461, 249750, " = Homarus gammarus = \n"},
		{"test", 2891, 286178, " = Robert Boulter = \n"},
	}
	for _, tc := range tests {
		t.Run(tc.split, func(t *testing.T) {
			opts, _ := quietOpts(t)
			t0 := time.Now()
			cold, err := LoadWikiText2With(dir, tc.split, tok, opts)
			if err != nil {
				t.Fatal(err)
			}
			coldTime := time.Since(t0)
			t0 = time.Now()
			warm, err := LoadWikiText2With(dir, tc.split, tok, opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d rows, %d ids; encode %v, cached %v", tc.split, cold.Rows, len(cold.IDs), coldTime, time.Since(t0))
			if cold.Rows != tc.rows || len(cold.IDs) != tc.ids {
				t.Errorf("%s: %d rows and %d ids, want %d and %d", tc.split, cold.Rows, len(cold.IDs), tc.rows, tc.ids)
			}
			if !warm.Cached || !slices.Equal(warm.IDs, cold.IDs) || warm.Rows != cold.Rows {
				t.Errorf("cached load differs (cached=%v)", warm.Cached)
			}
			// The stream starts with the first row, its " \n" (220, 198) and EOS.
			first := slices.Index(cold.IDs, GPT2EOS)
			if first < 2 || tok.Decode(cold.IDs[:first]) != tc.firstRow || !slices.Equal(cold.IDs[first-2:first], []int32{220, 198}) {
				t.Errorf("stream starts %v (%q), want the row %q", cold.IDs[:max(first, 0)], tok.Decode(cold.IDs[:max(first, 0)]), tc.firstRow)
			}
			n := 0
			for _, id := range cold.IDs {
				if id < 0 || id >= GPT2VocabSize {
					t.Fatalf("id %d out of range", id)
				}
				if id == GPT2EOS {
					n++
				}
			}
			if n != tc.rows {
				t.Errorf("%d EOS for %d rows", n, tc.rows)
			}
			ids, err := LoadWikiText2(dir, tc.split, tok)
			if err != nil || !slices.Equal(ids, cold.IDs) {
				t.Errorf("LoadWikiText2 differs: %v", err)
			}
		})
	}
}

// TestWikiText2ExactMatchesCodec runs Encode (the package's own
// pre-tokenizer and merge) over every row of the real validation and test
// files, and over each whole file, and compares with the codec.
func TestWikiText2ExactMatchesCodec(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	dir := wikiDataDir(t, "wiki.valid.raw")
	tok := NewTokenizer()
	for _, name := range []string{"wiki.valid.raw", "wiki.test.raw"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range append(Rows(string(b)), string(b)) {
			want, _ := tok.encode(row)
			if got := tok.Encode(row); !slices.Equal(got, want) {
				t.Fatalf("%s: row %.200q: Encode %v, codec %v", name, row, got, want)
			}
		}
	}
}
