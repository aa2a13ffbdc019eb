// Package export compiles a trained model into the ONNX files that
// runtime.Open serves: for every context length T it builds the eval-mode
// forward graph (compiler/model), runs the export pipeline of package
// passes (strip training, fold rpa, const fold, dce, fuse attention),
// lowers the result with compiler/onnx and writes model_L{T}.onnx; then it
// writes manifest.json (manifest.Manifest) with the lengths, the file
// hashes, the configuration and the fold statistics.
//
// Reading checkpoints and data is the caller's business (cmd/rpac): Export
// takes the weights as a kernels.Store and calibration data as token ids.
package export

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/internal/logging"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime/manifest"
)

// Defaults of Options.
const (
	DefaultCalibBatches = 8
	DefaultCalibBatch   = 4
)

// Options describe one export.
type Options struct {
	Config model.Config
	// Store holds the weights to export (see SelectWeights) and the
	// buffers: training-only buffers and running statistics. Calibration
	// writes the running statistics it computes into it.
	Store *kernels.Store
	// Trained reports whether a running-statistics buffer in Store holds
	// trained values (a checkpoint records which ones it updated); nil
	// means every running-statistics buffer present in Store counts.
	Trained func(name string) bool
	// Lengths are the context lengths to export, each in [1, max_len].
	Lengths []int
	// Batch is the static batch size of the exported graphs (default 1).
	Batch int
	// Fold is passes.FoldRPAMode (default), passes.FoldRankMode,
	// passes.FoldRankApproxMode or passes.FoldNoneMode.
	Fold passes.FoldMode
	// Attention is passes.AttentionOp (default), passes.AttentionOpPadded
	// or passes.AttentionPlain. Below opset 23, which has no Attention op,
	// the fused node is lowered to MatMul, Add, Where and Softmax.
	Attention passes.AttentionMode
	// DropBias removes the folded RPA bias of every layer (Fold rpa; see
	// passes.DropFoldedBias): the model without its prior, for measuring
	// what the prior costs (rpac bench infer). Its logits are not the
	// model's; rpac export never sets it, and the fold record says
	// bias_dropped.
	DropBias bool
	// Quantize is onnx.QuantizeNone (fp32) or onnx.QuantizeInt8 (int8
	// products in every Linear layer, for CPU serving; recorded in the
	// manifest's fold meta as "quantize").
	Quantize onnx.Quantize
	// DType is the type of weights and activations (ir.FP32 default,
	// ir.FP16, ir.BF16; LayerNorm, softmax and the reductions stay
	// float32, logits are float32). Not with Quantize or KVCache.
	DType ir.Precision
	// KVCache also writes, for every length, the prefill and decode graphs
	// of KV-cached decoding (manifest.KVCache; not with DropBias, Quantize,
	// DType or a rank fold).
	KVCache bool
	// Opset and IRVersion of the ONNX files (defaults: 23 and the one that
	// shipped with the opset).
	Opset, IRVersion int64
	// CalibIDs is the token stream calibration reads when a length has no
	// trained running statistics; CalibBatches batches of CalibBatch
	// sequential chunks of T tokens are averaged.
	CalibIDs     []int32
	CalibBatches int
	CalibBatch   int
	CalibSource  string // what CalibIDs are (for the manifest), e.g. "wikitext2 valid"
	// Out is the export folder (created if needed).
	Out string
	// Tokenizer names the tokenizer of the ids (e.g. "gpt2"); EOS is the
	// end-of-sequence id (padding).
	Tokenizer string
	EOS       int
	// Provenance is the record of the run the weights come from (run,
	// checkpoint, weights, step, data, splits; see training.Run.Provenance).
	// Export completes it with the tokenizer, the EOS, the commit (when the
	// caller has none: manifest.BuildCommit) and the fold, attention,
	// precision and quantization, and writes it into the manifest and every
	// file's metadata. nil: a record of the export settings alone.
	Provenance *manifest.Provenance
	// DumpIR names a pass of passes.ExportPipeline after which the graph is
	// printed to Dump ("all": after every pass).
	DumpIR string
	Dump   io.Writer
	Log    *slog.Logger // debug events (events.go); nil: none
}

// LengthResult is what Export did for one length.
type LengthResult struct {
	T          int
	File       string // path relative to the export folder
	Bytes      int64
	Nodes      int            // ONNX nodes
	Ops        map[string]int // ONNX op counts
	Calibrated bool           // running statistics came from calibration
	Fold       []passes.FoldLayer
	Seconds    float64
	// KVFiles are the prefill and decode graphs (Options.KVCache) and
	// KVBytes their size with external data.
	KVFiles []string
	KVBytes int64
}

// Result is the outcome of Export.
type Result struct {
	Dir      string
	Manifest *manifest.Manifest
	Lengths  []LengthResult
}

// Fold is the manifest's "fold" record (also the "fold" metadata entry).
type Fold struct {
	Mode      passes.FoldMode      `json:"mode"`
	Attention passes.AttentionMode `json:"attention"`
	// Calibrated lists the lengths whose running statistics were calibrated
	// on data (the others came from the checkpoint).
	Calibrated   []int              `json:"calibrated,omitempty"`
	CalibBatches int                `json:"calib_batches,omitempty"`
	CalibBatch   int                `json:"calib_batch,omitempty"`
	CalibSource  string             `json:"calib_source,omitempty"`
	Layers       []passes.FoldLayer `json:"layers,omitempty"`
	Meta         map[string]string  `json:"meta,omitempty"`
	// BiasDropped marks an export without the folded biases
	// (Options.DropBias): not the model, a benchmark's reference.
	BiasDropped bool `json:"bias_dropped,omitempty"`
	// DType and IO describe a reduced-precision export (ir.Precision,
	// onnx.LowPrecisionNote); absent for float32.
	DType string `json:"dtype,omitempty"`
	IO    string `json:"io,omitempty"`
}

// FileName is the ONNX file of length T.
func FileName(T int) string { return fmt.Sprintf("model_L%d.onnx", T) }

// CheckLengths validates the lengths against the model's limit.
func CheckLengths(lengths []int, maxLen int) error {
	if len(lengths) == 0 {
		return errors.New("no lengths to export")
	}
	seen := map[int]bool{}
	for _, T := range lengths {
		if T < 1 {
			return fmt.Errorf("length %d is not a positive integer", T)
		}
		if T > maxLen {
			return fmt.Errorf("length %d exceeds the model's maximum length %d (max_len: rows of its position embedding)", T, maxLen)
		}
		if seen[T] {
			return fmt.Errorf("length %d is listed twice", T)
		}
		seen[T] = true
	}
	return nil
}

// ParseLengths parses a comma-separated list of lengths ("384,768").
func ParseLengths(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		T, err := strconv.Atoi(f)
		if err != nil || T < 1 {
			return nil, fmt.Errorf("length %q is not a positive integer", f)
		}
		out = append(out, T)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no lengths in %q (want e.g. 384,768)", s)
	}
	return out, nil
}

func (o *Options) defaults() error {
	if o.Store == nil {
		return errors.New("export: no weights")
	}
	if err := o.Config.Validate(); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := CheckLengths(o.Lengths, o.Config.MaxLen); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if o.Batch == 0 {
		o.Batch = 1
	}
	if o.Batch < 0 {
		return fmt.Errorf("export: batch %d is negative", o.Batch)
	}
	if o.Fold > passes.FoldNoneMode {
		return fmt.Errorf("export: fold mode %v is unknown", o.Fold)
	}
	if o.DropBias && o.Fold != passes.FoldRPAMode {
		return fmt.Errorf("export: dropping the bias needs --fold rpa, not %s", o.Fold)
	}
	if o.DType = o.DType.Or(ir.FP32); o.DType != ir.FP32 && !o.DType.Reduced() {
		return fmt.Errorf("export: --dtype %s: want fp32, fp16 or bf16", o.DType)
	}
	if o.DType.Reduced() && o.Quantize != onnx.QuantizeNone {
		return fmt.Errorf("export: --dtype %s and --quantize %s do not combine (int8 products read float32 activations)", o.DType, o.Quantize)
	}
	if o.KVCache && (o.DropBias || o.Quantize != onnx.QuantizeNone) {
		return errors.New("export: the KV-cache graphs are written without quantization and with the model's prior; drop --quantize (or --kv-cache)")
	}
	if o.KVCache && (o.DType.Reduced() || o.Fold == passes.FoldRankMode || o.Fold == passes.FoldRankApproxMode) {
		return fmt.Errorf("export: the KV-cache graphs are written in fp32 with the dense folded prior; drop --dtype %s or --fold %s (or --kv-cache)", o.DType, o.Fold)
	}
	if o.Attention != passes.AttentionOp && o.Attention != passes.AttentionPlain && o.Attention != passes.AttentionOpPadded {
		return fmt.Errorf("export: attention lowering %v: want %s, %s or %s", o.Attention, passes.AttentionOp, passes.AttentionOpPadded, passes.AttentionPlain)
	}
	if o.KVCache && o.Config.SmearKeys {
		return errors.New("export: the model smears keys (smear_keys: each key mixed with the one before), which a KV cache of the mixed keys cannot step exactly; drop --kv-cache")
	}
	if o.KVCache && o.Attention == passes.AttentionOpPadded {
		return fmt.Errorf("export: the KV-cache graphs have no %s lowering; use --attention op or plain", passes.AttentionOpPadded)
	}
	if o.Opset == 0 {
		o.Opset = onnx.DefaultOpset
	}
	if o.CalibBatches == 0 {
		o.CalibBatches = DefaultCalibBatches
	}
	if o.CalibBatch == 0 {
		o.CalibBatch = DefaultCalibBatch
	}
	if o.CalibBatches < 0 || o.CalibBatch < 0 {
		return errors.New("export: calibration batches must not be negative")
	}
	if o.Out == "" {
		return errors.New("export: no output folder (--out)")
	}
	if o.Tokenizer == "" {
		o.Tokenizer = "unknown"
	}
	if o.EOS < 0 || o.EOS >= o.Config.Vocab {
		return fmt.Errorf("export: eos %d is outside the vocabulary [0,%d)", o.EOS, o.Config.Vocab)
	}
	if o.Log == nil {
		o.Log = logging.Discard()
	}
	return nil
}

// Export writes one ONNX file per length and the manifest into o.Out.
func Export(ctx context.Context, o Options) (*Result, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	// A stale manifest must not describe a half-written export.
	if err := os.Remove(filepath.Join(o.Out, manifest.FileName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("export: %w", err)
	}
	cfgJSON, err := json.Marshal(o.Config)
	if err != nil {
		return nil, err
	}
	lengths := append([]int(nil), o.Lengths...)
	sort.Ints(lengths)
	res := &Result{Dir: o.Out}
	prov := o.provenance()
	man := &manifest.Manifest{Format: manifest.FormatVersion, Lengths: lengths, VocabSize: o.Config.Vocab,
		Tokenizer: o.Tokenizer, EOS: o.EOS, Config: cfgJSON, Model: o.Config.Model.String(), Provenance: prov}
	fold := Fold{Mode: o.Fold, Attention: o.Attention, BiasDropped: o.DropBias}
	if o.Provenance != nil {
		fold.Meta = prov.LegacyMeta() // for readers of exports older than Provenance
	}
	if o.DType.Reduced() {
		fold.DType, fold.IO = o.DType.String(), onnx.LowPrecisionNote
	}
	for _, T := range lengths {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		t0 := time.Now()
		lr := LengthResult{T: T, File: FileName(T)}
		// Folded or not, the fuzzy model reads the running statistics of T.
		cal, err := EnsureRunning(&o.Config, T, o.Store, o.Trained, o.CalibIDs, o.CalibBatches, o.CalibBatch)
		if err != nil {
			return nil, fmt.Errorf("export: length %d: %w", T, err)
		}
		if cal {
			lr.Calibrated = true
			fold.Calibrated = append(fold.Calibrated, T)
			fold.CalibBatches, fold.CalibBatch, fold.CalibSource = o.CalibBatches, o.CalibBatch, o.CalibSource
			logging.Debug(o.Log, CalibratedEvent{T: T, Batches: o.CalibBatches, Batch: o.CalibBatch, Source: o.CalibSource})
		}
		g, rep, err := Graph(&o.Config, T, o.Batch, o.Store, GraphOptions{Fold: o.Fold, Attention: o.Attention, DropBias: o.DropBias, DumpIR: o.DumpIR, Dump: o.Dump})
		if err != nil {
			return nil, fmt.Errorf("export: length %d: %w", T, err)
		}
		lr.Fold = rep.Layers
		fold.Layers = append(fold.Layers, rep.Layers...)
		perFold := fold
		perFold.Layers = rep.Layers
		meta := Metadata{Lengths: lengths, Length: T, Batch: strconv.Itoa(o.Batch), VocabSize: o.Config.Vocab,
			Tokenizer: o.Tokenizer, EOS: o.EOS, Model: o.Config.Model, Config: cfgJSON, Fold: &perFold,
			Quantize: o.Quantize, DType: o.DType, Provenance: prov}
		m, err := Lower(g, o.Store, onnx.Options{Opset: o.Opset, IRVersion: o.IRVersion, Metadata: meta.Props(),
			GraphName: fmt.Sprintf("rpac_%v_L%d", o.Config.Model, T), Quantize: o.Quantize, Precision: o.DType})
		if err != nil {
			return nil, fmt.Errorf("export: length %d: %w", T, err)
		}
		if o.Quantize != onnx.QuantizeNone {
			// Refuse to write an integer product that any onnxruntime CPU
			// kernel could overflow.
			if _, err := onnx.CheckInt8Bound(m); err != nil {
				return nil, fmt.Errorf("export: length %d: %w", T, err)
			}
		}
		s := onnx.Inspect(m)
		lr.Nodes, lr.Ops = s.Nodes, s.Ops
		path := filepath.Join(o.Out, lr.File)
		if err := onnx.Write(path, m); err != nil {
			return nil, fmt.Errorf("export: %w", err)
		}
		m = nil
		f, err := manifest.NewFile(o.Out, lr.File, T)
		if err != nil {
			return nil, fmt.Errorf("export: %w", err)
		}
		man.Files = append(man.Files, f)
		lr.Bytes = f.Bytes
		if _, err := os.Stat(onnx.DataFile(path)); err == nil {
			df, err := manifest.NewFile(o.Out, filepath.Base(onnx.DataFile(path)), T)
			if err != nil {
				return nil, fmt.Errorf("export: %w", err)
			}
			man.Files = append(man.Files, df)
			lr.Bytes += df.Bytes
		}
		if o.KVCache {
			lay, files, err := exportKV(&o, T, g, meta)
			if err != nil {
				return nil, fmt.Errorf("export: length %d: %w", T, err)
			}
			man.Files = append(man.Files, files...)
			man.KVCache = manifest.NewKVCache(lay.Layers, lay.Heads, lay.HeadSize, lengths)
			for _, f := range files {
				lr.KVBytes += f.Bytes
				if f.Graph != manifest.GraphFull && strings.HasSuffix(f.Path, ".onnx") {
					lr.KVFiles = append(lr.KVFiles, f.Path)
				}
			}
		}
		lr.Seconds = time.Since(t0).Seconds()
		logging.Debug(o.Log, lr.Compiled())
		res.Lengths = append(res.Lengths, lr)
	}
	fj, err := json.Marshal(fold)
	if err != nil {
		return nil, err
	}
	man.Fold = fj
	if err := manifest.Write(o.Out, man); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	res.Manifest = man
	return res, nil
}

// provenance is o.Provenance completed with the export's own facts.
func (o *Options) provenance() *manifest.Provenance {
	p := &manifest.Provenance{}
	if o.Provenance != nil {
		*p = *o.Provenance
	}
	p.Tokenizer, p.EOS = o.Tokenizer, o.EOS
	if p.Commit == "" {
		p.Commit = manifest.BuildCommit()
	}
	p.Fold, p.Attention, p.Precision, p.Quantize = o.Fold.String(), o.Attention.String(), o.DType.String(), ""
	if o.Quantize != onnx.QuantizeNone {
		p.Quantize = o.Quantize.String()
	}
	return p
}

// GraphOptions select the export pipeline's variants.
type GraphOptions struct {
	Fold      passes.FoldMode
	Attention passes.AttentionMode
	// DropBias runs passes.DropFoldedBias right after the fold (see
	// Options.DropBias).
	DropBias bool
	DumpIR   string
	Dump     io.Writer
}

// Graph builds cfg's inference graph for length T and batch B (input
// "input_ids" [B,T], output "logits" [B,T,V]) and runs the export
// pipeline on it with the weights of st. The running statistics of length
// T must be in st when o.Fold is passes.FoldRPAMode (EnsureRunning). With
// AttentionNone or AttentionPlain the result runs on the CPU backend too.
func Graph(cfg *model.Config, T, B int, st *kernels.Store, o GraphOptions) (*ir.Graph, *passes.FoldReport, error) {
	mg, err := model.Build(cfg, model.Opts{T: T, B: B, Mode: model.Eval, Logits: true, NoLoss: true})
	if err != nil {
		return nil, nil, err
	}
	g := mg.Graph
	rep := &passes.FoldReport{}
	eo := &passes.ExportOptions{Store: st, Backend: cpu.New(ir.FP32), Fold: o.Fold, Attention: o.Attention, Report: rep}
	c := &passes.Context{Export: false, DumpAfter: o.DumpIR, Dump: o.Dump, Model: mg.Info(), ExportOptions: eo}
	pipe := passes.ExportPipeline
	if o.DropBias {
		if o.Fold != passes.FoldRPAMode {
			return nil, nil, fmt.Errorf("dropping the bias needs fold %s, not %s", passes.FoldRPAMode, o.Fold)
		}
		pipe = nil
		for _, ps := range passes.ExportPipeline {
			pipe = append(pipe, ps)
			if ps.Name == "fold rpa" {
				pipe = append(pipe, passes.Pass{Name: "drop bias", Fn: func(g *ir.Graph, _ *passes.Context) error {
					_, err := passes.DropFoldedBias(g, rep)
					return err
				}})
			}
		}
	}
	if err := passes.Run(g, pipe, c); err != nil {
		return nil, nil, err
	}
	return g, rep, nil
}

// Lower lowers an export graph to ONNX with the weights of st.
func Lower(g *ir.Graph, st *kernels.Store, o onnx.Options) (*onnxpb.ModelProto, error) {
	return onnx.Lower(g, storeWeights(st), o)
}

// storeWeights supplies the lowering with the tensors of st.
func storeWeights(st *kernels.Store) onnx.WeightFunc {
	return func(v *ir.Value) ([]float32, error) {
		t := st.Get(v.Name)
		if t == nil {
			return nil, fmt.Errorf("%s %q is not in the checkpoint", v.Kind, v.Name)
		}
		if !t.Shape.Equal(v.Shape) {
			return nil, fmt.Errorf("%s %q has shape %v in the checkpoint, the model wants %v", v.Kind, v.Name, t.Shape, v.Shape)
		}
		if t.F32 != nil {
			return t.F32, nil
		}
		return t.Float32s(), nil
	}
}

// EnsureRunning makes sure st holds running statistics of length T for
// every layer: trained ones (from the checkpoint) are kept; otherwise they
// are calibrated on ids (nb batches of b sequential chunks of T tokens, run
// through the eval graph with batch statistics) and written into st. It
// reports whether it calibrated.
func EnsureRunning(cfg *model.Config, T int, st *kernels.Store, trained func(string) bool, ids []int32, nb, b int) (bool, error) {
	bufs, err := model.RunningBuffers(cfg, T)
	if err != nil {
		return false, err
	}
	var missing []string
	for name := range bufs {
		t := st.Get(name)
		ok := t != nil
		if ok && trained != nil {
			ok = trained(name)
		}
		if !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return false, nil
	}
	sort.Strings(missing)
	if len(ids) == 0 {
		return false, fmt.Errorf("the checkpoint has no running statistics for length %d (%s); calibrate them on data: pass --calib-batches N with --data-dir (or export a length the model was trained at)",
			T, strings.Join(missing, ", "))
	}
	nb = max(nb, 1)
	b = max(b, 1)
	chunks := (len(ids) - 1) / T
	if chunks < 1 {
		return false, fmt.Errorf("calibration data has %d tokens, fewer than one chunk of %d+1", len(ids), T)
	}
	b = min(b, chunks)
	nb = min(nb, chunks/b)
	batches := make([][]int32, nb)
	for k := range batches {
		batches[k] = append([]int32(nil), ids[k*b*T:(k+1)*b*T]...)
	}
	mg, err := model.Build(cfg, model.Opts{T: T, B: b, Mode: model.Eval, BatchStats: true, NoLoss: true})
	if err != nil {
		return false, err
	}
	g, specs := mg.Graph, mg.Specs
	for _, s := range specs {
		if st.Get(s.Name) == nil && s.Param {
			return false, fmt.Errorf("parameter %s is not in the checkpoint", s.Name)
		}
	}
	// Buffers of the calibration graph that the checkpoint lacks (a
	// bias_scale in a hand-made store) take their initial values.
	if err := model.InitStore(specs, st, 0); err != nil {
		return false, err
	}
	if err := passes.Run(g, passes.EvalPipeline, &passes.Context{}); err != nil {
		return false, err
	}
	if err := passes.Calibrate(g, cpu.New(ir.FP32), st, batches, bufs); err != nil {
		return false, err
	}
	return true, nil
}
