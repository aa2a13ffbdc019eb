package training

import (
	"encoding/json"
	"fmt"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/rpac-dev/rpac/training/data"
	"github.com/rpac-dev/rpac/training/optim"
)

func saveCheckpoint(dir string, store *kernels.Store, opt *optim.AdamW, st *RunState) error {
	mom, steps := opt.Export()
	st.OptimStep = steps
	js, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := checkpoint.Save(dir, &checkpoint.Checkpoint{Weights: checkpoint.FromStore(store), Optim: mom, State: js}); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	return nil
}

// resume loads a checkpoint into store, opt and st. The model config comes
// from the checkpoint; a preset or model flag that disagrees is an error.
func resume(dir string, store *kernels.Store, opt *optim.AdamW, st *RunState, cfg *model.Config, batchers []*data.TrainBatcher) error {
	ck, err := checkpoint.Load(dir)
	if err != nil {
		return fmt.Errorf("--resume: %w", err)
	}
	var saved RunState
	if err := json.Unmarshal(ck.State, &saved); err != nil {
		return fmt.Errorf("--resume: %s/state.json: %w", dir, err)
	}
	if saved.Format != 1 && saved.Format != 2 {
		return fmt.Errorf("--resume: unsupported run state format %d", saved.Format)
	}
	if saved.Config.Model != cfg.Model || saved.Config.DModel != cfg.DModel || saved.Config.Layers != cfg.Layers || saved.Config.Vocab != cfg.Vocab {
		return fmt.Errorf("--resume: the checkpoint holds a %s model (d %d, %d layers, vocab %d); the flags ask for %s (d %d, %d layers, vocab %d)",
			saved.Config.Model, saved.Config.DModel, saved.Config.Layers, saved.Config.Vocab, cfg.Model, cfg.DModel, cfg.Layers, cfg.Vocab)
	}
	*cfg = saved.Config
	if _, err := checkpoint.IntoStore(store, ck.Weights); err != nil {
		return fmt.Errorf("--resume: %w", err)
	}
	if err := opt.Import(ck.Optim, saved.OptimStep); err != nil {
		return fmt.Errorf("--resume: optimizer state: %w", err)
	}
	rngs := saved.DataRNGs
	if len(rngs) == 0 { // format 1: one context, one generator
		rngs = []data.RNGState{saved.DataRNG}
	}
	if len(rngs) != len(batchers) {
		return fmt.Errorf("--resume: the checkpoint holds %d data generators, the flags ask for %d context lengths", len(rngs), len(batchers))
	}
	for i, b := range batchers {
		if err := b.SetState(rngs[i]); err != nil {
			return fmt.Errorf("--resume: %w", err)
		}
	}
	opts := st.Options
	*st = saved
	st.Options = opts
	if st.RunningOK == nil {
		st.RunningOK = map[string]bool{}
	}
	return nil
}
