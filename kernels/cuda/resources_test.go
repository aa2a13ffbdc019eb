package cuda

import (
	"strings"
	"testing"
)

// TestParsePtxasReport: the resource lines of a ptxas -v report, kernel by
// kernel, and a report without them is an error.
func TestParsePtxasReport(t *testing.T) {
	log := `ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'b_kernel' for 'sm_90'
ptxas info    : Function properties for b_kernel
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, 33024 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'a_kernel' for 'sm_90'
ptxas info    : Function properties for a_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, 400 bytes cmem[0]
`
	got, err := parsePtxasReport(log)
	if err != nil {
		t.Fatal(err)
	}
	want := []KernelResources{
		{Kernel: "a_kernel", Registers: 32},
		{Kernel: "b_kernel", Registers: 168, SharedBytes: 33024, StackBytes: 8, SpillStores: 4, SpillLoads: 12},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("kernel %d: got %v, want %v", i, got[i], want[i])
		}
	}
	if got[0].LocalMemory() || !got[1].LocalMemory() {
		t.Errorf("LocalMemory: got %v %v, want false true", got[0].LocalMemory(), got[1].LocalMemory())
	}
	if _, err := parsePtxasReport("nvrtc: nothing here\n"); err == nil {
		t.Error("a report without entry functions parsed")
	}
	if _, err := parsePtxasReport("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"); err == nil {
		t.Error("an entry without a register count parsed")
	}
}

// TestKernelResources: ptxas reports every kernel of every source for
// Hopper (sm_90), and the tensor-core attention kernels fit their launch
// bounds (3 blocks of 128 threads per SM: at most 170 registers). The
// report is logged: registers, shared memory, stack and spills per kernel,
// the compiler's view of occupancy and local memory without a GPU.
func TestKernelResources(t *testing.T) {
	n := nvrtcOrSkip(t)
	if n.Simulated() {
		t.Skip("the simulator's NVRTC runs no ptxas")
	}
	if major, _ := n.Version(); major < 11 {
		t.Skipf("NVRTC %d has no cubin output", major)
	}
	for _, name := range SourceNames() {
		res, err := Resources(n, name, "sm_90")
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]KernelResources{}
		for _, r := range res {
			got[r.Kernel] = r
			t.Log(r)
		}
		entries, _ := Entries(name)
		for _, e := range entries {
			r, ok := got[e]
			if !ok {
				t.Errorf("%s: no resource report for %s", name, e)
				continue
			}
			if strings.HasPrefix(e, "attention_fwd_bf16") || strings.HasPrefix(e, "attention_bwd_dq_bf16") {
				if r.Registers > 170 {
					t.Errorf("%s: %d registers, over the 170 of __launch_bounds__(128, 3)", e, r.Registers)
				}
			}
		}
	}
}
