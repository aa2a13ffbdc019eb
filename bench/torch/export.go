// Package torch exports what rpac_torch.py, the PyTorch implementation of
// the paper's model beside this file, compares against: a checkpoint, a
// fixed batch of token ids, and the loss rpac computes on that batch with
// those weights (docs/GPU.md, "PyTorch beside rpac").
//
// The loss is the mean pure cross-entropy per token of the evaluation graph
// with batch statistics (model.Opts.BatchStats: every statistic of the
// prior comes from the batch, as in the paper's listing), so that neither
// dropout nor Gumbel noise enters and both implementations compute the same
// function of the same weights.
package torch

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/training/checkpoint"
)

// Files of an export directory besides the checkpoint (dir/checkpoint).
const (
	CheckpointDir = "checkpoint"
	BatchFile     = "batch.safetensors" // input_ids [B,T], targets [B·T], as F32 (exact below 2^24)
	ResultFile    = "rpac.json"         // Result
)

// Batch is B sequences of T token ids and their next-token targets.
type Batch struct {
	B, T            int
	Inputs, Targets []int32
}

// RandomBatch draws a batch of ids below vocab from seed: each target is
// the next id of its sequence.
func RandomBatch(vocab, B, T int, seed uint64) Batch {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	b := Batch{B: B, T: T, Inputs: make([]int32, B*T), Targets: make([]int32, B*T)}
	for s := 0; s < B; s++ {
		prev := int32(r.IntN(vocab))
		for t := 0; t < T; t++ {
			next := int32(r.IntN(vocab))
			b.Inputs[s*T+t], b.Targets[s*T+t] = prev, next
			prev = next
		}
	}
	return b
}

// Result is what rpac computed on the batch, written to ResultFile.
type Result struct {
	Preset string       `json:"preset"`
	Config model.Config `json:"config"`
	B      int          `json:"batch"`
	T      int          `json:"context"`
	// Loss is the mean pure CE per token (eval graph, batch statistics,
	// float32 on the CPU backend).
	Loss float64 `json:"loss"`
}

// Loss computes the batch's mean pure CE per token with the weights in
// store (missing ones initialised from seed) on the CPU backend in fp32.
func Loss(cfg *model.Config, store *kernels.Store, b Batch, seed uint64) (float64, error) {
	mg, err := model.Build(cfg, model.Opts{T: b.T, B: b.B, Mode: model.Eval, BatchStats: true})
	if err != nil {
		return 0, err
	}
	if err := passes.Run(mg.Graph, passes.EvalPipeline, &passes.Context{Model: mg.Info()}); err != nil {
		return 0, err
	}
	if err := model.InitStore(mg.Specs, store, seed); err != nil {
		return 0, err
	}
	prog, err := cpu.New(ir.FP32).Compile(mg.Graph, passes.Plan(mg.Graph), store)
	if err != nil {
		return 0, err
	}
	defer prog.Close()
	feeds := map[string]*kernels.Tensor{
		"input_ids": kernels.IntTensor(ir.Shape{b.B, b.T}, b.Inputs),
		"targets":   kernels.IntTensor(ir.Shape{b.B * b.T}, b.Targets),
	}
	if err := prog.Run(feeds, 0); err != nil {
		return 0, err
	}
	return prog.Output("ce_sum").At(0) / float64(b.B*b.T), nil
}

// Export writes dir/checkpoint (the weights of store, initialised from
// seed where missing, and a state.json holding the config), dir/BatchFile
// and dir/ResultFile with rpac's loss on the batch, and returns the result.
func Export(dir, preset string, cfg *model.Config, store *kernels.Store, b Batch, seed uint64) (Result, error) {
	loss, err := Loss(cfg, store, b, seed)
	if err != nil {
		return Result{}, err
	}
	res := Result{Preset: preset, Config: *cfg, B: b.B, T: b.T, Loss: loss}
	state, err := json.Marshal(struct {
		Config model.Config `json:"config"`
		Preset string       `json:"preset"`
	}{*cfg, preset})
	if err != nil {
		return res, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return res, err
	}
	ck := &checkpoint.Checkpoint{Weights: checkpoint.FromStore(store), State: state}
	if err := checkpoint.Save(filepath.Join(dir, CheckpointDir), ck); err != nil {
		return res, err
	}
	if err := checkpoint.SaveWeightsFile(filepath.Join(dir, BatchFile), b.tensors(), nil); err != nil {
		return res, err
	}
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return res, err
	}
	return res, os.WriteFile(filepath.Join(dir, ResultFile), append(js, '\n'), 0o644)
}

// tensors holds the batch as float32 tensors (ids below 2^24 are exact).
func (b Batch) tensors() []checkpoint.Named {
	f := func(ids []int32) []float32 {
		out := make([]float32, len(ids))
		for i, v := range ids {
			out[i] = float32(v)
		}
		return out
	}
	return []checkpoint.Named{
		{Name: "input_ids", Shape: []int{b.B, b.T}, Data: f(b.Inputs)},
		{Name: "targets", Shape: []int{b.B * b.T}, Data: f(b.Targets)},
	}
}

// Check refuses a batch whose ids a float32 would not hold exactly or that
// the config's vocabulary does not cover.
func (b Batch) Check(vocab int) error {
	if vocab > 1<<24 {
		return fmt.Errorf("vocabulary %d: ids above 2^24 do not survive the batch file's float32", vocab)
	}
	for _, ids := range [][]int32{b.Inputs, b.Targets} {
		for _, v := range ids {
			if v < 0 || int(v) >= vocab {
				return fmt.Errorf("token id %d outside the vocabulary of %d", v, vocab)
			}
		}
	}
	return nil
}

// LoadCheckpoint reads a checkpoint rpac wrote (rpac train's, or Export's):
// its config from state.json and its weights into a new fp32 store.
func LoadCheckpoint(dir string) (*model.Config, *kernels.Store, error) {
	ck, err := checkpoint.LoadParts(dir, false)
	if err != nil {
		return nil, nil, err
	}
	var st struct {
		Config *model.Config `json:"config"`
	}
	if err := json.Unmarshal(ck.State, &st); err != nil {
		return nil, nil, fmt.Errorf("%s: state.json: %w", dir, err)
	}
	if st.Config == nil {
		return nil, nil, fmt.Errorf("%s: state.json holds no config", dir)
	}
	store := kernels.NewStore(ir.FP32)
	if _, err := checkpoint.IntoStore(store, ck.Weights); err != nil {
		return nil, nil, err
	}
	return st.Config, store, nil
}
