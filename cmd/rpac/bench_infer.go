package main

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	goruntime "runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/internal/logging"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu/blas"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/urfave/cli/v2"
)

// foldNoBias is the benchmark's fold label of the fuzzy model folded with
// rpa and its folded bias dropped (export.Options.DropBias): the same
// graph without the prior, the reference the prior's cost is measured
// against. rpac export has no such mode.
const foldNoBias = "nobias"

// foldControl labels a second, identical session of the folded model
// (--control): its difference from the first is what two sessions of one
// model differ by on this machine, the noise floor of the prior's cost.
const foldControl = "rpa#2"

func benchInferCommand() *cli.Command {
	return &cli.Command{
		Name: "infer",
		Usage: "latency (p50/p95, mean of the fastest half), tokens/s and achieved GFLOP/s of exported models in onnxruntime (CPU), " +
			"the folded prior's cost (fuzzy with against without its folded bias) and the GEMM peak measured in the same run",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "preset", Value: "tiny,paper", Usage: "comma-separated presets (" + strings.Join(model.PresetNames(), ", ") + ")"},
			&cli.StringFlag{Name: "model", Value: "fuzzy,baseline", Usage: "comma-separated: fuzzy, baseline"},
			&cli.StringFlag{Name: "fold", Value: passes.FoldRPAMode + "," + foldNoBias,
				Usage: "comma-separated fold modes for the fuzzy model: rpa (folded bias), rank or rank-approx (the prior as extra query/key components), nobias (the same folded graph with its bias dropped; benchmark only), none (RPA computed in the graph)"},
			&cli.StringFlag{Name: "attention", Value: passes.DefaultAttention, Usage: "comma-separated attention lowerings: plain, op, op8 (op with padded heads)"},
			&cli.StringFlag{Name: "dtype", Value: "fp32", Usage: "comma-separated precisions: fp32, fp16, bf16 (rpac export --dtype), int8 (rpac export --quantize int8)"},
			&cli.StringFlag{Name: "json", Usage: "also write the rows as JSON to this file"},
			&cli.IntFlag{Name: "length", Usage: "context length T (default: each preset's first training context)"},
			&cli.IntFlag{Name: "batch", Value: 1, Usage: "sequences per run"},
			&cli.IntFlag{Name: "runs", Value: 60, Usage: "timed runs per model"},
			&cli.IntFlag{Name: "block", Value: 3, Usage: "timed runs per model in one block; blocks alternate between the models (each block after one untimed run)"},
			&cli.BoolFlag{Name: "control", Usage: "also time a second session of the folded model (fold rpa#2) and report its difference from the first: the noise floor of the prior's cost"},
			&cli.IntFlag{Name: "threads", Usage: "onnxruntime intra-op threads (0: one per core)"},
			&cli.StringFlag{Name: "provider", Value: "cpu", Usage: "cpu|cuda"},
			&cli.DurationFlag{Name: "gemm-time", Value: 3 * time.Second, Usage: "time for the GEMM peak measurement (0: skip)"},
			&cli.StringFlag{Name: "keep", Usage: "keep the exported models under this folder"},
		},
		Action: benchInfer,
	}
}

// latency summarises timed runs.
type latency struct {
	p50, p95, p99, mean time.Duration
	// fast is the mean of the fastest half of the runs: a background load
	// only ever adds time, so the fastest runs are the least disturbed.
	fast time.Duration
	n    int
}

func summarize(ts []time.Duration) latency {
	if len(ts) == 0 {
		return latency{}
	}
	s := append([]time.Duration(nil), ts...)
	sort.Slice(s, func(a, b int) bool { return s[a] < s[b] })
	var total, fast time.Duration
	for _, d := range s {
		total += d
	}
	h := max(1, len(s)/2)
	for _, d := range s[:h] {
		fast += d
	}
	return latency{p50: s[len(s)/2], p95: s[min(len(s)-1, (len(s)*95+99)/100-1)], p99: s[min(len(s)-1, (len(s)*99+99)/100-1)],
		mean: total / time.Duration(len(s)), fast: fast / time.Duration(h), n: len(s)}
}

type inferRow struct {
	preset, model, fold, attention string
	dtype                          string // "fp32", "fp16", "bf16" or "int8"
	T, B                           int
	lat                            latency
	// halves: the runs of the first and of the second half of the blocks,
	// two repeats of the measurement whose p50s differ by the noise.
	half  [2]latency
	flops int64
	bytes int64
	nodes int
}

// noise is the p50 spread between the two halves of the blocks, in % of
// the p50 of all runs.
func (r inferRow) noise() float64 {
	if r.half[0].n == 0 || r.half[1].n == 0 || r.lat.p50 == 0 {
		return math.NaN()
	}
	return 100 * math.Abs(float64(r.half[0].p50-r.half[1].p50)) / float64(r.lat.p50)
}

// diff is the relative latency difference of two models timed in the
// same blocks, (a − b)/b in %, by several estimators.
type diff struct {
	p50, fast float64
	paired    float64    // median over blocks of the ratio of the two models' block medians, − 1
	halves    [2]float64 // p50 difference within each half of the blocks
}

func compare(a, b *inferCase, rounds int) diff {
	ra, rb := a.row(rounds), b.row(rounds)
	pct := func(x, y time.Duration) float64 { return 100 * (float64(x) - float64(y)) / float64(y) }
	d := diff{p50: pct(ra.lat.p50, rb.lat.p50), fast: pct(ra.lat.fast, rb.lat.fast)}
	for h := range d.halves {
		d.halves[h] = math.NaN()
		if ra.half[h].n > 0 && rb.half[h].n > 0 {
			d.halves[h] = pct(ra.half[h].p50, rb.half[h].p50)
		}
	}
	var ratios []float64
	for k := 0; k < rounds; k++ {
		x, y := summarize(a.blockTimes(k)), summarize(b.blockTimes(k))
		if x.n > 0 && y.n > 0 {
			ratios = append(ratios, float64(x.p50)/float64(y.p50))
		}
	}
	sort.Float64s(ratios)
	d.paired = 100 * (ratios[len(ratios)/2] - 1)
	return d
}

func (d diff) String() string {
	return fmt.Sprintf("%+.2f%% p50, %+.2f%% fast½, %+.2f%% paired (median per block), halves %+.2f%% / %+.2f%%",
		d.p50, d.fast, d.paired, d.halves[0], d.halves[1])
}

// priorCost compares the fuzzy model with its folded bias (rpa) and the
// same model without it (nobias), timed in the same blocks.
type priorCost struct {
	preset, attention string
	T                 int
	with, without     inferRow
	baseline          *inferRow
	cost              diff  // with against without
	control           *diff // a second session of the folded model against the first (--control)
	pooled            *diff // both sessions of the folded model against without (--control)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func benchInfer(c *cli.Context) error {
	if c.Args().Len() > 0 {
		return fmt.Errorf("unexpected arguments: %v", c.Args().Slice())
	}
	if c.Int("batch") < 1 || c.Int("runs") < 1 || c.Int("block") < 1 || c.Int("length") < 0 || c.Int("threads") < 0 {
		return fmt.Errorf("--batch, --runs and --block must be positive, --length and --threads not negative")
	}
	if err := runtime.Available(); err != nil {
		return err
	}
	for _, m := range splitList(c.String("model")) {
		if m != "fuzzy" && m != "baseline" {
			return fmt.Errorf("--model %q: want fuzzy or baseline", m)
		}
	}
	for _, f := range splitList(c.String("fold")) {
		if f != passes.FoldRPAMode && f != passes.FoldNoneMode && f != foldNoBias && f != passes.FoldRankMode && f != passes.FoldRankApproxMode {
			return fmt.Errorf("--fold %q: want rpa, rank, rank-approx, nobias or none", f)
		}
	}
	for _, d := range splitList(c.String("dtype")) {
		if _, _, err := benchPrecision(d); err != nil {
			return err
		}
	}
	for _, a := range splitList(c.String("attention")) {
		if a != passes.AttentionPlain && a != passes.AttentionOp && a != passes.AttentionOpPadded {
			return fmt.Errorf("--attention %q: want plain or op", a)
		}
	}
	var presets []model.Preset
	for _, name := range splitList(c.String("preset")) {
		p, err := model.LookupPreset(name)
		if err != nil {
			return err
		}
		presets = append(presets, p)
	}
	work := c.String("keep")
	if work == "" {
		dir, err := os.MkdirTemp("", "rpac-bench-infer")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		work = dir
	}
	w := c.App.Writer
	load0 := loadAvg()
	var rows []inferRow
	var costs []priorCost
	var loads []float64
	// One preset at a time: its models alternate among themselves and are
	// closed before the next preset's are opened.
	for _, p := range presets {
		r, pc, l, err := benchPreset(c, work, p)
		if err != nil {
			return err
		}
		rows = append(rows, r...)
		costs = append(costs, pc...)
		loads = append(loads, l...)
	}
	load1 := loadAvg()
	var peak float64
	if d := c.Duration("gemm-time"); d > 0 {
		var err error
		if peak, err = blas.Measure(2048, "f32", d); err != nil {
			return err
		}
	}
	printInferRows(w, rows, peak, c.Int("threads"), c.Int("block"), c.String("provider"))
	if f := c.String("json"); f != "" {
		if err := writeInferJSON(f, rows, c.String("provider")); err != nil {
			return err
		}
	}
	printPriorCosts(w, costs)
	fmt.Fprintf(w, "load average (1 min) before the timed runs %s, during them %s, after %s (this benchmark itself keeps about %d runnable)\n",
		load0, loadRange(loads), load1, benchThreads(c.Int("threads")))
	return nil
}

// benchPreset exports and times the models of one preset; it returns their
// rows, the prior's cost per attention lowering and the load averages read
// at every block.
func benchPreset(c *cli.Context, work string, p model.Preset) ([]inferRow, []priorCost, []float64, error) {
	var cases []*inferCase
	defer func() {
		for _, ic := range cases {
			ic.m.Close()
		}
	}()
	T := c.Int("length")
	if T == 0 {
		T = p.Contexts[0]
	}
	type built struct {
		cfg model.Config
		st  *kernels.Store
	}
	var models []built
	for _, mname := range splitList(c.String("model")) {
		cfg := p.Config
		cfg.Model = mname
		if T > cfg.MaxLen {
			return nil, nil, nil, fmt.Errorf("--length %d exceeds the %s preset's maximum length %d", T, p.Name, cfg.MaxLen)
		}
		st, err := randomStore(&cfg, T, 1)
		if err != nil {
			return nil, nil, nil, err
		}
		models = append(models, built{cfg, st})
	}
	// Per attention lowering: the fuzzy folds side by side, then the
	// baseline, so that the two models the prior's cost compares run next
	// to each other in every block.
	flops := map[string]int64{}
	for _, att := range splitList(c.String("attention")) {
		for i := range models {
			b := &models[i]
			folds := splitList(c.String("fold"))
			if b.cfg.Model == "baseline" {
				folds = []string{"-"}
			} else if c.Bool("control") && slices.Contains(folds, passes.FoldRPAMode) {
				// rpa#2, rpa, nobias: each pair compared is adjacent.
				folds = slices.Insert(slices.DeleteFunc(slices.Clone(folds), func(f string) bool { return f == passes.FoldRPAMode }), 0, foldControl, passes.FoldRPAMode)
			}
			for _, fold := range folds {
				for _, dt := range splitList(c.String("dtype")) {
					ic, err := prepareInfer(c, work, p.Name, &b.cfg, b.st, fold, att, dt, T, flops)
					if err != nil {
						return nil, nil, nil, err
					}
					cases = append(cases, ic)
					logging.Info(logger(c), benchExportEvent{Preset: p.Name, Model: b.cfg.Model, Fold: fold, Attention: att, DType: dt, T: T, Nodes: ic.r.nodes})
				}
			}
		}
	}
	// Blocks: each model runs a block of runs (the first untimed: it wakes
	// the model's onnxruntime threads while the previous model's threads
	// stop spinning), and the blocks of all models alternate, in an order
	// that reverses from one round to the next, so that a background load
	// that comes and goes hits all of them alike.
	runs, block := c.Int("runs"), c.Int("block")
	rounds := (runs + block - 1) / block
	var loads []float64
	for k := 0; k < rounds; k++ {
		per := min(block, runs-k*block)
		if l, err := strconv.ParseFloat(loadAvg(), 64); err == nil {
			loads = append(loads, l)
		}
		for j := range cases {
			ic := cases[j]
			if k%2 == 1 {
				ic = cases[len(cases)-1-j]
			}
			for i := -1; i < per; i++ {
				t0 := time.Now()
				if _, err := ic.m.Logits(c.Context, ic.seqs); err != nil {
					return nil, nil, nil, err
				}
				if i >= 0 {
					ic.times = append(ic.times, time.Since(t0))
					ic.blocks = append(ic.blocks, k)
				}
			}
		}
	}
	rows := make([]inferRow, len(cases))
	for i, ic := range cases {
		rows[i] = ic.row(rounds)
	}
	var costs []priorCost
	for _, att := range splitList(c.String("attention")) {
		var with, without, control, base *inferCase
		for _, ic := range cases {
			if ic.r.attention != att || ic.r.dtype != "fp32" {
				continue
			}
			switch {
			case ic.r.model == "baseline":
				base = ic
			case ic.r.fold == passes.FoldRPAMode:
				with = ic
			case ic.r.fold == foldNoBias:
				without = ic
			case ic.r.fold == foldControl:
				control = ic
			}
		}
		if with == nil || without == nil {
			continue
		}
		pc := priorCost{preset: p.Name, attention: att, T: T, with: with.row(rounds), without: without.row(rounds),
			cost: compare(with, without, rounds)}
		if base != nil {
			br := base.row(rounds)
			pc.baseline = &br
		}
		if control != nil {
			d := compare(control, with, rounds)
			pc.control = &d
			both := &inferCase{times: append(slices.Clone(with.times), control.times...), blocks: append(slices.Clone(with.blocks), control.blocks...)}
			d2 := compare(both, without, rounds)
			pc.pooled = &d2
		}
		costs = append(costs, pc)
	}
	return rows, costs, loads, nil
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

func loadRange(ls []float64) string {
	if len(ls) == 0 {
		return "?"
	}
	lo, hi, sum := ls[0], ls[0], 0.0
	for _, l := range ls {
		lo, hi, sum = math.Min(lo, l), math.Max(hi, l), sum+l
	}
	return fmt.Sprintf("%.2f on average (%.2f to %.2f, %d readings)", sum/float64(len(ls)), lo, hi, len(ls))
}

// benchThreads is the number of onnxruntime threads a run keeps busy.
func benchThreads(threads int) int {
	if threads > 0 {
		return threads
	}
	return goruntime.NumCPU()
}

type inferCase struct {
	r      inferRow
	m      *runtime.Model
	seqs   [][]int32
	times  []time.Duration
	blocks []int // the block of each timed run
}

func (ic *inferCase) blockTimes(k int) []time.Duration {
	var out []time.Duration
	for i, b := range ic.blocks {
		if b == k {
			out = append(out, ic.times[i])
		}
	}
	return out
}

func (ic *inferCase) row(rounds int) inferRow {
	r := ic.r
	r.lat = summarize(ic.times)
	if rounds >= 2 {
		var h [2][]time.Duration
		for i, b := range ic.blocks {
			k := 0
			if b >= rounds/2 {
				k = 1
			}
			h[k] = append(h[k], ic.times[i])
		}
		r.half = [2]latency{summarize(h[0]), summarize(h[1])}
	}
	return r
}

// randomStore initialises cfg's weights and its eval-mode buffers at T
// (running statistics at their initial value) from seed.
func randomStore(cfg *model.Config, T int, seed uint64) (*kernels.Store, error) {
	st := kernels.NewStore(kernels.F32)
	mg, err := model.Build(cfg, model.Opts{T: T, B: 1, Mode: model.Eval, Logits: true, NoLoss: true})
	if err != nil {
		return nil, err
	}
	specs := mg.Specs
	if err := model.InitStore(specs, st, seed); err != nil {
		return nil, err
	}
	return st, nil
}

func prepareInfer(c *cli.Context, work, preset string, cfg *model.Config, st *kernels.Store, fold, att, dtype string, T int, flops map[string]int64) (*inferCase, error) {
	ctx := c.Context
	B := c.Int("batch")
	prec, quant, err := benchPrecision(dtype)
	if err != nil {
		return nil, err
	}
	r := inferRow{preset: preset, model: cfg.Model, fold: fold, attention: att, dtype: dtype, T: T, B: B}
	ef, drop := fold, false
	switch fold {
	case "-":
		ef = passes.FoldRPAMode
	case foldNoBias:
		ef, drop = passes.FoldRPAMode, true
	case foldControl:
		ef = passes.FoldRPAMode
	}
	dir := fmt.Sprintf("%s/%s_%s_%s_%s_L%d", work, preset, cfg.Model, strings.NewReplacer("-", "", "#", "_").Replace(fold), att, T)
	if dtype != "fp32" {
		dir += "_" + dtype
	}
	res, err := export.Export(ctx, export.Options{Config: *cfg, Store: st, Lengths: []int{T}, Batch: B,
		Fold: ef, DropBias: drop, Attention: att, DType: prec, Quantize: quant, Out: dir, Tokenizer: "none", EOS: 0})
	if err != nil {
		return nil, err
	}
	r.bytes, r.nodes = res.Lengths[0].Bytes, res.Lengths[0].Nodes
	// Model FLOPs: the matrix products of the inference graph, attention
	// spelled out (FusedAttention hides its two products from Flops).
	key := fmt.Sprintf("%s/%s/%v", cfg.Model, ef, drop)
	if f, ok := flops[key]; ok {
		r.flops = f
	} else {
		g, _, err := export.Graph(cfg, T, B, st, export.GraphOptions{Fold: ef, DropBias: drop, Attention: passes.AttentionNone})
		if err != nil {
			return nil, err
		}
		r.flops = passes.Flops(g)
		flops[key] = r.flops
	}
	m, err := runtime.OpenContext(ctx, dir, runtime.Options{Provider: c.String("provider"), Threads: c.Int("threads")})
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(7, uint64(T)))
	seqs := make([][]int32, B)
	for i := range seqs {
		seqs[i] = make([]int32, T)
		for t := range seqs[i] {
			seqs[i][t] = int32(rng.IntN(cfg.Vocab))
		}
	}
	return &inferCase{r: r, m: m, seqs: seqs}, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func printInferRows(w io.Writer, rows []inferRow, peak float64, threads, block int, provider string) {
	th := "one per core"
	if threads > 0 {
		th = fmt.Sprint(threads)
	}
	fmt.Fprintf(w, "onnxruntime %s %s, threads %s; latency of one run of [B,T] token ids (logits included)\n", runtime.LoadedVersion(), strings.ToUpper(provider), th)
	fw := 6
	for _, r := range rows {
		fw = max(fw, len(r.label()))
	}
	if len(rows) > 0 {
		fmt.Fprintf(w, "%d timed runs per model in blocks of %d that alternate between the models; fast½: mean of the fastest half; noise: p50 spread between the first and the second half of the blocks\n",
			rows[0].lat.n, block)
	}
	fmt.Fprintf(w, "%-6s %-8s %-*s %-6s %5s %2s %9s %9s %9s %9s %6s %9s %8s %8s %6s %6s %5s\n",
		"preset", "model", fw, "fold", "attn", "T", "B", "p50 ms", "p95 ms", "p99 ms", "fast½ ms", "noise", "tokens/s", "GFLOP", "GFLOP/s", "%peak", "MiB", "nodes")
	// The GEMM runs on every core: %peak only when onnxruntime does too.
	allCores := benchThreads(threads) >= goruntime.NumCPU()
	for _, r := range rows {
		gfs := float64(r.flops) / 1e9 / r.lat.p50.Seconds()
		pct := "-"
		if peak > 0 && allCores {
			pct = fmt.Sprintf("%.0f%%", 100*gfs/peak)
		}
		noise := "-"
		if n := r.noise(); !math.IsNaN(n) {
			noise = fmt.Sprintf("%.1f%%", n)
		}
		tps := float64(r.B*r.T) / r.lat.mean.Seconds()
		fmt.Fprintf(w, "%-6s %-8s %-*s %-6s %5d %2d %9.2f %9.2f %9.2f %9.2f %6s %9.0f %8.2f %8.1f %6s %6.1f %5d\n",
			r.preset, r.model, fw, r.label(), r.attention, r.T, r.B, ms(r.lat.p50), ms(r.lat.p95), ms(r.lat.p99), ms(r.lat.fast), noise, tps,
			float64(r.flops)/1e9, gfs, pct, float64(r.bytes)/(1<<20), r.nodes)
	}
	if peak > 0 {
		fmt.Fprintf(w, "GEMM peak (blas.Measure n=2048 f32, %s, %d cores, same run): %.1f GFLOP/s", blas.Impl(), goruntime.NumCPU(), peak)
		if !allCores {
			fmt.Fprintf(w, " (no %%peak: onnxruntime used %d of the %d cores)", benchThreads(threads), goruntime.NumCPU())
		}
		fmt.Fprintln(w)
	}
}

// noise bounds the error of the cost estimate: half the spread between
// the costs measured in the two halves of the blocks (each has half the
// runs) and, with --control, the difference that two sessions of one
// model show.
func (pc priorCost) noise() float64 {
	n := math.Abs(pc.cost.halves[0]-pc.cost.halves[1]) / 2
	if pc.control != nil {
		n = math.Max(n, math.Max(math.Abs(pc.control.p50), math.Abs(pc.control.fast)))
	}
	return n
}

// verdict says whether the prior costs under 1%: yes when the p50 and the
// fast-half estimates are both below 1% and the noise is too, no when both
// are 1% or more; otherwise the run cannot tell.
func (pc priorCost) verdict() string {
	n := pc.noise()
	lo, hi := math.Min(pc.cost.p50, pc.cost.fast), math.Max(pc.cost.p50, pc.cost.fast)
	switch {
	case math.IsNaN(n):
		return "not resolved (too few blocks)"
	case hi < 1 && n < 1:
		return "under 1%"
	case lo >= 1 && lo-n >= 1:
		return "NOT under 1%"
	case lo >= 1:
		return "NOT under 1% (by less than the noise)"
	}
	return "not resolved at 1% (more --runs, --threads 1)"
}

// printPriorCosts prints one line per (preset, T, attention): what the
// folded bias costs against the same model without it.
func printPriorCosts(w io.Writer, costs []priorCost) {
	for _, pc := range costs {
		fmt.Fprintf(w, "prior cost %s T=%d %s: %s (p50 %.2f ms with the folded bias, %.2f without",
			pc.preset, pc.T, pc.attention, pc.cost, ms(pc.with.lat.p50), ms(pc.without.lat.p50))
		if pc.baseline != nil {
			fmt.Fprintf(w, ", baseline %.2f", ms(pc.baseline.lat.p50))
		}
		fmt.Fprintf(w, "); noise ±%.2f%%: %s\n", pc.noise(), pc.verdict())
		if pc.control != nil {
			fmt.Fprintf(w, "  control %s T=%d %s, the folded model's second session against its first: %s\n", pc.preset, pc.T, pc.attention, pc.control)
			fmt.Fprintf(w, "  prior cost %s T=%d %s, both sessions of the folded model pooled: %s\n", pc.preset, pc.T, pc.attention, pc.pooled)
		}
	}
}
