package cuda

import (
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cuda/driver"
	"github.com/rpac-dev/rpac/passes"
)

// TestFakeDeviceSignatures: the parser reads every kernel (a kernel it
// cannot read fails here, not on a GPU).
func TestFakeDeviceSignatures(t *testing.T) {
	sigs, err := kernelSignatures()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, name := range SourceNames() {
		e, _ := Entries(name)
		n += len(e)
	}
	if len(sigs) != n || len(sigs) < 30 {
		t.Fatalf("%d signatures for %d kernels", len(sigs), n)
	}
	if got := sigs["dropout_f32"]; len(got) != 6 || got[2].kind != "u64" || got[5].kind != "i64" {
		t.Fatalf("dropout_f32 signature %v", got)
	}
}

// TestFakeDeviceCatchesBadLaunches: the checks themselves fail when they
// should.
func TestFakeDeviceCatchesBadLaunches(t *testing.T) {
	f := mustFake(t)
	b, _ := f.alloc(400)
	one := [3]uint32{1, 1, 1}
	for _, bad := range [][]any{
		{b.Ptr, b.Ptr, int32(3)},                     // too few arguments
		{b.Ptr, b.Ptr, int32(3), int32(4)},           // i64 passed as i32
		{b.Ptr + 400, b.Ptr, int64(3)},               // pointer past the allocation
		{b.Ptr, uint64(12345), int64(3)},             // pointer to nothing
		{b.Ptr, b.Ptr, 3},                            // a Go int
		{b.Ptr, b.Ptr, int64(3), float32(0), 1, "x"}, // too many
	} {
		if err := f.launch("copy_words", one, one, 0, bad...); err == nil {
			t.Errorf("launch copy_words %v accepted", bad)
		}
	}
	if err := f.launch("copy_words", one, one, 0, b.Ptr, b.Ptr, int64(100)); err != nil {
		t.Errorf("a good launch: %v", err)
	}
	gemm := func(s GemmShape, A, B, C Buffer) error {
		c := GemmCall{Alpha: 1, A: A, B: B, C: C}
		pl, err := f.gemmPlan(driver.NewGemmKey(s, F32, c), 0)
		if err != nil {
			return err
		}
		return f.gemm(pl, c)
	}
	if err := gemm(GemmShape{M: 10, N: 10, K: 2, Batch: 1}, b, b, b); err != nil {
		t.Errorf("a GEMM that fits: %v", err)
	}
	if err := gemm(GemmShape{M: 10, N: 11, K: 2, Batch: 1}, b, b, b); err == nil {
		t.Error("a GEMM whose C overruns its buffer was accepted")
	}
	if err := gemm(GemmShape{M: 10, N: 4, K: 2, Batch: 1, LDA: 16}, b, b, b); err == nil {
		t.Error("a GEMM whose padded A overruns its buffer was accepted")
	}
	if _, err := f.gemmPlan(GemmKey{Shape: GemmShape{M: 10, N: 4, K: 8, Batch: 1, LDA: 4}, AB: F32}, 0); err == nil {
		t.Error("a GEMM plan with lda below the row length was accepted")
	}
	pl, err := f.gemmPlan(driver.NewGemmKey(GemmShape{M: 2, N: 2, K: 2, Batch: 1}, F32, GemmCall{A: b, B: b, C: b}), 0)
	if err != nil {
		t.Fatal(err)
	}
	off := Buffer{Ptr: b.Ptr + 4, Bytes: b.Bytes - 4}
	if err := f.gemm(pl, GemmCall{Alpha: 1, A: off, B: b, C: b}); err == nil {
		t.Error("a plan made for 256-byte-aligned operands ran on a 4-byte-aligned one")
	}
}

// TestBackendLaunchesEveryOpOnFakeDevice: every op case compiles and runs
// on the fake device in both GEMM precisions; every launch matches its
// kernel's signature and stays inside the allocations.
func TestBackendLaunchesEveryOpOnFakeDevice(t *testing.T) {
	for _, gemm := range []ir.Precision{ir.FP32, ir.BF16} {
		f := mustFake(t)
		be := newBackend(f, gemm, CandidateOptions())
		r := rand.New(rand.NewPCG(31, 32))
		for _, c := range opCases() {
			g, feeds := caseGraph(c, r)
			p, err := be.Compile(g, nil, kernels.NewStore(ir.FP32))
			if err != nil {
				t.Fatalf("%s (%s): compile: %v", c.op, gemm, err)
			}
			if err := p.Run(feeds, 7); err != nil {
				t.Fatalf("%s (%s): run: %v", c.op, gemm, err)
			}
			for name := range g.Outputs {
				if p.Output(name) == nil {
					t.Fatalf("%s (%s): output %s missing", c.op, gemm, name)
				}
			}
			p.Close()
		}
		if len(f.live) != 0 {
			t.Errorf("%s: %d allocations outlive their programs", gemm, len(f.live))
		}
		var used []string
		for k := range f.launches {
			used = append(used, k)
		}
		sort.Strings(used)
		t.Logf("%s: %d kernels launched, %d GEMMs: %s", gemm, len(used), f.gemms, strings.Join(used, " "))
	}
}

// TestBackendRunsTrainingStepsOnFakeDevice: the fuzzy and baseline models'
// planned training graphs (plan slots shared in one arena) and eval graphs
// compile and run on the fake device: every launch and GEMM of a real step
// is well formed. Heads of 16 take the tensor-core attention (bf16 GEMMs),
// the baseline's without a bias.
func TestBackendRunsTrainingStepsOnFakeDevice(t *testing.T) {
	p, err := model.LookupPreset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []model.Kind{model.Fuzzy, model.Baseline} {
		for _, mode := range []model.Mode{model.Train, model.Eval} {
			cfg := p.Config
			cfg.Model, cfg.Vocab, cfg.DModel, cfg.Layers, cfg.Heads, cfg.MaxLen, cfg.Dropout = kind, 97, 32, 2, 2, 24, 0.1
			const T, B = 24, 3
			mg, err := model.Build(&cfg, model.Opts{T: T, B: B, Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			pipe, pc := passes.EvalPipeline, &passes.Context{Model: mg.Info(), FuseAttention: true}
			if mode == model.Train {
				pipe, pc.Loss = passes.TrainPipeline, "loss"
			}
			if err := passes.Run(mg.Graph, pipe, pc); err != nil {
				t.Fatal(err)
			}
			st := kernels.NewStore(ir.FP32)
			if err := model.InitStore(mg.Specs, st, 7); err != nil {
				t.Fatal(err)
			}
			f := mustFake(t)
			be := newBackend(f, ir.BF16, CandidateOptions())
			prog, err := be.Compile(mg.Graph, passes.Plan(mg.Graph), st)
			if err != nil {
				t.Fatalf("%s %v: %v", kind, mode, err)
			}
			ids := make([]int32, B*T)
			for i := range ids {
				ids[i] = int32(i % cfg.Vocab)
			}
			feeds := map[string]*kernels.Tensor{
				"input_ids": kernels.IntTensor(ir.Shape{B, T}, ids),
				"targets":   kernels.IntTensor(ir.Shape{B * T}, ids),
			}
			if err := prog.Run(feeds, 3); err != nil {
				t.Fatalf("%s %v: %v", kind, mode, err)
			}
			prog.Close()
			be.Release(st)
			if len(f.live) != 0 {
				t.Errorf("%s %v: %d allocations left after Close and Release", kind, mode, len(f.live))
			}
			t.Logf("%s %v: %d nodes, %d GEMMs", kind, mode, len(mg.Graph.Nodes), f.gemms)
		}
	}
}

func mustFake(t *testing.T) *fakeDevice {
	t.Helper()
	f, err := newFakeDevice()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestReuseStoredSkipsOneUpload: after ReuseStored the next Run uploads
// only the feeds, and the Run after it the weights again.
func TestReuseStoredSkipsOneUpload(t *testing.T) {
	f := mustFake(t)
	be := newBackend(f, ir.FP32, CandidateOptions())
	g := ir.New("linear")
	x := g.Input("x", ir.Shape{2, 3}, ir.F32)
	g.SetOutput("y", g.Op1("Linear", nil, x, g.Param("w", ir.Shape{4, 3}), g.Param("b", ir.Shape{4})))
	st := kernels.NewStore(ir.FP32)
	st.Ensure("w", ir.Shape{4, 3})
	st.Ensure("b", ir.Shape{4})
	p, err := be.Compile(g, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	feeds := map[string]*kernels.Tensor{"x": kernels.NewTensor(ir.FP32, ir.Shape{2, 3})}
	var per []int
	for i, reuse := range []bool{false, true, false} {
		if reuse {
			p.(interface{ ReuseStored() }).ReuseStored()
		}
		before := f.uploads
		if err := p.Run(feeds, uint64(i)); err != nil {
			t.Fatal(err)
		}
		per = append(per, f.uploads-before)
	}
	if per[0] != 3 || per[1] != 1 || per[2] != 3 {
		t.Fatalf("uploads per run %v, want [3 1 3] (weights, bias and the feed; then the feed alone)", per)
	}
}
