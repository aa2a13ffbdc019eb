package export

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rpac-dev/rpac/compiler/hf"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime/manifest"
)

// HFResult is what HF wrote.
type HFResult struct {
	Dir string
	// Length is L, the one frame length of the export.
	Length int
	// Files are the files written, relative to Dir (the decoder, its
	// external data when it has some, and the configuration files).
	Files      []string
	Bytes      int64 // the decoder with its external data
	Nodes      int   // ONNX nodes of the decoder
	Calibrated bool  // L's running statistics came from calibration
	Layout     onnx.KVLayout
	Seconds    float64
}

// checkHF checks the options of a Hugging Face export: one length, fp32,
// the model's dense prior (fold rpa or none), attention op or plain.
func (o *Options) checkHF() error {
	if len(o.Lengths) != 1 {
		return fmt.Errorf("export: the Hugging Face layout holds one frame length (its prior is exact at that length, max_position_embeddings); have --lengths %v, want one", o.Lengths)
	}
	if o.DropBias || o.Quantize != onnx.QuantizeNone || o.DType.Reduced() {
		return errors.New("export: the Hugging Face decoder is written in fp32 with the model's prior; drop --quantize and --dtype")
	}
	if o.Fold != passes.FoldRPAMode && o.Fold != passes.FoldNoneMode {
		return fmt.Errorf("export: the Hugging Face decoder reads the dense folded prior; --fold %s is not supported (use %s or %s)", o.Fold, passes.FoldRPAMode, passes.FoldNoneMode)
	}
	if o.Attention == passes.AttentionOpPadded {
		return fmt.Errorf("export: the Hugging Face decoder has no %s lowering; use --attention op or plain", passes.AttentionOpPadded)
	}
	if o.Config.SmearKeys {
		return errors.New("export: the model smears keys (smear_keys: each key mixed with the one before), which a cache of the mixed keys cannot step exactly")
	}
	if o.KVCache {
		return errors.New("export: --kv-cache writes rpac's own prefill and decode graphs; the Hugging Face decoder is its own cache graph, drop --kv-cache")
	}
	return nil
}

// HF writes o.Model at its one length L (o.Lengths) in the Hugging Face /
// Optimum layout into o.Out: the decoder onnx/model.onnx (onnx.KVGrowing:
// input_ids, attention_mask, position_ids and past_key_values.{i}.* in,
// logits at every position and present.{i}.* out), config.json,
// generation_config.json and genai_config.json. The tokenizer files are the
// caller's (hf.WriteTokenizer). EOS is the BOS, EOS and padding id.
func HF(ctx context.Context, o Options) (*HFResult, error) {
	if err := o.checkHF(); err != nil {
		return nil, err
	}
	if err := o.defaults(); err != nil {
		return nil, err
	}
	t0 := time.Now()
	L := o.Lengths[0]
	res := &HFResult{Dir: o.Out, Length: L}
	cal, err := EnsureRunning(&o.Config, L, o.Store, o.Trained, o.CalibIDs, o.CalibBatches, o.CalibBatch)
	if err != nil {
		return nil, fmt.Errorf("export: length %d: %w", L, err)
	}
	res.Calibrated = cal
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	g, rep, err := Graph(&o.Config, L, 1, o.Store, GraphOptions{Fold: o.Fold, Attention: passes.AttentionOp, DumpIR: o.DumpIR, Dump: o.Dump})
	if err != nil {
		return nil, fmt.Errorf("export: length %d: %w", L, err)
	}
	cfgJSON, err := json.Marshal(o.Config)
	if err != nil {
		return nil, err
	}
	fold := Fold{Mode: o.Fold, Attention: o.Attention, Layers: rep.Layers}
	if cal {
		fold.Calibrated, fold.CalibBatches, fold.CalibBatch, fold.CalibSource = []int{L}, o.CalibBatches, o.CalibBatch, o.CalibSource
	}
	meta := Metadata{Lengths: []int{L}, Length: L, Batch: onnx.DimBatchSize, Graph: manifest.GraphHF, VocabSize: o.Config.Vocab,
		Tokenizer: o.Tokenizer, EOS: o.EOS, Model: o.Config.Model, Config: cfgJSON, Fold: &fold, DType: o.DType, Provenance: o.provenance()}
	m, lay, err := onnx.LowerKV(g, storeWeights(o.Store), onnx.KVOptions{Graph: onnx.KVGrowing, PlainAttention: o.Attention == passes.AttentionPlain},
		onnx.Options{Opset: o.Opset, IRVersion: o.IRVersion, Metadata: meta.Props(), GraphName: fmt.Sprintf("rpac_%s_L%d_hf", o.Config.Model, L)})
	if err != nil {
		return nil, fmt.Errorf("export: length %d: %w", L, err)
	}
	res.Layout, res.Nodes = lay, onnx.Inspect(m).Nodes
	path := filepath.Join(o.Out, filepath.FromSlash(hf.ModelFile))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	if err := onnx.Write(path, m); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	res.Files = append(res.Files, hf.ModelFile)
	for _, p := range []string{path, onnx.DataFile(path)} {
		if st, err := os.Stat(p); err == nil {
			res.Bytes += st.Size()
			if p != path {
				res.Files = append(res.Files, hf.ModelFile+filepath.Ext(p))
			}
		}
	}
	c := hf.Config{Vocab: o.Config.Vocab, DModel: lay.Heads * lay.HeadSize, Layers: lay.Layers, Heads: lay.Heads, Length: L, EOS: int32(o.EOS)}
	if err := hf.WriteConfig(o.Out, c); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	res.Files = append(res.Files, hf.ConfigFile, hf.GenerationFile, hf.GenAIConfigFile)
	res.Seconds = time.Since(t0).Seconds()
	return res, nil
}
