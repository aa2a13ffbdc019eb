package onnx

import (
	"fmt"
	"math"

	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/runtime/manifest"
)

// The growing-cache decoder (KVGrowing): the graph Hugging Face Optimum
// exports for a decoder with past, which transformers.js and
// onnxruntime-genai drive.
//
//	in:  input_ids                  int64 [batch_size, sequence_length]
//	     attention_mask             int64 [batch_size, total_sequence_length]
//	     position_ids               int64 [batch_size, sequence_length]
//	     past_key_values.{i}.key    float [batch_size, heads, past_sequence_length, head_size]
//	     past_key_values.{i}.value  float [batch_size, heads, past_sequence_length, head_size]
//	out: logits                     float [batch_size, sequence_length, V]
//	     present.{i}.key|value      float [batch_size, heads, total_sequence_length, head_size]
//
// with total_sequence_length = past_sequence_length + sequence_length:
// present is past with the new tokens' keys and values appended. Key j of
// a row attends when attention_mask[j] is 1 and j <= past_sequence_length + s
// for the new token s (causal by index, as Optimum's graphs are); every
// other key is masked with the lowest float32 (a large negative, so that a
// row of padding stays finite). The prior of length T enters exactly: the
// layer's folded [T,T] bias at row position_ids (the query's position) and
// at the columns of the keys' positions, CumSum(attention_mask) - 1, which
// are their position_ids when the caller numbers positions as Optimum does
// (left padding skipped). A position of T or more is out of the bias's
// range and the run fails: the graph is exact at length T and refuses
// longer sequences. Position tables enter as their rows position_ids, as in
// the decode graph.

// AttentionMaskName is the growing-cache decoder's attention_mask input.
const AttentionMaskName = manifest.HFAttentionMask

// Dynamic dimensions of the growing-cache decoder, named as Optimum's
// exports name them (transformers.js sizes an empty past from the input's
// declared shape: batch_size is the batch, any other name 0).
const (
	DimBatchSize          = "batch_size"
	DimSequenceLength     = "sequence_length"
	DimPastSequenceLength = "past_sequence_length"
	DimTotalSequence      = "total_sequence_length"
)

// maskedScore is the additive mask of a key a query does not attend to.
const maskedScore = -math.MaxFloat32

// cacheNames are layer i's past key, past value, present key and present
// value tensors in graph k (the prefill graph has no past; its names are
// unused).
func (k KVGraph) cacheNames(layer int) []string {
	if k == KVGrowing {
		return []string{fmt.Sprintf(manifest.HFPastKey, layer), fmt.Sprintf(manifest.HFPastValue, layer),
			fmt.Sprintf(manifest.HFPresentKey, layer), fmt.Sprintf(manifest.HFPresentValue, layer)}
	}
	return []string{PastKeyName(layer), PastValueName(layer), PresentKeyName(layer), PresentValueName(layer)}
}

// tokenInputs declares graph k's inputs before the cache.
func (k KVGraph) tokenInputs() []*onnxpb.ValueInfoProto {
	i64 := onnxpb.TensorProto_INT64
	switch k {
	case KVDecode:
		return []*onnxpb.ValueInfoProto{dynValueInfo(InputName, i64, DimBatch, 1), dynValueInfo(PositionIDsName, i64, DimBatch, 1)}
	case KVGrowing:
		return []*onnxpb.ValueInfoProto{dynValueInfo(InputName, i64, DimBatchSize, DimSequenceLength),
			dynValueInfo(AttentionMaskName, i64, DimBatchSize, DimTotalSequence),
			dynValueInfo(PositionIDsName, i64, DimBatchSize, DimSequenceLength)}
	}
	return []*onnxpb.ValueInfoProto{dynValueInfo(InputName, i64, DimBatch, DimSequence)}
}

// declareCache declares graph k's logits, its past inputs and its present
// outputs.
func (k KVGraph) declareCache(b *builder, lay KVLayout, V int) {
	f32 := onnxpb.TensorProto_FLOAT
	batch, logitSeq, past, present := any(DimBatch), any(1), any(DimPastSequence), any(DimSequence)
	switch k {
	case KVDecode:
		present = DimPastSequence
	case KVGrowing:
		batch, logitSeq, past, present = DimBatchSize, DimSequenceLength, DimPastSequenceLength, DimTotalSequence
	}
	b.gp.Output = append(b.gp.Output, dynValueInfo(OutputName, f32, batch, logitSeq, V))
	for i := 0; i < lay.Layers; i++ {
		n := k.cacheNames(i)
		if k != KVPrefill {
			b.gp.Input = append(b.gp.Input,
				dynValueInfo(n[0], f32, batch, lay.Heads, past, lay.HeadSize),
				dynValueInfo(n[1], f32, batch, lay.Heads, past, lay.HeadSize))
		}
		b.gp.Output = append(b.gp.Output,
			dynValueInfo(n[2], f32, batch, lay.Heads, present, lay.HeadSize),
			dynValueInfo(n[3], f32, batch, lay.Heads, present, lay.HeadSize))
	}
}

// growingMasks builds, once, what every layer of the growing-cache decoder
// shares: allowed [B,1,S,T], the keys each new token attends to, and
// keyCols [B,S,T], each key's position (a column of the bias), clamped to
// the bias's range (a masked key's column does not matter).
func (b *builder) growingMasks() {
	k := b.kv
	total := b.shapeOf(AttentionMaskName, 1, 2)
	seq := b.shapeOf(InputName, 1, 2)
	past := b.emit("hf.past_len", "Sub", []string{total, seq})
	keys := b.emit("hf.keys", "Range", []string{b.scalarI64(0), b.emit("hf.total", "Squeeze", []string{total}), b.scalarI64(1)})
	news := b.emit("hf.news", "Range", []string{b.scalarI64(0), b.emit("hf.seq", "Squeeze", []string{seq}), b.scalarI64(1)})
	rows := b.emit("hf.rows", "Unsqueeze", []string{b.emit("hf.query_index", "Add", []string{news, past}), b.constI64(1)})
	causal := b.emit("hf.causal", "LessOrEqual", []string{keys, rows}) // [S,T]
	on := b.emit("hf.on", "Unsqueeze", []string{b.emit("hf.mask_bool", "Cast", []string{AttentionMaskName}, attrInt("to", int64(onnxpb.TensorProto_BOOL))), b.constI64(1)})
	allowed := b.emit("hf.allowed3", "And", []string{causal, on}) // [B,S,T]
	k.allowed = b.emit("hf.allowed", "Unsqueeze", []string{allowed, b.constI64(1)})
	pos := b.emit("hf.key_pos", "Sub", []string{b.emit("hf.cumsum", "CumSum", []string{AttentionMaskName, b.scalarI64(1)}), b.scalarI64(1)})
	pos = b.emit("hf.key_col", "Min", []string{b.emit("hf.key_nonneg", "Max", []string{pos, b.scalarI64(0)}), b.scalarI64(int64(k.layout.Length - 1))})
	pos = b.emit("hf.key_cols1", "Unsqueeze", []string{pos, b.constI64(1)}) // [B,1,T]
	k.keyCols = b.emit("hf.key_cols", "Expand", []string{pos, b.emit("hf.allowed_shape", "Shape", []string{allowed})})
}

// kvGrowingAttention appends the new keys and values to layer i's past and
// attends with the mask and the prior's rows and columns (growingMasks).
func (b *builder) kvGrowingAttention(i int, q, key, val, bias string, scale float32, out string) string {
	k := b.kv
	n := KVGrowing.cacheNames(i)
	pk := b.emitTo(n[2], "Concat", []string{n[0], key}, attrInt("axis", 2))
	pv := b.emitTo(n[3], "Concat", []string{n[1], val}, attrInt("axis", 2))
	if k.allowed == "" {
		b.growingMasks()
	}
	var mask string
	if bias != "" {
		rows := b.emit(out+".bias_rows", "Gather", []string{bias, PositionIDsName}, attrInt("axis", 0)) // [B,S,T0]
		cols := b.emit(out+".bias_cols", "GatherElements", []string{rows, k.keyCols}, attrInt("axis", 2))
		cols = b.emit(out+".bias4", "Unsqueeze", []string{cols, b.constI64(1)})
		mask = b.emit(out+".mask", "Where", []string{k.allowed, cols, b.scalar(maskedScore)})
	} else {
		if k.zeroMask == "" {
			k.zeroMask = b.emit("hf.mask", "Where", []string{k.allowed, b.scalar(0), b.scalar(maskedScore)})
		}
		mask = k.zeroMask
	}
	return b.maskedAttention(q, pk, pv, mask, scale, out)
}
