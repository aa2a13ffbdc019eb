package export_test

import (
	"context"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
)

// rankExport exports the small fuzzy model (clip bias_clip) with fold and
// attention, at the test lengths.
func rankExport(t *testing.T, clip float64, fold passes.FoldMode, attention passes.AttentionMode) (exported, error) {
	t.Helper()
	cfg := smallCfg(model.Fuzzy)
	cfg.BiasClip = clip
	st := smallStore(t, &cfg, lengths...)
	dir := t.TempDir()
	res, err := export.Export(context.Background(), export.Options{Config: cfg, Store: st, Lengths: lengths, Batch: 2,
		Fold: fold, Attention: attention, Out: dir, Tokenizer: "test", EOS: 3})
	return exported{variant{model.Fuzzy, fold, attention, onnx.QuantizeNone, ""}, cfg, st, dir, res}, err
}

func logitsIn(t *testing.T, dir string, seqs [][]int32) []runtime.Logits {
	t.Helper()
	m, err := runtime.Open(dir, runtime.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	out, err := m.Logits(context.Background(), seqs)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func flat(ls []runtime.Logits) []float32 {
	var out []float32
	for _, l := range ls {
		out = append(out, l.Data...)
	}
	return out
}

// With the clip inactive, --fold rank computes the dense fold's logits in
// onnxruntime (both lowerings), holds no per-layer [T,T] initializer, gives the
// Attention op no mask, and stays causal.
func TestRankFoldParity(t *testing.T) {
	requireORT(t)
	for _, att := range []passes.AttentionMode{passes.AttentionOp, passes.AttentionPlain} {
		dense, err := rankExport(t, 50, passes.FoldRPAMode, att)
		if err != nil {
			t.Fatal(err)
		}
		rank, err := rankExport(t, 50, passes.FoldRankMode, att)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(51, 52))
		for _, T := range lengths {
			seqs := randSeqs(r, 2, T, dense.cfg.Vocab)
			want := flat(logitsIn(t, dense.dir, seqs))
			if d := maxDiff(logitsIn(t, rank.dir, seqs), want); d > 1e-4 {
				t.Errorf("%s T=%d: rank fold vs dense fold: max |Δlogit| %g > 1e-4", att, T, d)
			}
			m, err := onnx.Read(rank.dir + "/" + export.FileName(T))
			if err != nil {
				t.Fatal(err)
			}
			for _, init := range m.Graph.Initializer {
				// The plain lowering keeps one causal mask shared by all layers.
				if d := init.Dims; len(d) == 2 && d[0] == int64(T) && d[1] == int64(T) && !strings.HasPrefix(init.Name, "attn.causal_mask") {
					t.Errorf("%s T=%d: [T,T] initializer %s in the rank export", att, T, init.Name)
				}
			}
			for _, n := range m.Graph.Node {
				if n.OpType == "Attention" && len(n.Input) > 3 && n.Input[3] != "" {
					t.Errorf("%s T=%d: Attention node %s has a mask %q", att, T, n.Name, n.Input[3])
				}
			}
		}
		for _, l := range rank.res.Lengths {
			for _, f := range l.Fold {
				if f.Rank == 0 || f.ClipFrac != 0 {
					t.Errorf("%s T=%d: fold record %+v, want a rank form with no clip", att, l.T, f)
				}
			}
		}
		checkCausal(t, rank)
	}
}

// checkCausal: changing tokens after t leaves positions <= t unchanged.
func checkCausal(t *testing.T, e exported) {
	t.Helper()
	m, err := runtime.Open(e.dir, runtime.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r := rand.New(rand.NewPCG(61, 62))
	V := e.cfg.Vocab
	for _, T := range lengths {
		for _, cut := range []int{0, T / 2, T - 2} {
			a := randSeqs(r, 1, T, V)[0]
			b := append([]int32(nil), a...)
			for j := cut + 1; j < T; j++ {
				b[j] = int32((int(b[j]) + 1 + r.IntN(V-1)) % V)
			}
			out, err := m.Logits(context.Background(), [][]int32{a, b})
			if err != nil {
				t.Fatal(err)
			}
			var before, after float64
			for i := range out[0].Data {
				d := math.Abs(float64(out[0].Data[i] - out[1].Data[i]))
				if i/V <= cut {
					before = math.Max(before, d)
				} else {
					after = math.Max(after, d)
				}
			}
			if before > 1e-5 || after == 0 {
				t.Errorf("%s T=%d cut %d: change at or before the cut %g (want 0), after it %g (want > 0)", e.v, T, cut, before, after)
			}
		}
	}
}

// Where the clip is active, --fold rank is refused with a message naming
// rank-approx; rank-approx exports, and Verify measures its CE cost.
func TestRankFoldClip(t *testing.T) {
	requireORT(t)
	_, err := rankExport(t, 0.3, passes.FoldRankMode, passes.AttentionOp)
	if err == nil || !strings.Contains(err.Error(), "rank-approx") || !strings.Contains(err.Error(), "clip") {
		t.Fatalf("active clip: want a refusal naming rank-approx, got %v", err)
	}
	e, err := rankExport(t, 0.3, passes.FoldRankApproxMode, passes.AttentionOp)
	if err != nil {
		t.Fatal(err)
	}
	clipped := 0
	for _, l := range e.res.Lengths {
		for _, f := range l.Fold {
			if f.ClipFrac > 0 {
				clipped++
			}
		}
	}
	if clipped == 0 {
		t.Fatal("rank-approx: no layer reports a clipped fraction (the test model's clip is inactive)")
	}
	ids := randSeqs(rand.New(rand.NewPCG(71, 72)), 1, 200, e.cfg.Vocab)[0]
	res, err := export.Verify(context.Background(), export.VerifyOptions{Dir: e.dir, Config: e.cfg, Store: e.st, IDs: ids, Batches: 2, Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range res {
		cost := x.CEExport - x.CEEval
		if x.MaxAbsDiff < 1e-4 || math.IsNaN(cost) || cost == 0 {
			t.Errorf("T=%d: rank-approx max |Δlogit| %g, CE cost %g: want the dropped clip to show", x.T, x.MaxAbsDiff, cost)
		}
		t.Logf("rank-approx T=%d: CE cost %+.5f nats, max |Δlogit| %.2e", x.T, cost, x.MaxAbsDiff)
	}
	checkCausal(t, e)
}

// op8 (padded heads) computes the logits of op in onnxruntime, for the
// dense and the rank fold, and its Attention nodes read one head size that
// is a multiple of 8.
func TestPaddedHeadsParity(t *testing.T) {
	requireORT(t)
	for _, fold := range []passes.FoldMode{passes.FoldRPAMode, passes.FoldRankMode} {
		ref, err := rankExport(t, 50, fold, passes.AttentionOp)
		if err != nil {
			t.Fatal(err)
		}
		pad, err := rankExport(t, 50, fold, passes.AttentionOpPadded)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(57, 58))
		for _, T := range lengths {
			seqs := randSeqs(r, 2, T, ref.cfg.Vocab)
			if d := maxDiff(logitsIn(t, pad.dir, seqs), flat(logitsIn(t, ref.dir, seqs))); d > 1e-4 {
				t.Errorf("%s T=%d: op8 vs op: max |Δlogit| %g > 1e-4", fold, T, d)
			}
		}
		checkCausal(t, pad)
	}
}
