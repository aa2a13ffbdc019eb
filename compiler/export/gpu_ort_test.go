package export_test

import (
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
)

// requireCUDAProvider skips unless RPAC_GPU_ORT=1 (scripts/gpu-check-ort.sh
// sets it on a GPU machine, with $ORT_LIB at an onnxruntime with the CUDA
// provider); there, a provider that does not load fails the test.
func requireCUDAProvider(t *testing.T, dir string) *runtime.Model {
	t.Helper()
	if os.Getenv("RPAC_GPU_ORT") != "1" {
		t.Skip("set RPAC_GPU_ORT=1 on a GPU machine (scripts/gpu-check-ort.sh)")
	}
	m, err := runtime.Open(dir, runtime.Options{Provider: "cuda"})
	if err != nil {
		t.Fatalf("the CUDA provider does not load: %v", err)
	}
	return m
}

// gpuParity is one line of the GPU parity report (GPUPARITY {json}).
type gpuParity struct {
	DType      string               `json:"dtype"`
	Fold       passes.FoldMode      `json:"fold"`
	Attention  passes.AttentionMode `json:"attention"`
	T          int                  `json:"T"`
	MaxAbsDiff float64              `json:"max_abs_diff_vs_go_fp32"`
	CPUvsCUDA  float64              `json:"max_abs_diff_cpu_vs_cuda,omitempty"`
	CECost     float64              `json:"ce_cost_nats"`
	Budget     float64              `json:"budget"`
	OK         bool                 `json:"ok"`
}

// On the CUDA provider: fp32 matches the Go executor within 1e-4 (and the
// CPU provider), fp16 and bf16 cost less CE than the budget, for the dense
// fold, the rank fold and the rank fold with padded heads (op8).
func TestGPUProviderParity(t *testing.T) {
	if os.Getenv("RPAC_GPU_ORT") != "1" {
		t.Skip("set RPAC_GPU_ORT=1 on a GPU machine (scripts/gpu-check-ort.sh)")
	}
	for _, dt := range []ir.Precision{ir.FP32, ir.FP16, ir.BF16} {
		for _, c := range []struct {
			fold passes.FoldMode
			att  passes.AttentionMode
		}{
			{passes.FoldRPAMode, passes.AttentionOp}, {passes.FoldRankMode, passes.AttentionOp}, {passes.FoldRankMode, passes.AttentionOpPadded},
		} {
			fold := c.fold
			e := dtypeExport(t, dt, onnx.QuantizeNone, fold, c.att)
			m := requireCUDAProvider(t, e.dir)
			r := rand.New(rand.NewPCG(91, 92))
			var cpuDiff map[int]float64
			if dt != ir.BF16 { // the CPU provider has no bfloat16 kernels
				cpuDiff = map[int]float64{}
				c, err := runtime.Open(e.dir, runtime.Options{})
				if err != nil {
					t.Fatal(err)
				}
				for _, T := range lengths {
					seqs := randSeqs(r, 2, T, e.cfg.Vocab)
					a, err := m.Logits(context.Background(), seqs)
					if err != nil {
						t.Fatal(err)
					}
					b, err := c.Logits(context.Background(), seqs)
					if err != nil {
						t.Fatal(err)
					}
					cpuDiff[T] = maxDiff(a, flat(b))
				}
				c.Close()
			}
			m.Close()
			ids := randSeqs(rand.New(rand.NewPCG(81, 82)), 1, 300, e.cfg.Vocab)[0]
			res, err := export.Verify(context.Background(), export.VerifyOptions{Dir: e.dir, Config: e.cfg, Store: e.st, IDs: ids,
				Batches: 2, Batch: 2, Runtime: runtime.Options{Provider: "cuda"}})
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range res {
				p := gpuParity{DType: dt.String(), Fold: fold, Attention: c.att, T: x.T, MaxAbsDiff: x.MaxAbsDiff, CPUvsCUDA: cpuDiff[x.T], CECost: x.CEExport - x.CEEval}
				if dt == ir.FP32 {
					p.Budget = 1e-4
					p.OK = x.MaxAbsDiff <= 1e-4 && cpuDiff[x.T] <= 1e-4
				} else {
					p.Budget = halfCEBudget
					p.OK = math.Abs(p.CECost) < halfCEBudget
				}
				js, _ := json.Marshal(p)
				t.Logf("GPUPARITY %s", js)
				if !p.OK {
					t.Errorf("%s %s %s T=%d on the CUDA provider: %+v", dt, fold, c.att, x.T, p)
				}
			}
		}
	}
}
