package inferbench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	goruntime "runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/perf/benchfmt"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/internal/logging"
	"github.com/rpac-dev/rpac/kernels/cpu/blas"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
)

// Row is one case's measurement.
type Row struct {
	Preset, Model, Fold, Attention string
	DType                          string // "fp32", "fp16", "bf16" or "int8"
	T, B                           int
	Lat                            Latency
	Flops, Bytes                   int64
	Nodes                          int
}

// Label is the row's fold, with its precision when not fp32.
func (r Row) Label() string {
	if r.DType == "" || r.DType == "fp32" {
		return r.Fold
	}
	return r.Fold + "/" + r.DType
}

// Name is the row's benchmark name in Go's benchmark format: the case's
// keys as sub-benchmark configuration, which benchstat can group by.
func (r Row) Name() string {
	fold := strings.NewReplacer("#", "_", "/", "_").Replace(r.Fold)
	return fmt.Sprintf("Infer/preset=%s/model=%s/fold=%s/attn=%s/dtype=%s/T=%d/B=%d", r.Preset, r.Model, fold, r.Attention, r.DType, r.T, r.B)
}

// PriorCost compares the fuzzy model with its folded bias (rpa) and the
// same model without it (nobias), timed in the same blocks.
type PriorCost struct {
	Preset, Attention string
	T                 int
	With, Without     Row
	Baseline          *Row
	Cost              Diff  // with against without
	Control           *Diff // a second session of the folded model against the first (Config.Control)
	Pooled            *Diff // both sessions of the folded model against without (Config.Control)
}

// priorCost finds the fp32 cases of one attention lowering and compares
// them; ok is false when the pair is not among the cases.
func priorCost(cases []*benchCase, preset string, mode passes.AttentionMode, T, rounds int) (PriorCost, bool) {
	att := mode.String()
	var with, without, control, base *benchCase
	for _, cs := range cases {
		if cs.r.Attention != att || cs.r.DType != "fp32" {
			continue
		}
		switch {
		case cs.r.Model == model.Baseline.String():
			base = cs
		case cs.r.Fold == passes.FoldRPAMode.String():
			with = cs
		case cs.r.Fold == FoldNoBias:
			without = cs
		case cs.r.Fold == FoldControl:
			control = cs
		}
	}
	if with == nil || without == nil {
		return PriorCost{}, false
	}
	pc := PriorCost{Preset: preset, Attention: att, T: T, With: with.row(), Without: without.row(),
		Cost: Compare(with.times, without.times, with.blocks, without.blocks, rounds)}
	if base != nil {
		br := base.row()
		pc.Baseline = &br
	}
	if control != nil {
		d := Compare(control.times, with.times, control.blocks, with.blocks, rounds)
		pc.Control = &d
		both := append(slices.Clone(with.times), control.times...)
		blocks := append(slices.Clone(with.blocks), control.blocks...)
		d2 := Compare(both, without.times, blocks, without.blocks, rounds)
		pc.Pooled = &d2
	}
	return pc, true
}

// Noise bounds the error of the cost estimate: the half-width of the
// paired estimate's confidence interval and, with a control, the
// difference that two sessions of one model show.
func (pc PriorCost) Noise() float64 {
	n := pc.Cost.PairedNoise
	if pc.Control != nil {
		n = math.Max(n, math.Max(math.Abs(pc.Control.P50), math.Abs(pc.Control.Fast)))
	}
	return n
}

// Verdict says whether the prior costs under 1%: yes when the p50 and the
// fast-half estimates are both below 1% and the noise is too, no when both
// are 1% or more; otherwise the run cannot tell.
func (pc PriorCost) Verdict() string {
	n := pc.Noise()
	lo, hi := math.Min(pc.Cost.P50, pc.Cost.Fast), math.Max(pc.Cost.P50, pc.Cost.Fast)
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

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Threads is the number of onnxruntime threads a run keeps busy.
func Threads(threads int) int {
	if threads > 0 {
		return threads
	}
	return goruntime.NumCPU()
}

// PrintRows prints the table of rows and the GEMM peak.
func PrintRows(w io.Writer, rep *Report, c *Config) {
	th := "one per core"
	if c.Threads > 0 {
		th = fmt.Sprint(c.Threads)
	}
	fmt.Fprintf(w, "onnxruntime %s %s, threads %s; latency of one run of [B,T] token ids (logits included)\n", runtime.LoadedVersion(), strings.ToUpper(c.Provider), th)
	fw := 6
	for _, r := range rep.Rows {
		fw = max(fw, len(r.Label()))
	}
	if len(rep.Rows) > 0 {
		fmt.Fprintf(w, "%d timed runs per model in blocks of %d that alternate between the models; p50: median; fast½: mean of the fastest half; noise: ± of the median's %.0f%% confidence interval (benchmath)\n",
			rep.Rows[0].Lat.N, c.Block, 100*Confidence)
	}
	fmt.Fprintf(w, "%-6s %-8s %-*s %-6s %5s %2s %9s %9s %9s %9s %6s %9s %8s %8s %6s %6s %5s\n",
		"preset", "model", fw, "fold", "attn", "T", "B", "p50 ms", "p95 ms", "p99 ms", "fast½ ms", "noise", "tokens/s", "GFLOP", "GFLOP/s", "%peak", "MiB", "nodes")
	// The GEMM runs on every core: %peak only when onnxruntime does too.
	allCores := Threads(c.Threads) >= goruntime.NumCPU()
	for _, r := range rep.Rows {
		printRow(w, r, fw, rep.Peak, allCores)
	}
	if rep.Peak > 0 {
		fmt.Fprintf(w, "GEMM peak (blas.Measure n=2048 f32, %s, %d cores, same run): %.1f GFLOP/s", blas.Impl(), goruntime.NumCPU(), rep.Peak)
		if !allCores {
			fmt.Fprintf(w, " (no %%peak: onnxruntime used %d of the %d cores)", Threads(c.Threads), goruntime.NumCPU())
		}
		fmt.Fprintln(w)
	}
}

func printRow(w io.Writer, r Row, fw int, peak float64, allCores bool) {
	gfs := float64(r.Flops) / 1e9 / r.Lat.P50.Seconds()
	pct := "-"
	if peak > 0 && allCores {
		pct = fmt.Sprintf("%.0f%%", 100*gfs/peak)
	}
	noise := "-"
	if n := r.Lat.Noise(); !math.IsNaN(n) {
		noise = fmt.Sprintf("%.1f%%", n)
	}
	tps := float64(r.B*r.T) / r.Lat.Mean.Seconds()
	fmt.Fprintf(w, "%-6s %-8s %-*s %-6s %5d %2d %9.2f %9.2f %9.2f %9.2f %6s %9.0f %8.2f %8.1f %6s %6.1f %5d\n",
		r.Preset, r.Model, fw, r.Label(), r.Attention, r.T, r.B, ms(r.Lat.P50), ms(r.Lat.P95), ms(r.Lat.P99), ms(r.Lat.Fast), noise, tps,
		float64(r.Flops)/1e9, gfs, pct, float64(r.Bytes)/(1<<20), r.Nodes)
}

// PrintPriorCosts prints one line per (preset, T, attention): what the
// folded bias costs against the same model without it.
func PrintPriorCosts(w io.Writer, costs []PriorCost) {
	for _, pc := range costs {
		fmt.Fprintf(w, "prior cost %s T=%d %s: %s (p50 %.2f ms with the folded bias, %.2f without",
			pc.Preset, pc.T, pc.Attention, pc.Cost, ms(pc.With.Lat.P50), ms(pc.Without.Lat.P50))
		if pc.Baseline != nil {
			fmt.Fprintf(w, ", baseline %.2f", ms(pc.Baseline.Lat.P50))
		}
		fmt.Fprintf(w, "); noise ±%s: %s\n", pctOrDash(pc.Noise()), pc.Verdict())
		if pc.Control != nil {
			fmt.Fprintf(w, "  control %s T=%d %s, the folded model's second session against its first: %s\n", pc.Preset, pc.T, pc.Attention, pc.Control)
			fmt.Fprintf(w, "  prior cost %s T=%d %s, both sessions of the folded model pooled: %s\n", pc.Preset, pc.T, pc.Attention, pc.Pooled)
		}
	}
}

// LoadRange summarises the load averages read during the runs.
func LoadRange(ls []float64) string {
	if len(ls) == 0 {
		return "?"
	}
	lo, hi, sum := ls[0], ls[0], 0.0
	for _, l := range ls {
		lo, hi, sum = math.Min(lo, l), math.Max(hi, l), sum+l
	}
	return fmt.Sprintf("%.2f on average (%.2f to %.2f, %d readings)", sum/float64(len(ls)), lo, hi, len(ls))
}

// jsonRow is one row of rpac bench infer --json.
type jsonRow struct {
	Provider   string  `json:"provider"`
	ORT        string  `json:"onnxruntime"`
	Preset     string  `json:"preset"`
	Model      string  `json:"model"`
	Fold       string  `json:"fold"`
	Attention  string  `json:"attention"`
	DType      string  `json:"dtype"`
	T          int     `json:"T"`
	B          int     `json:"B"`
	Runs       int     `json:"runs"`
	P50ms      float64 `json:"p50_ms"`
	P95ms      float64 `json:"p95_ms"`
	P99ms      float64 `json:"p99_ms"`
	FastHalfMs float64 `json:"fast_half_ms"`
	TokensPerS float64 `json:"tokens_per_s"`
	GFLOP      float64 `json:"gflop"`
	MiB        float64 `json:"mib"`
	Nodes      int     `json:"nodes"`
}

// WriteJSON writes the rows as a JSON array.
func WriteJSON(w io.Writer, rows []Row, provider string) error {
	out := make([]jsonRow, len(rows))
	for i, r := range rows {
		out[i] = jsonRow{Provider: provider, ORT: runtime.LoadedVersion(), Preset: r.Preset, Model: r.Model, Fold: r.Fold,
			Attention: r.Attention, DType: r.DType, T: r.T, B: r.B, Runs: r.Lat.N, P50ms: ms(r.Lat.P50), P95ms: ms(r.Lat.P95),
			P99ms: ms(r.Lat.P99), FastHalfMs: ms(r.Lat.Fast), TokensPerS: float64(r.B*r.T) / r.Lat.Mean.Seconds(),
			GFLOP: float64(r.Flops) / 1e9, MiB: float64(r.Bytes) / (1 << 20), Nodes: r.Nodes}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// WriteBenchfmt writes every timed run in Go's benchmark format, one
// result line per run (sec/op and tokens/s), so that benchstat compares
// two runs of the benchmark:
//
//	benchstat old.txt new.txt
func WriteBenchfmt(w io.Writer, rep *Report, provider string) error {
	bw := benchfmt.NewWriter(w)
	cfg := []benchfmt.Config{{Key: "goos", Value: []byte(goruntime.GOOS), File: true}, {Key: "goarch", Value: []byte(goruntime.GOARCH), File: true},
		{Key: "pkg", Value: []byte("github.com/rpac-dev/rpac/app/inferbench"), File: true},
		{Key: "onnxruntime", Value: []byte(runtime.LoadedVersion()), File: true}, {Key: "provider", Value: []byte(provider), File: true}}
	for _, r := range rep.Rows {
		for _, d := range rep.Runs[r.Name()] {
			res := &benchfmt.Result{Config: cfg, Name: benchfmt.Name(fmt.Sprintf("%s-%d", r.Name(), goruntime.GOMAXPROCS(0))), Iters: 1,
				Values: []benchfmt.Value{{Value: d.Seconds(), Unit: "sec/op", OrigValue: float64(d.Nanoseconds()), OrigUnit: "ns/op"},
					{Value: float64(r.B*r.T) / d.Seconds(), Unit: "tokens/s"}}}
			if err := bw.Write(res); err != nil {
				return err
			}
		}
	}
	return nil
}

// ExportEvent: the benchmark exported one case ("bench.export", on
// stderr: the table on stdout is the report).
type ExportEvent struct {
	_         logging.Name `log:"bench.export"`
	Preset    string       `log:"preset"`
	Model     string       `log:"model"`
	Fold      string       `log:"fold"`
	Attention string       `log:"attention"`
	DType     string       `log:"dtype"`
	T         int          `log:"T"`
	Nodes     int          `log:"nodes"`
}

func (e ExportEvent) Text() string {
	return fmt.Sprintf("exported %s %s fold=%s attention=%s dtype=%s T=%d (%d nodes)", e.Preset, e.Model, e.Fold, e.Attention, e.DType, e.T, e.Nodes)
}
