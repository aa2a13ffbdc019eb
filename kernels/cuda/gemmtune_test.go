package cuda

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/passes"
)

// tuneGraph: y = x·Wᵀ + b (a bias epilogue) and dw = dyᵀ·x, two GEMM keys.
func tuneGraph(R, K, N int) *ir.Graph {
	g := ir.New("tune")
	x := g.Input("x", ir.Shape{R, K}, ir.F32)
	g.SetOutput("y", g.Op1("Linear", nil, x, g.Param("w", ir.Shape{N, K}), g.Param("b", ir.Shape{N})))
	g.SetOutput("dw", g.Op1("LinearGradW", nil, g.Input("dy", ir.Shape{R, N}, ir.F32), x))
	return g
}

// runTuned compiles and runs tuneGraph on a new backend with the choices
// file and tuning of o and returns its outputs, or the first error.
func runTuned(t *testing.T, o Options, weights, feeds map[string]*kernels.Tensor) (map[string][]float32, error) {
	t.Helper()
	be, err := New(0, ir.FP32, o)
	if err != nil {
		return nil, err
	}
	if path := o.GEMMAlgos; strings.Contains(be.Name(), "algorithms from "+path) != (path != "") {
		t.Errorf("backend %q with the choices file %q: the name does not say where the algorithms come from", be.Name(), path)
	}
	st := kernels.NewStore(ir.FP32)
	for name, w := range weights {
		copy(must(st.Ensure(name, w.Shape)).F32, w.F32)
	}
	defer be.Release(st)
	g := tuneGraph(67, 130, 45)
	p, err := be.Compile(g, passes.Plan(g), st)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	if err := p.Run(feeds, 1); err != nil {
		return nil, err
	}
	return map[string][]float32{"y": append([]float32(nil), p.Output("y").F32...), "dw": append([]float32(nil), p.Output("dw").F32...)}, nil
}

// TestSimGemmChoices: with Options.GEMMTune every GEMM key's
// candidates are timed and the choice written to the Options.GEMMAlgos
// file; a file's ranks are taken as they are (the simulator's second
// algorithm sums in reverse, so rank 1 gives other bits, within fp32's
// rounding of rank 0, the same on every run); a rank past the heuristic's
// list, a file of another device and tuning without a file are refused
// with errors that say so; the backend's name says which file chose.
func TestSimGemmChoices(t *testing.T) {
	simOnly(t)
	r := rand.New(rand.NewPCG(111, 112))
	weights := map[string]*kernels.Tensor{"w": randTensor(r, ir.Shape{45, 130}), "b": randTensor(r, ir.Shape{45})}
	feeds := map[string]*kernels.Tensor{"x": randTensor(r, ir.Shape{67, 130}), "dy": randTensor(r, ir.Shape{67, 45})}
	o := CandidateOptions()
	first, err := runTuned(t, o, weights, feeds)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "gemm-algos.json")
	o.GEMMAlgos, o.GEMMTune = path, true
	if _, err := runTuned(t, o, weights, feeds); err != nil {
		t.Fatal(err)
	}
	var file GemmChoices
	if b, err := os.ReadFile(path); err != nil || json.Unmarshal(b, &file) != nil {
		t.Fatalf("the choices file: %v", err)
	}
	if len(file.Keys) != 2 || !strings.Contains(file.Device, "sm_") {
		t.Fatalf("%d keys for device %q, want 2 (the Linear's, with its bias, and the weight gradient's)", len(file.Keys), file.Device)
	}
	biased := 0
	for k, ch := range file.Keys {
		if len(ch.Seconds) != 2 || ch.Rank < 0 || ch.Rank > 1 {
			t.Errorf("%s: %+v, want two timed candidates and one of them chosen", k, ch)
		}
		if !strings.HasSuffix(k, "bias 0") {
			biased++
		}
		ch.Rank = 1
		file.Keys[k] = ch
	}
	if biased != 1 {
		t.Errorf("%d keys with a bias epilogue, want 1: %v", biased, file.Keys)
	}
	write := func(f GemmChoices) {
		b, _ := json.Marshal(f)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(file)
	o.GEMMTune = false
	second, err := runTuned(t, o, weights, feeds)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := runTuned(t, o, weights, feeds)
	for _, name := range []string{"y", "dw"} {
		differ := 0
		for i, v := range first[name] {
			if second[name][i] != again[name][i] {
				t.Fatalf("%s[%d]: %g, then %g with the same choices", name, i, second[name][i], again[name][i])
			}
			if v != second[name][i] {
				differ++
			}
		}
		if differ == 0 {
			t.Errorf("%s: rank 1 gave rank 0's bits everywhere: the choice was not taken", name)
		}
		want := make([]float64, len(first[name]))
		for i, v := range first[name] {
			want[i] = float64(v)
		}
		closeTo(t, name, second[name], want, 1e-4)
	}
	for k, ch := range file.Keys {
		ch.Rank = 2
		file.Keys[k] = ch
	}
	write(file)
	if _, err := runTuned(t, o, weights, feeds); err == nil || !strings.Contains(err.Error(), "rank 2") {
		t.Errorf("rank 2 of 2 candidates: %v, want a refusal naming the rank", err)
	}
	file.Device = "another GPU"
	write(file)
	if _, err := runTuned(t, o, weights, feeds); err == nil || !strings.Contains(err.Error(), "another GPU") {
		t.Errorf("a file of another device: %v, want a refusal naming it", err)
	}
	o.GEMMAlgos, o.GEMMTune = "", true
	if _, err := New(0, ir.FP32, o); err == nil || !strings.Contains(err.Error(), "RPAC_CUDA_GEMM_ALGOS") {
		t.Errorf("tuning without a file: %v, want a refusal naming RPAC_CUDA_GEMM_ALGOS", err)
	}
}

// TestGemmKeyString: a key's name has every field a plan depends on, so
// two keys that differ anywhere have different names.
func TestGemmKeyString(t *testing.T) {
	base := GemmKey{Shape: GemmShape{TransB: true, M: 24576, N: 1020, K: 510, Batch: 1, LDA: 512, LDB: 512}, AB: BF16,
		Align: [3]uint16{256, 256, 16}, BiasAlign: 256}
	want := "gemm bf16 NT 24576x1020x510 ld 512/512/1020 batch 1 stride 0/0/0 align 256/256/16 bias 256"
	if got := base.String(); got != want {
		t.Errorf("%q, want %q", got, want)
	}
	seen := map[string]bool{base.String(): true}
	for _, f := range []func(*GemmKey){
		func(k *GemmKey) { k.Shape.TransA = true }, func(k *GemmKey) { k.Shape.M++ }, func(k *GemmKey) { k.Shape.N++ },
		func(k *GemmKey) { k.Shape.K++ }, func(k *GemmKey) { k.Shape.Batch = 2 }, func(k *GemmKey) { k.Shape.StrideA = 8 },
		func(k *GemmKey) { k.Shape.StrideB = 8 }, func(k *GemmKey) { k.Shape.StrideC = 8 }, func(k *GemmKey) { k.Shape.LDA = 520 },
		func(k *GemmKey) { k.Shape.LDB = 520 }, func(k *GemmKey) { k.Shape.LDC = 1024 }, func(k *GemmKey) { k.AB = F32 },
		func(k *GemmKey) { k.Align[0] = 8 }, func(k *GemmKey) { k.Align[1] = 8 }, func(k *GemmKey) { k.Align[2] = 8 },
		func(k *GemmKey) { k.BiasAlign = 0 },
	} {
		k := base
		f(&k)
		if seen[k.String()] {
			t.Errorf("%+v named %q like another key", k, k.String())
		}
		seen[k.String()] = true
	}
}
