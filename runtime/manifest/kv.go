package manifest

import (
	"errors"
	"fmt"
	"sort"
)

// GraphKind says which graph of an exported length a file holds.
type GraphKind string

const (
	// GraphFull is the [B,T] graph of every export (input_ids in, logits out).
	GraphFull GraphKind = ""
	// GraphPrefill runs a prompt and returns its keys and values
	// (`rpac export --kv-cache`).
	GraphPrefill GraphKind = "prefill"
	// GraphDecode runs one token per sequence against a KV cache.
	GraphDecode GraphKind = "decode"
	// GraphHF is the Hugging Face decoder of `rpac export --format hf`
	// (onnx/model.onnx, Optimum's growing cache): its files' metadata says
	// so; no manifest lists it.
	GraphHF GraphKind = "hf"
)

func (g GraphKind) valid() bool { return g == GraphFull || g == GraphPrefill || g == GraphDecode }

// Names of the KV-cache graphs' inputs and outputs. The %d is the layer
// index. The cache tensors are named for rpac's fixed-slot cache on
// purpose: Hugging Face Optimum's past_key_values.{i}.* / present.{i}.*
// mean a cache that grows by one position a step under an attention_mask,
// and a driver that feeds these graphs so must fail on a missing input, not
// run with wrong logits.
const (
	KVInputIDs     = "input_ids"
	KVPositionIDs  = "position_ids"
	KVLogits       = "logits"
	KVPastKey      = "cache.%d.key"
	KVPastValue    = "cache.%d.value"
	KVPresentKey   = "cache_out.%d.key"
	KVPresentValue = "cache_out.%d.value"
)

// Hugging Face Optimum's names of a cache that grows by the new tokens
// under an attention_mask: the decoder of `rpac export --format hf`
// (onnx/model.onnx) reads and writes them. Exports before the fixed-slot
// names used them for the fixed-slot graphs too; a manifest that does is
// refused (validateKV).
const (
	HFAttentionMask = "attention_mask"
	HFPastKey       = "past_key_values.%d.key"
	HFPastValue     = "past_key_values.%d.value"
	HFPresentKey    = "present.%d.key"
	HFPresentValue  = "present.%d.value"
)

// KVCacheLayout names the cache layout of the decode graphs: every
// sequence has T slots per layer, slot j holds the key and value of
// position j, and a step writes slot position_ids and attends to slots
// 0..position_ids (docs/EXPORT.md, "KV-cached decoding").
const KVCacheLayout = "fixed-slots"

// KVCache is the manifest's description of the KV-cache graphs. For every
// length in Lengths the export holds a prefill and a decode graph:
//
//	prefill  input_ids int64 [batch, sequence] (positions 0..sequence-1, sequence <= T)
//	         -> logits float [batch, sequence, V],
//	            cache_out.{i}.key|value float [batch, heads, sequence, head_size]
//	decode   input_ids int64 [batch, 1], position_ids int64 [batch, 1],
//	         cache.{i}.key|value float [batch, heads, past_sequence, head_size]
//	         -> logits float [batch, 1, V],
//	            cache_out.{i}.key|value float [batch, heads, past_sequence, head_size]
//
// with past_sequence <= T and position_ids < past_sequence; cache_out equals
// cache except in slot position_ids, which holds the new token's key and
// value.
type KVCache struct {
	Layout   string `json:"layout"`
	Layers   int    `json:"layers"`
	Heads    int    `json:"heads"`
	HeadSize int    `json:"head_size"`
	Lengths  []int  `json:"lengths"`
	// Inputs and outputs, %d standing for the layer (as
	// onnxruntime-genai's genai_config.json writes them).
	InputIDs          string `json:"input_ids"`
	PositionIDs       string `json:"position_ids"`
	Logits            string `json:"logits"`
	PastKeyNames      string `json:"past_key_names"`
	PastValueNames    string `json:"past_value_names"`
	PresentKeyNames   string `json:"present_key_names"`
	PresentValueNames string `json:"present_value_names"`
}

// NewKVCache returns the manifest record of KV-cache graphs with this
// runtime's names and layout.
func NewKVCache(layers, heads, headSize int, lengths []int) *KVCache {
	ls := append([]int(nil), lengths...)
	sort.Ints(ls)
	return &KVCache{Layout: KVCacheLayout, Layers: layers, Heads: heads, HeadSize: headSize, Lengths: ls,
		InputIDs: KVInputIDs, PositionIDs: KVPositionIDs, Logits: KVLogits,
		PastKeyNames: KVPastKey, PastValueNames: KVPastValue, PresentKeyNames: KVPresentKey, PresentValueNames: KVPresentValue}
}

// Bounds on a KV-cache record.
const (
	maxKVLayers = 1 << 10
	maxKVHeads  = 1 << 10
	maxHeadSize = 1 << 12
)

type kvKey struct {
	length int
	graph  GraphKind
}

// validateKV checks the KV-cache record against the files (kv counts the
// .onnx files of each length and kind).
func (m *Manifest) validateKV(kv map[kvKey]int) error {
	k := m.KVCache
	if k == nil {
		if len(kv) > 0 {
			return errors.New("manifest lists prefill or decode graphs but has no kv_cache record")
		}
		return nil
	}
	if k.Layout != KVCacheLayout {
		return fmt.Errorf("manifest kv_cache layout %q is not supported (this runtime reads %q)", k.Layout, KVCacheLayout)
	}
	if k.Layers < 1 || k.Layers > maxKVLayers || k.Heads < 1 || k.Heads > maxKVHeads || k.HeadSize < 1 || k.HeadSize > maxHeadSize {
		return fmt.Errorf("manifest kv_cache has %d layers of %d heads of size %d; want 1..%d, 1..%d, 1..%d", k.Layers, k.Heads, k.HeadSize, maxKVLayers, maxKVHeads, maxHeadSize)
	}
	if k.PastKeyNames == HFPastKey || k.PresentKeyNames == HFPresentKey {
		return fmt.Errorf("manifest kv_cache names its fixed-slot cache %s / %s (Optimum's names, written by older rpac versions); this runtime reads %s / %s: re-export with `rpac export --kv-cache`",
			k.PastKeyNames, k.PresentKeyNames, KVPastKey, KVPresentKey)
	}
	want := NewKVCache(k.Layers, k.Heads, k.HeadSize, k.Lengths)
	if k.InputIDs != want.InputIDs || k.PositionIDs != want.PositionIDs || k.Logits != want.Logits ||
		k.PastKeyNames != want.PastKeyNames || k.PastValueNames != want.PastValueNames ||
		k.PresentKeyNames != want.PresentKeyNames || k.PresentValueNames != want.PresentValueNames {
		return fmt.Errorf("manifest kv_cache names its tensors %s, %s, %s, %s, %s, %s, %s; this runtime reads %s, %s, %s, %s, %s, %s, %s",
			k.InputIDs, k.PositionIDs, k.Logits, k.PastKeyNames, k.PastValueNames, k.PresentKeyNames, k.PresentValueNames,
			want.InputIDs, want.PositionIDs, want.Logits, want.PastKeyNames, want.PastValueNames, want.PresentKeyNames, want.PresentValueNames)
	}
	has := map[int]bool{}
	for _, L := range m.Lengths {
		has[L] = true
	}
	seen := map[int]bool{}
	for _, L := range k.Lengths {
		if !has[L] || seen[L] {
			return fmt.Errorf("manifest kv_cache length %d is not an exported length or is listed twice (lengths %v)", L, m.Lengths)
		}
		seen[L] = true
		for _, g := range []GraphKind{GraphPrefill, GraphDecode} {
			if kv[kvKey{L, g}] != 1 {
				return fmt.Errorf("manifest has %d %s graphs for length %d, want exactly one", kv[kvKey{L, g}], g, L)
			}
		}
	}
	for key := range kv {
		if !seen[key.length] {
			return fmt.Errorf("manifest lists a %s graph for length %d, which kv_cache does not list", key.graph, key.length)
		}
	}
	return nil
}

// HasKVCache reports whether length T has prefill and decode graphs.
func (m *Manifest) HasKVCache(T int) bool {
	if m.KVCache == nil {
		return false
	}
	for _, L := range m.KVCache.Lengths {
		if L == T {
			return true
		}
	}
	return false
}
