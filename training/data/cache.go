package data

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/rpac-dev/rpac/internal/fileio"
)

// Token cache file layout (little-endian):
//
//	magic   [8]byte  "RPACIDS1"
//	source  [32]byte SHA-256 of the encoded file
//	nameLen uint16, name [nameLen]byte   tokenizer name
//	rows    uint64   number of rows encoded
//	count   uint64   number of ids
//	ids     [count]int32
//	crc     uint32   CRC-32C of every byte before it
const cacheMagic = "RPACIDS1"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// DefaultTokenCacheDir returns os.UserCacheDir()/rpac/tokens.
func DefaultTokenCacheDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(base, "rpac", "tokens"), nil
}

// cachePath names the cache file of a source hash and tokenizer name.
func cachePath(dir string, sum [32]byte, tokName string) string {
	safe := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' {
			return r
		}
		return '_'
	}, tokName)
	return filepath.Join(dir, hex.EncodeToString(sum[:])+"."+safe+".ids")
}

func encodeCache(sum [32]byte, tokName string, rows int, ids []int32) []byte {
	b := make([]byte, 0, len(cacheMagic)+32+2+len(tokName)+16+4*len(ids)+4)
	b = append(b, cacheMagic...)
	b = append(b, sum[:]...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(tokName)))
	b = append(b, tokName...)
	b = binary.LittleEndian.AppendUint64(b, uint64(rows))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(ids)))
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

var errBadCache = errors.New("token cache: invalid file")

func decodeCache(b []byte, sum [32]byte, tokName string) (rows int, ids []int32, err error) {
	bad := func(what string) (int, []int32, error) {
		return 0, nil, fmt.Errorf("%w: %s", errBadCache, what)
	}
	head := len(cacheMagic) + 32 + 2
	if len(b) < head+len(tokName)+16+4 {
		return bad("truncated")
	}
	if crc32.Checksum(b[:len(b)-4], castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return bad("checksum mismatch")
	}
	if string(b[:len(cacheMagic)]) != cacheMagic {
		return bad("bad magic")
	}
	if !bytes.Equal(b[len(cacheMagic):len(cacheMagic)+32], sum[:]) {
		return bad("source hash differs")
	}
	n := int(binary.LittleEndian.Uint16(b[head-2:]))
	if n != len(tokName) || string(b[head:head+n]) != tokName {
		return bad("tokenizer differs")
	}
	p := head + n
	r := binary.LittleEndian.Uint64(b[p:])
	c := binary.LittleEndian.Uint64(b[p+8:])
	p += 16
	if c > uint64(len(b)) || uint64(len(b)-p-4) != 4*c || r > c {
		return bad("length mismatch")
	}
	ids = make([]int32, c)
	for i := range ids {
		ids[i] = int32(binary.LittleEndian.Uint32(b[p+4*i:]))
	}
	return int(r), ids, nil
}

// readCacheFile reads a token cache file of at most limit bytes.
func readCacheFile(path string, limit int64) ([]byte, error) {
	return fileio.ReadBounded(path, limit, func(st fs.FileInfo) error {
		if !st.Mode().IsRegular() || st.Size() > limit {
			return fmt.Errorf("%w: %d bytes, more than the %d its source can give", errBadCache, st.Size(), limit)
		}
		return nil
	})
}

// writeFileAtomic writes data to path through a temporary file in the same
// directory, synced and then renamed over path, so readers see either the old
// file or the complete new one.
func writeFileAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	return fileio.Replace(f, path, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
}
