package cuda

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/passes"
)

// fusedCases are the FusedElementwise cases of the op table, and one chain
// with every unary and gradient op the generator writes.
func fusedCases() []opCase {
	var out []opCase
	for _, c := range append(opCases(), awkwardCases()...) {
		if c.op == ir.OpFusedElementwise {
			out = append(out, c)
		}
	}
	s := ir.Shape{4, 6}
	out = append(out, opCase{op: "FusedElementwise", pos: true, attrs: ir.Attrs{"shape": []int{4, 6}, "body": ir.FusedBody{
		{Op: "Log", Args: []int{0}},                                                  // 2
		{Op: "Exp", Args: []int{2}},                                                  // 3
		{Op: "Neg", Args: []int{3}},                                                  // 4
		{Op: "Sigmoid", Args: []int{4}},                                              // 5
		{Op: "Tanh", Args: []int{5}},                                                 // 6
		{Op: "ReLU", Args: []int{6}},                                                 // 7
		{Op: "NanToNum", Attrs: ir.Attrs{"nan": 0.5}, Args: []int{7}},                // 8
		{Op: "SigmoidGrad", Args: []int{1, 5}},                                       // 9
		{Op: "TanhGrad", Args: []int{9, 6}},                                          // 10
		{Op: "ReLUGrad", Args: []int{10, 4}},                                         // 11
		{Op: "ClampGrad", Attrs: ir.Attrs{"lo": 0.1, "hi": 0.9}, Args: []int{11, 5}}, // 12
		{Op: "NanToNumGrad", Args: []int{12, 8}},                                     // 13
		{Op: "Div", Args: []int{13, 0}},                                              // 14
		{Op: "StopGradient", Args: []int{14}},                                        // 15
	}}, in: []ir.Shape{s, {1, 6}}})
	// broadcast views the generator writes as constant offsets: over the
	// middle dim (strides D, 0, 1: a division, a remainder and a
	// multiply), and a scalar (offset 0)
	out = append(out, opCase{op: "FusedElementwise", attrs: ir.Attrs{"shape": []int{3, 5, 7}, "body": ir.FusedBody{
		{Op: "Mul", Args: []int{0, 1}}, // 3
		{Op: "Add", Args: []int{3, 2}}, // 4
	}}, in: []ir.Shape{{3, 5, 7}, {3, 1, 7}, {1}}})
	return out
}

// TestFusedGenCompiles: the generated kernels of every fused case compile
// with NVRTC for Ampere and Hopper, each kernel the backend launches is in
// the module, and the module holds one kernel per distinct chain.
func TestFusedGenCompiles(t *testing.T) {
	n := nvrtcOrSkip(t)
	if n.Simulated() {
		t.Skip("the simulator's NVRTC writes no PTX (TestSimFusedGenMatchesInterpreter runs these kernels there)")
	}
	r := rand.New(rand.NewPCG(5, 6))
	cases := fusedCases()
	f := mustFake(t)
	be := newBackend(f, ir.FP32, CandidateOptions())
	launched := map[string]bool{}
	for _, c := range cases {
		runCase(t, be, c, r, nil)
	}
	for k := range f.launches {
		if strings.HasPrefix(k, fusedGenPrefix) {
			launched[k] = true
		}
	}
	if len(launched) != len(cases) {
		t.Errorf("%d generated kernels launched for %d distinct chains", len(launched), len(cases))
	}
	if len(f.modules) != len(cases) {
		t.Fatalf("%d modules loaded for %d programs", len(f.modules), len(cases))
	}
	entry := regexp.MustCompile(`extern "C" __global__ void (` + fusedGenPrefix + `\w+)\(`)
	for _, src := range f.modules {
		names := entry.FindAllStringSubmatch(src, -1)
		if len(names) == 0 {
			t.Fatalf("a generated module defines no kernel:\n%s", src)
		}
		for _, arch := range []string{"compute_80", "compute_90"} {
			ptx, err := n.CompilePTX("fused_gen.cu", src, arch)
			if err != nil {
				t.Fatalf("%v\n%s", err, src[strings.Index(src, "#line 1 \"fused_gen.cu\""):])
			}
			for _, m := range names {
				if !strings.Contains(ptx, ".entry "+m[1]+"(") {
					t.Errorf("%s: kernel %s missing from the PTX", arch, m[1])
				}
				delete(launched, m[1])
			}
		}
		if _, err := n.CompileCUBIN("fused_gen.cu", src, "sm_90"); err != nil {
			t.Errorf("sm_90 cubin: %v", err)
		}
	}
	for k := range launched {
		t.Errorf("kernel %s launched but in no module", k)
	}
	// a chain reading a bf16 input (a GEMM's result stored so, halfOutput),
	// plain and folding its row sums
	prog, params, err := fusedStep(ir.FusedStep{Op: "Add", Args: []int{0, 1}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, sum := range []reducePlan{{}, planReduce(midAxis{A: 40, R: 512, C: 1})} {
		c := fusedChain{dense: []bool{true, true}, half: []bool{true, false}, prog: prog[:], params: params[:], idx32: true, sum: sum}
		name := c.name()
		src, err := fusedModule(map[string]string{name: c.source(name)})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(src, "const bf16_t* x0") {
			t.Fatalf("the bf16 input is not one:\n%s", src)
		}
		if ptx, err := n.CompilePTX("fused_gen.cu", src, "compute_90"); err != nil || !strings.Contains(ptx, ".entry "+name+"(") {
			t.Errorf("a chain with a bf16 input: %v", err)
		}
	}
}

// TestFusedGenDump: RPAC_CUDA_DUMP_GEN writes each generated source, the
// kernel the program launches in it.
func TestFusedGenDump(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("RPAC_CUDA_DUMP_GEN", dir)
	f := mustFake(t)
	runCase(t, newBackend(f, ir.FP32, CandidateOptions()), fusedCases()[0], rand.New(rand.NewPCG(1, 2)), nil)
	files, _ := filepath.Glob(filepath.Join(dir, "fused_gen-*.cu"))
	if len(files) != 1 {
		t.Fatalf("%d files dumped, want 1", len(files))
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	for k := range f.launches {
		if strings.HasPrefix(k, fusedGenPrefix) && !strings.Contains(string(b), "void "+k+"(") {
			t.Errorf("launched %s, not in the dumped source", k)
		}
	}
}

// runCase compiles the case's graph on be, runs it once and hands the
// program to read (when not nil) before closing it.
func runCase(t *testing.T, be *Backend, c opCase, r *rand.Rand, read func(*ir.Graph, kernels.Program)) {
	t.Helper()
	g, feeds := caseGraph(c, r)
	prog, err := be.Compile(g, passes.Plan(g), kernels.NewStore(ir.FP32))
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if err := prog.Run(feeds, 1); err != nil {
		t.Fatal(err)
	}
	if read != nil {
		read(g, prog)
	}
}
