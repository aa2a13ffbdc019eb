package passes_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/passes"
)

// rankCfg is exportCfg with a bias clip that cuts nothing.
func rankCfg(layers int) model.Config {
	cfg := exportCfg(model.Fuzzy, layers)
	cfg.BiasClip = 50
	return cfg
}

// With the clip inactive, the rank fold gives the eval-mode logits in
// every attention lowering, with no [T,T] constant and no bias Add left.
func TestFoldRankExact(t *testing.T) {
	for _, posmix := range []float64{0.1, 0} {
		for _, att := range []passes.AttentionMode{passes.AttentionNone, passes.AttentionOp, passes.AttentionPlain} {
			cfg := rankCfg(2)
			cfg.RPAPosmix = posmix
			const T, B = 12, 2
			st := exportStore(t, &cfg, T)
			ids := randIDs(rand.New(rand.NewPCG(3, 4)), B*T, cfg.Vocab)
			want := logitsOf(t, evalGraph(t, &cfg, T, B, model.Eval, false), st, ids)
			g := evalGraph(t, &cfg, T, B, model.Eval, false)
			rep := &passes.FoldReport{}
			if err := passes.Run(g, passes.ExportPipeline, exportCtx(g, st, passes.FoldRankMode, att, rep)); err != nil {
				t.Fatal(err)
			}
			if d := maxAbsDiff(logitsOf(t, g, st, ids), want); d > 1e-5 {
				t.Errorf("posmix %g %s: rank-folded logits differ from eval mode by %g", posmix, att, d)
			}
			if len(rep.Layers) != cfg.Layers {
				t.Fatalf("posmix %g %s: report has %d layers, want %d", posmix, att, len(rep.Layers), cfg.Layers)
			}
			K := cfg.K()
			for i, l := range rep.Layers {
				wantRank := K
				if posmix > 0 {
					wantRank++ // the per-key position term
				}
				if l.Layer != i || l.T != T || l.Rank != wantRank || l.ClipFrac != 0 || !(l.RankErr < 1e-5) || l.Min >= l.Max {
					t.Errorf("posmix %g %s: report entry %+v, want layer %d, rank %d, no clip, error < 1e-5", posmix, att, l, i, wantRank)
				}
			}
			for _, v := range g.Values {
				if v.Kind == ir.Const && len(v.Shape) == 2 && v.Shape[0] == T && v.Shape[1] == T && !strings.HasPrefix(v.Name, "attn.causal_mask") {
					t.Errorf("posmix %g %s: [T,T] constant %s left", posmix, att, v.Name)
				}
			}
			ops := g.OpCounts()
			for _, op := range []ir.OpName{ir.OpSinkhorn, ir.OpZScore, ir.OpCausalMask} {
				if ops[op] > 0 && !(op == ir.OpCausalMask && att == passes.AttentionNone) {
					t.Errorf("posmix %g %s: %s left: %v", posmix, att, op, ops)
				}
			}
			if ops["Concat"] != 2*cfg.Layers {
				t.Errorf("posmix %g %s: %d Concat nodes, want %d", posmix, att, ops["Concat"], 2*cfg.Layers)
			}
			for _, n := range g.Nodes {
				if n.Op == ir.OpFusedAttention && (len(n.Inputs) != 3 || n.Inputs[0].Shape[3] != cfg.HeadDim()+l0(rep).Rank) {
					t.Errorf("posmix %g %s: FusedAttention reads %d inputs, q %v", posmix, att, len(n.Inputs), n.Inputs[0].Shape)
				}
			}
		}
	}
}

func l0(r *passes.FoldReport) passes.FoldLayer { return r.Layers[0] }

// Where the clip cuts visible entries, rank is refused with a message
// that names the layer, the clip and the way out; rank-approx folds,
// reports the clipped fraction and computes the logits of the model with
// its clip removed.
func TestFoldRankClip(t *testing.T) {
	cfg := exportCfg(model.Fuzzy, 1)
	cfg.BiasClip = 0.5
	const T = 12
	st := exportStore(t, &cfg, T)
	g := evalGraph(t, &cfg, T, 1, model.Eval, false)
	err := passes.Run(g, passes.ExportPipeline, exportCtx(g, st, passes.FoldRankMode, passes.AttentionOp, nil))
	if err == nil || !strings.Contains(err.Error(), "layer 0") || !strings.Contains(err.Error(), "clip") || !strings.Contains(err.Error(), "rank-approx") {
		t.Fatalf("active clip: want a refusal naming the layer and rank-approx, got %v", err)
	}
	ids := randIDs(rand.New(rand.NewPCG(5, 6)), T, cfg.Vocab)
	clipped := logitsOf(t, evalGraph(t, &cfg, T, 1, model.Eval, false), st, ids)
	open := cfg
	open.BiasClip = 1000 // the largest a config may hold: no bias comes near it
	unclipped := logitsOf(t, evalGraph(t, &open, T, 1, model.Eval, false), st, ids)

	g = evalGraph(t, &cfg, T, 1, model.Eval, false)
	rep := &passes.FoldReport{}
	if err := passes.Run(g, passes.ExportPipeline, exportCtx(g, st, passes.FoldRankApproxMode, passes.AttentionOp, rep)); err != nil {
		t.Fatal(err)
	}
	if l := rep.Layers[0]; l.ClipFrac < 0.05 || l.Clip != 0.5 || !(l.RankErr > 1e-3) {
		t.Errorf("rank-approx report %+v: want the clipped fraction, the clip and a deviation", l)
	}
	got := logitsOf(t, g, st, ids)
	if d := maxAbsDiff(got, unclipped); d > 1e-5 {
		t.Errorf("rank-approx logits differ from the unclipped model's by %g", d)
	}
	if d := maxAbsDiff(got, clipped); d < 1e-4 {
		t.Errorf("rank-approx logits equal the clipped model's (%g): the test model's clip is not active", d)
	}
}

// The legacy bias (a running similarity matrix) and the baseline (no
// prior) have no rank form.
func TestFoldRankRefuses(t *testing.T) {
	cfg := rankCfg(1)
	cfg.UseRPA = false
	st := exportStore(t, &cfg, 8)
	g := evalGraph(t, &cfg, 8, 1, model.Eval, false)
	err := passes.Run(g, passes.ExportPipeline, exportCtx(g, st, passes.FoldRankMode, passes.AttentionOp, nil))
	if err == nil || !strings.Contains(err.Error(), "--fold rpa") || !strings.Contains(err.Error(), "layer 0") {
		t.Errorf("legacy bias: want a refusal pointing to --fold rpa, got %v", err)
	}
	base := exportCfg(model.Baseline, 1)
	bst := exportStore(t, &base, 8)
	g = evalGraph(t, &base, 8, 1, model.Eval, false)
	err = passes.Run(g, passes.ExportPipeline, exportCtx(g, bst, passes.FoldRankMode, passes.AttentionOp, nil))
	if err == nil || !strings.Contains(err.Error(), "no attention core with a bias") {
		t.Errorf("baseline: want a refusal, got %v", err)
	}
	g = evalGraph(t, &cfg, 8, 1, model.Eval, true)
	err = passes.Run(g, passes.ExportPipeline, exportCtx(g, st, passes.FoldRankMode, passes.AttentionOp, nil))
	if err == nil || !strings.Contains(err.Error(), "batch statistics") {
		t.Errorf("batch statistics: want a refusal, got %v", err)
	}
}

// Changing tokens after position t leaves the rank-folded logits at
// positions <= t unchanged.
func TestFoldRankCausal(t *testing.T) {
	cfg := rankCfg(2)
	const T = 10
	st := exportStore(t, &cfg, T)
	g := evalGraph(t, &cfg, T, 1, model.Eval, false)
	if err := passes.Run(g, passes.ExportPipeline, exportCtx(g, st, passes.FoldRankMode, passes.AttentionOp, nil)); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(9, 10))
	ids := randIDs(r, T, cfg.Vocab)
	base := logitsOf(t, g, st, ids)
	V := cfg.Vocab
	for _, cut := range []int{0, 4, 8} {
		alt := append([]int32(nil), ids...)
		for i := cut + 1; i < T; i++ {
			alt[i] = int32((int(alt[i]) + 1 + r.IntN(V-1)) % V)
		}
		got := logitsOf(t, g, st, alt)
		if d := maxAbsDiff(got[:(cut+1)*V], base[:(cut+1)*V]); d > 1e-6 || math.IsNaN(d) {
			t.Errorf("tokens after %d change logits at or before it by %g", cut, d)
		}
	}
}

// op8 pads q, k and v to one head size, a multiple of 8, and keeps the
// logits of op, for the dense and the rank fold.
func TestPadAttentionHeads(t *testing.T) {
	for _, fold := range []passes.FoldMode{passes.FoldRPAMode, passes.FoldRankMode} {
		cfg := rankCfg(2)
		const T, B = 10, 2
		st := exportStore(t, &cfg, T)
		ids := randIDs(rand.New(rand.NewPCG(13, 14)), B*T, cfg.Vocab)
		want := logitsOf(t, evalGraph(t, &cfg, T, B, model.Eval, false), st, ids)
		g := evalGraph(t, &cfg, T, B, model.Eval, false)
		if err := passes.Run(g, passes.ExportPipeline, exportCtx(g, st, fold, passes.AttentionOpPadded, nil)); err != nil {
			t.Fatal(err)
		}
		if d := maxAbsDiff(logitsOf(t, g, st, ids), want); d > 1e-5 {
			t.Errorf("%s op8: logits differ from eval mode by %g", fold, d)
		}
		n := 0
		for _, nd := range g.Nodes {
			if nd.Op != ir.OpFusedAttention {
				continue
			}
			n++
			q, k, v := nd.Inputs[0].Shape[3], nd.Inputs[1].Shape[3], nd.Inputs[2].Shape[3]
			if q != k || k != v || v%passes.HeadAlign != 0 {
				t.Errorf("%s op8: head sizes q %d, k %d, v %d, want one multiple of %d", fold, q, k, v, passes.HeadAlign)
			}
		}
		if n != cfg.Layers {
			t.Errorf("%s op8: %d FusedAttention nodes, want %d", fold, n, cfg.Layers)
		}
	}
}
