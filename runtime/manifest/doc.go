// Package manifest is the contract between the exporter and the runtime:
// manifest.json (the lengths, files and hashes, vocabulary, tokenizer, EOS
// and KV-cache record of an export folder) and the Provenance of an export
// (run, weights, data, splits, commit, compile settings). compiler/export
// writes it, runtime reads it, and training fills a run's part of the
// provenance: all three import this package, none imports another for it.
// It imports nothing of rpac.
package manifest
