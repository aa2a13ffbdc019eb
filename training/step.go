package training

import (
	"fmt"
	"sync"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/training/control"
)

// Step is the compiled training step of one context length T, batch,
// micro-batch and dropout rate: forward and backward over each micro-batch
// of the batch, with the gradients accumulated so that the optimizer sees
// the gradient of the whole batch's mean loss.
//
// The baseline model's loss is a mean over tokens, so a step over
// micro-batches equals the step over the whole batch to float32 rounding.
// The fuzzy model's RPA prior reads batch statistics (the batch-mean
// membership m̄, and the entropy floor's mean entropy): with micro-batches
// they are the statistics of each micro-batch, as with gradient accumulation
// in the paper's PyTorch code. The running statistics and diagnostics are
// averaged over the micro-batches, which for equal micro-batches is the
// whole batch's value.
type Step struct {
	T, Batch, Micro int
	Dropout         float64
	// counted: the loss is the mean over the targets that are not
	// ir.IgnoreTarget (LossAnswers), fed to the graph as model.LossScale.
	counted bool
	experts passes.Dispatch // dense or routed, as built
	// work: the GEMM work per step, the model's and the dense form's
	// (stepWork), counted once when asked for
	work func() (int64, int64)

	graph   *model.Graph
	plan    *kernels.Plan
	prog    kernels.Program
	params  []string
	acc     map[string][]float32 // gradient accumulators (Micro < Batch)
	running []model.RunningStat
	res     StepResult
	// onDevice: the gradients stay on the CUDA device (DeviceGrads), the
	// micro-batches accumulated there by devAcc.
	onDevice bool
	devAcc   *cuda.GradAccumulator
	// sat counts the saturated memberships on the device (one slot per
	// micro-batch and layer) when the step runs there.
	sat   *cuda.SatCounter
	store *kernels.Store
	// rank and ranks: this rank's share of the batch in a data-parallel
	// job (Shard); ranks 1: all of it.
	rank, ranks int
	// final, when set (OnGradFinal), is told of each parameter whose
	// gradient is final on the device, during the backward of the rank's
	// last micro-batch.
	final func(param string) error
}

// StepResult is what one step computed. Its slices are valid until the
// next Run.
type StepResult struct {
	Loss float64 // the training loss (smoothed CE plus penalties), batch mean
	CE   float64 // the pure cross-entropy per token
	// Grads holds each parameter's gradient of Loss (nil when the step
	// keeps its gradients on the device).
	Grads map[string][]float32
	// DeviceGrads holds them on the CUDA device (KeepGradsOnDevice).
	DeviceGrads map[string]cuda.Buffer
	// Layers are the fuzzy blocks' diagnostics (none for the baseline).
	Layers []LayerStats
	// Running holds the batch statistics that estimate the fuzzy blocks'
	// running statistics, and Buffers the store names of those running
	// statistics (aligned).
	Running [][]float32
	Buffers []string
}

// LayerStats are one block's per-step diagnostics.
type LayerStats struct {
	H     float64   // membership entropy H(μ)
	Sat   float64   // fraction of saturated memberships
	Usage []float64 // expert usage
}

// Probe outputs a step graph adds.
func probeMu(layer int) string   { return fmt.Sprintf("probe:blocks.%d.mu", layer) }
func probeBias(layer int) string { return fmt.Sprintf("probe:blocks.%d.bias", layer) }

// stepGraph builds and plans the training graph of a step.
func stepGraph(cfg *model.Config, T, micro int, dropout float64, loss LossTargets, pc *passes.Context) (*model.Graph, *kernels.Plan, error) {
	c := *cfg
	c.Dropout = dropout
	if pc == nil {
		pc = &passes.Context{}
	}
	mg, err := model.Build(&c, model.Opts{T: T, B: micro, Mode: model.Train, LossScaleInput: loss.counted(), Align: pc.Align,
		Experts: pc.ExpertDispatch()})
	if err != nil {
		return nil, nil, err
	}
	for _, l := range mg.Layers {
		mg.SetOutput(probeMu(l.Index), l.Mu)
	}
	pc.Loss, pc.Model = "loss", mg.Info()
	if err := passes.Run(mg.Graph, passes.TrainPipeline, pc); err != nil {
		return nil, nil, err
	}
	return mg, passes.Plan(mg.Graph), nil
}

// CompileStep compiles the step of cfg at T with batch sequences per step
// in micro-batches of micro (micro must divide batch) on be, over store's
// parameters. pc may ask for an IR dump.
func CompileStep(cfg *model.Config, store *kernels.Store, be kernels.Backend, T, batch, micro int, dropout float64, pc *passes.Context) (*Step, error) {
	return CompileStepLoss(cfg, store, be, T, batch, micro, dropout, LossAll, pc)
}

// CompileStepLoss is CompileStep whose loss averages over the targets loss
// chooses (with LossAnswers, the batches' other targets are
// ir.IgnoreTarget).
func CompileStepLoss(cfg *model.Config, store *kernels.Store, be kernels.Backend, T, batch, micro int, dropout float64, loss LossTargets, pc *passes.Context) (*Step, error) {
	if micro < 1 || batch%micro != 0 {
		return nil, fmt.Errorf("micro-batch %d does not divide the batch of %d sequences", micro, batch)
	}
	if pc == nil {
		pc = &passes.Context{}
	}
	pc.ForBackend(be.Capabilities()) // the CPU backend: none (its unfused attention's GEMMs are its fastest path)
	mg, plan, err := stepGraph(cfg, T, micro, dropout, loss, pc)
	if err != nil {
		return nil, err
	}
	prog, err := be.Compile(mg.Graph, plan, store)
	if err != nil {
		return nil, err
	}
	s := &Step{T: T, Batch: batch, Micro: micro, Dropout: dropout, counted: loss.counted(), graph: mg, plan: plan, prog: prog, params: mg.Params(), store: store,
		experts: pc.ExpertDispatch(), ranks: 1}
	s.work = sync.OnceValues(func() (int64, int64) { return stepWork(s, cfg, loss, pc) })
	if micro < batch {
		s.acc = map[string][]float32{}
		for _, n := range s.params {
			if t := store.Get(n); t != nil {
				s.acc[n] = make([]float32, len(t.F32))
			}
		}
	}
	s.res.Layers = make([]LayerStats, len(mg.Layers))
	s.running = mg.RunningStats()
	s.res.Running = make([][]float32, len(s.running))
	for _, r := range s.running {
		s.res.Buffers = append(s.res.Buffers, r.Buffer)
	}
	return s, nil
}

// Shard makes Run train on rank's share of each batch in a job of ranks:
// its run of Batch/Micro/ranks consecutive micro-batches, each weighted
// and seeded as in the whole batch's step, so that the sum of the ranks'
// results (gradients, loss, statistics) is the whole batch's.
func (s *Step) Shard(rank, ranks int) error {
	if n := s.Batch / s.Micro; n%ranks != 0 {
		return fmt.Errorf("the batch of %d sequences at context %d makes %d micro-batches of %d, which %d ranks cannot share equally: choose --tokens-per-step and --micro-batch so that the ranks divide the micro-batches", s.Batch, s.T, n, s.Micro, ranks)
	}
	s.rank, s.ranks = rank, ranks
	return nil
}

// micros are the micro-batches this rank runs: [lo, hi) of Batch/Micro.
func (s *Step) micros() (lo, hi int) {
	n := s.Batch / s.Micro
	return s.rank * n / s.ranks, (s.rank + 1) * n / s.ranks
}

// KeepGradsOnDevice makes Run leave the gradients on the CUDA device
// (StepResult.DeviceGrads; micro-batches accumulated there): for a
// DeviceAdamW. be must be the backend the step was compiled for.
func (s *Step) KeepGradsOnDevice(be *cuda.Backend) error {
	if _, ok := s.prog.(cuda.DeviceOutput); !ok {
		return fmt.Errorf("step: the program does not run on the CUDA backend")
	}
	if s.Micro < s.Batch && s.devAcc == nil {
		acc, err := cuda.NewGradAccumulator(be, s.store, s.params)
		if err != nil {
			return err
		}
		s.devAcc = acc
	}
	if n := len(s.graph.Layers) * (s.Batch / s.Micro); n > 0 && s.sat == nil {
		sat, err := cuda.NewSatCounter(be, n)
		if err != nil {
			return err
		}
		s.sat = sat
	}
	s.onDevice, s.acc = true, nil
	return nil
}

// Close frees the step's program.
func (s *Step) Close() {
	if s.devAcc != nil {
		s.devAcc.Close()
	}
	if s.sat != nil {
		s.sat.Close()
	}
	s.prog.Close()
}

// Flops is the GEMM work the model needs in one step (all micro-batches):
// the routed experts over the tokens top_k/E of them route, the usual
// convention of a mixture of experts, whichever form the step runs in
// (passes.Flops of the routed form's step graph).
func (s *Step) Flops() int64 { m, _ := s.work(); return m }

// DenseFlops is the GEMM work of the step in the dense form of the
// experts (passes.DenseFlops), whichever form it runs in.
func (s *Step) DenseFlops() int64 { _, d := s.work(); return d }

// Experts is the dispatch of the step's experts (dense or routed).
func (s *Step) Experts() passes.Dispatch { return s.experts }

// PlanBytes is the memory of the step's intermediate values.
func (s *Step) PlanBytes() int64 { return planBytes(s.plan) }

func planBytes(p *kernels.Plan) int64 { return int64(p.Peak+p.ScratchElems) * 4 }

// Run executes the step on the batch x, y (Batch·T token ids each, row by
// row). seed draws the step's randomness; micro-batch k uses a seed derived
// from it (k = 0 uses seed itself). A shard (Shard) runs its own
// micro-batches of the batch, with their seeds and weights.
func (s *Step) Run(x, y []int32, seed uint64) (*StepResult, error) {
	n := s.Batch / s.Micro
	lo, hi := s.micros()
	if len(x) != s.Batch*s.T || len(y) != s.Batch*s.T {
		return nil, fmt.Errorf("step: %d inputs and %d targets, want %d×%d", len(x), len(y), s.Batch, s.T)
	}
	if err := s.resetStats(); err != nil {
		return nil, err
	}
	w := 1 / float64(n)
	counted := 1 // the targets a counted mean divides by
	if s.counted {
		counted = max(1, countTargets(y))
	}
	for k := lo; k < hi; k++ {
		a, b := k*s.Micro*s.T, (k+1)*s.Micro*s.T
		feeds := map[string]*kernels.Tensor{
			"input_ids": kernels.IntTensor(ir.Shape{s.Micro, s.T}, x[a:b]),
			"targets":   kernels.IntTensor(ir.Shape{s.Micro * s.T}, y[a:b]),
		}
		if s.counted { // the micro-batches' gradients are averaged (weight w): the loss carries n/counted
			feeds[model.LossScale] = &kernels.Tensor{Shape: ir.Shape{}, F32: []float32{float32(float64(n) / float64(counted))}}
		}
		if r, ok := s.prog.(interface{ ReuseStored() }); ok && k > lo {
			r.ReuseStored() // the weights are those of micro-batch 0: no second upload
		}
		last := s.final != nil && s.onDevice && k == hi-1
		if err := s.runMicro(feeds, seed+uint64(k)*0x9e3779b97f4a7c15, last, k-lo, float32(w)); err != nil {
			return nil, err
		}
		s.res.Loss += w * s.prog.Output("loss").At(0)
		if s.counted {
			s.res.CE += s.prog.Output("ce_sum").At(0) / float64(counted)
		} else {
			s.res.CE += w * s.prog.Output("ce_sum").At(0) / float64(s.Micro*s.T)
		}
		if s.onDevice {
			if !last {
				if err := s.deviceGrads(k-lo, float32(w)); err != nil {
					return nil, err
				}
			}
			if err := s.countSaturated(k - lo); err != nil {
				return nil, err
			}
		} else {
			s.gatherGrads(k-lo, float32(w))
		}
		s.gatherStats(w)
	}
	if err := s.addSaturated(w); err != nil {
		return nil, err
	}
	return &s.res, nil
}

// countSaturated counts micro-batch k's saturated memberships of every
// layer on the device (slot k·layers + layer).
func (s *Step) countSaturated(k int) error {
	if s.sat == nil {
		return nil
	}
	do := s.prog.(cuda.DeviceOutput)
	for i, l := range s.graph.Layers {
		mu, ok := do.DeviceOutput(probeMu(l.Index))
		if !ok {
			continue
		}
		R := int(l.Mu.Shape[len(l.Mu.Shape)-1])
		if err := s.sat.Count(k*len(s.graph.Layers)+i, mu, R, control.SatThreshold); err != nil {
			return err
		}
	}
	return nil
}

// addSaturated brings the device counts of countSaturated to the layers'
// saturation fractions, micro-batch by micro-batch with weight w, in the
// order the host path adds them.
func (s *Step) addSaturated(w float64) error {
	if s.sat == nil {
		return nil
	}
	counts, err := s.sat.Counts()
	if err != nil {
		return err
	}
	L := len(s.graph.Layers)
	lo, hi := s.micros()
	for k := 0; k < hi-lo; k++ {
		for i, l := range s.graph.Layers {
			rows := l.Mu.Shape.Numel() / int(l.Mu.Shape[len(l.Mu.Shape)-1])
			s.res.Layers[i].Sat += w * (float64(counts[k*L+i]) / float64(rows))
		}
	}
	return nil
}

func (s *Step) resetStats() error {
	s.res.Loss, s.res.CE = 0, 0
	for i := range s.res.Layers {
		l := &s.res.Layers[i]
		l.H, l.Sat = 0, 0
		clear(l.Usage)
	}
	for i := range s.res.Running {
		clear(s.res.Running[i])
	}
	if s.sat != nil {
		return s.sat.Reset()
	}
	return nil
}

// gatherGrads points Grads at the program's gradients (one micro-batch) or
// adds micro-batch k's gradients, scaled by w, into the accumulators.
func (s *Step) gatherGrads(k int, w float32) {
	if s.res.Grads == nil {
		s.res.Grads = map[string][]float32{}
	}
	for _, name := range s.params {
		gt := s.prog.Output(passes.GradName(name))
		if gt == nil {
			continue
		}
		if s.acc == nil {
			s.res.Grads[name] = gt.F32
			continue
		}
		a := s.acc[name]
		if k == 0 {
			for i, g := range gt.F32 {
				a[i] = w * g
			}
		} else {
			for i, g := range gt.F32 {
				a[i] += w * g
			}
		}
		s.res.Grads[name] = a
	}
}

// deviceGrads points DeviceGrads at the program's gradient buffers (one
// micro-batch) or accumulates micro-batch k's into the device
// accumulators.
func (s *Step) deviceGrads(k int, w float32) error {
	for _, name := range s.params {
		if err := s.deviceGrad(k, w, name); err != nil {
			return err
		}
	}
	return nil
}

// deviceGrad is deviceGrads for parameter name.
func (s *Step) deviceGrad(k int, w float32, name string) error {
	if s.res.DeviceGrads == nil {
		s.res.DeviceGrads = map[string]cuda.Buffer{}
	}
	g, ok := s.prog.(cuda.DeviceOutput).DeviceOutput(passes.GradName(name))
	if !ok {
		return nil
	}
	if s.devAcc == nil {
		s.res.DeviceGrads[name] = g
		return nil
	}
	if err := s.devAcc.Add(name, k, w, g); err != nil {
		return err
	}
	s.res.DeviceGrads[name] = s.devAcc.Buffers()[name]
	return nil
}

// OnGradFinal makes Run tell final of each parameter whose gradient is
// final on the device (DeviceGrads), as the backward of the rank's last
// micro-batch writes it: the last writer of its gradient in the program
// has been launched, and its accumulation after it (nil: no hook). It
// needs KeepGradsOnDevice.
func (s *Step) OnGradFinal(final func(param string) error) error {
	if final != nil && !s.onDevice {
		return fmt.Errorf("step: gradients are final on the device only with KeepGradsOnDevice")
	}
	s.final = final
	return nil
}

// GradBuffers are the device buffers DeviceGrads holds after Run, in the
// parameters' order: names, buffers and float32 counts.
func (s *Step) GradBuffers() (names []string, bufs []cuda.Buffer, counts []int) {
	do := s.prog.(cuda.DeviceOutput)
	for _, name := range s.params {
		g, ok := do.DeviceOutput(passes.GradName(name))
		if !ok {
			continue
		}
		if s.devAcc != nil {
			g = s.devAcc.Buffers()[name]
		}
		names, bufs, counts = append(names, name), append(bufs, g), append(counts, len(s.store.Get(name).F32))
	}
	return names, bufs, counts
}

// runMicro runs the program on one micro-batch (k of the rank's, weight
// w); on the rank's last (last) it hands each gradient to deviceGrad and
// final as the backward finishes it.
func (s *Step) runMicro(feeds map[string]*kernels.Tensor, seed uint64, last bool, k int, w float32) error {
	if !last {
		return s.prog.Run(feeds, seed)
	}
	hook, ok := s.prog.(cuda.WrittenHook)
	if !ok {
		return fmt.Errorf("step: the program cannot report its gradients' last writers")
	}
	param := map[string]string{}
	var outs []string
	for _, name := range s.params {
		if _, ok := s.prog.(cuda.DeviceOutput).DeviceOutput(passes.GradName(name)); ok {
			param[passes.GradName(name)] = name
			outs = append(outs, passes.GradName(name))
		}
	}
	if err := hook.WhenWritten(outs, func(done []string) error {
		for _, o := range done {
			if err := s.deviceGrad(k, w, param[o]); err != nil {
				return err
			}
			if err := s.final(param[o]); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	defer hook.WhenWritten(nil, nil)
	return s.prog.Run(feeds, seed)
}

// gatherStats adds one micro-batch's diagnostics and batch statistics with
// weight w.
func (s *Step) gatherStats(w float64) {
	for i, l := range s.graph.Layers {
		st := &s.res.Layers[i]
		if t := s.prog.Output(l.Entropy); t != nil {
			st.H += w * t.At(0)
		}
		if s.sat == nil { // on the device: addSaturated
			if t := s.prog.Output(probeMu(l.Index)); t != nil {
				st.Sat += w * control.SatFraction(t.F32, t.Shape[len(t.Shape)-1], control.SatThreshold)
			}
		}
		if t := s.prog.Output(l.Usage); t != nil {
			if len(st.Usage) != t.Len() {
				st.Usage = make([]float64, t.Len())
			}
			for e := range st.Usage {
				st.Usage[e] += w * t.At(e)
			}
		}
	}
	for i, rs := range s.running {
		t := s.prog.Output(rs.Stat)
		if t == nil {
			continue
		}
		if len(s.res.Running[i]) != t.Len() {
			s.res.Running[i] = make([]float32, t.Len())
		}
		r := s.res.Running[i]
		for j, v := range t.F32 {
			r[j] += float32(w) * v
		}
	}
}

// stepWork is the GEMM work of step s of cfg per step (all micro-batches):
// the model's and the dense form's (passes.Flops and DenseFlops of the
// routed form's step graph: s's own when it is routed, else built, through
// the same passes, for the count only; 0, 0 if that fails).
func stepWork(s *Step, cfg *model.Config, loss LossTargets, pc *passes.Context) (int64, int64) {
	g := s.graph.Graph
	if s.experts != passes.DispatchRouted {
		c := *pc
		c.DumpAfter, c.Dump, c.Experts = "", nil, passes.DispatchRouted
		mg, _, err := stepGraph(cfg, s.T, s.Micro, s.Dropout, loss, &c)
		if err != nil {
			return 0, 0
		}
		g = mg.Graph
	}
	n := int64(s.Batch / s.Micro)
	return passes.Flops(g) * n, passes.DenseFlops(g) * n
}
