package export_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
)

// attentionMasks lists, per attention core of an exported file, the
// initializer its scores get added: the Attention node's attn_mask input
// (op), or the constant of the Add before the Softmax (plain); "" when
// there is none.
func attentionMasks(m *onnxpb.ModelProto) []string {
	inits := map[string]bool{}
	for _, t := range m.Graph.Initializer {
		inits[t.Name] = true
	}
	var out []string
	for _, n := range m.Graph.Node {
		switch {
		case n.OpType == "Attention":
			mask := ""
			if len(n.Input) > 3 {
				mask = n.Input[3]
			}
			out = append(out, mask)
		case n.OpType == "Add" && len(n.Input) == 2 && inits[n.Input[1]] && strings.Contains(n.Input[1], "causal"):
			out = append(out, n.Input[1])
		}
	}
	return out
}

// The export without the bias (Options.DropBias) is the folded export less
// its biases: the same nodes, the Attention nodes without an attn_mask (op)
// or the Adds of one shared causal mask (plain), no other initializer
// changed; its logits are those of the folded graph with zero biases, not
// the model's.
func TestDropBias(t *testing.T) {
	requireORT(t)
	const B, T = 2, 24
	for _, att := range []passes.AttentionMode{passes.AttentionOp, passes.AttentionPlain} {
		t.Run(att.String(), func(t *testing.T) {
			cfg := smallCfg(model.Fuzzy)
			st := smallStore(t, &cfg, T)
			ex := func(drop bool) (string, *export.Result) {
				dir := t.TempDir()
				res, err := export.Export(context.Background(), export.Options{Config: cfg, Store: st, Lengths: []int{T}, Batch: B,
					Fold: passes.FoldRPAMode, DropBias: drop, Attention: att, Out: dir, Tokenizer: "test", EOS: 3})
				if err != nil {
					t.Fatal(err)
				}
				return dir, res
			}
			fdir, fres := ex(false)
			ddir, dres := ex(true)
			if fl, dl := fres.Lengths[0], dres.Lengths[0]; fl.Nodes != dl.Nodes || !maps.Equal(fl.Ops, dl.Ops) {
				t.Errorf("nodes: folded %d %v, without the bias %d %v", fl.Nodes, fl.Ops, dl.Nodes, dl.Ops)
			}
			read := func(dir string) *onnxpb.ModelProto {
				m, err := onnx.Read(filepath.Join(dir, export.FileName(T)))
				if err != nil {
					t.Fatal(err)
				}
				return m
			}
			fm, dm := read(fdir), read(ddir)
			fmasks, dmasks := attentionMasks(fm), attentionMasks(dm)
			if len(fmasks) != cfg.Layers || len(dmasks) != cfg.Layers {
				t.Fatalf("attention cores: folded %v, without the bias %v; want %d each", fmasks, dmasks, cfg.Layers)
			}
			for l := range cfg.Layers {
				if want := fmt.Sprintf("blocks.%d.attn.rpa_bias.T%d", l, T); !strings.HasPrefix(fmasks[l], want) {
					t.Errorf("folded layer %d adds %q, want the folded bias %s", l, fmasks[l], want)
				}
				want := ""
				if att == passes.AttentionPlain {
					want = fmt.Sprintf("attn.causal_mask.T%d", T)
				}
				if dmasks[l] != want {
					t.Errorf("layer %d without the bias adds %q, want %q", l, dmasks[l], want)
				}
			}
			inits := func(m *onnxpb.ModelProto) []string {
				var out []string
				for _, init := range m.Graph.Initializer {
					if !slices.Contains(fmasks, init.Name) && !slices.Contains(dmasks, init.Name) {
						out = append(out, init.Name)
					}
				}
				slices.Sort(out)
				return out
			}
			if a, b := inits(fm), inits(dm); !slices.Equal(a, b) {
				t.Errorf("initializers besides the masks differ:\nfolded  %v\nno bias %v", a, b)
			}

			// Records: the fold says the bias was dropped; the folded export does not.
			for _, tc := range []struct {
				dir  string
				want bool
			}{{fdir, false}, {ddir, true}} {
				man, err := runtime.ReadManifest(tc.dir)
				if err != nil {
					t.Fatal(err)
				}
				var fold export.Fold
				if err := json.Unmarshal(man.Fold, &fold); err != nil || fold.BiasDropped != tc.want || fold.Mode != passes.FoldRPAMode {
					t.Errorf("%s: manifest fold %s (%v), want bias_dropped %v", tc.dir, man.Fold, err, tc.want)
				}
			}

			// Logits: those of the folded graph with zero biases.
			seqs := randSeqs(rand.New(rand.NewPCG(41, 42)), B, T, cfg.Vocab)
			logits := func(dir string) []runtime.Logits {
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
			got := logits(ddir)
			g, rep, err := export.Graph(&cfg, T, B, st, export.GraphOptions{Fold: passes.FoldRPAMode, Attention: passes.AttentionNone})
			if err != nil {
				t.Fatal(err)
			}
			if d := maxDiff(got, goLogits(t, g, st, seqs)); d < 1e-3 {
				t.Errorf("without the bias the logits moved by %g only", d)
			}
			if d := maxDiff(logits(fdir), goLogits(t, g, st, seqs)); d > 1e-4 {
				t.Errorf("folded export vs Go folded graph: %g", d)
			}
			for _, l := range rep.Layers {
				c := g.Lookup(l.Name)
				for i := range c.Data {
					c.Data[i] = 0
				}
			}
			if d := maxDiff(got, goLogits(t, g, st, seqs)); d > 1e-4 {
				t.Errorf("without the bias vs the Go folded graph with zero biases: max |Δlogit| %g > 1e-4", d)
			}
			dg, _, err := export.Graph(&cfg, T, B, st, export.GraphOptions{Fold: passes.FoldRPAMode, DropBias: true, Attention: passes.AttentionNone})
			if err != nil {
				t.Fatal(err)
			}
			if d := maxDiff(got, goLogits(t, dg, st, seqs)); d > 1e-4 {
				t.Errorf("without the bias: onnxruntime vs Go: max |Δlogit| %g > 1e-4", d)
			}
		})
	}
}

// DropBias needs a folded bias: not with fold none, not for the baseline.
func TestDropBiasErrors(t *testing.T) {
	for _, tc := range []struct {
		kind model.Kind
		fold passes.FoldMode
		want string
	}{
		{model.Fuzzy, passes.FoldNoneMode, "fold rpa"},
		{model.Baseline, passes.FoldRPAMode, "no folded bias"},
	} {
		cfg := smallCfg(tc.kind)
		st := smallStore(t, &cfg, 8)
		_, err := export.Export(context.Background(), export.Options{Config: cfg, Store: st, Lengths: []int{8},
			Fold: tc.fold, DropBias: true, Out: t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s fold %s: want an error mentioning %q, got %v", tc.kind, tc.fold, tc.want, err)
		}
	}
}
