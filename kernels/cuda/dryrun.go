package cuda

import (
	"fmt"
	"regexp"
	"strings"
	"unsafe"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// fakeDevice is the dry-run device: it allocates address ranges, and checks
// each launch against the kernel's C signature (argument count and types)
// and each pointer, copy and GEMM operand against the live allocations. The
// numbers the programs compute are zeros; what it checks is that every
// launch the backend makes is well formed.
type fakeDevice struct {
	next     uint64
	live     map[uint64]uint64 // base -> bytes
	sigs     map[string][]param
	launches map[string]int
	gemms    int
	plans    int // GEMM plans made
	uploads  int
	modules  []string // generated sources loaded (loadModule)
}

// fakePlan is the dry-run device's GEMM plan; like a real algorithm it
// asks for a workspace when one is allowed.
type fakePlan struct {
	k  GemmKey
	ws uint64
}

func (p *fakePlan) key() GemmKey      { return p.k }
func (p *fakePlan) workspace() uint64 { return p.ws }

type param struct {
	name string
	kind string // ptr, i32, i64, u64, f32
}

var sigRE = regexp.MustCompile(`extern "C" __global__ (?:__launch_bounds__\([^)]*\) )?void (\w+)\(([^)]*)\)`)

// kernelSignatures parses every embedded kernel's parameter list.
func kernelSignatures() (map[string][]param, error) {
	sigs := map[string][]param{}
	for _, name := range SourceNames() {
		src, err := Source(name)
		if err != nil {
			return nil, err
		}
		if err := parseSignatures(src, sigs); err != nil {
			return nil, err
		}
	}
	return sigs, nil
}

// parseSignatures adds the parameter list of every kernel src defines to
// sigs.
func parseSignatures(src string, sigs map[string][]param) error {
	for _, m := range sigRE.FindAllStringSubmatch(src, -1) {
		var ps []param
		for _, raw := range strings.Split(m[2], ",") {
			f := strings.Fields(strings.TrimSpace(raw))
			if len(f) < 2 {
				return fmt.Errorf("kernel %s: cannot read parameter %q", m[1], raw)
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
				return fmt.Errorf("kernel %s: parameter type %q", m[1], typ)
			}
			ps = append(ps, param{pname, kind})
		}
		sigs[m[1]] = ps
	}
	return nil
}

func newFakeDevice() (*fakeDevice, error) {
	sigs, err := kernelSignatures()
	if err != nil {
		return nil, err
	}
	return &fakeDevice{next: 1 << 32, live: map[uint64]uint64{}, sigs: sigs, launches: map[string]int{}}, nil
}

// NewDryRun returns a backend on a device that computes nothing: it checks
// each launch against its kernel's C signature (argument count and types),
// each pointer, copy and GEMM operand against the live allocations, and
// downloads zeros. It runs the backend's whole host side without a GPU, so
// tests can drive training and evaluation through it. It takes the paths
// o chooses (its GEMMs have no algorithms to choose: o.GEMMAlgos is not
// read).
func NewDryRun(gemm ir.Precision, o Options) (*Backend, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	f, err := newFakeDevice()
	if err != nil {
		return nil, err
	}
	return newBackend(f, gemm, o), nil
}

func (f *fakeDevice) Info() DeviceInfo {
	return DeviceInfo{Name: "fake", Arch: "compute_90", Major: 9, SMs: 132, SharedOptin: 227 << 10, TotalMemory: 80 << 30}
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
	f.uploads++
	return f.within(b.Ptr, bytes)
}

func (f *fakeDevice) download(dst unsafe.Pointer, b Buffer, bytes uint64) error {
	clear(unsafe.Slice((*byte)(dst), bytes))
	return f.within(b.Ptr, bytes)
}

func (f *fakeDevice) zero(b Buffer, bytes uint64) error { return f.within(b.Ptr, bytes) }
func (f *fakeDevice) poison(b Buffer) error             { return f.within(b.Ptr, b.Bytes) }
func (f *fakeDevice) sync() error                       { return nil }

// loadModule takes the kernels of a generated source: their signatures
// check the launches that follow.
func (f *fakeDevice) loadModule(_, src string, kernels []string) error {
	if err := parseSignatures(src, f.sigs); err != nil {
		return err
	}
	for _, k := range kernels {
		if _, ok := f.sigs[k]; !ok {
			return fmt.Errorf("generated module defines no kernel %s", k)
		}
	}
	f.modules = append(f.modules, src)
	return nil
}
func (f *fakeDevice) separateSlots() bool { return false }

// nullable are the pointer parameters (kernel.parameter) a kernel accepts
// as null besides the attention kernels' bias: the first pass of a
// two-pass reduction writes its partials to part, or without part its
// result to out, and sums products x·y only with y (src/graph.cu).
var nullable = map[string]bool{"reduce_rows_f32.out": true, "reduce_rows_f32.part": true, "reduce_cols_f32.part": true,
	"reduce_rows_f32.y": true, "reduce_cols_f32.y": true, "reduce_view_f32.y": true, // no product: a plain sum
	"attention_bwd_dq_bf16.part": true, // no bias, no bias-gradient partial sums
	"attn_softmax_bwd_f32.part":  true, // no bias
	"attn_unpack_f32.tw":         true, // no bf16 copy
	"softmax_ce_fused_f32.gb":    true, // the gradient in fp32, over the logits
	"softmax_ce_smem_f32.gb":     true,
	"compact_rows_f32.s":         true, // no scale: a plain copy
	"expert_scatter_f32.w":       true} // no weights: the input gradient's scatter

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
			if p == 0 && (want.name == "bias" || nullable[name+"."+want.name]) {
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
	if block[0]*block[1]*block[2] > 1024 || int(shared) > f.Info().SharedOptin {
		return fmt.Errorf("launch of %s: block %v, %d bytes of shared memory", name, block, shared)
	}
	f.launches[name]++
	return nil
}

// hasAlgo: the dry run takes every GEMM a GPU's cuBLASLt would.
func (f *fakeDevice) hasAlgo(GemmKey) bool { return true }

func (f *fakeDevice) gemmPlan(k GemmKey, maxWorkspace uint64) (gemmPlan, error) {
	s := k.Shape
	if s.M <= 0 || s.N <= 0 || s.K <= 0 || s.Batch <= 0 {
		return nil, fmt.Errorf("gemm %+v: empty shape", s)
	}
	if _, ca := s.StoredA(); s.LeadingA() < ca {
		return nil, fmt.Errorf("gemm %+v: lda %d < %d", s, s.LeadingA(), ca)
	}
	if _, cb := s.StoredB(); s.LeadingB() < cb {
		return nil, fmt.Errorf("gemm %+v: ldb %d < %d", s, s.LeadingB(), cb)
	}
	if s.LeadingC() < s.N {
		return nil, fmt.Errorf("gemm %+v: ldc %d < %d", s, s.LeadingC(), s.N)
	}
	f.plans++
	return &fakePlan{k: k, ws: min(maxWorkspace, 1<<20)}, nil
}

func (f *fakeDevice) freeGemmPlan(gemmPlan) {}

func (f *fakeDevice) gemm(pl gemmPlan, call GemmCall) error {
	A, B, C, ws := call.A, call.B, call.C, call.WS
	k := pl.key()
	s := k.Shape
	size := uint64(4)
	if k.AB == BF16 {
		size = 2
	}
	if got := driver.NewGemmKey(s, k.AB, call); got != k {
		return fmt.Errorf("gemm %+v: operands aligned to %v bytes (bias %d), the plan was made for %v (bias %d)",
			s, got.Align, got.BiasAlign, k.Align, k.BiasAlign)
	}
	na, nb := gemmElems(s)
	nc := (s.M-1)*s.LeadingC() + s.N
	if s.Batch > 1 {
		nc += int(s.StrideC) * (s.Batch - 1)
	}
	for _, c := range []struct {
		what string
		b    Buffer
		n    uint64
	}{{"A", A, uint64(na) * size}, {"B", B, uint64(nb) * size}, {"C", C, uint64(nc) * uint64(k.C.Size())}, {"workspace", ws, pl.workspace()},
		{"bias", call.Bias, uint64(4 * s.N)}} {
		if (c.n == 0 && c.what == "workspace") || (c.what == "bias" && k.BiasAlign == 0) {
			continue
		}
		if err := f.within(c.b.Ptr, c.n); err != nil {
			return fmt.Errorf("gemm %+v operand %s: %w", s, c.what, err)
		}
	}
	f.gemms++
	return nil
}

// DryRunLaunches is the number of kernel launches and GEMMs a dry-run
// backend has checked (0 for a backend on a GPU).
func DryRunLaunches(b *Backend) int {
	dev := b.dev
	if td, ok := dev.(*tracedDevice); ok {
		dev = td.device
	}
	f, ok := dev.(*fakeDevice)
	if !ok {
		return 0
	}
	n := f.gemms
	for _, c := range f.launches {
		n += c
	}
	return n
}
