package data

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
)

// LoadOptions tune LoadWikiText2With and EncodeFile. The zero value is the
// default: token cache in DefaultTokenCacheDir, all cores, checksum
// mismatches are errors, warnings go to slog.Default.
type LoadOptions struct {
	// CacheDir holds the token cache; "" means DefaultTokenCacheDir.
	CacheDir string
	// NoCache neither reads nor writes the token cache.
	NoCache bool
	// AllowModified accepts a file named like a known split whose SHA-256
	// differs from the official one, logging a warning instead of failing.
	AllowModified bool
	// Workers is the number of encoding goroutines; <= 0 means GOMAXPROCS.
	Workers int
	// Logger receives warnings (cache problems, accepted modified files);
	// nil means slog.Default.
	Logger *slog.Logger
}

func (o LoadOptions) logger() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.Default()
}

// Encoded is a text file turned into the paper's id stream.
type Encoded struct {
	Path      string  // the file encoded
	SHA256    string  // the file's SHA-256, lower-case hex
	Tokenizer string  // the encoder's Name
	Rows      int     // rows kept (non-empty, not all whitespace)
	IDs       []int32 // each row's ids followed by EOS
	Cached    bool    // IDs came from the token cache
}

// LoadWikiText2 returns the id stream of a split ("train", "valid" or
// "test") of the WikiText-2 files in dir (see the package documentation for
// the exact processing), with default options.
func LoadWikiText2(dir, split string, enc TextEncoder) ([]int32, error) {
	e, err := LoadWikiText2With(dir, split, enc, LoadOptions{})
	if err != nil {
		return nil, err
	}
	return e.IDs, nil
}

// LoadWikiText2With is LoadWikiText2 with options, returning the details.
func LoadWikiText2With(dir, split string, enc TextEncoder, opts LoadOptions) (*Encoded, error) {
	p, err := SplitPath(dir, split)
	if err != nil {
		return nil, err
	}
	return EncodeFile(p, enc, opts)
}

// EncodeFile encodes a WikiText-style file: Rows, then EncodeRows. If the
// file's base name is a known WikiText-2 file, its SHA-256 must match the
// official one (see LoadOptions.AllowModified). The result is cached on disk,
// keyed by the file's SHA-256 and enc.Name().
func EncodeFile(path string, enc TextEncoder, opts LoadOptions) (*Encoded, error) {
	if enc == nil {
		return nil, fmt.Errorf("wikitext-2: encoding %s: no tokenizer given", path)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("wikitext-2: cannot read %s: %w", path, err)
	}
	sum := sha256.Sum256(raw)
	hexSum := hex.EncodeToString(sum[:])
	log := opts.logger()
	if spec, ok := KnownFile(filepath.Base(path)); ok && spec.SHA256 != hexSum {
		msg := fmt.Sprintf("%s (%d bytes) has SHA-256 %s, but the official %s (%d bytes) has %s", path, len(raw), hexSum,
			spec.Name, spec.Size, spec.SHA256)
		if !opts.AllowModified {
			return nil, fmt.Errorf("wikitext-2: %s; results on a modified file are not comparable with the paper's "+
				"(a CRLF copy is a common cause): replace it with the official file, or accept it explicitly "+
				"(LoadOptions.AllowModified)", msg)
		}
		log.Warn("wikitext-2: using a modified file", "detail", msg)
	}
	out := &Encoded{Path: path, SHA256: hexSum, Tokenizer: enc.Name()}

	var cacheFile string
	if !opts.NoCache {
		dir := opts.CacheDir
		if dir == "" {
			if dir, err = DefaultTokenCacheDir(); err != nil {
				log.Warn("wikitext-2: no user cache directory; token cache disabled", "err", err)
			}
		}
		if dir != "" {
			cacheFile = cachePath(dir, sum, enc.Name())
		}
	}
	if cacheFile != "" {
		// Each id covers at least one byte of the source or ends a row, so
		// a real cache file is at most about 8 bytes per source byte; a
		// larger one is not read.
		limit := int64(len(cacheMagic)+32+2+len(enc.Name())+16+4) + 4*(2*int64(len(raw))+1)
		b, err := readCacheFile(cacheFile, limit)
		if err == nil {
			var rows int
			var ids []int32
			if rows, ids, err = decodeCache(b, sum, enc.Name()); err == nil {
				out.Rows, out.IDs, out.Cached = rows, ids, true
				return out, nil
			}
		}
		if !errors.Is(err, fs.ErrNotExist) {
			log.Warn("wikitext-2: ignoring the token cache file; re-encoding", "file", cacheFile, "err", err)
		}
	}

	rows := Rows(string(raw))
	out.Rows = len(rows)
	out.IDs = EncodeRows(rows, enc, opts.Workers)
	if cacheFile != "" {
		if err := writeFileAtomic(cacheFile, encodeCache(sum, enc.Name(), out.Rows, out.IDs)); err != nil {
			log.Warn("wikitext-2: cannot write the token cache", "file", cacheFile, "err", err)
		}
	}
	return out, nil
}
