package training

import (
	"errors"
	"math/rand/v2"
	"slices"
	"syscall"
	"time"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/rpac-dev/rpac/kernels/cuda/driver"
	"github.com/rpac-dev/rpac/kernels/cuda/perf"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/training/optim"
)

// Bench times the training step a run would use: the same Plan (micro-
// batches within the memory budget), the same compiled Step, clipping and
// AdamW, on random tokens of the preset's vocabulary.
type Bench struct {
	Plan    *Plan
	step    *Step
	store   *kernels.Store
	opt     *optim.AdamW
	params  map[string][]float32
	x, y    []int32
	nparam  int
	backend kernels.Backend
	// dev: the optimizer state on the CUDA device (nil on the CPU, or with
	// HostOptimizer).
	dev *cuda.DeviceAdamW
}

// NewBench plans and compiles the step of o's first training length.
func NewBench(o Options) (*Bench, error) {
	if err := o.openBackend(); err != nil {
		return nil, err
	}
	p, err := Setup(o, nil, nil)
	if err != nil {
		return nil, err
	}
	l := p.Lengths[0]
	mg, err := model.Build(&p.Config, model.Opts{T: l.T, B: 1, Mode: model.Train})
	if err != nil {
		return nil, err
	}
	acfg := optim.DefaultAdamW()
	acfg.Decay = mg.Decayed()
	b := &Bench{Plan: p, store: kernels.NewStore(ir.FP32), opt: optim.NewAdamW(acfg), params: map[string][]float32{}}
	if err := model.InitStore(mg.Specs, b.store, o.Seed); err != nil {
		return nil, err
	}
	for _, n := range mg.Params() {
		b.params[n] = b.store.Get(n).F32
	}
	b.nparam = model.CountParams(mg.Specs)
	be := o.Backend
	b.backend = be
	if b.step, err = CompileStep(&p.Config, b.store, be, l.T, l.Batch, l.Micro, p.Config.Dropout, &passes.Context{Experts: o.Experts}); err != nil {
		return nil, err
	}
	if gpu, ok := be.(*cuda.Backend); ok && !o.HostOptimizer {
		if b.dev, err = newDeviceAdamW(gpu, b.store, acfg, mg.Params()); err != nil {
			return nil, err
		}
		if err := b.step.KeepGradsOnDevice(gpu); err != nil {
			return nil, err
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	b.x, b.y = make([]int32, l.Batch*l.T), make([]int32, l.Batch*l.T)
	for i := range b.x {
		b.x[i], b.y[i] = int32(rng.IntN(p.Config.Vocab)), int32(rng.IntN(p.Config.Vocab))
	}
	return b, nil
}

// Step runs one training step: forward and backward over the micro-
// batches, clipping, AdamW.
func (b *Bench) Step(seed uint64) error {
	out, err := b.step.Run(b.x, b.y, seed)
	if err != nil {
		return err
	}
	if b.dev != nil {
		if _, err := b.dev.ClipGlobalNorm(out.DeviceGrads, 1); err != nil {
			return err
		}
		return b.dev.Step(out.DeviceGrads, 1e-4)
	}
	optim.ClipGlobalNorm(out.Grads, 1)
	return b.opt.Step(b.params, out.Grads, 1e-4)
}

// Backend is the backend the step runs on.
func (b *Bench) Backend() kernels.Backend { return b.backend }

// Length is the benchmarked length's plan.
func (b *Bench) Length() LengthPlan { return b.Plan.Lengths[0] }

// Flops is the GEMM work the model needs in one step (the routed experts
// over the tokens they need, whichever form the step runs: Step.Flops).
func (b *Bench) Flops() int64 { return b.step.Flops() }

// RoutedFlops is the work of the experts routed: each token through its
// top-k only (Flops, which counts the model's work so, whichever form the
// step runs; DenseFlops is the dense form's).
func (b *Bench) RoutedFlops() int64 { return b.step.Flops() }

// DenseFlops is the GEMM work of the step with the experts counted over
// every token, as the dense form computes them.
func (b *Bench) DenseFlops() int64 { return b.step.DenseFlops() }

// Experts is the dispatch of the step's experts.
func (b *Bench) Experts() passes.Dispatch { return b.step.Experts() }

// PlanBytes is the step program's memory.
func (b *Bench) PlanBytes() int64 { return b.step.PlanBytes() }

// HostOptimized is the number of parameters the host clips and updates
// each step (0 when the optimizer runs on the device).
func (b *Bench) HostOptimized() int {
	if b.dev != nil {
		return 0
	}
	return b.nparam
}

// GradBytes is the bytes of the fp32 gradients a data-parallel step
// all-reduces.
func (b *Bench) GradBytes() float64 { return 4 * float64(b.nparam) }

// Params is the parameter count.
func (b *Bench) Params() int { return b.nparam }

// Close frees the step.
func (b *Bench) Close() {
	if b.dev != nil {
		b.dev.Close()
	}
	b.step.Close()
}

// Time runs one warm-up step, then steps timed steps (profiled by
// startProfile when it is not nil: it starts a profile and returns its
// stop), and returns the seconds per step.
func (b *Bench) Time(steps int, startProfile func() (stop func(), err error)) (float64, error) {
	if err := b.Step(0); err != nil { // warm-up
		return 0, err
	}
	if startProfile != nil {
		stop, err := startProfile()
		if err != nil {
			return 0, err
		}
		defer stop()
	}
	t0 := time.Now()
	for i := range steps {
		if err := b.Step(uint64(i + 1)); err != nil {
			return 0, err
		}
	}
	return time.Since(t0).Seconds() / float64(steps), nil
}

// PredictOptions readies o for tracing a step on the CUDA backend to
// predict its time on hw: with --device cuda and no usable GPU, the
// dry-run device (every launch checked, nothing computed) with a memory
// budget of 90% of hw's unless o sets one; dryRun reports that choice.
func PredictOptions(o Options, hw perf.Hardware) (_ Options, dryRun bool, err error) {
	switch {
	case o.Backend != nil:
		return o, false, nil
	case o.Device == DeviceCUDASim:
		return o, false, o.openBackend()
	case o.Device != DeviceCUDA:
		return o, false, errors.New("--predict traces the CUDA backend: use --device cuda (the dry-run device stands in without a GPU) or cuda-sim")
	}
	_, p, err := resolveDevice(o.Device, o.Precision)
	if err != nil {
		return o, false, err
	}
	if driver.Available() == nil { // the device resolved: a GPU
		o.Backend, err = OpenBackend(Target{Device: DeviceCUDA, Precision: p}, o.CUDA)
		return o, false, err
	}
	if o.Backend, err = cuda.NewDryRun(p, cudaOptions(o.CUDA)); err != nil {
		return o, false, err
	}
	if o.MemBudget == 0 {
		o.MemBudget = int64(0.9 * hw.MemGiB * (1 << 30))
	}
	return o, true, nil
}

// Predict runs one warm-up step (first-step allocations and uploads),
// traces the next on the CUDA backend and predicts its time on hw; with
// measure, each kernel and GEMM of the traced step is also timed on the
// device (cuda.Backend.StartMeasuredTrace: a GPU or the simulator).
func (b *Bench) Predict(hw perf.Hardware, measure bool) (*perf.Prediction, error) {
	gpu, ok := b.Backend().(*cuda.Backend)
	if !ok {
		return nil, errors.New("--predict: the step does not run on the CUDA backend")
	}
	if err := b.Step(0); err != nil {
		return nil, err
	}
	start := gpu.StartTrace
	if measure {
		start = gpu.StartMeasuredTrace
	}
	tr, err := start()
	if err != nil {
		return nil, err
	}
	tr.Reset()
	if err := b.Step(1); err != nil {
		return nil, err
	}
	p := perf.Predict(tr.Events(), hw, b.HostOptimized())
	p.MeasureFloor = tr.Floor()
	return p, nil
}

// StepTime is a bench's time per step: the median wall time, and the
// mean CPU time of the process (every thread's user and system time; on
// a machine shared with other work, the figure the load changes least).
type StepTime struct{ Wall, CPU float64 }

// TimeInterleaved compares benches under the same load: one warm-up step
// of each, then steps rounds of one timed step of each in turn.
func TimeInterleaved(benches []*Bench, steps int) ([]StepTime, error) {
	walls := make([][]float64, len(benches))
	out := make([]StepTime, len(benches))
	for _, b := range benches {
		if err := b.Step(0); err != nil {
			return nil, err
		}
	}
	for i := range steps {
		for j, b := range benches {
			t0, c0 := time.Now(), cpuSeconds()
			if err := b.Step(uint64(i + 1)); err != nil {
				return nil, err
			}
			walls[j] = append(walls[j], time.Since(t0).Seconds())
			out[j].CPU += (cpuSeconds() - c0) / float64(steps)
		}
	}
	for j, ts := range walls {
		slices.Sort(ts)
		out[j].Wall = ts[len(ts)/2]
	}
	return out, nil
}

// cpuSeconds is the user and system time of every thread of the process
// so far (0 where the system does not say).
func cpuSeconds() float64 {
	var u syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &u) != nil {
		return 0
	}
	return float64(u.Utime.Nano()+u.Stime.Nano()) / 1e9
}
