package runtime_test

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/runtime"
)

// requireORT skips a test that needs the onnxruntime library when it is
// missing, except under CI=true, where a missing library fails the test.
func requireORT(t testing.TB) {
	t.Helper()
	if err := runtime.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and %v", err)
		}
		t.Skipf("%v", err)
	}
}

// weightSet supplies deterministic pseudo-random weights by value name,
// with overrides; data is float32-rounded so the reference sees exactly
// what the model stores.
type weightSet struct {
	scale     float64
	overrides map[string][]float64
}

func (w weightSet) get(v *ir.Value) []float64 {
	if d, ok := w.overrides[v.Name]; ok {
		if len(d) != v.Shape.Numel() {
			panic(fmt.Sprintf("override %s: %d values for %v", v.Name, len(d), v.Shape))
		}
		return d
	}
	h := fnv.New64a()
	h.Write([]byte(v.Name))
	rng := rand.New(rand.NewPCG(h.Sum64(), 7))
	scale := w.scale
	if scale == 0 {
		scale = 1
	}
	d := make([]float64, v.Shape.Numel())
	for i := range d {
		d[i] = float64(float32((rng.Float64()*2 - 1) * scale))
	}
	return d
}

func (w weightSet) f32(v *ir.Value) ([]float32, error) {
	d := w.get(v)
	out := make([]float32, len(d))
	for i, x := range d {
		out[i] = float32(x)
	}
	return out, nil
}

type exportSpec struct {
	build    func(B, T int) *ir.Graph
	lengths  []int
	batch    int
	vocab    int
	eos      int
	weights  weightSet
	opts     onnx.Options
	external bool
}

// export lowers the graph for every length into dir and writes the
// manifest.
func export(t testing.TB, dir string, s exportSpec) {
	t.Helper()
	man := &runtime.Manifest{Format: runtime.ManifestFormat, VocabSize: s.vocab, EOS: s.eos, Tokenizer: "test", Model: "test"}
	for _, L := range s.lengths {
		g := s.build(s.batch, L)
		m, err := onnx.Lower(g, s.weights.f32, s.opts)
		if err != nil {
			t.Fatalf("lower T=%d: %v", L, err)
		}
		name := fmt.Sprintf("model_L%d.onnx", L)
		path := filepath.Join(dir, name)
		if s.external {
			err = onnx.WriteExternal(path, m)
		} else {
			err = onnx.Write(path, m)
		}
		if err != nil {
			t.Fatal(err)
		}
		f, err := runtime.NewFile(dir, name, L)
		if err != nil {
			t.Fatal(err)
		}
		man.Lengths = append(man.Lengths, L)
		man.Files = append(man.Files, f)
		if s.external {
			f, err := runtime.NewFile(dir, name+".data", L)
			if err != nil {
				t.Fatal(err)
			}
			man.Files = append(man.Files, f)
		}
	}
	if err := runtime.WriteManifest(dir, man); err != nil {
		t.Fatal(err)
	}
}

// closeEnough compares a float32 result with a float64 reference; NaN
// matches NaN and infinities match by sign.
func closeEnough(got float32, want float64, tol float64) bool {
	g := float64(got)
	switch {
	case math.IsNaN(want):
		return math.IsNaN(g)
	case math.IsInf(want, 0):
		return g == want
	}
	return math.Abs(g-want) <= tol*(1+math.Abs(want))
}

// checkLogits compares the logits of each sequence with the reference
// logits [B,T,V] of a graph built for that sequence alone.
func checkLogits(t *testing.T, what string, got runtime.Logits, want *tensor, row int, tol float64) {
	t.Helper()
	T, V := want.shape[1], want.shape[2]
	if got.Len != T || got.Vocab != V || len(got.Data) != T*V {
		t.Fatalf("%s: got %d×%d logits (%d values), want %d×%d", what, got.Len, got.Vocab, len(got.Data), T, V)
	}
	bad := 0
	for i, g := range got.Data {
		w := want.data[row*T*V+i]
		if !closeEnough(g, w, tol) {
			if bad < 5 {
				t.Errorf("%s: logits[%d,%d] = %v, reference %v", what, i/V, i%V, g, w)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d logits differ", what, bad, len(got.Data))
	}
}
