package data

import (
	"archive/zip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rpac-dev/rpac/internal/logging"
)

// EnvDataDir names the environment variable consulted by Locate after the
// explicit directory.
const EnvDataDir = "RPAC_DATA"

// DefaultDataCacheDir returns os.UserCacheDir()/rpac/wikitext-2-raw-v1.
func DefaultDataCacheDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(base, "rpac", DatasetName), nil
}

// Locator finds (and if need be downloads) the WikiText-2 data directory.
// The zero value behaves like Locate("") without progress output.
type Locator struct {
	// DataDir is an explicit directory (the CLI's --data-dir); "" if none.
	DataDir string
	// Getenv reads the environment; nil means os.Getenv.
	Getenv func(string) string
	// CacheDir is where downloads go and are looked for; "" means
	// DefaultDataCacheDir.
	CacheDir string
	// BaseURL is the directory URL of the archive; "" means DefaultBaseURL.
	BaseURL string
	// Archive describes what is downloaded; nil means &WikiText2Raw.
	Archive *ArchiveSpec
	// Client performs the download; nil means a client with a 10-minute
	// overall timeout.
	Client *http.Client
	// NoDownload makes Locate fail instead of downloading.
	NoDownload bool
	// Log receives the download's events (nil: slog.Default()).
	Log *slog.Logger
	// OnProgress, if set, is called as the archive arrives with the bytes
	// received so far and the expected total.
	OnProgress func(done, total int64)
}

// Locate returns the WikiText-2 data directory, trying in order: dataDir (the
// --data-dir value) if not empty, then $RPAC_DATA if set, then the user cache
// directory if it holds all three splits, and finally a download of the
// official archive into the user cache (its events go to slog.Default()). An
// explicit directory or $RPAC_DATA that is missing, unreadable or holds no
// split file is an error; Locate does not fall through past it.
func Locate(dataDir string) (string, error) {
	l := Locator{DataDir: dataDir}
	return l.Locate(context.Background())
}

// Locate is the package-level Locate with the Locator's settings.
func (l *Locator) Locate(ctx context.Context) (string, error) {
	if l.DataDir != "" {
		if err := checkDataDir(l.DataDir); err != nil {
			return "", fmt.Errorf("--data-dir: %w", err)
		}
		return l.DataDir, nil
	}
	getenv := l.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if d := getenv(EnvDataDir); d != "" {
		if err := checkDataDir(d); err != nil {
			return "", fmt.Errorf("$%s: %w (unset it to use the user cache)", EnvDataDir, err)
		}
		return d, nil
	}
	cache := l.CacheDir
	if cache == "" {
		var err error
		if cache, err = DefaultDataCacheDir(); err != nil {
			return "", fmt.Errorf("wikitext-2: no --data-dir, no $%s, and no user cache directory (%v): "+
				"pass --data-dir with a directory holding wiki.{train,valid,test}.raw", EnvDataDir, err)
		}
	}
	spec := l.archive()
	if hasAll(cache, spec) {
		return cache, nil
	}
	if l.NoDownload {
		return "", fmt.Errorf("wikitext-2: no --data-dir, no $%s, and the user cache %s lacks %s; downloading is off: "+
			"pass --data-dir with a directory holding the files", EnvDataDir, cache, strings.Join(fileNames(spec), ", "))
	}
	if err := l.Download(ctx, cache); err != nil {
		return "", err
	}
	return cache, nil
}

func (l *Locator) archive() *ArchiveSpec {
	if l.Archive != nil {
		return l.Archive
	}
	return &WikiText2Raw
}

func fileNames(spec *ArchiveSpec) []string {
	var names []string
	for _, f := range spec.Files {
		names = append(names, f.Name)
	}
	return names
}

func hasAll(dir string, spec *ArchiveSpec) bool {
	for _, f := range spec.Files {
		fi, err := os.Stat(filepath.Join(dir, f.Name))
		if err != nil || !fi.Mode().IsRegular() {
			return false
		}
	}
	return true
}

// checkDataDir accepts a readable directory holding at least one split file.
func checkDataDir(dir string) error {
	if err := checkDir(dir); err != nil {
		return err
	}
	if len(AvailableSplits(dir)) == 0 {
		return fmt.Errorf("wikitext-2: data directory %s holds none of wiki.train.raw, wiki.valid.raw, wiki.test.raw: "+
			"pass the directory that holds them", dir)
	}
	return nil
}

// Download fetches the archive into a temporary file next to dest, checks
// its size and SHA-256, extracts the spec's files into a staging directory
// checking each one's size and SHA-256, and then moves them into dest (the
// whole directory is renamed into place when dest does not exist yet; each
// file is renamed otherwise). On any failure nothing is left behind and dest
// is untouched.
func (l *Locator) Download(ctx context.Context, dest string) (err error) {
	spec := l.archive()
	base := l.BaseURL
	if base == "" {
		base = DefaultBaseURL
	}
	url := strings.TrimRight(base, "/") + "/" + spec.Name
	parent := filepath.Dir(dest)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("wikitext-2: cannot create %s for the download: %w", parent, err)
	}

	zipFile, err := os.CreateTemp(parent, "."+spec.Name+".part-*")
	if err != nil {
		return fmt.Errorf("wikitext-2: cannot create a temporary file in %s: %w", parent, err)
	}
	defer func() {
		zipFile.Close()
		os.Remove(zipFile.Name())
	}()
	if err := l.fetch(ctx, url, spec, zipFile); err != nil {
		return err
	}

	staging, err := os.MkdirTemp(parent, "."+filepath.Base(dest)+".staging-*")
	if err != nil {
		return fmt.Errorf("wikitext-2: cannot create a staging directory in %s: %w", parent, err)
	}
	defer os.RemoveAll(staging) // empty or gone after a successful move
	if err := extract(zipFile, spec, url, staging); err != nil {
		return err
	}
	if err := os.Rename(staging, dest); err == nil {
		logging.Info(l.log(), DataReadyEvent{Dir: dest})
		return nil
	}
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return fmt.Errorf("wikitext-2: cannot create %s: %w", dest, err)
	}
	for _, f := range spec.Files {
		if err := os.Rename(filepath.Join(staging, f.Name), filepath.Join(dest, f.Name)); err != nil {
			return fmt.Errorf("wikitext-2: cannot move %s into %s: %w", f.Name, dest, err)
		}
	}
	logging.Info(l.log(), DataReadyEvent{Dir: dest})
	return nil
}

func (l *Locator) log() *slog.Logger {
	if l.Log != nil {
		return l.Log
	}
	return slog.Default()
}

// fetch streams url into f, reporting progress, and verifies size and hash.
func (l *Locator) fetch(ctx context.Context, url string, spec *ArchiveSpec, f *os.File) error {
	client := l.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Minute}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("wikitext-2: bad download URL %q: %w", url, err)
	}
	offline := fmt.Sprintf("if this machine is offline, download %s elsewhere, unzip it and pass --data-dir "+
		"(or set $%s) to the directory holding wiki.*.raw", spec.Name, EnvDataDir)
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("wikitext-2: downloading %s: %w; %s", url, err, offline)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("wikitext-2: downloading %s: server answered %s; %s", url, resp.Status, offline)
	}
	if resp.ContentLength >= 0 && resp.ContentLength != spec.Size {
		return fmt.Errorf("wikitext-2: downloading %s: the server announces %d bytes, but the official archive has %d; "+
			"the URL serves a different file: %s", url, resp.ContentLength, spec.Size, offline)
	}
	logging.Info(l.log(), DownloadEvent{URL: url, Bytes: spec.Size})
	h := sha256.New()
	pw := &progressWriter{l: l, total: spec.Size, last: -1}
	// Read at most one byte more than expected, so an oversized body is
	// detected without filling the disk.
	n, err := io.Copy(io.MultiWriter(f, h, pw), io.LimitReader(resp.Body, spec.Size+1))
	if err != nil {
		return fmt.Errorf("wikitext-2: downloading %s: %w after %d bytes; retry, or %s", url, err, n, offline)
	}
	if n != spec.Size {
		return fmt.Errorf("wikitext-2: downloading %s: got %d bytes, the official archive has %d; retry, or %s",
			url, n, spec.Size, offline)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != spec.SHA256 {
		return fmt.Errorf("wikitext-2: checksum mismatch for %s: SHA-256 %s, expected %s; the download is corrupt "+
			"or the server serves a different file: retry, or %s", url, got, spec.SHA256, offline)
	}
	return nil
}

type progressWriter struct {
	l           *Locator
	done, total int64
	last        int64 // last reported tenth
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.done += int64(len(b))
	if p.l.OnProgress != nil {
		p.l.OnProgress(p.done, p.total)
	}
	if p.total > 0 {
		if tenth := p.done * 10 / p.total; tenth > p.last {
			p.last = tenth
			logging.Info(p.l.log(), DownloadProgressEvent{Done: p.done, Total: p.total})
		}
	}
	return len(b), nil
}

// extract copies the spec's files out of the zip in f into dir, verifying
// each one's size and SHA-256.
func extract(f *os.File, spec *ArchiveSpec, url, dir string) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	zr, err := zip.NewReader(f, fi.Size())
	if err != nil {
		return fmt.Errorf("wikitext-2: the archive from %s is not a readable zip: %w", url, err)
	}
	for _, want := range spec.Files {
		var member *zip.File
		for _, zf := range zr.File {
			if zf.Name == want.Member {
				member = zf
				break
			}
		}
		if member == nil {
			return fmt.Errorf("wikitext-2: the archive from %s has no member %s", url, want.Member)
		}
		if err := extractOne(member, want, filepath.Join(dir, want.Name)); err != nil {
			return fmt.Errorf("wikitext-2: extracting %s from %s: %w", want.Member, url, err)
		}
	}
	return nil
}

func extractOne(member *zip.File, want FileSpec, path string) (err error) {
	rc, err := member.Open()
	if err != nil {
		return err
	}
	defer rc.Close()
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), io.LimitReader(rc, want.Size+1))
	if err != nil {
		return err
	}
	if n != want.Size {
		return fmt.Errorf("size %d, expected %d", n, want.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want.SHA256 {
		return fmt.Errorf("checksum mismatch: SHA-256 %s, expected %s", got, want.SHA256)
	}
	return out.Sync()
}
