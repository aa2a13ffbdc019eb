package cuda

import (
	"math"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cuda/perf"
	"github.com/rpac-dev/rpac/passes"
)

// TestKernelCostCoversEveryKernel: every kernel of src/*.cu has a cost
// (bytes moved) in kernelCost, so no launch enters a prediction as free.
func TestKernelCostCoversEveryKernel(t *testing.T) {
	sigs, err := kernelSignatures()
	if err != nil {
		t.Fatal(err)
	}
	for name, sig := range sigs {
		args := make([]any, len(sig))
		for i, p := range sig {
			switch p.kind {
			case "ptr", "u64":
				args[i] = uint64(1 << 32)
			case "i64":
				args[i] = int64(1000)
			case "i32":
				args[i] = int32(4)
			case "f32":
				args[i] = float32(1)
			}
		}
		e := perf.Event{Kind: perf.EvLaunch, Name: name, Threads: 256}
		kernelCost(&e, kargs{sig, args}, [3]uint32{4, 4, 1})
		if !(e.Bytes > 0) {
			t.Errorf("kernel %s: no cost (bytes %v)", name, e.Bytes)
		}
	}
}

// TestTraceRecordsTrainingStep: a traced training step on the dry-run
// device records every launch and GEMM the device checked, the GEMM FLOPs
// of the graph (all but the fused attention, whose products run in its own
// kernels), and the weights going up.
func TestTraceRecordsTrainingStep(t *testing.T) {
	s := traceTinyStep(t, ir.FP32, false, CandidateOptions())
	var launches, gemms int
	var gemmFlops float64
	for _, e := range s.events {
		switch e.Kind {
		case perf.EvLaunch:
			launches++
		case perf.EvGEMM:
			gemms++
			gemmFlops += e.Flops
		}
	}
	if launches+gemms != s.checked || gemms == 0 {
		t.Errorf("trace: %d launches + %d GEMMs, the device checked %d", launches, gemms, s.checked)
	}
	want := float64(passes.Flops(s.g))
	for _, n := range s.g.Nodes {
		if n.Op == ir.OpFusedAttention {
			q, k, o := n.Inputs[0].Shape, n.Inputs[1].Shape, n.Outputs[0].Shape
			want -= float64(2 * (q.Numel() + o.Numel()) * k[2])
		}
	}
	if math.Abs(gemmFlops-want) > 1e-9*want {
		t.Errorf("traced GEMM FLOPs %.6g, the graph's %.6g", gemmFlops, want)
	}
	if params := float64(4 * s.params); s.h2d < params {
		t.Errorf("host→device %.0f bytes, below the %.0f bytes of weights uploaded each Run", s.h2d, params)
	}
	// every reduction of the step is two-pass: the serial loops left are
	// the single-thread Sinkhorn's
	serial := map[string]bool{}
	for _, e := range s.events {
		if e.Kind == perf.EvLaunch && e.Class == perf.ClassSerial && !strings.HasPrefix(e.Name, "sinkhorn") {
			serial[e.Name] = true
		}
	}
	if len(serial) > 0 {
		t.Errorf("serial loops in the step: %v", serial)
	}
	// the backward reads the forward's output and log-sum-exp: one forward
	// launch per FusedAttention node, none from the gradients
	var fused, forwards int
	for _, n := range s.g.Nodes {
		if n.Op == ir.OpFusedAttention {
			fused++
		}
	}
	for _, e := range s.events {
		if strings.HasPrefix(e.Name, "attention_fwd_") {
			forwards++
		}
	}
	if fused == 0 || forwards != fused {
		t.Errorf("%d attention forward launches for %d FusedAttention nodes", forwards, fused)
	}
}

// TestTraceBF16GEMMsPadded: in bf16 every tensor-core GEMM of a training
// step reads A and B with 16-byte-aligned leading dimensions (the model's
// d_model is not a multiple of 8), and a weight is converted at most once
// per step: a second micro-batch on the same weights (ReuseStored)
// converts only activations.
func TestTraceBF16GEMMsPadded(t *testing.T) {
	s := traceTinyStep(t, ir.BF16, false, CandidateOptions())
	var bf16 int
	for _, e := range s.events {
		if e.Kind == perf.EvGEMM && e.DType == BF16 {
			bf16++
			if !e.Shape.OperandsAligned() {
				t.Errorf("%s %+v: A or B not 16-byte aligned", e.Name, e.Shape)
			}
		}
	}
	if bf16 == 0 {
		t.Fatal("no bf16 GEMM traced")
	}
	conv := func(evs []perf.Event) (n int) {
		for _, e := range evs {
			if e.Name == "f32_to_bf16_pad_kernel" {
				n++
			}
		}
		return n
	}
	first, again := conv(s.events), conv(s.again)
	if w := first - again; w <= 0 || w > s.weights {
		t.Errorf("%d conversions in the first micro-batch, %d in the second: %d weight conversions for %d weights", first, again, w, s.weights)
	}
	t.Logf("%d bf16 GEMMs; conversions: %d, then %d on the same weights", bf16, first, again)
}

// tracedStep is one traced training step of a small fuzzy model on the
// dry-run device (traceTinyStep: with the sibling gradients joined when
// join is set).
type tracedStep struct {
	g       *ir.Graph
	events  []perf.Event
	again   []perf.Event // a second Run on the same weights (ReuseStored)
	checked int          // launches and GEMMs the device checked
	h2d     float64
	params  int
	weights int // weight tensors
}

func traceTinyStep(t *testing.T, gemm ir.Precision, join bool, o Options) tracedStep {
	t.Helper()
	p, err := model.LookupPreset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg := p.Config
	cfg.Vocab, cfg.DModel, cfg.Layers, cfg.Heads, cfg.MaxLen = 97, 34, 2, 2, 24
	const T, B = 24, 3
	mg, err := model.Build(&cfg, model.Opts{T: T, B: B, Mode: model.Train})
	if err != nil {
		t.Fatal(err)
	}
	if err := passes.Run(mg.Graph, passes.TrainPipeline, &passes.Context{Model: mg.Info(), FuseAttention: true, Loss: "loss", JoinGrads: join}); err != nil {
		t.Fatal(err)
	}
	st := kernels.NewStore(ir.FP32)
	if err := model.InitStore(mg.Specs, st, 7); err != nil {
		t.Fatal(err)
	}
	be := newBackend(mustFake(t), gemm, o)
	tr, err := be.StartTrace()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := be.Compile(mg.Graph, passes.Plan(mg.Graph), st)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	ids := make([]int32, B*T)
	for i := range ids {
		ids[i] = int32(i % cfg.Vocab)
	}
	feeds := map[string]*kernels.Tensor{"input_ids": kernels.IntTensor(ir.Shape{B, T}, ids), "targets": kernels.IntTensor(ir.Shape{B * T}, ids)}
	tr.Reset()
	before := DryRunLaunches(be)
	if err := prog.Run(feeds, 3); err != nil {
		t.Fatal(err)
	}
	h2d, _ := tr.HostDeviceBytes()
	s := tracedStep{g: mg.Graph, events: tr.Events(), checked: DryRunLaunches(be) - before, h2d: h2d,
		params: model.CountParams(mg.Specs), weights: len(mg.Specs)}
	tr.Reset()
	prog.(interface{ ReuseStored() }).ReuseStored()
	if err := prog.Run(feeds, 4); err != nil {
		t.Fatal(err)
	}
	s.again = tr.Events()
	return s
}

// TestTraceJoinedGradients: with the sibling gradients joined, a bf16 step
// launches one f32_cat_to_bf16_pad_kernel per lazy Concat whose GEMMs run
// in bf16 (its parts converted once for both GEMMs) and writes none of
// them: the scatters added are the other Concats' (the joined weights',
// and the lazy ones of GEMMs too small for bf16: the membership's two
// gates, 1 and 4 wide); fewer GEMMs, the same FLOPs.
func TestTraceJoinedGradients(t *testing.T) {
	count := func(s tracedStep) (gemms int, flops float64, names map[string]int) {
		names = map[string]int{}
		for _, e := range s.events {
			names[e.Name]++
			if e.Kind == perf.EvGEMM {
				gemms++
				flops += e.Flops
			}
		}
		return
	}
	// the weight gradients over their own dims (padded, the joined and the
	// plain ones would round up differently: other FLOPs)
	o := CandidateOptions()
	o.PadGradW = false
	plain, joined := traceTinyStep(t, ir.BF16, false, o), traceTinyStep(t, ir.BF16, true, o)
	uses := joined.g.Uses()
	folded, written := 0, 0
	for _, n := range joined.g.Nodes {
		if n.Op != ir.OpConcat {
			continue
		}
		o := n.Outputs[0]
		bf16 := n.Attrs.Bool("lazy", false)
		for _, u := range uses[o] {
			N := lastDim(o.Shape)
			bf16 = bf16 && min(o.Shape.Numel()/N, N, lastDim(u.Outputs[0].Shape)) > SmallGEMMDim
		}
		if bf16 {
			folded++
		} else {
			written += len(n.Inputs)
		}
	}
	pg, pf, pn := count(plain)
	jg, jf, jn := count(joined)
	if folded == 0 || jn["f32_cat_to_bf16_pad_kernel"] != folded || pn["f32_cat_to_bf16_pad_kernel"] != 0 {
		t.Errorf("%d lazy Concats read by bf16 GEMMs; %d part conversions joined, %d plain", folded, jn["f32_cat_to_bf16_pad_kernel"], pn["f32_cat_to_bf16_pad_kernel"])
	}
	if got := jn["scatter_view_f32"] - pn["scatter_view_f32"]; got != written {
		t.Errorf("scatter_view_f32: %d more launches joined than plain, want the %d parts of the Concats not folded", got, written)
	}
	if jg >= pg || math.Abs(jf-pf) > 1e-9*pf {
		t.Errorf("GEMMs %d joined, %d plain; FLOPs %.6g and %.6g", jg, pg, jf, pf)
	}
	t.Logf("%d lazy Concats folded; GEMMs %d → %d", folded, pg, jg)
}

// dryRunEvents compiles g on the dry-run device (fp32 GEMMs), runs it once
// on feeds and returns the launches of that run.
func dryRunEvents(t *testing.T, g *ir.Graph, feeds map[string]*kernels.Tensor) []perf.Event {
	t.Helper()
	be := newBackend(mustFake(t), ir.FP32, CandidateOptions())
	tr, err := be.StartTrace()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := be.Compile(g, passes.Plan(g), kernels.NewStore(ir.FP32))
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	tr.Reset()
	if err := prog.Run(feeds, 1); err != nil {
		t.Fatal(err)
	}
	return tr.Events()
}

// TestTraceFusedBytes: a FusedElementwise launch is charged its inputs'
// own sizes (a broadcast one counted once) and its output, which the
// backend states (costHinter) since the kernels' arguments cannot; a
// generated chain is reported by kind (every input dense, or a broadcast
// over a view of two dims: a stream; a broadcast over more: the view
// class).
func TestTraceFusedBytes(t *testing.T) {
	cases := []struct {
		name, kernel string
		y            ir.Shape
		class        perf.CostClass
	}{
		{"generated, broadcast over rows", fusedGenBcast, ir.Shape{7}, perf.ClassStream},
		{"generated, broadcast inside", fusedGenView, ir.Shape{5, 1}, perf.ClassView},
		{"generated, dense", fusedGenDense, ir.Shape{3, 5, 7}, perf.ClassStream},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := ir.New("fused")
			x := g.Input("x", ir.Shape{3, 5, 7}, ir.F32)
			y := g.Input("y", c.y, ir.F32)
			body := ir.FusedBody{{Op: "Add", Args: []int{0, 1}}, {Op: "Neg", Args: []int{2}}}
			g.SetOutput("o", g.Apply("FusedElementwise", ir.Attrs{"shape": []int{3, 5, 7}, "body": body}, x, y)[0])
			feeds := map[string]*kernels.Tensor{"x": kernels.NewTensor(ir.FP32, ir.Shape{3, 5, 7}), "y": kernels.NewTensor(ir.FP32, c.y)}
			n := 0
			for _, e := range dryRunEvents(t, g, feeds) {
				if e.Kind != perf.EvLaunch || strings.HasPrefix(e.Name, "copy") {
					continue
				}
				if e.Name != c.kernel {
					t.Errorf("launch of %s, want %s", e.Name, c.kernel)
					continue
				}
				n++
				if want := 4.0 * float64(105+c.y.Numel()+105); e.Bytes != want {
					t.Errorf("%s charged %g bytes, want %g", e.Name, e.Bytes, want)
				}
				if e.Class != c.class {
					t.Errorf("%s in class %v, want %v", e.Name, e.Class, c.class)
				}
			}
			if n != 1 {
				t.Fatalf("%d %s launches traced, want 1", n, c.kernel)
			}
		})
	}
}

// TestTraceBF16StagingKeepsSharedInput: under ir.BF16 an activation that
// several GEMMs read stays in its staging buffer while another activation
// is converted between them (two buffers per side, least recently read
// replaced): x feeds two up projections, each followed by a down
// projection of its own hidden activation, so the activations x, h1 and h2
// take three conversions, not four.
func TestTraceBF16StagingKeepsSharedInput(t *testing.T) {
	const M, K, F = 40, 24, 32
	g := ir.New("experts")
	x := g.Input("x", ir.Shape{M, K}, ir.F32)
	st := kernels.NewStore(ir.FP32)
	w := func(name string, n, k int) *ir.Value {
		v := g.Param(name, ir.Shape{n, k})
		if _, err := st.Ensure(name, v.Shape); err != nil {
			t.Fatal(err)
		}
		return v
	}
	h1 := g.Op1("Linear", nil, x, w("up1", F, K))
	y1 := g.Op1("Linear", nil, h1, w("down1", K, F))
	h2 := g.Op1("Linear", nil, x, w("up2", F, K))
	y2 := g.Op1("Linear", nil, h2, w("down2", K, F))
	g.SetOutput("y", g.Op1("Add", nil, y1, y2))
	be := newBackend(mustFake(t), ir.BF16, CandidateOptions())
	tr, err := be.StartTrace()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := be.Compile(g, passes.Plan(g), st)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	feeds := map[string]*kernels.Tensor{"x": kernels.NewTensor(ir.FP32, ir.Shape{M, K})}
	if err := prog.Run(feeds, 1); err != nil { // converts the weights too
		t.Fatal(err)
	}
	tr.Reset()
	prog.(interface{ ReuseStored() }).ReuseStored()
	if err := prog.Run(feeds, 2); err != nil {
		t.Fatal(err)
	}
	conv, gemms := 0, 0
	for _, e := range tr.Events() {
		switch {
		case e.Name == "f32_to_bf16_pad_kernel":
			conv++
		case e.Kind == perf.EvGEMM && e.DType == BF16:
			gemms++
		}
	}
	if gemms != 4 || conv != 3 {
		t.Fatalf("%d bf16 GEMMs and %d activation conversions, want 4 and 3", gemms, conv)
	}
}

// TestBinaryKernelChoice: a binary op whose operands both have the output's
// shape launches binary_dense_f32; one with a broadcast operand runs as a
// generated one-step chain (a two-dim broadcast: fused_gen_bcast_f32; a
// deeper one: fused_gen_view_f32).
func TestBinaryKernelChoice(t *testing.T) {
	for _, tc := range []struct {
		b    ir.Shape
		want string
	}{
		{ir.Shape{3, 5, 7}, "binary_dense_f32"},
		{ir.Shape{7}, fusedGenBcast},
		{ir.Shape{5, 1}, fusedGenView},
	} {
		g := ir.New("binary")
		a := g.Input("a", ir.Shape{3, 5, 7}, ir.F32)
		b := g.Input("b", tc.b, ir.F32)
		g.SetOutput("o", g.Op1("Mul", nil, a, b))
		feeds := map[string]*kernels.Tensor{"a": kernels.NewTensor(ir.FP32, ir.Shape{3, 5, 7}), "b": kernels.NewTensor(ir.FP32, tc.b)}
		var names []string
		for _, e := range dryRunEvents(t, g, feeds) {
			if strings.HasPrefix(e.Name, "binary_") || strings.HasPrefix(e.Name, fusedGenPrefix) {
				names = append(names, e.Name)
			}
		}
		if len(names) != 1 || names[0] != tc.want {
			t.Errorf("b%v: launched %v, want [%s]", tc.b, names, tc.want)
		}
	}
}
