package export_test

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
)

// CE budgets of the reduced-precision exports against float32 (nats).
const (
	halfCEBudget = 0.01
	int8CEBudget = 0.05
)

func dtypeExport(t *testing.T, dt ir.Precision, quant onnx.Quantize, fold passes.FoldMode, att passes.AttentionMode) exported {
	t.Helper()
	cfg := smallCfg(model.Fuzzy)
	if fold == passes.FoldRankMode {
		cfg.BiasClip = 50
	}
	st := smallStore(t, &cfg, lengths...)
	dir := t.TempDir()
	res, err := export.Export(context.Background(), export.Options{Config: cfg, Store: st, Lengths: lengths, Batch: 2,
		Fold: fold, Attention: att, DType: dt, Quantize: quant, Out: dir, Tokenizer: "test", EOS: 3})
	if err != nil {
		t.Fatalf("%s %s %s: %v", dt, fold, att, err)
	}
	return exported{variant{model.Fuzzy, fold, att, quant, ""}, cfg, st, dir, res}
}

// initTypes counts the initializers of an exported file by element type.
func initTypes(t *testing.T, path string) map[onnxpb.TensorProto_DataType]int {
	t.Helper()
	m, err := onnx.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[onnxpb.TensorProto_DataType]int{}
	for _, in := range m.Graph.Initializer {
		out[onnxpb.TensorProto_DataType(in.DataType)]++
	}
	return out
}

// ceCost runs Verify on random held-out ids and returns, per length, the
// CE of the export minus the CE of the float32 Go executor.
func ceCost(t *testing.T, e exported) []export.VerifyResult {
	t.Helper()
	ids := randSeqs(rand.New(rand.NewPCG(81, 82)), 1, 300, e.cfg.Vocab)[0]
	res, err := export.Verify(context.Background(), export.VerifyOptions{Dir: e.dir, Config: e.cfg, Store: e.st, IDs: ids, Batches: 2, Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// fp16 exports (dense and rank fold, both lowerings) load and run on
// onnxruntime's CPU provider, store their weights in half precision, keep
// float32 logits, stay causal and cost less than the CE budget.
func TestFP16Export(t *testing.T) {
	requireORT(t)
	for _, c := range []struct {
		fold passes.FoldMode
		att  passes.AttentionMode
	}{
		{passes.FoldRPAMode, passes.AttentionOp}, {passes.FoldRPAMode, passes.AttentionPlain}, {passes.FoldRankMode, passes.AttentionOp},
	} {
		e := dtypeExport(t, ir.FP16, onnx.QuantizeNone, c.fold, c.att)
		for _, l := range e.res.Lengths {
			n := initTypes(t, filepath.Join(e.dir, l.File))
			if n[onnxpb.TensorProto_FLOAT16] == 0 {
				t.Errorf("fp16 %s %s T=%d: no float16 initializer: %v", c.fold, c.att, l.T, n)
			}
		}
		for _, x := range ceCost(t, e) {
			cost := x.CEExport - x.CEEval
			if !(math.Abs(cost) < halfCEBudget) || !(x.MaxAbsDiff < 0.1) {
				t.Errorf("fp16 %s %s T=%d: CE cost %+.5f nats (budget %g), max |Δlogit| %g", c.fold, c.att, x.T, cost, halfCEBudget, x.MaxAbsDiff)
			}
			t.Logf("fp16 %s %s T=%d: CE cost %+.5f nats, max |Δlogit| %.2e", c.fold, c.att, x.T, cost, x.MaxAbsDiff)
		}
		checkCausal(t, e)
	}
}

// missingOp reads the op a provider has no kernel for out of an
// onnxruntime load error.
var missingOp = regexp.MustCompile(`(?:Could not find an implementation for |Optype \()(\w+)`)

// bf16 exports store bfloat16 weights. onnxruntime 1.30's CPU provider has
// no bfloat16 kernel for Add (it has one for few ops), so the test checks
// that loading fails naming the op; should a build run them, their CE cost
// must be within the budget.
func TestBF16Export(t *testing.T) {
	requireORT(t)
	for _, att := range []passes.AttentionMode{passes.AttentionOp, passes.AttentionPlain} {
		e := dtypeExport(t, ir.BF16, onnx.QuantizeNone, passes.FoldRPAMode, att)
		for _, l := range e.res.Lengths {
			if n := initTypes(t, filepath.Join(e.dir, l.File)); n[onnxpb.TensorProto_BFLOAT16] == 0 {
				t.Errorf("bf16 %s T=%d: no bfloat16 initializer: %v", att, l.T, n)
			}
		}
		m, err := runtime.Open(e.dir, runtime.Options{Threads: 2})
		if err != nil {
			op := missingOp.FindStringSubmatch(err.Error())
			if op == nil {
				t.Errorf("bf16 %s: the load error names no op: %v", att, err)
				continue
			}
			t.Logf("bf16 %s: onnxruntime's CPU provider cannot run %s in bfloat16 (%v)", att, op[1], err)
			continue
		}
		m.Close()
		for _, x := range ceCost(t, e) {
			if cost := x.CEExport - x.CEEval; !(math.Abs(cost) < halfCEBudget) {
				t.Errorf("bf16 %s T=%d: CE cost %+.5f nats (budget %g)", att, x.T, cost, halfCEBudget)
			}
		}
		checkCausal(t, e)
	}
}

// int8 (CPU serving) costs less than its CE budget; int8 and a reduced
// dtype do not combine.
func TestInt8CECost(t *testing.T) {
	requireORT(t)
	e := dtypeExport(t, ir.FP32, onnx.QuantizeInt8, passes.FoldRPAMode, passes.AttentionOp)
	for _, x := range ceCost(t, e) {
		cost := x.CEExport - x.CEEval
		if !(math.Abs(cost) < int8CEBudget) {
			t.Errorf("int8 T=%d: CE cost %+.5f nats (budget %g)", x.T, cost, int8CEBudget)
		}
		t.Logf("int8 T=%d: CE cost %+.5f nats, max |Δlogit| %.2e", x.T, cost, x.MaxAbsDiff)
	}
	cfg := smallCfg(model.Fuzzy)
	_, err := export.Export(context.Background(), export.Options{Config: cfg, Store: smallStore(t, &cfg, 8), Lengths: []int{8},
		DType: ir.FP16, Quantize: onnx.QuantizeInt8, Out: filepath.Join(t.TempDir(), "x"), Tokenizer: "test"})
	if err == nil {
		t.Fatal("fp16 with int8: want a refusal")
	}
	if _, err := os.Stat(filepath.Join(t.TempDir(), "x")); err == nil {
		t.Error("the refused export wrote its folder")
	}
}

// The KV-cache graphs are fp32 with the dense prior: a reduced dtype or a
// rank fold with --kv-cache is refused before anything is written.
func TestKVCacheRefusesDTypeAndRank(t *testing.T) {
	cfg := smallCfg(model.Fuzzy)
	st := smallStore(t, &cfg, 8)
	for _, c := range []struct {
		dt   ir.Precision
		fold passes.FoldMode
	}{{ir.FP16, passes.FoldRPAMode}, {ir.FP32, passes.FoldRankMode}, {ir.FP32, passes.FoldRankApproxMode}} {
		out := filepath.Join(t.TempDir(), "x")
		_, err := export.Export(context.Background(), export.Options{Config: cfg, Store: st, Lengths: []int{8}, KVCache: true,
			DType: c.dt, Fold: c.fold, Out: out, Tokenizer: "test"})
		if err == nil || !strings.Contains(err.Error(), "KV-cache") {
			t.Errorf("%s %s with the KV cache: want a refusal, got %v", c.dt, c.fold, err)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%s %s: the refused export wrote its folder", c.dt, c.fold)
		}
	}
}

// A Triton repository is fp32 with the dense prior for now: --dtype and
// the rank fold are refused with --format triton.
func TestTritonRefusesDTypeAndRank(t *testing.T) {
	cfg := smallCfg(model.Fuzzy)
	st := smallStore(t, &cfg, 8)
	for _, c := range []struct {
		dt   ir.Precision
		fold passes.FoldMode
	}{{ir.FP16, passes.FoldRPAMode}, {ir.FP32, passes.FoldRankMode}} {
		_, err := export.Triton(context.Background(), export.TritonOptions{Options: export.Options{Config: cfg, Store: st, Lengths: []int{8},
			DType: c.dt, Fold: c.fold, Out: filepath.Join(t.TempDir(), "x"), Tokenizer: "test"}})
		if err == nil || !strings.Contains(err.Error(), "not available for Triton") {
			t.Errorf("%s %s for Triton: want a refusal, got %v", c.dt, c.fold, err)
		}
	}
}
