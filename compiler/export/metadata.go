package export

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime/manifest"
)

// Metadata is what an exported ONNX file says about itself in its
// metadata_props. Props renders it, and is the only place that spells the
// keys; they are those earlier exports wrote, so readers of the string
// metadata (rpac inspect, onnxruntime's model metadata, Triton) keep working.
type Metadata struct {
	// Lengths are all the exported lengths ("lengths", comma-separated;
	// omitted when empty); Length is this file's ("length").
	Lengths []int
	Length  int
	// Batch is the static batch size, or the name of the dynamic batch
	// dimension ("batch"; omitted when empty, as in the KV-cache graphs).
	Batch string
	// MaxBatch is Triton's max_batch_size ("max_batch_size"; omitted when 0).
	MaxBatch int
	// Graph is a KV-cache graph's kind ("graph"; omitted for the full graph).
	Graph manifest.GraphKind

	VocabSize int        // "vocab_size"
	Tokenizer string     // "tokenizer"
	EOS       int        // "eos"
	Model     model.Kind // "model"
	// Config is the model configuration as JSON ("config").
	Config json.RawMessage
	// Fold is the fold record ("fold", as JSON). Without it, FoldMode and
	// Attention are written as "fold" and "attention" on their own (the
	// Triton repository's form).
	Fold      *Fold
	FoldMode  passes.FoldMode
	Attention passes.AttentionMode
	// Quantize is onnx.QuantizeInt8 ("quantize", with "int8_weight_max")
	// or onnx.QuantizeNone (omitted).
	Quantize onnx.Quantize
	// DType is the type of weights and activations ("dtype"; omitted for
	// float32).
	DType ir.Precision
	// Provenance is the export's record ("provenance", as JSON), also
	// written under the keys earlier exports used (manifest.LegacyMeta:
	// weights, source, step, data_dir, synthetic, seed); nil: none.
	Provenance *manifest.Provenance
}

// Props renders md as ONNX metadata_props (a key → value map; the lowering
// writes them sorted by key).
func (md *Metadata) Props() map[string]string {
	out := map[string]string{}
	if md.Provenance != nil {
		// Written first: the fixed keys below take precedence.
		for k, v := range md.Provenance.LegacyMeta() {
			out[k] = v
		}
		if js, err := json.Marshal(md.Provenance); err == nil {
			out["provenance"] = string(js)
		}
	}
	if len(md.Lengths) > 0 {
		s := make([]string, len(md.Lengths))
		for i, T := range md.Lengths {
			s[i] = strconv.Itoa(T)
		}
		out["lengths"] = strings.Join(s, ",")
	}
	out["length"] = strconv.Itoa(md.Length)
	if md.Batch != "" {
		out["batch"] = md.Batch
	}
	if md.MaxBatch > 0 {
		out["max_batch_size"] = strconv.Itoa(md.MaxBatch)
	}
	if md.Graph != manifest.GraphFull {
		out["graph"] = string(md.Graph)
	}
	out["vocab_size"] = strconv.Itoa(md.VocabSize)
	out["tokenizer"] = md.Tokenizer
	out["eos"] = strconv.Itoa(md.EOS)
	out["model"] = md.Model.String()
	out["config"] = string(md.Config)
	if md.Fold != nil {
		js, _ := json.Marshal(md.Fold)
		out["fold"] = string(js)
	} else {
		out["fold"], out["attention"] = md.FoldMode.String(), md.Attention.String()
	}
	if md.Quantize != onnx.QuantizeNone {
		out["quantize"] = md.Quantize.String()
		out["int8_weight_max"] = strconv.Itoa(onnx.Int8WeightMax)
	}
	if md.DType.Reduced() {
		out["dtype"] = md.DType.String()
	}
	return out
}
