package runtime_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/runtime"
)

func TestSmoke(t *testing.T) {
	dir := t.TempDir()
	g := ir.New("smoke")
	ids := g.Input("input_ids", ir.Shape{1, 4}, ir.I32)
	E := g.Param("emb", ir.Shape{5, 3})
	h := g.Op1("Gather", nil, E, ids)
	h = g.Op1("GELU", nil, h)
	l := g.Op1("Linear", nil, h, E)
	g.SetOutput("logits", l)
	m, err := onnx.Lower(g, func(v *ir.Value) ([]float32, error) {
		d := make([]float32, v.Shape.Numel())
		for i := range d {
			d[i] = float32(i) * 0.1
		}
		return d, nil
	}, onnx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(onnx.Inspect(m))
	if err := onnx.Write(filepath.Join(dir, "m.onnx"), m); err != nil {
		t.Fatal(err)
	}
	f, err := runtime.NewFile(dir, "m.onnx", 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := runtime.WriteManifest(dir, &runtime.Manifest{Format: 1, Lengths: []int{4}, Files: []runtime.File{f}, VocabSize: 5, EOS: 4}); err != nil {
		t.Fatal(err)
	}
	mod, err := runtime.Open(dir, runtime.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Close()
	out, err := mod.Logits(context.Background(), [][]int32{{1, 2}, {0, 1, 2, 3}})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(out)
}
