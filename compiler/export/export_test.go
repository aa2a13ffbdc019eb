package export_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
)

// requireORT skips a test that needs onnxruntime when the library is
// missing, except under CI=true, where that is a failure.
func requireORT(t testing.TB) {
	t.Helper()
	if err := runtime.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and onnxruntime is unavailable: %v", err)
		}
		t.Skipf("onnxruntime unavailable: %v", err)
	}
}

var lengths = []int{8, 24}

func smallCfg(kind model.Kind) model.Config {
	p, _ := model.LookupPreset("tiny")
	c := p.Config
	c.Model = kind
	c.Vocab, c.DModel, c.Heads, c.Layers, c.MaxLen = 97, 32, 2, 2, 32
	c.Experts, c.TopK, c.Dropout = 2, 1, 0.1
	return c
}

// smallStore is a random-init checkpoint of cfg: weights, training-only
// buffers (warm-in scale 0.8), random running statistics at every length
// in ls, and Guardian policy weights that must never reach an export.
func smallStore(t testing.TB, cfg *model.Config, ls ...int) *kernels.Store {
	t.Helper()
	st := kernels.NewStore(ir.FP32)
	r := rand.New(rand.NewPCG(11, 12))
	for _, T := range ls {
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
		if err := model.InitStore(append(specs, especs...), st, 7); err != nil {
			t.Fatal(err)
		}
		for _, s := range especs {
			if s.Running == "" {
				continue
			}
			d := st.Get(s.Name)
			R := s.Shape[1]
			for i := 0; i < d.Len(); i += R {
				var sum float64
				w := make([]float64, R)
				for j := range w {
					w[j] = 0.05 + r.Float64()*r.Float64()
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
			tt.Set(0, 0.8)
		}
	}
	for _, name := range []string{"guardian.policy.0.weight", "guardian.value.weight"} {
		g, _ := st.Ensure(name, ir.Shape{4, 3})
		for i := 0; i < g.Len(); i++ {
			g.Set(i, float64(i))
		}
	}
	return st
}

type variant struct {
	kind      model.Kind
	fold      passes.FoldMode
	attention passes.AttentionMode
	quantize  onnx.Quantize
	options   string // "", or "+"-joined model options: rope, smear
}

func (v variant) String() string {
	s := fmt.Sprintf("%v/%v/%v", v.kind, v.fold, v.attention)
	if v.quantize != onnx.QuantizeNone {
		s += "/" + v.quantize.String()
	}
	if v.options != "" {
		s += "/" + v.options
	}
	return s
}

var variants = []variant{
	{model.Fuzzy, passes.FoldRPAMode, passes.AttentionPlain, onnx.QuantizeNone, ""},
	{model.Fuzzy, passes.FoldRPAMode, passes.AttentionOp, onnx.QuantizeNone, ""},
	{model.Fuzzy, passes.FoldNoneMode, passes.AttentionPlain, onnx.QuantizeNone, ""},
	{model.Fuzzy, passes.FoldNoneMode, passes.AttentionOp, onnx.QuantizeNone, ""},
	{model.Baseline, passes.FoldRPAMode, passes.AttentionPlain, onnx.QuantizeNone, ""},
	{model.Baseline, passes.FoldNoneMode, passes.AttentionOp, onnx.QuantizeNone, ""},
	{model.Fuzzy, passes.FoldRPAMode, passes.AttentionOp, onnx.QuantizeInt8, ""},
	{model.Baseline, passes.FoldRPAMode, passes.AttentionPlain, onnx.QuantizeInt8, ""},
	{model.Fuzzy, passes.FoldRPAMode, passes.AttentionOp, onnx.QuantizeNone, "rope"},
	{model.Baseline, passes.FoldNoneMode, passes.AttentionPlain, onnx.QuantizeNone, "rope"},
	{model.Fuzzy, passes.FoldRPAMode, passes.AttentionPlain, onnx.QuantizeNone, "rope+smear"},
}

type exported struct {
	v   variant
	cfg model.Config
	st  *kernels.Store
	dir string
	res *export.Result
}

func doExport(t *testing.T, v variant, batch int) exported {
	t.Helper()
	cfg := smallCfg(v.kind)
	opts := strings.Split(v.options, "+")
	cfg.RoPE, cfg.SmearKeys = slices.Contains(opts, "rope"), slices.Contains(opts, "smear")
	st := smallStore(t, &cfg, lengths...)
	dir := t.TempDir()
	res, err := export.Export(context.Background(), export.Options{Config: cfg, Store: st, Lengths: lengths, Batch: batch,
		Fold: v.fold, Attention: v.attention, Quantize: v.quantize, Out: dir, Tokenizer: "test", EOS: 3, Provenance: &runtime.Provenance{Weights: "last"}})
	if err != nil {
		t.Fatalf("%s: %v", v, err)
	}
	return exported{v, cfg, st, dir, res}
}

func randSeqs(r *rand.Rand, B, T, V int) [][]int32 {
	out := make([][]int32, B)
	for i := range out {
		out[i] = make([]int32, T)
		for j := range out[i] {
			out[i][j] = int32(r.IntN(V))
		}
	}
	return out
}

// goLogits runs g ([B,T] ids) on the CPU backend.
func goLogits(t *testing.T, g *ir.Graph, st *kernels.Store, seqs [][]int32) []float32 {
	t.Helper()
	var ids []int32
	for _, s := range seqs {
		ids = append(ids, s...)
	}
	p, err := cpu.New(ir.FP32).Compile(g, passes.Plan(g), st)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Run(map[string]*kernels.Tensor{"input_ids": kernels.IntTensor(g.Lookup("input_ids").Shape, ids)}, 0); err != nil {
		t.Fatal(err)
	}
	return p.Output("logits").Float32s()
}

func evalMode(t *testing.T, cfg *model.Config, T, B int) *ir.Graph {
	t.Helper()
	mg, err := model.Build(cfg, model.Opts{T: T, B: B, Mode: model.Eval, Logits: true, NoLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	g := mg.Graph
	if err := passes.Run(g, passes.EvalPipeline, &passes.Context{}); err != nil {
		t.Fatal(err)
	}
	return g
}

func maxDiff(got []runtime.Logits, want []float32) float64 {
	var m float64
	off := 0
	for _, l := range got {
		for _, x := range l.Data {
			d := math.Abs(float64(x) - float64(want[off]))
			if d > m || d != d {
				m = d
			}
			off++
		}
	}
	return m
}

// Parity: onnxruntime computes the logits of the Go executor. With fold
// none the reference is the eval-mode graph; with fold rpa it is the
// folded graph (and, since the fold is exact, the eval-mode graph too).
func TestParity(t *testing.T) {
	requireORT(t)
	const B = 2
	for _, v := range variants {
		t.Run(strings.ReplaceAll(v.String(), "/", "_"), func(t *testing.T) {
			e := doExport(t, v, B)
			m, err := runtime.Open(e.dir, runtime.Options{Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			r := rand.New(rand.NewPCG(21, 22))
			for _, T := range lengths {
				seqs := randSeqs(r, B, T, e.cfg.Vocab)
				got, err := m.Logits(context.Background(), seqs)
				if err != nil {
					t.Fatal(err)
				}
				eval := goLogits(t, evalMode(t, &e.cfg, T, B), e.st, seqs)
				tol := 1e-4
				if v.quantize == onnx.QuantizeInt8 {
					tol = 2e-2 // int8 products: the rounding of weights and activations
				}
				d := maxDiff(got, eval)
				if d > tol {
					t.Errorf("T=%d: onnxruntime vs Go eval mode: max |Δlogit| %g > %g", T, d, tol)
				}
				if v.quantize != onnx.QuantizeNone {
					t.Logf("%s T=%d: max |Δlogit| %.2e", v, T, d)
					checkInt8File(t, e, T)
					continue
				}
				if v.fold == passes.FoldRPAMode {
					fg, _, err := export.Graph(&e.cfg, T, B, e.st, export.GraphOptions{Fold: v.fold, Attention: v.attention})
					if err != nil {
						t.Fatal(err)
					}
					if d := maxDiff(got, goLogits(t, fg, e.st, seqs)); d > 1e-4 {
						t.Errorf("T=%d: onnxruntime vs Go folded graph: max |Δlogit| %g > 1e-4", T, d)
					}
				}
			}
		})
	}
}

// Causality: in every exported graph, changing the tokens after position
// t leaves the logits at positions <= t unchanged.
func TestCausality(t *testing.T) {
	requireORT(t)
	for _, v := range variants {
		e := doExport(t, v, 1)
		m, err := runtime.Open(e.dir, runtime.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(31, 32))
		for _, T := range lengths {
			for _, cut := range []int{0, T / 2, T - 2} {
				a := randSeqs(r, 1, T, e.cfg.Vocab)[0]
				b := append([]int32(nil), a...)
				for j := cut + 1; j < T; j++ {
					b[j] = int32((int(b[j]) + 1 + r.IntN(e.cfg.Vocab-1)) % e.cfg.Vocab)
				}
				out, err := m.Logits(context.Background(), [][]int32{a, b})
				if err != nil {
					t.Fatal(err)
				}
				V := e.cfg.Vocab
				var before, after float64
				for i := range out[0].Data {
					d := math.Abs(float64(out[0].Data[i] - out[1].Data[i]))
					if i/V <= cut {
						before = math.Max(before, d)
					} else {
						after = math.Max(after, d)
					}
				}
				if before > 1e-6 {
					t.Errorf("%s T=%d: changing tokens after %d moved the logits at positions <= %d by %g", v, T, cut, cut, before)
				}
				if after == 0 {
					t.Errorf("%s T=%d: changing tokens after %d changed nothing (the test is vacuous)", v, T, cut)
				}
			}
		}
		m.Close()
	}
}

// No training-only op or parameter in any exported file, and no unused
// initializer; the metadata and the manifest carry the export's facts.
func TestExportedFilesAreClean(t *testing.T) {
	banned := map[string]bool{"Dropout": true, "RandomUniform": true, "RandomUniformLike": true, "RandomNormal": true,
		"RandomNormalLike": true, "Bernoulli": true, "Multinomial": true}
	for _, v := range variants {
		e := doExport(t, v, 1)
		man, err := runtime.ReadManifest(e.dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := man.VerifyFiles(e.dir); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(man.Lengths) != fmt.Sprint(lengths) || man.VocabSize != e.cfg.Vocab || man.Tokenizer != "test" || man.EOS != 3 || man.Model != v.kind.String() {
			t.Errorf("%s: manifest %+v", v, man)
		}
		var fold export.Fold
		if err := json.Unmarshal(man.Fold, &fold); err != nil || fold.Mode != v.fold || fold.Attention != v.attention {
			t.Errorf("%s: manifest fold %s (%v)", v, man.Fold, err)
		}
		if v.kind == model.Fuzzy && v.fold == passes.FoldRPAMode && len(fold.Layers) != e.cfg.Layers*len(lengths) {
			t.Errorf("%s: fold statistics for %d layer-lengths, want %d", v, len(fold.Layers), e.cfg.Layers*len(lengths))
		}
		for _, T := range lengths {
			path := filepath.Join(e.dir, export.FileName(T))
			m, err := onnx.Read(path)
			if err != nil {
				t.Fatal(err)
			}
			if m.IrVersion > 13 || m.OpsetImport[0].Version != 23 {
				t.Errorf("%s: IR version %d opset %d", path, m.IrVersion, m.OpsetImport[0].Version)
			}
			read := map[string]bool{}
			for _, n := range m.Graph.Node {
				if banned[n.OpType] {
					t.Errorf("%s: training-only op %s", path, n.OpType)
				}
				for _, in := range n.Input {
					read[in] = true
				}
			}
			for _, init := range m.Graph.Initializer {
				if strings.HasPrefix(init.Name, "guardian.") || strings.Contains(init.Name, "lambda_sat") {
					t.Errorf("%s: training-only parameter %s", path, init.Name)
				}
				if !read[init.Name] {
					t.Errorf("%s: unused initializer %s", path, init.Name)
				}
			}
			meta := onnx.Inspect(m).Metadata
			for _, k := range []string{"lengths", "vocab_size", "tokenizer", "config", "fold"} {
				if meta[k] == "" {
					t.Errorf("%s: metadata %q missing", path, k)
				}
			}
			if meta["lengths"] != "8,24" || meta["length"] != fmt.Sprint(T) {
				t.Errorf("%s: metadata lengths %q length %q", path, meta["lengths"], meta["length"])
			}
			ops := onnx.Inspect(m).Ops
			if v.attention == passes.AttentionOp && ops["Attention"] != e.cfg.Layers {
				t.Errorf("%s: %d Attention nodes, want %d", path, ops["Attention"], e.cfg.Layers)
			}
			if v.kind == model.Fuzzy && v.fold == passes.FoldRPAMode && ops["ReduceSum"] > 0 && ops["Sqrt"] > 0 {
				t.Errorf("%s: the RPA computation (ZScore, Sinkhorn) is still in a folded graph: %v", path, ops)
			}
		}
	}
}

// Verify compares onnxruntime with the Go executor on held-out ids.
func TestVerify(t *testing.T) {
	requireORT(t)
	e := doExport(t, variant{model.Fuzzy, passes.FoldRPAMode, passes.DefaultAttention, onnx.QuantizeNone, ""}, 2)
	r := rand.New(rand.NewPCG(41, 42))
	ids := randSeqs(r, 1, 200, e.cfg.Vocab)[0]
	res, err := export.Verify(context.Background(), export.VerifyOptions{Dir: e.dir, Config: e.cfg, Store: e.st, IDs: ids, Batches: 2, Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(lengths) {
		t.Fatalf("%d results, want %d", len(res), len(lengths))
	}
	for _, x := range res {
		if x.MaxAbsDiff > 1e-4 || math.Abs(x.CEExport-x.CEEval) > 1e-4 || x.Tokens != 2*2*x.T {
			t.Errorf("T=%d: %+v", x.T, x)
		}
		if math.IsNaN(x.CEBatchStats) || x.CEBatchStats <= 0 {
			t.Errorf("T=%d: batch-statistics CE %v", x.T, x.CEBatchStats)
		}
	}
}

func TestCalibration(t *testing.T) {
	cfg := smallCfg(model.Fuzzy)
	st := smallStore(t, &cfg, 8)
	// No running statistics at 16 and no data: a clear error.
	_, err := export.Export(context.Background(), export.Options{Config: cfg, Store: st, Lengths: []int{16}, Out: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "--calib-batches") {
		t.Fatalf("want an error asking for calibration, got %v", err)
	}
	// Running statistics that the checkpoint marks untrained are calibrated.
	r := rand.New(rand.NewPCG(1, 1))
	ids := randSeqs(r, 1, 400, cfg.Vocab)[0]
	res, err := export.Export(context.Background(), export.Options{Config: cfg, Store: st, Lengths: []int{8, 16}, Out: t.TempDir(),
		Trained: func(name string) bool { return strings.HasSuffix(name, ".T8") }, CalibIDs: ids, CalibBatches: 3, CalibBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Lengths[0].Calibrated || !res.Lengths[1].Calibrated {
		t.Fatalf("calibrated: T=8 %v, T=16 %v; want false, true", res.Lengths[0].Calibrated, res.Lengths[1].Calibrated)
	}
	mu := st.Get(model.RunningMuName(0, 16))
	if mu == nil {
		t.Fatal("no running statistics stored for T=16")
	}
	for i := 0; i < 16; i++ { // rows are memberships
		var s float64
		for j := 0; j < cfg.R; j++ {
			s += mu.At(i*cfg.R + j)
		}
		if math.Abs(s-1) > 1e-4 {
			t.Fatalf("calibrated row %d sums to %g", i, s)
		}
	}
}

func TestExportErrors(t *testing.T) {
	cfg := smallCfg(model.Fuzzy)
	st := smallStore(t, &cfg, 8)
	for _, tc := range []struct {
		o    func(*export.Options)
		want string
	}{
		{func(o *export.Options) { o.Lengths = []int{0} }, "not a positive integer"},
		{func(o *export.Options) { o.Lengths = []int{33} }, "maximum length 32"},
		{func(o *export.Options) { o.Lengths = []int{8, 8} }, "twice"},
		{func(o *export.Options) { o.Fold = passes.FoldMode(9) }, "fold"},
		{func(o *export.Options) { o.Attention = passes.AttentionNone }, "attention"},
		{func(o *export.Options) { o.Attention = passes.AttentionMode(9) }, "attention"},
		{func(o *export.Options) { o.Opset = 12 }, "opset"},
		{func(o *export.Options) { o.Out = "" }, "output folder"},
		{func(o *export.Options) { o.EOS = 1000 }, "eos"},
	} {
		o := export.Options{Config: cfg, Store: st, Lengths: []int{8}, Out: t.TempDir()}
		tc.o(&o)
		if _, err := export.Export(context.Background(), o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error containing %q, got %v", tc.want, err)
		}
	}
	for _, s := range []string{"", "abc", "8,-1", "0", "8,,x"} {
		if _, err := export.ParseLengths(s); err == nil {
			t.Errorf("ParseLengths(%q) accepted", s)
		}
	}
	if ls, err := export.ParseLengths(" 384, 768 "); err != nil || fmt.Sprint(ls) != "[384 768]" {
		t.Errorf("ParseLengths: %v %v", ls, err)
	}
}

// Below opset 23 the fused attention is spelled out; the file still runs
// and matches the Go executor.
func TestOldOpset(t *testing.T) {
	requireORT(t)
	cfg := smallCfg(model.Fuzzy)
	st := smallStore(t, &cfg, 8)
	dir := t.TempDir()
	if _, err := export.Export(context.Background(), export.Options{Config: cfg, Store: st, Lengths: []int{8}, Out: dir,
		Attention: passes.AttentionOp, Opset: 18}); err != nil {
		t.Fatal(err)
	}
	m, err := onnx.Read(filepath.Join(dir, export.FileName(8)))
	if err != nil {
		t.Fatal(err)
	}
	if s := onnx.Inspect(m); s.Ops["Attention"] != 0 || s.Opsets[""] != 18 {
		t.Fatalf("opset 18 file: ops %v opsets %v", s.Ops, s.Opsets)
	}
	rt, err := runtime.Open(dir, runtime.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	seqs := randSeqs(rand.New(rand.NewPCG(5, 5)), 1, 8, cfg.Vocab)
	got, err := rt.Logits(context.Background(), seqs)
	if err != nil {
		t.Fatal(err)
	}
	if d := maxDiff(got, goLogits(t, evalMode(t, &cfg, 8, 1), st, seqs)); d > 1e-4 {
		t.Fatalf("opset 18: max |Δlogit| %g", d)
	}
}

// checkInt8File proves, on the exported file of length T, that no integer
// product can overflow an onnxruntime CPU kernel (onnx.CheckInt8Bound), and
// that every Linear layer of the model became one.
func checkInt8File(t *testing.T, e exported, T int) {
	t.Helper()
	for _, lr := range e.res.Lengths {
		if lr.T != T {
			continue
		}
		m, err := onnx.Read(filepath.Join(e.dir, lr.File))
		if err != nil {
			t.Fatal(err)
		}
		ps, err := onnx.CheckInt8Bound(m)
		if err != nil {
			t.Fatalf("T=%d: %v", T, err)
		}
		n := 0
		for _, node := range m.Graph.Node {
			if node.OpType == "MatMulIntegerToFloat" {
				n++
			}
		}
		if n == 0 || len(ps) != n {
			t.Fatalf("T=%d: %d products checked, %d in the graph", T, len(ps), n)
		}
		for _, p := range ps {
			if p.PairMax > 1<<15-1 || p.WeightMax > onnx.Int8WeightMax {
				t.Errorf("T=%d: %s: %+v", T, p.Node, p)
			}
		}
		t.Logf("T=%d: %d integer products, pair sums ≤ %d, row sums ≤ %d", T, len(ps), ps[0].PairMax, ps[0].RowMax)
		return
	}
	t.Fatalf("no exported file of length %d", T)
}
