package plot

import (
	"fmt"
	"math"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/rpac-dev/rpac/training/metrics"
)

// RecallRun is one run of a recall comparison: its evaluations (records
// of metrics.jsonl with recall_acc) and the label its curves get.
type RecallRun struct {
	Label string
	Evals []metrics.Record
}

// ReadRecallRun reads a run directory's evaluations that scored recall.
func ReadRecallRun(dir, label string) (RecallRun, error) {
	recs, err := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		return RecallRun{}, fmt.Errorf("plot: %w (is %s a run directory?)", err, dir)
	}
	rr := RecallRun{Label: label}
	for _, r := range recs {
		if r.RecallAcc.Present() {
			rr.Evals = append(rr.Evals, r)
		}
	}
	if len(rr.Evals) == 0 {
		return rr, fmt.Errorf("plot: %s scored no recall (an MQAR or synthetic run has recall_acc in metrics.jsonl)", dir)
	}
	return rr, nil
}

// Recall draws runs into one PNG: (a) recall accuracy against the step,
// (b) recall against the distance from pair to query at each run's last
// evaluation (a point per distance bucket that held answers, at the
// bucket's geometric middle).
func Recall(path string, runs []RecallRun) error {
	steps := newPlot("recall accuracy", "step", "recall")
	dist := newPlot("recall by distance (last evaluation)", "distance from pair to query (tokens)", "recall")
	for _, p := range []*plot.Plot{steps, dist} {
		p.Y.Min, p.Y.Max = 0, 1.05
		p.Legend.Top = false
	}
	anyDist := false
	for i, r := range runs {
		if err := addLine(steps, r.Label, series(r.Evals, field(func(r rec) metrics.Num { return r.RecallAcc })), i, false, false); err != nil {
			return err
		}
		last := &r.Evals[len(r.Evals)-1]
		xy := byDistance(last)
		anyDist = anyDist || len(xy) > 0
		label := fmt.Sprintf("%s (step %.0f)", r.Label, float64(last.Step))
		if err := addLine(dist, label, xy, i, false, true); err != nil {
			return err
		}
	}
	if !anyDist { // no distance buckets (the synthetic corpus): the steps alone
		return saveGrid(path, [][]*plot.Plot{{steps}}, 6*vg.Inch, 4.5*vg.Inch)
	}
	dist.X.Scale = plot.LogScale{}
	dist.X.Tick.Marker = plot.LogTicks{Prec: -1}
	return saveGrid(path, [][]*plot.Plot{{steps, dist}}, 12*vg.Inch, 4.5*vg.Inch)
}

// byDistance is an evaluation's recall per distance bucket (recall_by_dist:
// lo, hi, correct, total), at √(lo·hi), buckets without answers left out.
func byDistance(r rec) plotter.XYs {
	var xy plotter.XYs
	if r.RecallBreakdown == nil {
		return nil
	}
	for _, b := range r.ByDist {
		lo, hi := float64(b.Lo), float64(b.Hi)
		if b.Total > 0 && lo > 0 && hi > lo {
			xy = append(xy, plotter.XY{X: math.Sqrt(lo * hi), Y: float64(b.Correct) / float64(b.Total)})
		}
	}
	return xy
}

// recallRun draws one run's recall (Recall) when its evaluations scored it.
func recallRun(path, label string, evals []metrics.Record) (bool, error) {
	r := RecallRun{Label: label}
	for _, e := range evals {
		if e.RecallAcc.Present() {
			r.Evals = append(r.Evals, e)
		}
	}
	if len(r.Evals) == 0 {
		return false, nil
	}
	return true, Recall(path, []RecallRun{r})
}
