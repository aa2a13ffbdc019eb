package passes_test

import (
	"bytes"
	"flag"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/passes"
)

var update = flag.Bool("update", false, "rewrite the golden IR dumps in testdata/golden")

// exportCfg is a small model for export tests.
func exportCfg(kind model.Kind, layers int) model.Config {
	p, _ := model.LookupPreset("tiny")
	c := p.Config
	c.Model = kind
	c.Vocab, c.DModel, c.Heads, c.Layers, c.MaxLen, c.Dropout = 41, 16, 2, layers, 16, 0.1
	c.Experts, c.TopK = 2, 1
	return c
}

// exportStore initialises every tensor the eval graphs of cfg at the given
// lengths read, with running statistics drawn at random (rows of a
// membership: positive, summing to 1) and a bias warm-in scale of 0.75.
func exportStore(t testing.TB, cfg *model.Config, lengths ...int) *kernels.Store {
	t.Helper()
	st := kernels.NewStore(ir.FP32)
	r := rand.New(rand.NewPCG(5, 6))
	for _, T := range lengths {
		mg, err := model.Build(cfg, model.Opts{T: T, B: 1, Mode: model.Train})
		if err != nil {
			t.Fatal(err)
		}
		specs := mg.Specs
		mg, err = model.Build(cfg, model.Opts{T: T, B: 1, Mode: model.Eval})
		if err != nil {
			t.Fatal(err)
		}
		especs := mg.Specs
		if err := model.InitStore(append(specs, especs...), st, 3); err != nil {
			t.Fatal(err)
		}
		for _, s := range especs {
			if s.Running == "" {
				continue
			}
			d := st.Get(s.Name)
			R := s.Shape[len(s.Shape)-1]
			for i := 0; i < d.Len(); i += R {
				var sum float64
				w := make([]float64, R)
				for j := range w {
					w[j] = 0.1 + r.Float64()
					sum += w[j]
				}
				for j := range w {
					d.Set(i+j, w[j]/sum)
				}
			}
		}
	}
	for name, tt := range st.Tensors {
		if strings.HasSuffix(name, ".bias_scale") {
			tt.Set(0, 0.75)
		}
	}
	return st
}

func evalGraph(t testing.TB, cfg *model.Config, T, B int, mode model.Mode, batchStats bool) *ir.Graph {
	t.Helper()
	mg, err := model.Build(cfg, model.Opts{T: T, B: B, Mode: mode, BatchStats: batchStats, Logits: true, NoLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	infos[mg.Graph] = mg.Info()
	return mg.Graph
}

// infos holds the model description of every graph evalGraph built.
var infos = map[*ir.Graph]*passes.ModelInfo{}

func exportCtx(g *ir.Graph, st *kernels.Store, fold passes.FoldMode, attention passes.AttentionMode, rep *passes.FoldReport) *passes.Context {
	return &passes.Context{Model: infos[g], ExportOptions: &passes.ExportOptions{
		Store: st, Backend: cpu.New(ir.FP32), Fold: fold, Attention: attention, Report: rep}}
}

// logitsOf runs g on the CPU backend.
func logitsOf(t testing.TB, g *ir.Graph, st *kernels.Store, ids []int32) []float64 {
	t.Helper()
	p, err := cpu.New(ir.FP32).Compile(g, passes.Plan(g), st)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	in := g.Lookup("input_ids")
	if err := p.Run(map[string]*kernels.Tensor{"input_ids": kernels.IntTensor(in.Shape, ids)}, 1); err != nil {
		t.Fatal(err)
	}
	return p.Output("logits").Float64s()
}

func randIDs(r *rand.Rand, n, vocab int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(r.IntN(vocab))
	}
	return ids
}

func maxAbsDiff(a, b []float64) float64 {
	var m float64
	for i := range a {
		d := math.Abs(a[i] - b[i])
		if d > m || d != d {
			m = d
		}
	}
	return m
}

// TestExportGolden dumps the graph after every pass of the export
// pipeline on one-layer models and compares with testdata/golden (go test
// ./passes -run Golden -update rewrites them).
func TestExportGolden(t *testing.T) {
	cases := []struct {
		name      string
		kind      model.Kind
		fold      passes.FoldMode
		attention passes.AttentionMode
		mode      model.Mode
	}{
		{"export_fuzzy_rpa_plain", model.Fuzzy, passes.FoldRPAMode, passes.AttentionPlain, model.Eval},
		{"export_fuzzy_rpa_op", model.Fuzzy, passes.FoldRPAMode, passes.AttentionOp, model.Eval},
		{"export_fuzzy_none_op", model.Fuzzy, passes.FoldNoneMode, passes.AttentionOp, model.Eval},
		{"export_baseline_plain", model.Baseline, passes.FoldRPAMode, passes.AttentionPlain, model.Eval},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := exportCfg(tc.kind, 1)
			cfg.Vocab, cfg.DModel = 11, 8
			const T = 4
			st := exportStore(t, &cfg, T)
			g := evalGraph(t, &cfg, T, 1, tc.mode, false)
			var buf bytes.Buffer
			c := exportCtx(g, st, tc.fold, tc.attention, nil)
			c.DumpAfter, c.Dump = "all", &buf
			buf.WriteString("// before passes\n" + g.String())
			if err := passes.Run(g, passes.ExportPipeline, c); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, tc.name, buf.String())
		})
	}
}

// TestStripTrainingGolden strips a training-mode forward graph (dropout,
// Gumbel noise, controller hooks, warm-in scale).
func TestStripTrainingGolden(t *testing.T) {
	cfg := exportCfg(model.Fuzzy, 1)
	cfg.Vocab, cfg.DModel = 11, 8
	st := exportStore(t, &cfg, 4)
	g := evalGraph(t, &cfg, 4, 1, model.Train, false)
	var buf bytes.Buffer
	buf.WriteString("// before passes\n" + g.String())
	c := exportCtx(g, st, passes.FoldNoneMode, passes.AttentionNone, nil)
	c.DumpAfter, c.Dump = "strip training", &buf
	if err := passes.Run(g, passes.ExportPipeline[:1], c); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "strip_training_train_mode", buf.String())
}

// scalarConst matches the printed value of a scalar constant; folded
// values are compared to 5 significant digits so that the last bits of a
// GEMM (OpenBLAS or the Go fallback, FMA or not) do not change the dump.
var scalarConst = regexp.MustCompile(`(?m)^(  const \S+ f32\[[0-9,]*\] = )(\S+)$`)

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	got = scalarConst.ReplaceAllStringFunc(got, func(line string) string {
		m := scalarConst.FindStringSubmatch(line)
		x, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return line
		}
		return m[1] + strconv.FormatFloat(x, 'g', 5, 64)
	})
	path := filepath.Join("..", "testdata", "golden", name+".txt")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./passes -run Golden -update to create it)", err)
	}
	if string(want) != got {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := 0; i < max(len(gl), len(wl)); i++ {
			var a, b string
			if i < len(gl) {
				a = gl[i]
			}
			if i < len(wl) {
				b = wl[i]
			}
			if a != b {
				t.Fatalf("%s differs from %s at line %d:\n got: %s\nwant: %s\n(run go test ./passes -run Golden -update if the change is intended)", name, path, i+1, a, b)
			}
		}
	}
}

func TestStripTraining(t *testing.T) {
	cfg := exportCfg(model.Fuzzy, 2)
	st := exportStore(t, &cfg, 8)
	g := evalGraph(t, &cfg, 8, 2, model.Train, false)
	if g.OpCounts()["Dropout"] == 0 || g.OpCounts()["GumbelNoise"] == 0 {
		t.Fatal("the training graph should hold Dropout and GumbelNoise")
	}
	if err := passes.StripTraining(g, infos[g].Hooks, st); err != nil {
		t.Fatal(err)
	}
	if err := ir.Verify(g, true); err != nil {
		t.Fatalf("stripped graph does not verify as an export graph: %v", err)
	}
	for op := range g.OpCounts() {
		if d := ir.Ops[op]; d.TrainingOnly || d.Random || op == ir.OpStopGradient {
			t.Errorf("op %s survived", op)
		}
	}
	for name := range g.Outputs {
		if strings.HasPrefix(name, "stat:") {
			t.Errorf("controller hook %s survived", name)
		}
	}
	for _, v := range g.Values {
		if strings.HasSuffix(v.Name, ".bias_scale") && (v.Kind != ir.Const || v.Data[0] != 0.75) {
			t.Errorf("%s: kind %v data %v, want a constant 0.75", v.Name, v.Kind, v.Data)
		}
	}
	// Without the store, the warm-in scale has no value to freeze.
	g = evalGraph(t, &cfg, 8, 1, model.Eval, false)
	err := passes.StripTraining(g, infos[g].Hooks, kernels.NewStore(ir.FP32))
	if err == nil || !strings.Contains(err.Error(), "bias_scale") {
		t.Fatalf("want an error naming bias_scale, got %v", err)
	}
}

// The verifier rejects a training-only op in a graph that must verify as
// an export graph.
func TestVerifierRejectsTrainingOps(t *testing.T) {
	cfg := exportCfg(model.Fuzzy, 1)
	g := evalGraph(t, &cfg, 8, 1, model.Train, false)
	noop := []passes.Pass{{Name: "noop", ExportAfter: true, Fn: func(*ir.Graph, *passes.Context) error { return nil }}}
	err := passes.Run(g, noop, &passes.Context{})
	if err == nil || !strings.Contains(err.Error(), "training-only") {
		t.Fatalf("want a training-only error, got %v", err)
	}
}

// Folding the RPA path is exact: the folded graph computes the logits of
// the eval-mode graph.
func TestFoldRPAExact(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		cfg := exportCfg(model.Fuzzy, 2)
		cfg.UseRPA = !legacy
		const T, B = 12, 2
		st := exportStore(t, &cfg, T)
		ref := evalGraph(t, &cfg, T, B, model.Eval, false)
		r := rand.New(rand.NewPCG(1, 2))
		ids := randIDs(r, B*T, cfg.Vocab)
		want := logitsOf(t, ref, st, ids)

		g := evalGraph(t, &cfg, T, B, model.Eval, false)
		rep := &passes.FoldReport{}
		if err := passes.Run(g, passes.ExportPipeline, exportCtx(g, st, passes.FoldRPAMode, passes.AttentionNone, rep)); err != nil {
			t.Fatal(err)
		}
		got := logitsOf(t, g, st, ids)
		if d := maxAbsDiff(got, want); d > 1e-5 {
			t.Errorf("legacy=%v: folded logits differ from eval mode by %g", legacy, d)
		}
		for _, v := range g.Values {
			if v.Kind == ir.Buffer {
				t.Errorf("legacy=%v: buffer %s left after the fold", legacy, v.Name)
			}
		}
		for _, op := range []ir.OpName{ir.OpSinkhorn, ir.OpZScore} {
			if g.OpCounts()[op] > 0 {
				t.Errorf("legacy=%v: %s left after the fold", legacy, op)
			}
		}
		if len(rep.Layers) != cfg.Layers {
			t.Fatalf("legacy=%v: report has %d layers, want %d", legacy, len(rep.Layers), cfg.Layers)
		}
		for i, l := range rep.Layers {
			if l.Layer != i || l.T != T || l.Min > l.Max || l.ClipFrac < 0 || l.ClipFrac > 1 || l.Clip != cfg.BiasClip {
				t.Errorf("legacy=%v: bad report entry %+v", legacy, l)
			}
			if math.Abs(l.Max) > 0.75*cfg.BiasClip+1e-6 || math.Abs(l.Min) > 0.75*cfg.BiasClip+1e-6 {
				t.Errorf("legacy=%v: bias range [%g,%g] beyond clip·bias_scale", legacy, l.Min, l.Max)
			}
		}
	}
}

func TestFoldRPAClipFraction(t *testing.T) {
	cfg := exportCfg(model.Fuzzy, 1)
	cfg.BiasClip = 0.5 // most z-scores exceed it
	const T = 12
	st := exportStore(t, &cfg, T)
	g := evalGraph(t, &cfg, T, 1, model.Eval, false)
	rep := &passes.FoldReport{}
	if err := passes.Run(g, passes.ExportPipeline, exportCtx(g, st, passes.FoldRPAMode, passes.AttentionNone, rep)); err != nil {
		t.Fatal(err)
	}
	if l := rep.Layers[0]; l.ClipFrac < 0.05 || math.Abs(l.Max) > 0.5*0.75+1e-6 {
		t.Fatalf("clip 0.5: report %+v, want a clipped fraction and |bias| <= 0.375", l)
	}
}

func TestFoldRPAErrors(t *testing.T) {
	cfg := exportCfg(model.Fuzzy, 1)
	st := exportStore(t, &cfg, 8)
	g := evalGraph(t, &cfg, 8, 1, model.Eval, true)
	err := passes.Run(g, passes.ExportPipeline, exportCtx(g, st, passes.FoldRPAMode, passes.AttentionNone, nil))
	if err == nil || !strings.Contains(err.Error(), "running statistics") {
		t.Fatalf("batch-statistics graph: want a refusal, got %v", err)
	}
	// Running statistics of another length are missing.
	g = evalGraph(t, &cfg, 6, 1, model.Eval, false)
	err = passes.Run(g, passes.ExportPipeline, exportCtx(g, st, passes.FoldRPAMode, passes.AttentionNone, nil))
	if err == nil || !strings.Contains(err.Error(), "rpa_mu_mean.T6") || !strings.Contains(err.Error(), "calib") {
		t.Fatalf("missing running statistics: want an error naming them and calibration, got %v", err)
	}
}

// Calibrate stores the mean of the batch statistics over the batches.
func TestCalibrate(t *testing.T) {
	cfg := exportCfg(model.Fuzzy, 2)
	const T, B = 8, 2
	st := exportStore(t, &cfg, T)
	mg, err := model.Build(&cfg, model.Opts{T: T, B: B, Mode: model.Eval, BatchStats: true, NoLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	g, specs := mg.Graph, mg.Specs
	_ = specs
	stats := map[string]string{}
	for i := 0; i < cfg.Layers; i++ {
		stats[model.RunningMuName(i, T)] = model.StatMu(i)
	}
	r := rand.New(rand.NewPCG(3, 4))
	batches := [][]int32{randIDs(r, B*T, cfg.Vocab), randIDs(r, B*T, cfg.Vocab), randIDs(r, B*T, cfg.Vocab)}
	// Reference: the mean of each batch's stat output.
	p, err := cpu.New(ir.FP32).Compile(g, passes.Plan(g), st)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]float64{}
	for _, b := range batches {
		if err := p.Run(map[string]*kernels.Tensor{"input_ids": kernels.IntTensor(ir.Shape{B, T}, b)}, 0); err != nil {
			t.Fatal(err)
		}
		for buf, out := range stats {
			o := p.Output(out).Float64s()
			if want[buf] == nil {
				want[buf] = make([]float64, len(o))
			}
			for i, x := range o {
				want[buf][i] += x / float64(len(batches))
			}
		}
	}
	p.Close()
	if err := passes.Calibrate(g, cpu.New(ir.FP32), st, batches, stats); err != nil {
		t.Fatal(err)
	}
	for buf, w := range want {
		if d := maxAbsDiff(st.Get(buf).Float64s(), w); d > 1e-6 {
			t.Errorf("%s: calibrated values differ from the batch mean by %g", buf, d)
		}
	}
	if err := passes.Calibrate(g, cpu.New(ir.FP32), st, [][]int32{{1, 2}}, stats); err == nil {
		t.Error("a batch of the wrong size must be an error")
	}
}

// ConstFold folds parameter-only subgraphs (the sliced position table,
// clamped scalars) and leaves the running statistics of an unfolded export
// alone.
func TestConstFold(t *testing.T) {
	cfg := exportCfg(model.Fuzzy, 1)
	const T = 8 // < max_len: the position table is sliced
	st := exportStore(t, &cfg, T)
	g := evalGraph(t, &cfg, T, 1, model.Eval, false)
	r := rand.New(rand.NewPCG(9, 9))
	ids := randIDs(r, T, cfg.Vocab)
	want := logitsOf(t, g, st, ids)
	if err := passes.Run(g, passes.ExportPipeline[:4], exportCtx(g, st, passes.FoldNoneMode, passes.AttentionNone, nil)); err != nil {
		t.Fatal(err)
	}
	if g.Lookup("pos_emb.weight") != nil || g.Lookup("pos_emb.weight.slice") == nil {
		t.Error("the sliced position table should be a folded constant")
	}
	if v := g.Lookup(model.RunningMuName(0, T)); v == nil || v.Kind != ir.Buffer {
		t.Error("with fold none the running statistics must stay buffers")
	}
	if g.Lookup("tok_emb.weight") == nil {
		t.Error("the token embedding must stay a parameter")
	}
	if d := maxAbsDiff(logitsOf(t, g, st, ids), want); d > 1e-5 {
		t.Errorf("const-folded logits differ by %g", d)
	}
}

// FuseAttention keeps the logits and leaves one fused node (op) or no
// CausalMask (plain, folded bias) per layer.
func TestFuseAttention(t *testing.T) {
	for _, kind := range []model.Kind{model.Fuzzy, model.Baseline} {
		for _, fold := range []passes.FoldMode{passes.FoldRPAMode, passes.FoldNoneMode} {
			for _, att := range []passes.AttentionMode{passes.AttentionOp, passes.AttentionPlain} {
				cfg := exportCfg(kind, 2)
				const T, B = 10, 2
				st := exportStore(t, &cfg, T)
				r := rand.New(rand.NewPCG(7, 8))
				ids := randIDs(r, B*T, cfg.Vocab)
				want := logitsOf(t, evalGraph(t, &cfg, T, B, model.Eval, false), st, ids)
				g := evalGraph(t, &cfg, T, B, model.Eval, false)
				if err := passes.Run(g, passes.ExportPipeline, exportCtx(g, st, fold, att, nil)); err != nil {
					t.Fatal(err)
				}
				ops := g.OpCounts()
				switch {
				case att == passes.AttentionOp && ops["FusedAttention"] != cfg.Layers:
					t.Errorf("%s %s %s: %d FusedAttention nodes, want %d", kind, fold, att, ops["FusedAttention"], cfg.Layers)
				case att == passes.AttentionOp && ops["CausalMask"] != 0:
					t.Errorf("%s %s %s: CausalMask left", kind, fold, att)
				case att == passes.AttentionPlain && (fold == passes.FoldRPAMode || kind == model.Baseline) && ops["CausalMask"] != 0:
					t.Errorf("%s %s %s: CausalMask left: %v", kind, fold, att, ops)
				}
				if d := maxAbsDiff(logitsOf(t, g, st, ids), want); d > 1e-5 {
					t.Errorf("%s %s %s: fused logits differ by %g", kind, fold, att, d)
				}
			}
		}
	}
}

func TestExportPipelineOrder(t *testing.T) {
	if err := passes.CheckOrder(passes.ExportPipeline); err != nil {
		t.Fatal(err)
	}
	if _, ok := passes.Pipelines["export"]; !ok {
		t.Fatal("the export pipeline is not registered")
	}
	swapped := append([]passes.Pass(nil), passes.ExportPipeline...)
	swapped[0], swapped[1] = swapped[1], swapped[0]
	if err := passes.CheckOrder(swapped); err == nil {
		t.Fatal("fold rpa before strip training must be rejected")
	}
	want := []string{"strip training", "fold rpa", "const fold", "dce", "fuse attention", "dce"}
	if got := passes.Names(passes.ExportPipeline); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("export pipeline %v, want %v", got, want)
	}
}

func TestDumpAfterNamedPass(t *testing.T) {
	cfg := exportCfg(model.Fuzzy, 1)
	st := exportStore(t, &cfg, 8)
	g := evalGraph(t, &cfg, 8, 1, model.Eval, false)
	var buf bytes.Buffer
	c := exportCtx(g, st, passes.FoldRPAMode, passes.AttentionPlain, nil)
	c.DumpAfter, c.Dump = "fold rpa", &buf
	if err := passes.Run(g, passes.ExportPipeline, c); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if strings.Count(out, "// after pass") != 1 || !strings.Contains(out, "// after pass fold rpa") || !strings.Contains(out, "rpa_bias.T8") {
		t.Fatalf("dump after fold rpa:\n%.400s", out)
	}
}
