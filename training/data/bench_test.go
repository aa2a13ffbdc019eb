package data

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkEncodeWikiText2Test measures encoding wiki.test.raw without the
// token cache (rows split, BPE on all cores).
func BenchmarkEncodeWikiText2Test(b *testing.B) {
	dir := os.Getenv(EnvDataDir)
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "shared", "data", "wikitext-2-raw-v1")
	}
	p := filepath.Join(dir, "wiki.test.raw")
	if _, err := os.Stat(p); err != nil {
		b.Skip(err)
	}
	tok := NewTokenizer()
	for b.Loop() {
		if _, err := EncodeFile(p, tok, LoadOptions{NoCache: true}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoadWikiText2TestCached measures a load served by the token cache.
func BenchmarkLoadWikiText2TestCached(b *testing.B) {
	dir := os.Getenv(EnvDataDir)
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "shared", "data", "wikitext-2-raw-v1")
	}
	if _, err := os.Stat(filepath.Join(dir, "wiki.test.raw")); err != nil {
		b.Skip(err)
	}
	tok := NewTokenizer()
	opts := LoadOptions{CacheDir: b.TempDir()}
	if _, err := LoadWikiText2With(dir, "test", tok, opts); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		e, err := LoadWikiText2With(dir, "test", tok, opts)
		if err != nil || !e.Cached {
			b.Fatal("not cached", err)
		}
	}
}

func BenchmarkTrainBatch(b *testing.B) {
	s, _ := Synthetic(1, 1<<20, SyntheticConfig{})
	tb, _ := NewTrainBatcher(s.IDs, 256, 8192, 1)
	var bt Batch
	for b.Loop() {
		tb.NextInto(&bt)
	}
}
