// Package plot draws a training run's diagnostics as PNG files: the
// validation CE and its smoothed rate of change, the attention temperature
// τ_att per layer, the membership entropy H(μ), the context distribution
// q(c), the MoE expert usage, Guardian's reward and λs, the learning rate,
// and heatmaps of each layer's RPA bias B(T) early and late in training (the
// paper's Figure 1 and its "Interpreting B(T)" paragraph).
//
// It reads what the trainer writes into a run directory: metrics.jsonl and
// bias/early.safetensors, bias/late.safetensors.
package plot

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/palette/moreland"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/rpac-dev/rpac/training/metrics"
)

// Run reads the run in runDir and writes its PNGs into outDir (created if
// needed). It returns the files written. Figures whose data the run lacks
// (no context game, no Guardian, a baseline model) are skipped.
func Run(runDir, outDir string) ([]string, error) {
	recs, err := metrics.ReadJSONL(filepath.Join(runDir, "metrics.jsonl"))
	if err != nil {
		return nil, fmt.Errorf("plot: %w (is %s a run directory?)", err, runDir)
	}
	var steps, evals []metrics.Record
	for _, r := range recs {
		switch r.Kind() {
		case metrics.KindEval:
			evals = append(evals, r)
		case metrics.KindStep:
			steps = append(steps, r)
		}
	}
	if len(steps) == 0 && len(evals) == 0 {
		return nil, fmt.Errorf("plot: %s/metrics.jsonl holds no training records", runDir)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	var written []string
	emit := func(name string, f func(path string) (bool, error)) error {
		path := filepath.Join(outDir, name)
		ok, err := f(path)
		if err != nil {
			return fmt.Errorf("plot: %s: %w", name, err)
		}
		if ok {
			written = append(written, path)
		}
		return nil
	}
	figs := []struct {
		name string
		f    func(string) (bool, error)
	}{
		{"val_ce.png", func(p string) (bool, error) { return valCE(p, steps, evals) }},
		{"tau_att.png", func(p string) (bool, error) { return tauAtt(p, evals) }},
		{"mu_entropy.png", func(p string) (bool, error) { return muEntropy(p, steps, evals) }},
		{"q_context.png", func(p string) (bool, error) { return qContext(p, steps, evals) }},
		{"expert_usage.png", func(p string) (bool, error) { return expertUsage(p, evals) }},
		{"guardian.png", func(p string) (bool, error) { return guardian(p, evals) }},
		{"lr.png", func(p string) (bool, error) { return lrPlot(p, steps) }},
		{"bias_heatmaps.png", func(p string) (bool, error) { return biasHeatmaps(p, runDir) }},
		{"recall.png", func(p string) (bool, error) { return recallRun(p, filepath.Base(runDir), evals) }},
	}
	for _, f := range figs {
		if err := emit(f.name, f.f); err != nil {
			return written, err
		}
	}
	return written, nil
}

// rec is one record of metrics.jsonl.
type rec = *metrics.Record

// series collects (step, f(r)) for records where f is a finite number.
func series(recs []metrics.Record, f func(rec) float64) plotter.XYs {
	var xy plotter.XYs
	for i := range recs {
		x, y := float64(recs[i].Step), f(&recs[i])
		if !math.IsNaN(y) && !math.IsInf(y, 0) {
			xy = append(xy, plotter.XY{X: x, Y: y})
		}
	}
	return xy
}

// field reads a number of a record (NaN when absent).
func field(f func(rec) metrics.Num) func(rec) float64 {
	return func(r rec) float64 { return f(r).Value() }
}

// index reads element i of a list of a record (NaN when absent).
func index(f func(rec) []float64, i int) func(rec) float64 {
	return func(r rec) float64 {
		if v := f(r); i < len(v) {
			return v[i]
		}
		return math.NaN()
	}
}

// emaXY smooths y with an exponential moving average of weight alpha.
func emaXY(xy plotter.XYs, alpha float64) plotter.XYs {
	out := make(plotter.XYs, len(xy))
	var s float64
	for i, p := range xy {
		if i == 0 {
			s = p.Y
		} else {
			s = alpha*p.Y + (1-alpha)*s
		}
		out[i] = plotter.XY{X: p.X, Y: s}
	}
	return out
}

// RateOfChange is the smoothed rate of change of a curve: the slope between
// consecutive points (per 1,000 steps), smoothed by an EMA of weight alpha.
func RateOfChange(xy plotter.XYs, alpha float64) plotter.XYs {
	var d plotter.XYs
	for i := 1; i < len(xy); i++ {
		dx := xy[i].X - xy[i-1].X
		if dx <= 0 {
			continue
		}
		d = append(d, plotter.XY{X: xy[i].X, Y: 1000 * (xy[i].Y - xy[i-1].Y) / dx})
	}
	return emaXY(d, alpha)
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, x, y
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	return p
}

func addLine(p *plot.Plot, name string, xy plotter.XYs, i int, dashed, points bool) error {
	if len(xy) == 0 {
		return nil
	}
	l, err := plotter.NewLine(xy)
	if err != nil {
		return err
	}
	l.Color = plotutil.Color(i)
	l.Width = vg.Points(1.5)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	p.Add(l)
	if points {
		s, err := plotter.NewScatter(xy)
		if err != nil {
			return err
		}
		s.Color = l.Color
		s.Radius = vg.Points(2)
		p.Add(s)
	}
	if name != "" {
		p.Legend.Add(name, l)
	}
	return nil
}

func faint(p *plot.Plot, name string, xy plotter.XYs) error {
	if len(xy) == 0 {
		return nil
	}
	l, err := plotter.NewLine(xy)
	if err != nil {
		return err
	}
	l.Color = color.RGBA{R: 170, G: 170, B: 170, A: 255}
	l.Width = vg.Points(0.7)
	p.Add(l)
	if name != "" {
		p.Legend.Add(name, l)
	}
	return nil
}

// saveGrid draws plots in rows×cols tiles into one PNG.
func saveGrid(path string, plots [][]*plot.Plot, w, h vg.Length) error {
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))
	dc := draw.New(img)
	t := draw.Tiles{Rows: len(plots), Cols: len(plots[0]), PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, t, dc)
	for j := range plots {
		for i := range plots[j] {
			if plots[j][i] != nil {
				plots[j][i].Draw(canvases[j][i])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func valCEOf(r rec) metrics.Num { return r.ValCE }
func emaCEOf(r rec) metrics.Num { return r.ValCEEMA }
func swaCEOf(r rec) metrics.Num { return r.ValCESWA }

// valCE: (a) validation CE of the raw, EMA and SWA weights with the training
// CE behind them, SWA members marked; (b) the smoothed rate of change of the
// validation CE.
func valCE(path string, steps, evals []metrics.Record) (bool, error) {
	raw := series(evals, field(valCEOf))
	if len(raw) == 0 {
		return false, nil
	}
	p := newPlot("Validation cross-entropy", "step", "CE (nats)")
	if err := faint(p, "train CE (EMA)", emaXY(series(steps, field(func(r rec) metrics.Num { return r.TrainCE })), 0.1)); err != nil {
		return false, err
	}
	if err := addLine(p, "val CE", raw, 0, false, true); err != nil {
		return false, err
	}
	if err := addLine(p, "val CE, EMA weights", series(evals, field(emaCEOf)), 1, true, false); err != nil {
		return false, err
	}
	if err := addLine(p, "val CE, SWA weights", series(evals, field(swaCEOf)), 2, true, false); err != nil {
		return false, err
	}
	var joined plotter.XYs
	for _, r := range evals {
		if r.SWAJoin != nil && *r.SWAJoin {
			joined = append(joined, plotter.XY{X: float64(r.Step), Y: r.ValCE.Value()})
		}
	}
	if len(joined) > 0 {
		s, err := plotter.NewScatter(joined)
		if err != nil {
			return false, err
		}
		s.GlyphStyle.Shape = draw.RingGlyph{}
		s.Radius = vg.Points(5)
		s.Color = plotutil.Color(2)
		p.Add(s)
		p.Legend.Add("SWA-select member", s)
	}
	// Keep the axis on the validation curves (the first training steps are far above).
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, k := range []func(rec) metrics.Num{valCEOf, emaCEOf, swaCEOf} {
		for _, q := range series(evals, field(k)) {
			lo, hi = math.Min(lo, q.Y), math.Max(hi, q.Y)
		}
	}
	pad := math.Max(0.05, 0.1*(hi-lo))
	p.Y.Min, p.Y.Max = lo-pad, hi+pad
	r := newPlot("Smoothed rate of change of val CE", "step", "dCE/dstep × 1000")
	if err := addLine(r, "raw weights", RateOfChange(raw, 0.5), 0, false, true); err != nil {
		return false, err
	}
	zero, _ := plotter.NewLine(plotter.XYs{{X: raw[0].X, Y: 0}, {X: raw[len(raw)-1].X, Y: 0}})
	zero.Color = color.Black
	r.Add(zero)
	return true, saveGrid(path, [][]*plot.Plot{{p}, {r}}, 18*vg.Centimeter, 18*vg.Centimeter)
}

func tauAtt(path string, evals []metrics.Record) (bool, error) {
	n := 0
	for _, r := range evals {
		n = max(n, len(r.TauAtt))
	}
	if n == 0 {
		return false, nil
	}
	title := "Attention temperature τ_att per layer (at each evaluation)"
	p := newPlot(title, "step", "τ_att")
	for l := 0; l < n; l++ {
		if err := addLine(p, fmt.Sprintf("layer %d", l), series(evals, index(func(r rec) []float64 { return r.TauAtt }, l)), l, false, true); err != nil {
			return false, err
		}
	}
	return true, saveGrid(path, [][]*plot.Plot{{p}}, 18*vg.Centimeter, 11*vg.Centimeter)
}

func muEntropy(path string, steps, evals []metrics.Record) (bool, error) {
	if len(series(evals, field(func(r rec) metrics.Num { return r.MuEntropy }))) == 0 {
		return false, nil
	}
	p := newPlot("Membership entropy H(μ)", "step", "H(μ) (nats)")
	if err := faint(p, "per step (EMA)", emaXY(series(steps, field(func(r rec) metrics.Num { return r.MuEntropy })), 0.1)); err != nil {
		return false, err
	}
	n := 0
	for _, r := range evals {
		n = max(n, len(r.MuEntropyLayers))
	}
	for l := 0; l < n; l++ {
		if err := addLine(p, fmt.Sprintf("layer %d (epoch mean)", l), series(evals, index(func(r rec) []float64 { return r.MuEntropyLayers }, l)), l, false, true); err != nil {
			return false, err
		}
	}
	s := newPlot("Saturation fraction (tokens with max μ > 0.9)", "step", "fraction")
	if err := faint(s, "per step (EMA)", emaXY(series(steps, field(func(r rec) metrics.Num { return r.SatFrac })), 0.1)); err != nil {
		return false, err
	}
	for l := 0; l < n; l++ {
		if err := addLine(s, fmt.Sprintf("layer %d", l), series(evals, index(func(r rec) []float64 { return r.SatFracLayers }, l)), l, false, true); err != nil {
			return false, err
		}
	}
	return true, saveGrid(path, [][]*plot.Plot{{p}, {s}}, 18*vg.Centimeter, 18*vg.Centimeter)
}

func qContext(path string, steps, evals []metrics.Record) (bool, error) {
	var ctx []int
	for _, r := range evals {
		if c := r.Contexts; len(c) > len(ctx) {
			ctx = c
		}
	}
	if len(ctx) == 0 {
		return false, nil
	}
	p := newPlot("Context game: q(c)", "step", "probability")
	for i, c := range ctx {
		if err := addLine(p, fmt.Sprintf("c = %d", c), series(evals, index(func(r rec) []float64 { return r.QContext }, i)), i, false, true); err != nil {
			return false, err
		}
	}
	p.Y.Min, p.Y.Max = 0, 1
	// Fraction of the steps of each window actually run at each length.
	h := newPlot("Share of steps per context (windows of 10 steps)", "step", "share")
	for i, c := range ctx {
		var xy plotter.XYs
		var n, k int
		for j, r := range steps {
			n++
			if r.Context == c {
				k++
			}
			if n == 10 || j == len(steps)-1 {
				xy = append(xy, plotter.XY{X: float64(r.Step), Y: float64(k) / float64(n)})
				n, k = 0, 0
			}
		}
		if err := addLine(h, fmt.Sprintf("c = %d", c), xy, i, false, false); err != nil {
			return false, err
		}
	}
	h.Y.Min, h.Y.Max = 0, 1
	return true, saveGrid(path, [][]*plot.Plot{{p}, {h}}, 18*vg.Centimeter, 18*vg.Centimeter)
}

func expertUsage(path string, evals []metrics.Record) (bool, error) {
	var layers int
	for _, r := range evals {
		layers = max(layers, len(r.ExpertUsage))
	}
	if layers == 0 {
		return false, nil
	}
	var grid [][]*plot.Plot
	for l := 0; l < layers; l++ {
		p := newPlot(fmt.Sprintf("Expert usage, layer %d (mean gate weight per expert)", l), "step", "usage")
		experts := 0
		for _, r := range evals {
			if u := r.ExpertUsage; l < len(u) {
				experts = max(experts, len(u[l]))
			}
		}
		for e := 0; e < experts; e++ {
			xy := series(evals, func(r rec) float64 {
				u := r.ExpertUsage
				if l < len(u) && e < len(u[l]) {
					return u[l][e]
				}
				return math.NaN()
			})
			if err := addLine(p, fmt.Sprintf("expert %d", e), xy, e, false, true); err != nil {
				return false, err
			}
		}
		grid = append(grid, []*plot.Plot{p})
	}
	return true, saveGrid(path, grid, 18*vg.Centimeter, vg.Length(layers)*7*vg.Centimeter)
}

func guardian(path string, evals []metrics.Record) (bool, error) {
	rw := series(evals, field(func(r rec) metrics.Num { return r.GuardianReward }))
	if len(rw) == 0 {
		return false, nil
	}
	p := newPlot("Guardian reward R = −CE + λ1(ΔCE)+ + λ2σ(κΔCE/CE)", "step", "reward")
	if err := addLine(p, "reward", rw, 0, false, true); err != nil {
		return false, err
	}
	a := newPlot("Guardian actions and penalty weights", "step", "value")
	for i, n := range []string{"Δτ_att", "Δλ_delta", "Δλ_sat"} {
		if err := addLine(a, "action "+n, series(evals, index(func(r rec) []float64 { return r.GuardianAction }, i)), i, true, true); err != nil {
			return false, err
		}
	}
	if err := addLine(a, "λ_sat", series(evals, field(func(r rec) metrics.Num { return r.LambdaSat })), 3, false, false); err != nil {
		return false, err
	}
	if err := addLine(a, "λ_delta", series(evals, field(func(r rec) metrics.Num { return r.LambdaDelta })), 4, false, false); err != nil {
		return false, err
	}
	if err := addLine(a, "β", series(evals, field(func(r rec) metrics.Num { return r.GuardianBeta })), 5, false, false); err != nil {
		return false, err
	}
	return true, saveGrid(path, [][]*plot.Plot{{p}, {a}}, 18*vg.Centimeter, 18*vg.Centimeter)
}

func lrPlot(path string, steps []metrics.Record) (bool, error) {
	xy := series(steps, field(func(r rec) metrics.Num { return r.LR }))
	if len(xy) == 0 {
		return false, nil
	}
	p := newPlot("Learning rate (schedule × chaos factor)", "step", "LR")
	if err := addLine(p, "LR", xy, 0, false, false); err != nil {
		return false, err
	}
	grid := [][]*plot.Plot{{p}}
	if c := series(steps, field(func(r rec) metrics.Num { return r.Chaos })); len(c) > 0 {
		q := newPlot("Chaos factor (1−a) + a·x, on LR and bias scale", "step", "factor")
		if err := addLine(q, "chaos", c, 1, false, false); err != nil {
			return false, err
		}
		if err := addLine(q, "bias scale", series(steps, field(func(r rec) metrics.Num { return r.BiasScale })), 2, false, false); err != nil {
			return false, err
		}
		grid = append(grid, []*plot.Plot{q})
	}
	return true, saveGrid(path, grid, 18*vg.Centimeter, vg.Length(len(grid))*9*vg.Centimeter)
}

// grid is a T×T matrix for plotter.HeatMap; row 0 (query 0) is drawn at the top.
type grid struct {
	t    int
	data []float32
}

func (g grid) Dims() (c, r int)   { return g.t, g.t }
func (g grid) Z(c, r int) float64 { return float64(g.data[(g.t-1-r)*g.t+c]) }
func (g grid) X(c int) float64    { return float64(c) }
func (g grid) Y(r int) float64    { return float64(r) }

// biasHeatmaps draws each layer's B(T) (z-scored, /τ, clipped; before the
// warm-in scale) at the first and the last evaluation, on one colour scale
// per layer (blue negative, red positive). The y axis is the query position
// i (0 at the top), the x axis the key position j.
func biasHeatmaps(path, runDir string) (bool, error) {
	load := func(name string) ([]checkpoint.Named, map[string]string, error) {
		ts, meta, err := checkpoint.LoadWeightsFile(filepath.Join(runDir, "bias", name+".safetensors"))
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, nil
		}
		return ts, meta, err
	}
	early, me, err := load("early")
	if err != nil || early == nil {
		return false, err
	}
	late, ml, err := load("late")
	if err != nil {
		return false, err
	}
	if late == nil {
		late, ml = early, me
	}
	sort.Slice(early, func(i, j int) bool { return early[i].Name < early[j].Name })
	sort.Slice(late, func(i, j int) bool { return late[i].Name < late[j].Name })
	var rows [][]*plot.Plot
	for l := range early {
		if l >= len(late) || len(early[l].Shape) != 2 {
			continue
		}
		T := early[l].Shape[0]
		lim := 0.0
		for _, ts := range [][]float32{early[l].Data, late[l].Data} {
			for _, v := range ts {
				lim = math.Max(lim, math.Abs(float64(v)))
			}
		}
		var row []*plot.Plot
		for _, set := range []struct {
			t    checkpoint.Named
			meta map[string]string
			when string
		}{{early[l], me, "early"}, {late[l], ml, "late"}} {
			pal := moreland.SmoothBlueRed().Palette(255)
			h := plotter.NewHeatMap(grid{t: T, data: set.t.Data}, pal)
			h.Min, h.Max = -lim, lim
			h.Rasterized = true
			p := newPlot(fmt.Sprintf("%s: B(T=%d), %s (step %s), range ±%.2f", set.t.Name, T, set.when, set.meta["step"], lim),
				"key position j", "query position i")
			p.Add(h)
			p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = -0.5, float64(T)-0.5, -0.5, float64(T)-0.5
			p.Y.Tick.Marker = flipTicks{T}
			row = append(row, p)
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		return false, nil
	}
	return true, saveGrid(path, rows, 24*vg.Centimeter, vg.Length(len(rows))*11*vg.Centimeter)
}

// flipTicks labels the y axis with query positions counted from the top.
type flipTicks struct{ t int }

func (f flipTicks) Ticks(min, max float64) []plot.Tick {
	top := float64(f.t - 1)
	var out []plot.Tick
	for _, tk := range (plot.DefaultTicks{}).Ticks(top-max, top-min) {
		tk.Value = top - tk.Value
		out = append(out, tk)
	}
	return out
}
