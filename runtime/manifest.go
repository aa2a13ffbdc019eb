package runtime

import "github.com/rpac-dev/rpac/runtime/manifest"

// The manifest and provenance types live in runtime/manifest, the contract
// the exporter writes and the runtime reads; these names keep the
// runtime's API whole for services that import it alone.
type (
	Manifest   = manifest.Manifest
	File       = manifest.File
	GraphKind  = manifest.GraphKind
	KVCache    = manifest.KVCache
	Provenance = manifest.Provenance
)

// ManifestName is the manifest's file name inside an export folder.
const ManifestName = manifest.FileName

// ManifestFormat is the manifest format this runtime reads.
const ManifestFormat = manifest.FormatVersion

// Graph kinds of an exported length (manifest.GraphKind).
const (
	GraphFull    = manifest.GraphFull
	GraphPrefill = manifest.GraphPrefill
	GraphDecode  = manifest.GraphDecode
)

// Names and layout of the KV-cache graphs (manifest.KVCache).
const (
	KVInputIDs     = manifest.KVInputIDs
	KVPositionIDs  = manifest.KVPositionIDs
	KVLogits       = manifest.KVLogits
	KVPastKey      = manifest.KVPastKey
	KVPastValue    = manifest.KVPastValue
	KVPresentKey   = manifest.KVPresentKey
	KVPresentValue = manifest.KVPresentValue
	KVCacheLayout  = manifest.KVCacheLayout
)

// Bounds on a manifest (manifest.MaxManifestBytes, ...).
const (
	MaxManifestBytes   = manifest.MaxManifestBytes
	MaxManifestLengths = manifest.MaxManifestLengths
	MaxManifestFiles   = manifest.MaxManifestFiles
	MaxFileBytes       = manifest.MaxFileBytes
)

// ReadManifest reads and validates dir/manifest.json (manifest.Read).
func ReadManifest(dir string) (*Manifest, error) { return manifest.Read(dir) }

// WriteManifest validates m and writes dir/manifest.json (manifest.Write).
func WriteManifest(dir string, m *Manifest) error { return manifest.Write(dir, m) }

// NewFile hashes dir/rel into a manifest entry (manifest.NewFile).
func NewFile(dir, rel string, length int) (File, error) { return manifest.NewFile(dir, rel, length) }

// HashFile returns the SHA-256 and size of a file (manifest.HashFile).
func HashFile(path string) (string, int64, error) { return manifest.HashFile(path) }

// NewKVCache returns the KV-cache record with this runtime's names and
// layout (manifest.NewKVCache).
func NewKVCache(layers, heads, headSize int, lengths []int) *KVCache {
	return manifest.NewKVCache(layers, heads, headSize, lengths)
}

// BuildCommit is the VCS revision of this binary (manifest.BuildCommit).
func BuildCommit() string { return manifest.BuildCommit() }

// ProvenanceFromMeta reads the fold record's legacy meta strings
// (manifest.ProvenanceFromMeta).
func ProvenanceFromMeta(meta map[string]string) *Provenance { return manifest.ProvenanceFromMeta(meta) }
