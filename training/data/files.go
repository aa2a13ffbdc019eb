package data

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The WikiText-2 splits.
const (
	SplitTrain = "train"
	SplitValid = "valid"
	SplitTest  = "test"
)

// Splits lists the split names in their canonical order.
var Splits = []string{SplitTrain, SplitValid, SplitTest}

// The official WikiText-2 (raw, v1) release.
const (
	// DefaultBaseURL serves the official archive. The original location
	// (s3.amazonaws.com/research.metamind.io/wikitext/) no longer answers;
	// this host is the dataset author's, used by the Hugging Face loader.
	DefaultBaseURL = "https://wikitext.smerity.com"
	// ArchiveName is the archive's file name under the base URL.
	ArchiveName = "wikitext-2-raw-v1.zip"
	// ArchiveSize is the archive's size in bytes.
	ArchiveSize = 4_721_645
	// ArchiveSHA256 is the archive's SHA-256.
	ArchiveSHA256 = "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11"
	// DatasetName names the dataset directory in the user cache.
	DatasetName = "wikitext-2-raw-v1"
)

// FileSpec describes one file of the release.
type FileSpec struct {
	Name   string // file name in a data directory, e.g. "wiki.valid.raw"
	Member string // path inside the archive
	Size   int64  // bytes
	SHA256 string // lower-case hex
}

// ArchiveSpec describes a downloadable archive and the files to take from it.
type ArchiveSpec struct {
	Name   string // file name under the base URL
	Size   int64
	SHA256 string
	Files  []FileSpec
}

// WikiText2Raw is the official release: the archive and its three raw splits.
var WikiText2Raw = ArchiveSpec{
	Name:   ArchiveName,
	Size:   ArchiveSize,
	SHA256: ArchiveSHA256,
	Files: []FileSpec{
		{Name: "wiki.train.raw", Member: "wikitext-2-raw/wiki.train.raw", Size: 10_940_747,
			SHA256: "6707892fa3788b5ab9ed78ab5ff37d9fe825f6011a2ad4fcd6a6d467f0e7da57"},
		{Name: "wiki.valid.raw", Member: "wikitext-2-raw/wiki.valid.raw", Size: 1_146_846,
			SHA256: "4cd0f6876d07a413aa911261ff6d363c72d757d47f0fdd6015702014c89cb9c7"},
		{Name: "wiki.test.raw", Member: "wikitext-2-raw/wiki.test.raw", Size: 1_290_590,
			SHA256: "173c87a53759e0201f33e0ccf978e510c2042d7f2cb78229d9a50d79b9e7dd08"},
	},
}

// KnownFile returns the official size and SHA-256 of a WikiText-2 raw file by
// its base name (wiki.train.raw, wiki.valid.raw, wiki.test.raw).
func KnownFile(name string) (FileSpec, bool) {
	for _, f := range WikiText2Raw.Files {
		if f.Name == name {
			return f, true
		}
	}
	return FileSpec{}, false
}

// SplitFileName returns the file name of a split: "wiki.<split>.raw".
func SplitFileName(split string) (string, error) {
	for _, s := range Splits {
		if s == split {
			return "wiki." + split + ".raw", nil
		}
	}
	return "", fmt.Errorf("wikitext-2: unknown split %q: use one of %s", split, strings.Join(Splits, ", "))
}

// AvailableSplits lists the splits whose files are regular files in dir.
func AvailableSplits(dir string) []string {
	var out []string
	for _, s := range Splits {
		name, _ := SplitFileName(s)
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil && fi.Mode().IsRegular() {
			out = append(out, s)
		}
	}
	return out
}

// SplitPath returns the path of a split's file in dir. When dir lacks it, the
// error names the missing file and the splits dir does have.
func SplitPath(dir, split string) (string, error) {
	name, err := SplitFileName(split)
	if err != nil {
		return "", err
	}
	if err := checkDir(dir); err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		avail := "none"
		if a := AvailableSplits(dir); len(a) > 0 {
			avail = strings.Join(a, ", ")
		}
		return "", fmt.Errorf("wikitext-2: split %q needs %s, which is not in %s (splits available there: %s); "+
			"copy the file there, or point --data-dir or $RPAC_DATA at a directory that has it", split, name, dir, avail)
	case err != nil:
		return "", fmt.Errorf("wikitext-2: cannot read %s: %w", p, err)
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("wikitext-2: %s is not a regular file", p)
	}
	return p, nil
}

// checkDir reports, in words a user can act on, why dir cannot serve as a
// data directory.
func checkDir(dir string) error {
	if dir == "" {
		return errors.New("wikitext-2: empty data directory path")
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("wikitext-2: data directory %s does not exist: create it and put wiki.{train,valid,test}.raw there, "+
			"or pass the directory that holds them", dir)
	case err != nil:
		return fmt.Errorf("wikitext-2: cannot access data directory %s: %w (check its permissions)", dir, err)
	case !fi.IsDir():
		return fmt.Errorf("wikitext-2: data directory %s is a file, not a directory: pass the directory that holds wiki.*.raw", dir)
	}
	if _, err := os.ReadDir(dir); err != nil {
		return fmt.Errorf("wikitext-2: cannot list data directory %s: %w (check its permissions)", dir, err)
	}
	return nil
}
