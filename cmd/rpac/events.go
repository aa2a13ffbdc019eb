package main

import (
	"fmt"
	"github.com/rpac-dev/rpac/compiler/export"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/internal/logging"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/training"
)

// The result events of the commands, written on stdout (see logs.go): one
// line each for people, one JSON object each with --log-format json.

// failedEvent is a command that failed ("error", on stderr).
type failedEvent struct {
	_   logging.Name `log:"error"`
	Err string       `log:"err"`
}

func (e failedEvent) Text() string { return "rpac: " + e.Err }

// trainedEvent ends a training run ("train.done"). NaN fields did not
// happen in this invocation and are left out.
type trainedEvent struct {
	_               logging.Name `log:"train.done"`
	Steps, Params   int
	FirstCE, LastCE float64 // this invocation's first and last train CE
	ValCE           float64
	EMACE, SWACE    float64
	SWAMembers      int
	Recall          float64 // NaN or RecallN 0: no recall
	RecallN         int
	TokensPerS      float64
	Out             string
}

// alreadyFinishedEvent: a finished run was resumed with no more steps to
// train ("train.finished").
type alreadyFinishedEvent struct {
	_     logging.Name `log:"train.finished"`
	Out   string       `log:"run"`
	Steps int          `log:"steps"`
	ValCE float64      `log:"val_ce,omitnan"` // the last evaluation's; NaN when none ran
}

func (e alreadyFinishedEvent) Text() string {
	s := fmt.Sprintf("the run in %s already finished at step %d; nothing to train", e.Out, e.Steps)
	if !math.IsNaN(e.ValCE) {
		s += fmt.Sprintf(" (last eval CE %.4f, ppl %.1f)", e.ValCE, math.Exp(e.ValCE))
	}
	return s + "; pass a larger --steps to train further"
}

func (e trainedEvent) Attrs() []slog.Attr {
	a := []slog.Attr{slog.Int("steps", e.Steps), slog.Int("params", e.Params)}
	for _, f := range []struct {
		key string
		v   float64
	}{{"train_ce_first", e.FirstCE}, {"train_ce", e.LastCE}, {"val_ce", e.ValCE}, {"val_ppl", math.Exp(e.ValCE)},
		{"val_ce_ema", e.EMACE}, {"val_ce_swa", e.SWACE}} {
		if !math.IsNaN(f.v) {
			a = append(a, slog.Float64(f.key, f.v))
		}
	}
	if !math.IsNaN(e.SWACE) {
		a = append(a, slog.Int("swa_count", e.SWAMembers))
	}
	if e.hasRecall() {
		a = append(a, slog.Float64("recall_acc", e.Recall), slog.Int("recall_n", e.RecallN))
	}
	if e.TokensPerS > 0 {
		a = append(a, slog.Float64("tok_per_s", e.TokensPerS))
	}
	return append(a, slog.String("out", e.Out))
}

func (e trainedEvent) hasRecall() bool { return !math.IsNaN(e.Recall) && e.RecallN > 0 }

func (e trainedEvent) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "trained %d steps (%d parameters)", e.Steps, e.Params)
	var parts []string
	if !math.IsNaN(e.FirstCE) {
		parts = append(parts, fmt.Sprintf("train CE %.4f -> %.4f", e.FirstCE, e.LastCE))
	}
	if !math.IsNaN(e.ValCE) {
		parts = append(parts, fmt.Sprintf("final eval CE %.4f (ppl %.1f)", e.ValCE, math.Exp(e.ValCE)))
	}
	if !math.IsNaN(e.EMACE) {
		parts = append(parts, fmt.Sprintf("EMA %.4f", e.EMACE))
	}
	if e.hasRecall() {
		parts = append(parts, fmt.Sprintf("recall %.4f (%d answers)", e.Recall, e.RecallN))
	}
	if !math.IsNaN(e.SWACE) {
		parts = append(parts, fmt.Sprintf("SWA %.4f (%d members)", e.SWACE, e.SWAMembers))
	}
	if e.TokensPerS > 0 {
		parts = append(parts, fmt.Sprintf("%.0f tokens/s", e.TokensPerS))
	}
	if len(parts) > 0 {
		b.WriteString(": " + strings.Join(parts, ", "))
	}
	b.WriteString("; run in " + e.Out)
	return b.String()
}

// initialisedEvent: `rpac train --steps 0` wrote the initial checkpoint
// ("train.init").
type initialisedEvent struct {
	_      logging.Name `log:"train.init"`
	Params int
	Out    string
}

func (e initialisedEvent) Attrs() []slog.Attr {
	return []slog.Attr{slog.Int("params", e.Params), slog.Int("step", 0), slog.String("out", e.Out)}
}

func (e initialisedEvent) Text() string {
	return fmt.Sprintf("wrote the initial checkpoint (%d parameters, step 0) to %s", e.Params, e.Out)
}

// exportedEvent summarises an export ("export.done").
type exportedEvent struct {
	_         logging.Name         `log:"export.done"`
	Model     model.Kind           `log:"model,string"`
	Weights   training.WeightSet   `log:"weights,string"`
	Step      int                  `log:"step"`
	Dir       string               `log:"dir"`
	Manifest  string               `log:"manifest"`
	Lengths   []int                `log:"lengths"`
	Seconds   float64              `log:"seconds"`
	Fold      passes.FoldMode      `log:"fold,string"`
	Attention passes.AttentionMode `log:"attention,string"`
	Batch     int                  `log:"batch"`
	DType     ir.Precision         `log:"dtype,string"`
	Quantize  onnx.Quantize        `log:"quantize,string,omitempty"` // onnx.QuantizeNone is left out
	KVCache   bool                 `log:"kv_cache,omitempty"`
}

func (e exportedEvent) Text() string {
	extra := ""
	if e.DType.Reduced() {
		extra += ", dtype " + e.DType.String()
	}
	if e.Quantize != onnx.QuantizeNone {
		extra += ", quantized " + e.Quantize.String()
	}
	return fmt.Sprintf("exported %s model (%s weights, step %d) to %s in %.1fs: fold %s, attention %s, batch %d%s",
		e.Model, e.Weights, e.Step, e.Dir, e.Seconds, e.Fold, e.Attention, e.Batch, extra)
}

// exportedLengthEvent is one length's graphs ("export.length"): the
// export's CompiledEvent and how it was calibrated.
type exportedLengthEvent struct {
	_ logging.Name `log:"export.length"`
	export.CompiledEvent
	Calibrated   bool     `log:"calibrated,omitempty"`
	CalibBatches int      `log:"calib_batches,with=Calibrated"`
	CalibBatch   int      `log:"calib_batch,with=Calibrated"`
	CalibSource  string   `log:"calib_source,with=Calibrated"`
	KVFiles      []string `log:"kv_files,omitempty"`
	KVBytes      int64    `log:"kv_bytes,with=KVFiles"`
}

func (e exportedLengthEvent) Text() string {
	s := fmt.Sprintf("  L=%d  %s  %.1f MiB  %d nodes  %.1fs", e.T, e.File, float64(e.Bytes)/(1<<20), e.Nodes, e.Seconds)
	if e.Calibrated {
		s += fmt.Sprintf(", running statistics calibrated on %d×%d chunks (%s)", e.CalibBatches, e.CalibBatch, e.CalibSource)
	}
	if len(e.KVFiles) > 0 {
		s += fmt.Sprintf("; KV cache: %s  %.1f MiB", strings.Join(e.KVFiles, ", "), float64(e.KVBytes)/(1<<20))
	}
	return s
}

// foldLayerEvent is one layer's folded prior at one length ("export.fold").
type foldLayerEvent struct {
	_ logging.Name `log:"export.fold"`
	passes.FoldLayer
}

func (e foldLayerEvent) Attrs() []slog.Attr {
	a := []slog.Attr{slog.Int("T", e.T), slog.Int("layer", e.Layer), slog.Float64("bias_min", e.Min), slog.Float64("bias_max", e.Max),
		slog.Float64("bias_mean", e.Mean), slog.Float64("clip_frac", e.ClipFrac), slog.Float64("clip", e.Clip)}
	if e.Rank > 0 {
		a = append(a, slog.Int("rank", e.Rank), slog.Float64("rank_err", e.RankErr))
	}
	return a
}

func (e foldLayerEvent) Text() string {
	rank := ""
	if e.Rank > 0 {
		rank = fmt.Sprintf("  rank form: %d extra q/k components, max deviation %.1e", e.Rank, e.RankErr)
	}
	return fmt.Sprintf("    layer %2d  bias [%+.3f, %+.3f] mean %+.3f  clipped %.2f%% (|x| > %g)%s", e.Layer, e.Min, e.Max, e.Mean, 100*e.ClipFrac, e.Clip, rank)
}

// exportNoteEvent is advice about an export ("export.note").
type exportNoteEvent struct {
	_    logging.Name `log:"export.note"`
	Note string       `log:"note"`
}

func (e exportNoteEvent) Text() string { return "  note: " + e.Note }

// verifyEvent starts `export --verify`'s report ("export.verify").
type verifyEvent struct {
	_        logging.Name `log:"export.verify"`
	Split    string       `log:"split"`
	Protocol string       `log:"protocol"`
}

func (e verifyEvent) Text() string { return fmt.Sprintf("verify on %s (%s):", e.Split, e.Protocol) }

// verifyLimitsEvent ends a passing `export --verify` with the limits it
// held ("export.verify_limits").
type verifyLimitsEvent struct {
	_ logging.Name `log:"export.verify_limits"`
	export.VerifyLimits
}

func (e verifyLimitsEvent) Attrs() []slog.Attr {
	return []slog.Attr{slog.Float64("max_kl", e.MaxKL), slog.Float64("max_ce_cost", e.MaxCECost), slog.Float64("max_abs_logit_diff", e.MaxAbsDiff)}
}

func (e verifyLimitsEvent) Text() string {
	return fmt.Sprintf("  within the limits: mean KL %g, CE cost %g nats, max |Δlogit| %g", e.MaxKL, e.MaxCECost, e.MaxAbsDiff)
}

// verifiedEvent is one length's check against the Go executor
// ("export.verified").
type verifiedEvent struct {
	_ logging.Name `log:"export.verified"`
	export.VerifyResult
}

func (e verifiedEvent) Attrs() []slog.Attr {
	a := []slog.Attr{slog.Int("T", e.T), slog.Int("tokens", e.Tokens), slog.Int("batches", e.Batches), slog.Int("batch", e.Batch),
		slog.Float64("max_abs_logit_diff", e.MaxAbsDiff), slog.Float64("mean_kl", e.MeanKL), slog.Float64("ce_onnxruntime", e.CEExport), slog.Float64("ce_go_eval", e.CEEval),
		slog.Float64("export_cost", e.CEExport-e.CEEval), slog.Float64("ce_batch_stats", e.CEBatchStats)}
	if e.KVSteps > 0 {
		a = append(a, slog.Int("kv_steps", e.KVSteps), slog.Float64("kv_max_abs_logit_diff", e.KVMaxAbsDiff))
	}
	return a
}

func (e verifiedEvent) Text() string {
	s := fmt.Sprintf("  L=%d  %d tokens (%d×%d)  max|Δlogit| %.2e  KL %.1e  CE onnxruntime %.5f  CE Go eval %.5f (export cost %+.5f nats)  CE batch-stats (paper's way) %.5f",
		e.T, e.Tokens, e.Batches, e.Batch, e.MaxAbsDiff, e.MeanKL, e.CEExport, e.CEEval, e.CEExport-e.CEEval, e.CEBatchStats)
	if e.KVSteps > 0 {
		s += fmt.Sprintf("; KV cache: %d decode steps, max|Δlogit| %.2e", e.KVSteps, e.KVMaxAbsDiff)
	}
	return s
}

// tritonEvent summarises a Triton model repository ("export.triton").
type tritonEvent struct {
	_         logging.Name         `log:"export.triton"`
	Out       string               `log:"dir"`
	Seconds   float64              `log:"seconds"`
	Fold      passes.FoldMode      `log:"fold,string"`
	Attention passes.AttentionMode `log:"attention,string"`
}

func (e tritonEvent) Text() string {
	return fmt.Sprintf("wrote a Triton model repository to %s in %.1fs (fold %s, attention %s):", e.Out, e.Seconds, e.Fold, e.Attention)
}

// hfEvent is what --format hf wrote ("export.hf").
type hfEvent struct {
	_         logging.Name         `log:"export.hf"`
	Out       string               `log:"dir"`
	T         int                  `log:"T"`
	Files     string               `log:"files"`
	Bytes     int64                `log:"bytes"`
	Nodes     int                  `log:"nodes"`
	Seconds   float64              `log:"seconds"`
	Fold      passes.FoldMode      `log:"fold,string"`
	Attention passes.AttentionMode `log:"attention,string"`
}

func (e hfEvent) Text() string {
	return fmt.Sprintf("wrote the Hugging Face layout to %s in %.1fs (L %d, fold %s, attention %s; decoder %d nodes, %d bytes): %s",
		e.Out, e.Seconds, e.T, e.Fold, e.Attention, e.Nodes, e.Bytes, e.Files)
}

// tritonModelEvent is one model of the repository ("export.triton.model").
type tritonModelEvent struct {
	_ logging.Name `log:"export.triton.model"`
	export.TritonModel
}

func (e tritonModelEvent) Attrs() []slog.Attr {
	return []slog.Attr{slog.String("model", e.Name), slog.Int("T", e.T), slog.Int64("bytes", e.Bytes), slog.Int("nodes", e.Nodes), slog.String("config", e.Config)}
}

func (e tritonModelEvent) Text() string {
	return fmt.Sprintf("  %s  L=%d  %.1f MiB  %d nodes  %s", e.Name, e.T, float64(e.Bytes)/(1<<20), e.Nodes, e.Config)
}

// tritonServeEvent says how to serve the repository ("export.triton.serve").
type tritonServeEvent struct {
	_       logging.Name `log:"export.triton.serve"`
	Command string       `log:"command"`
}

func (e tritonServeEvent) Text() string { return "serve it with: " + e.Command }

// evaluatedEvent is `rpac eval`'s score ("eval.done").
type evaluatedEvent struct {
	_                     logging.Name `log:"eval.done"`
	Data                  string       // e.g. "wikitext2 valid"
	T, Chunks, Tokens     int
	CE                    float64
	ModelTokPerS, TokPerS float64
	Runtime, Provider     string
}

func (e evaluatedEvent) Attrs() []slog.Attr {
	return []slog.Attr{slog.String("data", e.Data), slog.Int("T", e.T), slog.Int("chunks", e.Chunks), slog.Int("tokens", e.Tokens),
		slog.Float64("ce", e.CE), slog.Float64("ppl", math.Exp(e.CE)), slog.Float64("model_tok_per_s", e.ModelTokPerS),
		slog.Float64("tok_per_s", e.TokPerS), slog.String("onnxruntime", e.Runtime), slog.String("provider", e.Provider)}
}

func (e evaluatedEvent) Text() string {
	return fmt.Sprintf("%s, L=%d, %d chunks (%d tokens): CE %.4f nats, perplexity %.2f; %.0f tokens/s in the model (onnxruntime %s, %s), %.0f tokens/s with scoring",
		e.Data, e.T, e.Chunks, e.Tokens, e.CE, math.Exp(e.CE), e.ModelTokPerS, e.Runtime, e.Provider, e.TokPerS)
}

// servingEvent: rpac serve listens ("serve.start").
type servingEvent struct {
	_             logging.Name  `log:"serve.start"`
	Model         string        `log:"model"`
	Dir           string        `log:"dir"`
	Lengths       []int         `log:"lengths"`
	Batch         int           `log:"batch"`
	URL           string        `log:"url"`
	MaxBatch      int           `log:"max_batch"`
	MaxWait       time.Duration `log:"max_wait_s,seconds"`
	Queue         int           `log:"queue"`
	Tokenizer     string        `log:"tokenizer"`                  // the manifest's
	Tokenizes     bool          `log:"text_prompts"`               // false: prompts must be token ids
	KVCacheLength []int         `log:"kv_cache_lengths,omitempty"` // nil: completions recompute the context
	// Weights and Step say which weights are served (the export's
	// provenance; "" and 0 when it records none).
	Weights string `log:"weights,omitempty"`
	Step    int    `log:"step,with=Weights"`
}

func (e servingEvent) Text() string {
	s := fmt.Sprintf("serving %s (%s, lengths %v, graph batch %d) on %s: max batch %d, max wait %v, queue %d",
		e.Model, e.Dir, e.Lengths, e.Batch, e.URL, e.MaxBatch, e.MaxWait, e.Queue)
	if len(e.KVCacheLength) > 0 {
		s += fmt.Sprintf("; completions decode on the KV cache (lengths %v)", e.KVCacheLength)
	} else {
		s += "; completions recompute the whole context at every step (export with --kv-cache to decode on a cache)"
	}
	if !e.Tokenizes {
		s += fmt.Sprintf("; tokenizer %q: prompts must be token ids", e.Tokenizer)
	}
	return s
}

// stoppedEvent: rpac serve stopped ("serve.stop").
type stoppedEvent struct {
	_     logging.Name  `log:"serve.stop"`
	After time.Duration `log:"uptime_s,seconds"`
}

func (e stoppedEvent) Text() string {
	return fmt.Sprintf("stopped after %v", e.After.Round(time.Second))
}
