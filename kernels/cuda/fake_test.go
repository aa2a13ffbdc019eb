package cuda

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unsafe"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/passes"
)

// fakeDevice runs the backend without a GPU: it allocates address ranges,
// and checks each launch against the kernel's C signature (argument count
// and types) and each pointer, copy and GEMM operand against the live
// allocations. The numbers the programs compute are meaningless; what the
// tests check is that every launch the backend makes is well formed.
type fakeDevice struct {
	next     uint64
	live     map[uint64]uint64 // base -> bytes
	sigs     map[string][]param
	launches map[string]int
	gemms    int
}

type param struct {
	name string
	kind string // ptr, i32, i64, u64, f32
}

var sigRE = regexp.MustCompile(`extern "C" __global__ void (\w+)\(([^)]*)\)`)

// kernelSignatures parses every embedded kernel's parameter list.
func kernelSignatures() (map[string][]param, error) {
	sigs := map[string][]param{}
	for _, name := range SourceNames() {
		src, err := Source(name)
		if err != nil {
			return nil, err
		}
		for _, m := range sigRE.FindAllStringSubmatch(src, -1) {
			var ps []param
			for _, raw := range strings.Split(m[2], ",") {
				f := strings.Fields(strings.TrimSpace(raw))
				if len(f) < 2 {
					return nil, fmt.Errorf("kernel %s: cannot read parameter %q", m[1], raw)
				}
				typ, pname := strings.Join(f[:len(f)-1], " "), strings.TrimLeft(f[len(f)-1], "*")
				if strings.HasPrefix(f[len(f)-1], "*") {
					typ += "*"
				}
				var kind string
				switch {
				case strings.Contains(typ, "*"):
					kind = "ptr"
				case typ == "unsigned long long":
					kind = "u64"
				case typ == "i64" || typ == "long long":
					kind = "i64"
				case typ == "int":
					kind = "i32"
				case typ == "float":
					kind = "f32"
				default:
					return nil, fmt.Errorf("kernel %s: parameter type %q", m[1], typ)
				}
				ps = append(ps, param{pname, kind})
			}
			sigs[m[1]] = ps
		}
	}
	return sigs, nil
}

func newFakeDevice(t *testing.T) *fakeDevice {
	t.Helper()
	sigs, err := kernelSignatures()
	if err != nil {
		t.Fatal(err)
	}
	return &fakeDevice{next: 1 << 32, live: map[uint64]uint64{}, sigs: sigs, launches: map[string]int{}}
}

func (f *fakeDevice) Info() DeviceInfo {
	return DeviceInfo{Name: "fake", Arch: "compute_90", Major: 9, SMs: 132, TotalMemory: 80 << 30}
}
func (f *fakeDevice) bind() (func(), error) { return func() {}, nil }

func (f *fakeDevice) alloc(bytes uint64) (Buffer, error) {
	p := f.next
	f.next += align256(max(bytes, 1)) + 256 // a gap, so overruns land outside every allocation
	f.live[p] = bytes
	return Buffer{Ptr: p, Bytes: bytes}, nil
}

func (f *fakeDevice) free(b Buffer) { delete(f.live, b.Ptr) }

// within checks that [ptr, ptr+bytes) lies inside one live allocation.
func (f *fakeDevice) within(ptr, bytes uint64) error {
	for base, n := range f.live {
		if ptr >= base && ptr+bytes <= base+max(n, 1) && (bytes > 0 || ptr < base+max(n, 1)) {
			return nil
		}
	}
	return fmt.Errorf("address range [%#x, +%d) is outside every allocation", ptr, bytes)
}

func (f *fakeDevice) upload(b Buffer, _ unsafe.Pointer, bytes uint64) error {
	return f.within(b.Ptr, bytes)
}

func (f *fakeDevice) download(dst unsafe.Pointer, b Buffer, bytes uint64) error {
	clear(unsafe.Slice((*byte)(dst), bytes))
	return f.within(b.Ptr, bytes)
}

func (f *fakeDevice) zero(b Buffer, bytes uint64) error { return f.within(b.Ptr, bytes) }
func (f *fakeDevice) sync() error                       { return nil }

func (f *fakeDevice) launch(name string, grid, block [3]uint32, shared uint32, args ...any) error {
	sig, ok := f.sigs[name]
	if !ok {
		return fmt.Errorf("launch of %s: no such kernel", name)
	}
	if len(args) != len(sig) {
		return fmt.Errorf("launch of %s: %d arguments, the kernel takes %d", name, len(args), len(sig))
	}
	for i, a := range args {
		want := sig[i]
		var got string
		switch a.(type) {
		case uint64:
			got = "ptr|u64"
		case int64:
			got = "i64"
		case int32:
			got = "i32"
		case float32:
			got = "f32"
		default:
			got = fmt.Sprintf("%T", a)
		}
		if !strings.Contains(got, want.kind) {
			return fmt.Errorf("launch of %s: argument %d (%s) is %s, the kernel takes %s", name, i, want.name, got, want.kind)
		}
		if want.kind == "ptr" {
			p := a.(uint64)
			if p == 0 && want.name == "bias" {
				continue
			}
			if err := f.within(p, 0); err != nil {
				return fmt.Errorf("launch of %s: pointer argument %d (%s): %w", name, i, want.name, err)
			}
		}
	}
	for d := 0; d < 3; d++ {
		if grid[d] == 0 || block[d] == 0 {
			return fmt.Errorf("launch of %s: empty grid %v or block %v", name, grid, block)
		}
	}
	if block[0]*block[1]*block[2] > 1024 || shared > 48<<10 {
		return fmt.Errorf("launch of %s: block %v, %d bytes of shared memory", name, block, shared)
	}
	f.launches[name]++
	return nil
}

func (f *fakeDevice) gemm(s GemmShape, _ float32, A, B Buffer, ab DType, _ float32, C Buffer) error {
	size := uint64(4)
	if ab == BF16 {
		size = 2
	}
	na, nb := gemmElems(s)
	nc := s.M * s.N
	if s.Batch > 1 {
		nc += int(s.StrideC) * (s.Batch - 1)
	}
	if s.M <= 0 || s.N <= 0 || s.K <= 0 || s.Batch <= 0 {
		return fmt.Errorf("gemm %+v: empty shape", s)
	}
	for _, c := range []struct {
		what string
		b    Buffer
		n    uint64
	}{{"A", A, uint64(na) * size}, {"B", B, uint64(nb) * size}, {"C", C, uint64(nc) * 4}} {
		if err := f.within(c.b.Ptr, c.n); err != nil {
			return fmt.Errorf("gemm %+v operand %s: %w", s, c.what, err)
		}
	}
	f.gemms++
	return nil
}

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
	if got := sigs["dropout_f32"]; len(got) != 7 || got[3].kind != "u64" || got[6].kind != "i64" {
		t.Fatalf("dropout_f32 signature %v", got)
	}
}

// TestFakeDeviceCatchesBadLaunches: the checks themselves fail when they
// should.
func TestFakeDeviceCatchesBadLaunches(t *testing.T) {
	f := newFakeDevice(t)
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
	if err := f.gemm(GemmShape{M: 10, N: 10, K: 2, Batch: 1}, 1, b, b, F32, 0, b); err != nil {
		t.Errorf("a GEMM that fits: %v", err)
	}
	if err := f.gemm(GemmShape{M: 10, N: 11, K: 2, Batch: 1}, 1, b, b, F32, 0, b); err == nil {
		t.Error("a GEMM whose C overruns its buffer was accepted")
	}
}

// TestBackendLaunchesEveryOpOnFakeDevice: every op case compiles and runs
// on the fake device in both GEMM precisions; every launch matches its
// kernel's signature and stays inside the allocations.
func TestBackendLaunchesEveryOpOnFakeDevice(t *testing.T) {
	for _, gemm := range []GEMMPrecision{GEMMF32, GEMMBF16} {
		f := newFakeDevice(t)
		be := newBackend(f, gemm)
		r := rand.New(rand.NewPCG(31, 32))
		for _, c := range opCases() {
			g, feeds := caseGraph(c, r)
			p, err := be.Compile(g, nil, kernels.NewStore(kernels.F32))
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
// is well formed.
func TestBackendRunsTrainingStepsOnFakeDevice(t *testing.T) {
	p, err := model.LookupPreset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"fuzzy", "baseline"} {
		for _, mode := range []model.Mode{model.Train, model.Eval} {
			cfg := p.Config
			cfg.Model, cfg.Vocab, cfg.DModel, cfg.Layers, cfg.Heads, cfg.MaxLen, cfg.Dropout = kind, 97, 16, 2, 2, 24, 0.1
			const T, B = 24, 3
			mg, err := model.Build(&cfg, model.Opts{T: T, B: B, Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			pipe, pc := passes.EvalPipeline, &passes.Context{Model: mg.Info()}
			if mode == model.Train {
				pipe, pc.Loss = passes.TrainPipeline, "loss"
			}
			if err := passes.Run(mg.Graph, pipe, pc); err != nil {
				t.Fatal(err)
			}
			st := kernels.NewStore(kernels.F32)
			if err := model.InitStore(mg.Specs, st, 7); err != nil {
				t.Fatal(err)
			}
			f := newFakeDevice(t)
			be := newBackend(f, GEMMBF16)
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
