package training

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels/cpu"
)

// shardRun runs rank of ranks' shard of the fixture's step (batch B in
// micro-batches of micro) and returns its loss, gradients and statistics.
func (f *stepFixture) shardRun(t *testing.T, micro, rank, ranks int, seed uint64) (map[string][]float32, *StepResult) {
	t.Helper()
	s, err := CompileStep(&f.cfg, f.store, cpu.New(ir.FP32), f.T, f.B, micro, f.cfg.Dropout, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Shard(rank, ranks); err != nil {
		t.Fatal(err)
	}
	out, err := s.Run(f.x, f.y, seed)
	if err != nil {
		t.Fatal(err)
	}
	grads := map[string][]float32{}
	for n, g := range out.Grads {
		grads[n] = slices.Clone(g)
	}
	res := &StepResult{Loss: out.Loss, CE: out.CE}
	for _, l := range out.Layers {
		res.Layers = append(res.Layers, LayerStats{H: l.H, Sat: l.Sat, Usage: slices.Clone(l.Usage)})
	}
	for _, r := range out.Running {
		res.Running = append(res.Running, slices.Clone(r))
	}
	return grads, res
}

// TestShardsSumToTheStep: the ranks' shards of a step (fuzzy model, with
// dropout and Gumbel routing) sum to the one-rank step: its gradients, loss,
// CE and every statistic. With one micro-batch per rank the sums are the
// same bits; with two per rank they differ by float rounding only (the
// order of the sums over micro-batches).
func TestShardsSumToTheStep(t *testing.T) {
	for _, c := range []struct {
		B   int
		tol float64
	}{{2, 0}, {4, 1e-5}} {
		f := newStepFixture(t, model.Fuzzy, 16, c.B, func(cfg *model.Config) { cfg.Dropout = 0.1 })
		whole, wholeStats := f.shardRun(t, 1, 0, 1, 5)
		g0, s0 := f.shardRun(t, 1, 0, 2, 5)
		g1, s1 := f.shardRun(t, 1, 1, 2, 5)
		sum := map[string][]float32{}
		for n, a := range g0 {
			sum[n] = make([]float32, len(a))
			for i := range a {
				sum[n][i] = a[i] + g1[n][i] // the all-reduce's order: rank 0 then rank 1
			}
		}
		if d := maxRelDiff(t, whole, sum); d > c.tol {
			t.Errorf("batch %d: the shards' gradients sum to the step's within %.2e, want %g", c.B, d, c.tol)
		}
		want, v0, v1 := packStats(wholeStats), packStats(s0), packStats(s1)
		if len(v0) != len(want) || len(v1) != len(want) {
			t.Fatalf("batch %d: %d, %d and %d statistics", c.B, len(v0), len(v1), len(want))
		}
		for i := range v0 {
			v0[i] += v1[i]
		}
		unpackStats(s0, v0) // as the reduction does: the running statistics back to float32
		for i, got := range packStats(s0) {
			if w := want[i]; math.Abs(got-w) > c.tol*math.Abs(w) {
				t.Errorf("batch %d: statistic %d: shards sum to %.9g, the step %.9g", c.B, i, got, w)
			}
		}
	}
}

// TestShardRefusesUnequalShares: a batch whose micro-batches the ranks
// cannot share equally is refused with a clear error.
func TestShardRefusesUnequalShares(t *testing.T) {
	f := newStepFixture(t, model.Baseline, 16, 3)
	s, err := CompileStep(&f.cfg, f.store, cpu.New(ir.FP32), f.T, 3, 1, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Shard(0, 2); err == nil || !strings.Contains(err.Error(), "2 ranks cannot share equally") {
		t.Errorf("3 micro-batches on 2 ranks: %v", err)
	}
}

// TestPackStats: the statistics a step reduces come back where they were.
func TestPackStats(t *testing.T) {
	out := &StepResult{Loss: 1, CE: 2, Layers: []LayerStats{{H: 3, Sat: 4, Usage: []float64{5, 6}}, {H: 7, Sat: 8, Usage: []float64{9}}},
		Running: [][]float32{{10, 11}, {12}}}
	v := packStats(out)
	if !slices.Equal(v, []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}) {
		t.Fatalf("packed %v", v)
	}
	for i := range v {
		v[i] *= 2
	}
	unpackStats(out, v)
	if out.Loss != 2 || out.CE != 4 || out.Layers[1].Usage[0] != 18 || out.Running[0][1] != 22 || out.Running[1][0] != 24 {
		t.Errorf("unpacked %+v", out)
	}
}

// TestFirstDiffering: the job check names the first rank whose figures
// differ from rank 0's, and which figure.
func TestFirstDiffering(t *testing.T) {
	for _, c := range []struct {
		rows       []float64
		row, field int
	}{
		{[]float64{1, 2, 1, 2, 1, 2}, 0, 0},
		{[]float64{1, 2, 1, 2, 1, 3}, 2, 1},
		{[]float64{1, 2, 0, 2, 1, 3}, 1, 0},
		{[]float64{1, 2}, 0, 0},
	} {
		if r, f := firstDiffering(c.rows, 2); r != c.row || f != c.field {
			t.Errorf("%v: rank %d, field %d; want %d, %d", c.rows, r, f, c.row, c.field)
		}
	}
}
