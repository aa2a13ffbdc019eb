package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// joinedGraph is the joined backward of three Linears that read x (as
// passes.JoinSiblingGrads makes it): D = Concat(dy0, dy1, dy2) along the
// columns (lazy as asked), dw = LinearGradW(D, x), dx = LinearGradX(D,
// Concat(w0, w1, w2)). The parts' widths are no multiples of 8, so the
// padded bf16 rows of D take columns of two parts in one 16-byte store.
func joinedGraph(R, K int, widths []int, lazy bool) *ir.Graph {
	g := ir.New("joined")
	var dys []*ir.Value
	for i, n := range widths {
		dy := g.Input(string(rune('a'+i)), ir.Shape{R, n}, ir.F32)
		dys = append(dys, g.Op1("Scale", ir.Attrs{"alpha": 1.0, "beta": 0.0}, dy)) // intermediates, in plan slots
	}
	addJoinedGrads(g, g.Input("x", ir.Shape{R, K}, ir.F32), dys, lazy)
	return g
}

// addJoinedGrads adds the joined gradients over parts to g: D =
// Concat(parts) along the columns (lazy as asked), outputs dw =
// LinearGradW(D, x) and dx = LinearGradX(D, Concat(w_i)), the weights w_i
// params p, q, r, ... of the parts' widths.
func addJoinedGrads(g *ir.Graph, x *ir.Value, parts []*ir.Value, lazy bool) {
	K := lastDim(x.Shape)
	var ws []*ir.Value
	for i, v := range parts {
		ws = append(ws, g.Param(string(rune('p'+i)), ir.Shape{lastDim(v.Shape), K}))
	}
	d := g.Op1("Concat", ir.Attrs{"axis": -1, "lazy": lazy}, parts...)
	g.SetOutput("dw", g.Op1("LinearGradW", nil, d, x))
	g.SetOutput("dx", g.Op1("LinearGradX", nil, d, g.Op1("Concat", ir.Attrs{"axis": 0}, ws...)))
}

// TestGPUJoinedGradsLazyConcat: under bf16 GEMMs a lazy Concat that only
// the GEMMs read is never written (its parts go straight to the staging
// buffer through f32_cat_to_bf16_pad_kernel), and the outputs equal the
// eager Concat's bit for bit and the bf16 products to 1e-4; with fp32
// GEMMs the lazy Concat is written as any other. On the simulator all of
// it again in differential mode.
func TestGPUJoinedGradsLazyConcat(t *testing.T) {
	differentially(t, []string{"f32_cat_to_bf16_pad_kernel"}, func() { joinedGradsLazyConcat(t) })
}

func joinedGradsLazyConcat(t *testing.T) {
	const R, K = 45, 37
	widths := []int{13, 30, 21}
	r := rand.New(rand.NewPCG(71, 72))
	feeds := map[string]*kernels.Tensor{"x": {Shape: ir.Shape{R, K}, F32: randF32(r, R*K, 1)}}
	var D []float32 // the concatenation, row by row
	parts := make([][]float32, len(widths))
	for i, n := range widths {
		parts[i] = randF32(r, R*n, 1)
		feeds[string(rune('a'+i))] = &kernels.Tensor{Shape: ir.Shape{R, n}, F32: parts[i]}
	}
	N := 0
	for _, n := range widths {
		N += n
	}
	for row := 0; row < R; row++ {
		for i, n := range widths {
			D = append(D, parts[i][row*n:(row+1)*n]...)
		}
	}
	W := randF32(r, N*K, 1)
	weights := map[string]*kernels.Tensor{}
	off := 0
	for i, n := range widths {
		weights[string(rune('p'+i))] = &kernels.Tensor{Shape: ir.Shape{n, K}, F32: W[off*K : (off+n)*K]}
		off += n
	}
	run := func(prec ir.Precision, lazy bool) (dw, dx []float32, folded int) {
		res := runPacked(t, joinedGraph(R, K, widths, lazy), prec, true, weights, feeds, []string{"dw", "dx"})
		return res.outs["dw"], res.outs["dx"], res.cats
	}
	dw, dx, folded := run(ir.BF16, true)
	if folded != 1 {
		t.Fatalf("bf16: %d lazy Concats left unwritten, want 1", folded)
	}
	closeTo(t, "dw", dw, matmulRef(D, feeds["x"].F32, 1, N, K, R, true, false, true), 1e-4)
	closeTo(t, "dx", dx, matmulRef(D, W, 1, R, K, N, false, false, true), 1e-4)
	edw, edx, efolded := run(ir.BF16, false)
	if efolded != 0 {
		t.Fatalf("an eager Concat was left unwritten")
	}
	for i := range dw {
		if dw[i] != edw[i] {
			t.Fatalf("dw[%d] = %g with the lazy Concat, %g with the eager one", i, dw[i], edw[i])
		}
	}
	for i := range dx {
		if dx[i] != edx[i] {
			t.Fatalf("dx[%d] = %g with the lazy Concat, %g with the eager one", i, dx[i], edx[i])
		}
	}
	fdw, fdx, ffolded := run(ir.FP32, true)
	if ffolded != 0 {
		t.Fatalf("fp32 GEMMs: the lazy Concat was left unwritten")
	}
	closeTo(t, "fp32 dw", fdw, matmulRef(D, feeds["x"].F32, 1, N, K, R, true, false, false), 1e-4)
	closeTo(t, "fp32 dx", fdx, matmulRef(D, W, 1, R, K, N, false, false, false), 1e-4)
}
