package passes_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/passes"
)

// DropFoldedBias leaves the folded graph without its biases: one Add per
// layer fewer, no bias constant, and the logits of the folded graph with
// every bias set to zero.
func TestDropFoldedBias(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		cfg := exportCfg(model.Fuzzy, 2)
		cfg.UseRPA = !legacy
		const T, B = 12, 2
		st := exportStore(t, &cfg, T)
		ids := randIDs(rand.New(rand.NewPCG(3, 4)), B*T, cfg.Vocab)
		build := func(drop bool) (*ir.Graph, *passes.FoldReport) {
			g := evalGraph(t, &cfg, T, B, model.Eval, false)
			rep := &passes.FoldReport{}
			pipe := append([]passes.Pass(nil), passes.ExportPipeline[:2]...)
			pipe = append(pipe, passes.Pass{Name: "drop bias", Fn: func(g *ir.Graph, _ *passes.Context) error {
				if !drop {
					return nil
				}
				n, err := passes.DropFoldedBias(g, rep)
				if err == nil && n != cfg.Layers {
					t.Errorf("legacy=%v: dropped %d biases, want %d", legacy, n, cfg.Layers)
				}
				return err
			}})
			pipe = append(pipe, passes.ExportPipeline[2:]...)
			if err := passes.Run(g, pipe, exportCtx(g, st, passes.FoldRPAMode, passes.AttentionNone, rep)); err != nil {
				t.Fatal(err)
			}
			return g, rep
		}
		folded, rep := build(false)
		dropped, _ := build(true)
		want := folded.OpCounts()
		want["Add"] -= cfg.Layers
		if got := dropped.OpCounts(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("legacy=%v: ops without the bias %v, want the folded graph's less one Add per layer %v", legacy, got, want)
		}
		if len(dropped.Nodes) != len(folded.Nodes)-cfg.Layers {
			t.Errorf("legacy=%v: %d nodes without the bias, %d folded", legacy, len(dropped.Nodes), len(folded.Nodes))
		}
		withBias := logitsOf(t, folded, st, ids)
		for _, l := range rep.Layers {
			if dropped.Lookup(l.Name) != nil {
				t.Errorf("legacy=%v: bias %s left in the graph", legacy, l.Name)
			}
			c := folded.Lookup(l.Name)
			for i := range c.Data {
				c.Data[i] = 0
			}
		}
		got := logitsOf(t, dropped, st, ids)
		if d := maxAbsDiff(got, logitsOf(t, folded, st, ids)); d > 1e-6 {
			t.Errorf("legacy=%v: logits without the bias differ from the folded graph's with zero biases by %g", legacy, d)
		}
		if d := maxAbsDiff(got, withBias); d < 1e-4 {
			t.Errorf("legacy=%v: dropping the bias moved the logits by %g only", legacy, d)
		}
	}
	cfg := exportCfg(model.Fuzzy, 1)
	g := evalGraph(t, &cfg, 8, 1, model.Eval, false)
	if _, err := passes.DropFoldedBias(g, &passes.FoldReport{}); err == nil || !strings.Contains(err.Error(), "no folded bias") {
		t.Errorf("empty report: got %v", err)
	}
	if _, err := passes.DropFoldedBias(g, &passes.FoldReport{Layers: []passes.FoldLayer{{Name: "blocks.0.attn.rpa_bias.T99"}}}); err == nil || !strings.Contains(err.Error(), "rpa_bias.T99") {
		t.Errorf("unknown bias: got %v", err)
	}
}
