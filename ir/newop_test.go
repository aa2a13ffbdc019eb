package ir_test

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/rpac-dev/rpac/passes"
)

// trialCube is an elementwise op that exists only in this test binary: the
// recipe's one entry of ir.Elementwise, which every backend, autodiff and
// the ONNX lowering must take up with no other edit (TestEveryOpIsCovered
// covers it as any other op).
var trialCube = &ir.EwSpec{
	Name: "TrialCube", Doc: "TrialCube(x) -> x³.",
	F64:  func(x, _ float64, _ ir.EwParams[float64]) float64 { return x * x * x },
	F32:  func(x, _ float32, _ ir.EwParams[float32]) float32 { return x * x * x },
	CUDA: "x * x * x",
	Grad: func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
		x := n.Inputs[0]
		return []*ir.Value{g.Op1("Mul", nil, d[0], g.Op1("Scale", ir.Attrs{"alpha": 3.0}, g.Op1("Mul", nil, x, x)))}
	},
	Lower: func(e ir.ONNXEmitter, n *ir.Node, in []string, out string) string {
		sq := e.Emit(out+".sq", "Mul", []string{in[0], in[0]})
		return e.EmitTo(out, "Mul", []string{sq, in[0]})
	},
	Cases: []ir.EwCase{{}},
}

func init() { ir.RegisterElementwise(trialCube) }

// TestNewElementwiseOpReachesEveryBackend: the op registered at test time
// has a CPU kernel that computes its formula, a gradient that autodiff
// emits and the CPU runs (3x²), a CUDA case in every kernel source's
// prelude and launches on the dry-run device, and an ONNX lowering.
func TestNewElementwiseOpReachesEveryBackend(t *testing.T) {
	if !cpu.HasKernel("TrialCube") || !cuda.HasKernel("TrialCube") || !onnx.Lowered("TrialCube") ||
		!slices.Contains(passes.GradOps(), "TrialCube") {
		t.Fatalf("TrialCube: cpu %v, cuda %v, onnx %v, gradient rule %v", cpu.HasKernel("TrialCube"),
			cuda.HasKernel("TrialCube"), onnx.Lowered("TrialCube"), slices.Contains(passes.GradOps(), "TrialCube"))
	}
	// the CPU: forward and the gradient autodiff emits
	g := ir.New("trial")
	w := g.Param("w", ir.Shape{5})
	y := g.Op1("TrialCube", nil, w)
	g.SetOutput("y", y)
	g.SetOutput("loss", g.Op1("ReduceSum", nil, y))
	if err := passes.Autodiff(g, "loss"); err != nil {
		t.Fatal(err)
	}
	st := kernels.NewStore(ir.FP64)
	wt, err := st.Ensure("w", ir.Shape{5})
	if err != nil {
		t.Fatal(err)
	}
	copy(wt.F64, []float64{-2, -0.5, 0, 1.5, 3})
	p, err := cpu.New(ir.FP64).Compile(g, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Run(nil, 1); err != nil {
		t.Fatal(err)
	}
	for i, x := range wt.F64 {
		if got := p.Output("y").F64[i]; got != x*x*x {
			t.Errorf("TrialCube(%g) = %g on the CPU", x, got)
		}
		if got := p.Output(passes.GradName("w")).F64[i]; math.Abs(got-3*x*x) > 1e-12 {
			t.Errorf("d TrialCube(%g) = %g, want %g", x, got, 3*x*x)
		}
	}
	// CUDA: the prelude's case, and the program on the dry-run device
	src, err := cuda.Source("graph.cu")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(src, "case U_TRIALCUBE: return x * x * x;") {
		t.Error("the CUDA prelude has no case for TrialCube")
	}
	be, err := cuda.NewDryRun(ir.FP32, cuda.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	dst := kernels.NewStore(ir.FP32)
	if _, err := dst.Ensure("w", ir.Shape{5}); err != nil {
		t.Fatal(err)
	}
	dp, err := be.Compile(g, nil, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if err := dp.Run(nil, 1); err != nil {
		t.Fatal(err)
	}
	// ONNX: the spec's lowering
	eg := ir.New("trial_export")
	ids := eg.Input(onnx.InputName, ir.Shape{1, 3}, ir.I32)
	h := eg.Op1("Gather", nil, eg.Param("emb", ir.Shape{4, 4}), ids)
	eg.SetOutput("logits", eg.Op1("TrialCube", nil, h))
	m, err := onnx.Lower(eg, func(v *ir.Value) ([]float32, error) { return make([]float32, v.Shape.Numel()), nil }, onnx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var ops []string
	for _, n := range m.Graph.Node {
		ops = append(ops, n.OpType)
	}
	if !slices.Equal(ops, []string{"Gather", "Mul", "Mul"}) {
		t.Errorf("lowered to %v, want Gather, Mul, Mul", ops)
	}
}

// TestSpecWithoutCUDAFormulaIsRefused: a spec that lacks a CUDA formula
// (or any other part) is refused at registration, so no binary with it
// starts: a missing formula fails every test, no simulator needed.
func TestSpecWithoutCUDAFormulaIsRefused(t *testing.T) {
	for name, broken := range map[string]func(s *ir.EwSpec){
		"cuda":  func(s *ir.EwSpec) { s.CUDA = "" },
		"go":    func(s *ir.EwSpec) { s.F32 = nil },
		"grad":  func(s *ir.EwSpec) { s.Grad = nil },
		"cases": func(s *ir.EwSpec) { s.Cases = nil },
	} {
		s := *trialCube
		s.Name = ir.OpName("TrialBroken" + name)
		broken(&s)
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("a spec without its %s part was registered", name)
				}
			}()
			ir.RegisterElementwise(&s)
		}()
		if ir.Ops[s.Name] != nil || ir.ElementwiseOf(s.Name) != nil {
			t.Errorf("the spec without its %s part is in the table", name)
		}
	}
}
