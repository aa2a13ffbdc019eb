package passes_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/passes"
)

// layoutGraph: a causal core on the Transposes of three [B,T,H,D] inputs,
// its output transposed back, with dropout; extra adds a second reader of
// the transposed q (then the core must keep its layout).
func layoutGraph(extra bool) *ir.Graph {
	g := ir.New("layout")
	s := ir.Shape{2, 7, 3, 4}
	perm := ir.Attrs{"perm": []int{0, 2, 1, 3}}
	var qkv []*ir.Value
	for _, n := range []string{"q", "k", "v"} {
		qkv = append(qkv, g.Op1("Transpose", perm, g.Input(n, s, ir.F32)))
	}
	o := g.Apply("FusedAttention", ir.Attrs{"scale": 0.5, "causal": true, "dropout": 0.2}, qkv...)[0]
	g.SetOutput("out", g.Op1("Transpose", perm, o))
	if extra {
		g.SetOutput("q", g.Op1("Neg", nil, qkv[0]))
	}
	return g
}

// TestAttentionLayout: the core takes the [B,T,H,D] inputs as they are and
// its Transposes go, computing the same values (the same dropout draws);
// with another reader of the transposed q it keeps [B,H,T,D].
func TestAttentionLayout(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	feeds := map[string]*kernels.Tensor{}
	for _, n := range []string{"q", "k", "v"} {
		x := kernels.NewTensor(ir.FP32, ir.Shape{2, 7, 3, 4})
		for i := range x.F32 {
			x.F32[i] = float32(r.NormFloat64())
		}
		feeds[n] = x
	}
	want := runGraph(t, layoutGraph(false), feeds)
	g := layoutGraph(false)
	if err := passes.AttentionLayout(g); err != nil {
		t.Fatal(err)
	}
	if err := ir.Verify(g, false); err != nil {
		t.Fatal(err)
	}
	counts := g.OpCounts()
	if counts["Transpose"] != 0 || counts["FusedAttention"] != 1 || ir.AttnLayoutOf(g.Nodes[0].Attrs) != ir.AttnBTHD {
		t.Fatalf("ops %v, layout %v: want one bthd FusedAttention and no Transpose", counts, g.Nodes[0].Attrs)
	}
	got := runGraph(t, g, feeds)
	for i := range want {
		if math.Abs(float64(got[i]-want[i])) > 1e-6 {
			t.Fatalf("out[%d] = %v in bthd, %v in bhtd", i, got[i], want[i])
		}
	}
	kept := layoutGraph(true)
	if err := passes.AttentionLayout(kept); err != nil {
		t.Fatal(err)
	}
	for _, n := range kept.Nodes {
		if n.Op == ir.OpFusedAttention && ir.AttnLayoutOf(n.Attrs) != ir.AttnBHTD {
			t.Error("a core whose transposed q has another reader changed layout")
		}
	}
}
