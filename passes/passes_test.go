package passes_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/passes"
)

func trainGraph(t *testing.T, kind model.Kind) *ir.Graph {
	t.Helper()
	p, _ := model.LookupPreset("tiny")
	c := p.Config
	c.Model = kind
	c.Vocab, c.DModel, c.MaxLen, c.Dropout = 97, 32, 16, 0.1
	mg, err := model.Build(&c, model.Opts{T: 16, B: 2, Mode: model.Train})
	if err != nil {
		t.Fatal(err)
	}
	g := mg.Graph
	if err := passes.Run(g, passes.TrainPipeline, &passes.Context{Loss: "loss"}); err != nil {
		t.Fatal(err)
	}
	return g
}

// The plan never lets two values that are live at the same time share a
// slot, unless one is an alias op's view of the other (Reshape,
// StopGradient: the same elements), keeps outputs live to the end, and
// reuses memory; the step graph's reshapes of activations do share slots.
func TestPlanIsSafeAndReuses(t *testing.T) {
	for _, kind := range []model.Kind{model.Fuzzy, model.Baseline} {
		g := trainGraph(t, kind)
		p := passes.Plan(g)
		def := map[*ir.Value]int{}
		last := map[*ir.Value]int{}
		for i, n := range g.Nodes {
			for _, o := range n.Outputs {
				def[o] = i
				last[o] = i
			}
			for _, in := range n.Inputs {
				last[in] = i
			}
		}
		for _, v := range g.Outputs {
			last[v] = len(g.Nodes)
		}
		bySlot := map[int][]*ir.Value{}
		for v := range def {
			if v.DType != ir.F32 {
				continue
			}
			s, ok := p.Slot[v.ID]
			if !ok {
				t.Fatalf("%s: value %s has no slot", kind, v)
			}
			if p.SlotElems[s] < v.Shape.Numel() {
				t.Fatalf("%s: slot %d holds %d elements, value %s needs %d", kind, s, p.SlotElems[s], v, v.Shape.Numel())
			}
			bySlot[s] = append(bySlot[s], v)
		}
		root := func(v *ir.Value) *ir.Value { // the value an alias chain starts from
			for v.Def != nil && ir.Ops[v.Def.Op].Alias {
				x := v.Def.Inputs[0]
				if s, ok := p.Slot[x.ID]; !ok || x.Kind != ir.Intermediate || s != p.Slot[v.ID] {
					break
				}
				v = x
			}
			return v
		}
		aliased := 0
		for s, vs := range bySlot {
			for i := range vs {
				if root(vs[i]) != vs[i] {
					aliased++
				}
				for j := i + 1; j < len(vs); j++ {
					a, b := vs[i], vs[j]
					// live ranges [def, last] must not overlap, but for views
					// of the same elements
					if def[a] <= last[b] && def[b] <= last[a] && root(a) != root(b) {
						t.Fatalf("%s: slot %d shared by %s [%d,%d] and %s [%d,%d]", kind, s, a, def[a], last[a], b, def[b], last[b])
					}
				}
			}
		}
		if aliased == 0 {
			t.Fatalf("%s: no reshape shares its input's slot", kind)
		}
		checkFreedAfter(t, g, p, bySlot, def, last, root)
		if p.Peak >= p.Naive {
			t.Fatalf("%s: plan peak %d is not below the naive %d", kind, p.Peak, p.Naive)
		}
		t.Logf("%s: %d nodes, %d slots, peak %d elements vs %d without reuse", kind, len(g.Nodes), len(p.SlotElems), p.Peak, p.Naive)
	}
}

// checkFreedAfter: Plan.FreedAfter gives a slot back only after a node
// past which none of its values is live, and between any two values of a
// slot that are not views of one another, the first dead before the
// second is made, it gives the slot back (where a backend may poison it).
func checkFreedAfter(t *testing.T, g *ir.Graph, p *kernels.Plan, bySlot map[int][]*ir.Value, def, last map[*ir.Value]int,
	root func(*ir.Value) *ir.Value) {
	t.Helper()
	at := map[int]int{} // node ID -> index
	for i, n := range g.Nodes {
		at[n.ID] = i
	}
	freed := map[int][]int{} // slot -> the node indices after which it is given back
	for id, slots := range p.FreedAfter {
		for _, s := range slots {
			i := at[id]
			freed[s] = append(freed[s], i)
			for _, v := range bySlot[s] {
				if def[v] <= i && i < last[v] {
					t.Fatalf("slot %d given back after node %d while %s [%d,%d] is live", s, i, v, def[v], last[v])
				}
			}
		}
	}
	for s, vs := range bySlot {
		for _, a := range vs {
			for _, b := range vs {
				if last[a] >= def[b] || root(a) == root(b) {
					continue
				}
				if !slices.ContainsFunc(freed[s], func(i int) bool { return last[a] <= i && i < def[b] }) {
					t.Fatalf("slot %d passes from %s [%d,%d] to %s [%d,%d] without being given back", s, a, def[a], last[a], b, def[b], last[b])
				}
			}
		}
	}
}

// Pipelines that break an ordering constraint are refused.
func TestPipelineOrder(t *testing.T) {
	bad := []passes.Pass{{Name: "dce"}, {Name: "autodiff"}}
	if err := passes.CheckOrder(bad); err == nil {
		t.Fatal("dce before autodiff accepted")
	}
	if err := passes.CheckOrder(passes.TrainPipeline); err != nil {
		t.Fatal(err)
	}
}

// The dump after a named pass is the verified graph text.
func TestDumpAfterPass(t *testing.T) {
	p, _ := model.LookupPreset("tiny")
	c := p.Config
	c.Vocab, c.DModel, c.MaxLen = 31, 16, 8
	mg, err := model.Build(&c, model.Opts{T: 8, B: 1, Mode: model.Train})
	if err != nil {
		t.Fatal(err)
	}
	g := mg.Graph
	var b strings.Builder
	if err := passes.Run(g, passes.TrainPipeline, &passes.Context{Loss: "loss", DumpAfter: "autodiff", Dump: &b}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"// after pass autodiff", "GaussianMembershipGrad", `output "grad:blocks.0.mem.centers"`} {
		if !strings.Contains(out, want) {
			t.Fatalf("dump lacks %q", want)
		}
	}
}

// A training graph computes its LM head with the fused op: the plan holds
// no [B·T,V] value, records the op's scratch, and Flops counts its GEMMs
// (6·N·V·D for the forward and its gradient).
func TestFusedHeadPlanAndFlops(t *testing.T) {
	g := trainGraph(t, model.Baseline)
	const N, V, D = 32, 97, 32
	counts := g.OpCounts()
	if counts["LMHeadCrossEntropy"] != 1 || counts["LMHeadCrossEntropyGrad"] != 1 || counts["CrossEntropy"] != 0 {
		t.Fatalf("op counts %v: want one fused head and its gradient", counts)
	}
	for _, v := range g.Values {
		if v.Kind == ir.Intermediate && len(v.Shape) > 0 && v.Shape[len(v.Shape)-1] == V && v.Shape.Numel() == N*V {
			t.Errorf("value %s%v has the shape of the logits", v, v.Shape)
		}
	}
	p := passes.Plan(g)
	rows := N // at most one chunk here
	want := rows*(V+4) + N*D + V*D + (rows+2)*D + 2*N
	if p.ScratchElems != want {
		t.Errorf("plan scratch %d elements, want %d", p.ScratchElems, want)
	}
	var head int64
	for _, n := range g.Nodes {
		if n.Op == ir.OpLMHeadCrossEntropy || n.Op == ir.OpLMHeadCrossEntropyGrad {
			one := ir.New("one")
			one.Nodes = []*ir.Node{n}
			head += passes.Flops(one)
		}
	}
	if head != 6*N*V*D {
		t.Errorf("head flops %d, want 6·N·V·D = %d", head, 6*N*V*D)
	}
}

// TestLMHeadChunkPass: a backend's LM-head chunk (Context.LMHeadChunk,
// from kernels.Capabilities) reaches the fused head and its gradient
// through the train pipeline, and the plan's scratch follows it; without
// one the nodes keep ir.LMHeadChunk; a node's own chunk stays.
func TestLMHeadChunkPass(t *testing.T) {
	p, _ := model.LookupPreset("tiny")
	c := p.Config
	c.Model = model.Baseline
	c.Vocab, c.DModel, c.MaxLen, c.Dropout = 97, 32, 16, 0
	const B, T, N, V, D = 4, 16, 64, 97, 32
	build := func(chunk int) *ir.Graph {
		mg, err := model.Build(&c, model.Opts{T: T, B: B, Mode: model.Train})
		if err != nil {
			t.Fatal(err)
		}
		if err := passes.Run(mg.Graph, passes.TrainPipeline, &passes.Context{Loss: "loss", LMHeadChunk: chunk}); err != nil {
			t.Fatal(err)
		}
		return mg.Graph
	}
	// chunk 0: ir.LMHeadChunk, above N: one chunk; 24: three chunks of 22
	for _, cs := range []struct{ chunk, rows int }{{0, N}, {24, 22}} {
		chunk := cs.chunk
		g := build(chunk)
		heads := 0
		for _, n := range g.Nodes {
			if n.Op == ir.OpLMHeadCrossEntropy || n.Op == ir.OpLMHeadCrossEntropyGrad {
				heads++
				if got := n.Attrs.Int("chunk", 0); got != chunk {
					t.Errorf("chunk %d: %s has chunk attribute %d", chunk, n.Op, got)
				}
				if rows := ir.LMHeadChunkRows(n); rows != cs.rows {
					t.Errorf("chunk %d: %s computes %d rows at once", chunk, n.Op, rows)
				}
			}
		}
		if heads != 2 {
			t.Fatalf("chunk %d: %d head nodes, want the head and its gradient", chunk, heads)
		}
	}
	g := ir.New("own")
	x, w := g.Input("x", ir.Shape{N, D}, ir.F32), g.Input("w", ir.Shape{V, D}, ir.F32)
	y := g.Input("y", ir.Shape{N}, ir.I32)
	g.Apply("LMHeadCrossEntropy", ir.Attrs{"chunk": 7}, x, w, y)
	passes.LMHeadChunk(g, 4096)
	if got := g.Nodes[0].Attrs.Int("chunk", 0); got != 7 {
		t.Errorf("a node's own chunk 7 became %d", got)
	}
}
