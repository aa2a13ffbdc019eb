package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu/blas"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/urfave/cli/v2"
)

func benchInferCommand() *cli.Command {
	return &cli.Command{
		Name: "infer",
		Usage: "latency (p50/p95), tokens/s and achieved GFLOP/s of exported models in onnxruntime (CPU), " +
			"against the GEMM peak measured in the same run",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "preset", Value: "tiny,paper", Usage: "comma-separated presets (" + strings.Join(model.PresetNames(), ", ") + ")"},
			&cli.StringFlag{Name: "model", Value: "fuzzy,baseline", Usage: "comma-separated: fuzzy, baseline"},
			&cli.StringFlag{Name: "fold", Value: "rpa,none", Usage: "comma-separated fold modes for the fuzzy model: rpa, none"},
			&cli.StringFlag{Name: "attention", Value: passes.DefaultAttention, Usage: "comma-separated attention lowerings: plain, op"},
			&cli.IntFlag{Name: "length", Usage: "context length T (default: each preset's first training context)"},
			&cli.IntFlag{Name: "batch", Value: 1, Usage: "sequences per run"},
			&cli.IntFlag{Name: "runs", Value: 20, Usage: "timed runs per model, in up to 5 blocks that alternate between the models (each block after one untimed run)"},
			&cli.IntFlag{Name: "threads", Usage: "onnxruntime intra-op threads (0: one per core)"},
			&cli.StringFlag{Name: "provider", Value: "cpu", Usage: "cpu|cuda"},
			&cli.DurationFlag{Name: "gemm-time", Value: 3 * time.Second, Usage: "time for the GEMM peak measurement (0: skip)"},
			&cli.StringFlag{Name: "keep", Usage: "keep the exported models under this folder"},
		},
		Action: benchInfer,
	}
}

type inferRow struct {
	preset, model, fold, attention string
	T, B                           int
	p50, p95, mean                 time.Duration
	flops                          int64
	bytes                          int64
	nodes                          int
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
	if c.Int("batch") < 1 || c.Int("runs") < 1 || c.Int("length") < 0 || c.Int("threads") < 0 {
		return fmt.Errorf("--batch and --runs must be positive, --length and --threads not negative")
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
		if f != passes.FoldRPAMode && f != passes.FoldNoneMode {
			return fmt.Errorf("--fold %q: want rpa or none", f)
		}
	}
	for _, a := range splitList(c.String("attention")) {
		if a != passes.AttentionPlain && a != passes.AttentionOp {
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
	// One preset at a time: its models alternate among themselves and are
	// closed before the next preset's are opened.
	for _, p := range presets {
		r, err := benchPreset(c, work, p)
		if err != nil {
			return err
		}
		rows = append(rows, r...)
	}
	var peak float64
	if d := c.Duration("gemm-time"); d > 0 {
		var err error
		if peak, err = blas.Measure(2048, "f32", d); err != nil {
			return err
		}
	}
	printInferRows(w, rows, peak, c.Int("threads"))
	fmt.Fprintf(w, "load average (1 min) before the runs %s, after %s\n", load0, loadAvg())
	return nil
}

// benchPreset exports and times the models of one preset.
func benchPreset(c *cli.Context, work string, p model.Preset) ([]inferRow, error) {
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
	for _, mname := range splitList(c.String("model")) {
		cfg := p.Config
		cfg.Model = mname
		if T > cfg.MaxLen {
			return nil, fmt.Errorf("--length %d exceeds the %s preset's maximum length %d", T, p.Name, cfg.MaxLen)
		}
		st, err := randomStore(&cfg, T, 1)
		if err != nil {
			return nil, err
		}
		folds := splitList(c.String("fold"))
		if mname == "baseline" {
			folds = []string{"-"}
		}
		for _, fold := range folds {
			for _, att := range splitList(c.String("attention")) {
				ic, err := prepareInfer(c, work, p.Name, &cfg, st, fold, att, T)
				if err != nil {
					return nil, err
				}
				cases = append(cases, ic)
				fmt.Fprintf(c.App.ErrWriter, "exported %s %s fold=%s attention=%s T=%d\n", p.Name, mname, fold, att, T)
			}
		}
	}
	// Rounds: each model runs a block of runs (the first untimed: it wakes
	// the model's onnxruntime threads while the previous model's threads
	// stop spinning), and the blocks of all models alternate, so that a
	// background load that comes and goes hits all of them alike.
	runs := c.Int("runs")
	rounds := min(5, runs)
	for k := 0; k < rounds; k++ {
		per := runs / rounds
		if k < runs%rounds {
			per++
		}
		for _, ic := range cases {
			for i := -1; i < per; i++ {
				t0 := time.Now()
				if _, err := ic.m.Logits(c.Context, ic.seqs); err != nil {
					return nil, err
				}
				if i >= 0 {
					ic.times = append(ic.times, time.Since(t0))
				}
			}
		}
	}
	rows := make([]inferRow, len(cases))
	for i, ic := range cases {
		rows[i] = ic.row(runs)
	}
	return rows, nil
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

type inferCase struct {
	r     inferRow
	m     *runtime.Model
	seqs  [][]int32
	times []time.Duration
}

func (ic *inferCase) row(runs int) inferRow {
	r := ic.r
	times := append([]time.Duration(nil), ic.times...)
	var total time.Duration
	for _, d := range times {
		total += d
	}
	sort.Slice(times, func(a, b int) bool { return times[a] < times[b] })
	r.p50 = times[len(times)/2]
	r.p95 = times[min(len(times)-1, (len(times)*95+99)/100-1)]
	r.mean = total / time.Duration(len(times))
	return r
}

// randomStore initialises cfg's weights and its eval-mode buffers at T
// (running statistics at their initial value) from seed.
func randomStore(cfg *model.Config, T int, seed uint64) (*kernels.Store, error) {
	st := kernels.NewStore(kernels.F32)
	_, specs, err := model.Build(cfg, model.Opts{T: T, B: 1, Mode: model.Eval, Logits: true, NoLoss: true})
	if err != nil {
		return nil, err
	}
	if err := model.InitStore(specs, st, seed); err != nil {
		return nil, err
	}
	return st, nil
}

func prepareInfer(c *cli.Context, work, preset string, cfg *model.Config, st *kernels.Store, fold, att string, T int) (*inferCase, error) {
	ctx := c.Context
	B := c.Int("batch")
	r := inferRow{preset: preset, model: cfg.Model, fold: fold, attention: att, T: T, B: B}
	ef := fold
	if ef == "-" {
		ef = passes.FoldRPAMode
	}
	dir := fmt.Sprintf("%s/%s_%s_%s_%s_L%d", work, preset, cfg.Model, strings.Trim(fold, "-"), att, T)
	res, err := export.Export(ctx, export.Options{Config: *cfg, Store: st, Lengths: []int{T}, Batch: B,
		Fold: ef, Attention: att, Out: dir, Tokenizer: "none", EOS: 0})
	if err != nil {
		return nil, err
	}
	r.bytes, r.nodes = res.Lengths[0].Bytes, res.Lengths[0].Nodes
	// Model FLOPs: the matrix products of the inference graph, attention
	// spelled out (FusedAttention hides its two products from Flops).
	g, _, err := export.Graph(cfg, T, B, st, export.GraphOptions{Fold: ef, Attention: passes.AttentionNone})
	if err != nil {
		return nil, err
	}
	r.flops = passes.Flops(g)
	m, err := runtime.Open(dir, runtime.Options{Provider: c.String("provider"), Threads: c.Int("threads")})
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

func printInferRows(w io.Writer, rows []inferRow, peak float64, threads int) {
	th := "one per core"
	if threads > 0 {
		th = fmt.Sprint(threads)
	}
	fmt.Fprintf(w, "onnxruntime %s CPU, threads %s; latency of one run of [B,T] token ids (logits included)\n", runtime.ORTVersion, th)
	fmt.Fprintf(w, "%-6s %-8s %-4s %-6s %5s %2s %9s %9s %10s %8s %8s %7s %6s\n",
		"preset", "model", "fold", "attn", "T", "B", "p50 ms", "p95 ms", "tokens/s", "GFLOP", "GFLOP/s", "%peak", "MiB")
	for _, r := range rows {
		gfs := float64(r.flops) / 1e9 / r.p50.Seconds()
		pct := "-"
		if peak > 0 {
			pct = fmt.Sprintf("%.0f%%", 100*gfs/peak)
		}
		tps := float64(r.B*r.T) / r.mean.Seconds()
		fmt.Fprintf(w, "%-6s %-8s %-4s %-6s %5d %2d %9.2f %9.2f %10.0f %8.2f %8.1f %7s %6.1f\n",
			r.preset, r.model, r.fold, r.attention, r.T, r.B, ms(r.p50), ms(r.p95), tps, float64(r.flops)/1e9, gfs, pct, float64(r.bytes)/(1<<20))
	}
	if peak > 0 {
		fmt.Fprintf(w, "GEMM peak (blas.Measure n=2048 f32, %s, same run): %.1f GFLOP/s\n", blas.Impl(), peak)
	}
}
