// Package inferbench measures exported models in onnxruntime: it exports
// every case of a benchmark (preset × model × fold × attention × precision)
// from random weights, times the cases in alternating blocks, and
// summarises the runs with golang.org/x/perf's benchmath (medians, their
// confidence intervals, Mann-Whitney tests). It reports a table, JSON, and
// Go's benchmark format for benchstat, and what the folded prior costs:
// the fuzzy model with its folded bias against the same graph without it.
// rpac bench infer is its command line.
package inferbench

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/internal/logging"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu/blas"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
)

// FoldNoBias is the fold label of the fuzzy model folded with rpa and its
// folded bias dropped (export.Options.DropBias): the same graph without
// the prior, the reference the prior's cost is measured against. rpac
// export has no such mode.
const FoldNoBias = "nobias"

// FoldControl labels a second, identical session of the folded model
// (Config.Control): its difference from the first is what two sessions of
// one model differ by on this machine, the noise floor of the prior's cost.
const FoldControl = "rpa#2"

// foldBaseline is the fold label of the baseline model (it has no prior).
const foldBaseline = "-"

// Config describes a benchmark.
type Config struct {
	Presets    []model.Preset
	Models     []model.Kind
	Folds      []string // fold labels of the fuzzy model: fold modes (passes.ParseFold), FoldNoBias
	Attentions []passes.AttentionMode
	DTypes     []string // fp32, fp16, bf16, int8
	Length     int      // 0: each preset's first training context
	Batch      int      // sequences per run
	Runs       int      // timed runs per case
	Block      int      // timed runs per case in one block
	Control    bool     // also time FoldControl
	Threads    int      // onnxruntime intra-op threads (0: one per core)
	Provider   string
	GEMMTime   time.Duration // GEMM peak measurement (0: none)
	Work       string        // folder for the exports
	Log        *slog.Logger
}

// Check checks the lists and counts of c.
func (c *Config) Check() error {
	if c.Batch < 1 || c.Runs < 1 || c.Block < 1 || c.Length < 0 || c.Threads < 0 {
		return fmt.Errorf("--batch, --runs and --block must be positive, --length and --threads not negative")
	}
	for _, f := range c.Folds {
		if _, _, err := exportFold(f); err != nil {
			return fmt.Errorf("%w (or %s)", err, FoldNoBias)
		}
	}
	for _, d := range c.DTypes {
		if _, _, err := Precision(d); err != nil {
			return err
		}
	}
	for _, a := range c.Attentions {
		if a != passes.AttentionPlain && a != passes.AttentionOp && a != passes.AttentionOpPadded {
			return fmt.Errorf("--attention %s: want plain, op or op8", a)
		}
	}
	return nil
}

// Precision maps a dtype of Config.DTypes to the export's precision and
// quantization.
func Precision(d string) (ir.Precision, onnx.Quantize, error) {
	if d == "int8" {
		return ir.FP32, onnx.QuantizeInt8, nil
	}
	p, err := ir.ParsePrecision(d)
	if err != nil || d == "" {
		return ir.FP32, onnx.QuantizeNone, fmt.Errorf("--dtype %q: want fp32, fp16, bf16 or int8", d)
	}
	return p, onnx.QuantizeNone, nil
}

// Report is what a benchmark measured.
type Report struct {
	Rows  []Row
	Costs []PriorCost
	// Loads are the 1-minute load averages read at every block; Load0
	// and Load1 before and after the timed runs.
	Loads        []float64
	Load0, Load1 string
	Peak         float64 // GEMM GFLOP/s measured in the same run (0: none)
	Runs         map[string][]time.Duration
}

// Run runs the benchmark: one preset at a time (its cases alternate among
// themselves and are closed before the next preset's are opened), then
// the GEMM peak.
func Run(ctx context.Context, c Config) (*Report, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	rep := &Report{Load0: LoadAvg(), Runs: map[string][]time.Duration{}}
	for _, p := range c.Presets {
		if err := runPreset(ctx, &c, p, rep); err != nil {
			return nil, err
		}
	}
	rep.Load1 = LoadAvg()
	if c.GEMMTime > 0 {
		var err error
		if rep.Peak, err = blas.Measure(2048, "f32", c.GEMMTime); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// runPreset exports and times the cases of one preset and adds their
// rows, the prior's cost per attention lowering and the load averages to
// rep.
func runPreset(ctx context.Context, c *Config, p model.Preset, rep *Report) error {
	T := c.Length
	if T == 0 {
		T = p.Contexts[0]
	}
	cases, err := prepareCases(ctx, c, p, T)
	defer func() {
		for _, cs := range cases {
			cs.m.Close()
		}
	}()
	if err != nil {
		return err
	}
	rounds := (c.Runs + c.Block - 1) / c.Block
	if err := timeBlocks(ctx, c, cases, rounds, rep); err != nil {
		return err
	}
	for _, cs := range cases {
		r := cs.row()
		rep.Rows = append(rep.Rows, r)
		rep.Runs[r.Name()] = cs.times
	}
	for _, att := range c.Attentions {
		if pc, ok := priorCost(cases, p.Name, att, T, rounds); ok {
			rep.Costs = append(rep.Costs, pc)
		}
	}
	return nil
}

// timeBlocks times the cases in blocks: each case runs a block of runs
// (the first untimed: it wakes the case's onnxruntime threads while the
// previous case's threads stop spinning), and the blocks of all cases
// alternate, in an order that reverses from one round to the next, so
// that a background load that comes and goes hits all of them alike.
func timeBlocks(ctx context.Context, c *Config, cases []*benchCase, rounds int, rep *Report) error {
	for k := range rounds {
		per := min(c.Block, c.Runs-k*c.Block)
		if l, err := strconv.ParseFloat(LoadAvg(), 64); err == nil {
			rep.Loads = append(rep.Loads, l)
		}
		for j := range cases {
			cs := cases[j]
			if k%2 == 1 {
				cs = cases[len(cases)-1-j]
			}
			if err := cs.block(ctx, k, per); err != nil {
				return err
			}
		}
	}
	return nil
}

// prepareCases exports the cases of one preset: per attention lowering
// the fuzzy folds side by side, then the baseline, so that the two models
// the prior's cost compares run next to each other in every block.
func prepareCases(ctx context.Context, c *Config, p model.Preset, T int) ([]*benchCase, error) {
	type built struct {
		cfg model.Config
		st  *kernels.Store
	}
	var models []built
	for _, kind := range c.Models {
		cfg := p.Config
		cfg.Model = kind
		if T > cfg.MaxLen {
			return nil, fmt.Errorf("--length %d exceeds the %s preset's maximum length %d", T, p.Name, cfg.MaxLen)
		}
		st, err := RandomStore(&cfg, 1, T)
		if err != nil {
			return nil, err
		}
		models = append(models, built{cfg, st})
	}
	flops := map[string]int64{}
	var cases []*benchCase
	for _, att := range c.Attentions {
		for i := range models {
			for _, fold := range c.folds(models[i].cfg.Model) {
				for _, dt := range c.DTypes {
					cs, err := prepare(ctx, c, p.Name, &models[i].cfg, models[i].st, fold, att, dt, T, flops)
					if err != nil {
						return cases, err
					}
					cases = append(cases, cs)
					logging.Info(c.Log, ExportEvent{Preset: p.Name, Model: models[i].cfg.Model.String(), Fold: fold, Attention: att.String(), DType: dt, T: T, Nodes: cs.r.Nodes})
				}
			}
		}
	}
	return cases, nil
}

// folds are the fold labels timed for a model: the baseline has none;
// with Control, rpa#2 and rpa lead so that each pair compared is adjacent.
func (c *Config) folds(m model.Kind) []string {
	if m == model.Baseline {
		return []string{foldBaseline}
	}
	rpa := passes.FoldRPAMode.String()
	if !c.Control || !slices.Contains(c.Folds, rpa) {
		return c.Folds
	}
	rest := slices.DeleteFunc(slices.Clone(c.Folds), func(f string) bool { return f == rpa })
	return slices.Insert(rest, 0, FoldControl, rpa)
}

// RandomStore initialises cfg's weights from seed and its eval-mode
// buffers at every length of lengths (running statistics at their initial
// value).
func RandomStore(cfg *model.Config, seed uint64, lengths ...int) (*kernels.Store, error) {
	st := kernels.NewStore(ir.FP32)
	for _, T := range lengths {
		mg, err := model.Build(cfg, model.Opts{T: T, B: 1, Mode: model.Eval, Logits: true, NoLoss: true})
		if err != nil {
			return nil, err
		}
		if err := model.InitStore(mg.Specs, st, seed); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// ExportRandom exports o.Config with random weights (seed 1) at o.Lengths
// to o.Out, with no tokenizer (prompts are token ids) and EOS 0; it fills
// o.Store.
func ExportRandom(ctx context.Context, o export.Options) (*export.Result, error) {
	st, err := RandomStore(&o.Config, 1, o.Lengths...)
	if err != nil {
		return nil, err
	}
	o.Store, o.Tokenizer, o.EOS = st, "none", 0
	return export.Export(ctx, o)
}

// benchCase is one exported model, opened, and its timed runs.
type benchCase struct {
	r      Row
	m      *runtime.Model
	seqs   [][]int32
	times  []time.Duration
	blocks []int // the block of each timed run
	rounds int
}

// block runs the case once untimed and per times timed, in block k.
func (cs *benchCase) block(ctx context.Context, k, per int) error {
	cs.rounds = max(cs.rounds, k+1)
	for i := -1; i < per; i++ {
		t0 := time.Now()
		if _, err := cs.m.Logits(ctx, cs.seqs); err != nil {
			return err
		}
		if i >= 0 {
			cs.times = append(cs.times, time.Since(t0))
			cs.blocks = append(cs.blocks, k)
		}
	}
	return nil
}

func (cs *benchCase) row() Row {
	r := cs.r
	r.Lat = Summarize(cs.times)
	return r
}

// exportFold is the export's fold mode and bias drop of a fold label.
func exportFold(fold string) (passes.FoldMode, bool, error) {
	switch fold {
	case foldBaseline, FoldControl:
		return passes.FoldRPAMode, false, nil
	case FoldNoBias:
		return passes.FoldRPAMode, true, nil
	}
	f, err := passes.ParseFold(fold)
	return f, false, err
}

// prepare exports one case, counts its model FLOPs (cached per model and
// fold in flops) and opens it with random input ids.
func prepare(ctx context.Context, c *Config, preset string, cfg *model.Config, st *kernels.Store, fold string, att passes.AttentionMode, dtype string, T int, flops map[string]int64) (*benchCase, error) {
	prec, quant, err := Precision(dtype)
	if err != nil {
		return nil, err
	}
	r := Row{Preset: preset, Model: cfg.Model.String(), Fold: fold, Attention: att.String(), DType: dtype, T: T, B: c.Batch}
	ef, drop, err := exportFold(fold)
	if err != nil {
		return nil, err
	}
	dir := fmt.Sprintf("%s/%s_%v_%s_%v_L%d", c.Work, preset, cfg.Model, strings.NewReplacer("-", "", "#", "_").Replace(fold), att, T)
	if dtype != "fp32" {
		dir += "_" + dtype
	}
	res, err := export.Export(ctx, export.Options{Config: *cfg, Store: st, Lengths: []int{T}, Batch: c.Batch,
		Fold: ef, DropBias: drop, Attention: att, DType: prec, Quantize: quant, Out: dir, Tokenizer: "none", EOS: 0})
	if err != nil {
		return nil, err
	}
	r.Bytes, r.Nodes = res.Lengths[0].Bytes, res.Lengths[0].Nodes
	if r.Flops, err = modelFlops(cfg, T, c.Batch, st, ef, drop, flops); err != nil {
		return nil, err
	}
	m, err := runtime.OpenContext(ctx, dir, runtime.Options{Provider: c.Provider, Threads: c.Threads})
	if err != nil {
		return nil, err
	}
	return &benchCase{r: r, m: m, seqs: randomSeqs(c.Batch, T, cfg.Vocab)}, nil
}

// modelFlops counts the matrix products of the inference graph, attention
// spelled out (FusedAttention hides its two products from Flops).
func modelFlops(cfg *model.Config, T, B int, st *kernels.Store, fold passes.FoldMode, drop bool, cache map[string]int64) (int64, error) {
	key := fmt.Sprintf("%v/%v/%v", cfg.Model, fold, drop)
	if f, ok := cache[key]; ok {
		return f, nil
	}
	g, _, err := export.Graph(cfg, T, B, st, export.GraphOptions{Fold: fold, DropBias: drop, Attention: passes.AttentionNone})
	if err != nil {
		return 0, err
	}
	cache[key] = passes.Flops(g)
	return cache[key], nil
}

func randomSeqs(B, T, vocab int) [][]int32 {
	rng := rand.New(rand.NewPCG(7, uint64(T)))
	seqs := make([][]int32, B)
	for i := range seqs {
		seqs[i] = make([]int32, T)
		for t := range seqs[i] {
			seqs[i][t] = int32(rng.IntN(vocab))
		}
	}
	return seqs
}

// LoadAvg is the 1-minute load average ("?" where it cannot be read).
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}
