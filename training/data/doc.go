// Package data provides everything the trainer reads: the GPT-2 BPE tokenizer,
// WikiText-2 (raw, v1) loaded exactly as the paper's build_wikitext2_loaders
// does, a built-in synthetic corpus with measurable long-span recall, and the
// batching of token streams into [B,T] training and evaluation batches.
//
// # WikiText-2
//
// The dataset's rows are the lines of wiki.{train,valid,test}.raw, each WITH
// its trailing "\n" (as the Hugging Face "wikitext-2-raw-v1" rows are). Rows
// that are empty or all whitespace (Python's str.isspace) are dropped; every
// remaining row is encoded on its own with GPT-2 BPE (tiktoken r50k_base,
// vocabulary 50,257) and followed by EOS 50256. Check figures: wiki.valid.raw
// gives 2,461 rows and 249,750 ids, wiki.test.raw 286,178 ids.
//
// The data directory is found by [Locate]: an explicit directory (the CLI's
// --data-dir), then $RPAC_DATA, then the user cache
// (os.UserCacheDir()/rpac/wikitext-2-raw-v1), and finally by downloading the
// official archive, whose size and SHA-256 and each member's SHA-256 are
// compiled in.
//
// Checksum policy: a file named like a known split (wiki.train.raw, ...) is
// hashed when loaded (the hash is also the key of the token cache) and
// compared with the official SHA-256. A mismatch is an error by default,
// because results on a modified file are not comparable with the paper's;
// [LoadOptions].AllowModified turns it into a logged warning. Files downloaded
// by [Locate] are always verified, and a mismatch there is always an error.
//
// Encoding a split runs on all cores and its result is cached as a .ids file
// under os.UserCacheDir()/rpac/tokens, keyed by the file's SHA-256 and the
// tokenizer's name; the cache is written atomically and ignored (and
// rewritten) when it fails its own integrity checks.
//
// # Synthetic corpus
//
// [Synthetic] generates, from a seed and without files, sequences over a
// vocabulary of [SyntheticVocab] ids in which a (key, value) pair is stated
// early, filler text follows, and the key is queried much later; the value
// after the query can only be predicted by recalling the statement.
// [RecallAccuracy] scores argmax predictions on those answer positions only
// ([SyntheticStream.AnswerMask]). [NewSyntheticCorpus] gives train and eval
// streams with different seeds.
//
// # Batching
//
// Training draws random contiguous chunks (x = ids[i:i+T], y = ids[i+1:i+T+1],
// i uniform in [0, len-T-1]) from a seeded PCG generator whose state can be
// saved and restored ([TrainBatcher]). Evaluation walks sequential
// non-overlapping chunks with stride T and drops an incomplete last batch
// ([EvalBatcher]). Batches are [B,T] int32, row-major.
package data
