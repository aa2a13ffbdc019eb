package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/runtime"
)

// Benchmarks of lowering choices, run in onnxruntime:
//
//	go test -run '^$' -bench . ./runtime

const (
	benchV = 8192
	benchD = 256
	benchT = 256
)

// headGraph is an embedding, an MLP with GELU and an LM head that is either
// tied to the embedding (stored once, transposed by a node) or a separate
// weight (stored pre-transposed).
func headGraph(tied bool) func(B, T int) *ir.Graph {
	return func(B, T int) *ir.Graph {
		g := ir.New("bench")
		ids := g.Input("input_ids", ir.Shape{B, T}, ir.I32)
		E := g.Param("emb", ir.Shape{benchV, benchD})
		x := g.Op1("Gather", nil, E, ids)
		f := g.Op1("GELU", nil, g.Op1("Linear", nil, x, g.Param("up", ir.Shape{4 * benchD, benchD})))
		x = g.Op1("Add", nil, x, g.Op1("Linear", nil, f, g.Param("down", ir.Shape{benchD, 4 * benchD})))
		W := E
		if !tied {
			W = g.Param("head", ir.Shape{benchV, benchD})
		}
		g.SetOutput("logits", g.Op1("Linear", nil, x, W))
		return g
	}
}

func benchLogits(b *testing.B, build func(B, T int) *ir.Graph, opts onnx.Options) {
	requireORT(b)
	dir := b.TempDir()
	export(b, dir, exportSpec{build: build, lengths: []int{benchT}, batch: 1, vocab: benchV, eos: 0, weights: weightSet{scale: 0.05}, opts: opts})
	m, err := runtime.Open(dir, runtime.Options{Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	seq := make([]int32, benchT)
	for i := range seq {
		seq[i] = int32(i * 31 % benchV)
	}
	ctx := context.Background()
	if _, err := m.Logits(ctx, [][]int32{seq}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := m.Logits(ctx, [][]int32{seq}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHead(b *testing.B) {
	for _, tied := range []bool{true, false} {
		b.Run(fmt.Sprintf("tied=%v", tied), func(b *testing.B) { benchLogits(b, headGraph(tied), onnx.Options{}) })
	}
}

func BenchmarkGELU(b *testing.B) {
	for _, mode := range []string{onnx.GELUOp, onnx.GELUErf} {
		b.Run(mode, func(b *testing.B) { benchLogits(b, headGraph(false), onnx.Options{GELU: mode}) })
	}
}

// TestCancelDuringRun cancels a context while onnxruntime runs: the call
// returns the context's error (or its result, when the run wins the race)
// and the model stays usable.
func TestCancelDuringRun(t *testing.T) {
	requireORT(t)
	dir := t.TempDir()
	export(t, dir, exportSpec{build: headGraph(true), lengths: []int{benchT}, batch: 2, vocab: benchV, weights: weightSet{scale: 0.05}})
	m := openT(t, dir, runtime.Options{Threads: 1})
	seq := make([]int32, benchT)
	for i := 0; i < 5; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i)*time.Millisecond)
		_, err := m.Logits(ctx, [][]int32{seq, seq, seq})
		cancel()
		t.Logf("timeout %dms: %v", i, err)
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("cancelled run: %v", err)
		}
	}
	if _, err := m.Logits(context.Background(), [][]int32{seq}); err != nil {
		t.Fatalf("run after cancellations: %v", err)
	}
}
