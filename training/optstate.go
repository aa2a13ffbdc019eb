package training

import (
	"fmt"
	"sort"
	"strings"

	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/rpac-dev/rpac/training/optim"
)

// optState is where a run's training state lives and is updated between
// steps: the weights, the AdamW moments, the clipping and the EMA. On the
// host (hostState) the store is always current; on a CUDA device
// (deviceState) the device copies are authoritative and come to the store
// only for evaluations and checkpoints (toHost), and what the host changes
// there (a controller's τ, an averaged set swapped in for an evaluation)
// goes back with toDevice.
type optState interface {
	// prepare makes a freshly compiled step deliver its gradients where
	// the optimizer reads them.
	prepare(s *Step) error
	// clip scales the step's gradients to a global L2 norm of at most
	// maxNorm (when > 0) and returns the norm before clipping.
	clip(out *StepResult, maxNorm float64) (float64, error)
	// step applies AdamW at lr.
	step(out *StepResult, lr float64) error
	// updateEMA moves the EMA weights (when the run keeps them).
	updateEMA(cs *ControlState) error
	// toHost brings the store's parameters (and the EMA set) up to date.
	toHost() error
	// toDevice sends the store's parameters back after the host changed
	// them.
	toDevice() error
	// moments are the optimizer's checkpoint tensors and step count.
	moments() ([]checkpoint.Named, int, error)
	// onDevice reports whether the state lives on a device.
	onDevice() bool
	close()
}

// hostState: optim.AdamW over the store's float32 slices.
type hostState struct {
	opt *optim.AdamW
	w   *weightSets
}

func (h *hostState) prepare(*Step) error { return nil }

func (h *hostState) clip(out *StepResult, maxNorm float64) (float64, error) {
	return optim.ClipGlobalNorm(out.Grads, maxNorm), nil
}

func (h *hostState) step(out *StepResult, lr float64) error {
	return h.opt.Step(h.w.params, out.Grads, lr)
}

func (h *hostState) updateEMA(cs *ControlState) error {
	h.w.updateEMA(cs)
	return nil
}

func (h *hostState) toHost() error   { return nil }
func (h *hostState) toDevice() error { return nil }
func (h *hostState) onDevice() bool  { return false }
func (h *hostState) close()          {}

func (h *hostState) moments() ([]checkpoint.Named, int, error) {
	m, n := h.opt.Export()
	return m, n, nil
}

// deviceState: weights, moments, gradients, clipping and EMA on the CUDA
// device (cuda.DeviceAdamW, cuda.DeviceEMA). Per step only the loss and
// the statistics the controllers read, and the gradient norm, reach the
// host.
type deviceState struct {
	gpu   *cuda.Backend
	adam  *cuda.DeviceAdamW
	ema   *cuda.DeviceEMA // nil without EMA
	cfg   optim.AdamWConfig
	w     *weightSets
	fresh bool // the store holds the device's current values
}

// newDeviceState moves the parameters and the host optimizer's state
// (fresh, or restored from a checkpoint) to gpu.
func newDeviceState(gpu *cuda.Backend, store *kernels.Store, opt *optim.AdamW, w *weightSets) (_ *deviceState, err error) {
	d := &deviceState{gpu: gpu, w: w, fresh: true, cfg: opt.Config()}
	if d.adam, err = newDeviceAdamW(gpu, store, d.cfg, w.names); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	if mom, steps := opt.Export(); steps > 0 || len(mom) > 0 {
		if err := importDevice(d.adam, d.cfg, mom, steps); err != nil {
			return nil, fmt.Errorf("optimizer state to the device: %w", err)
		}
	}
	if w.ema != nil {
		if d.ema, err = cuda.NewDeviceEMA(d.adam, w.byName(w.ema)); err != nil {
			return nil, err
		}
	}
	w.afterSwap = d.adam.UploadWeights
	return d, nil
}

func (d *deviceState) prepare(s *Step) error { return s.KeepGradsOnDevice(d.gpu) }

func (d *deviceState) clip(out *StepResult, maxNorm float64) (float64, error) {
	return d.adam.ClipGlobalNorm(out.DeviceGrads, maxNorm)
}

func (d *deviceState) step(out *StepResult, lr float64) error {
	d.fresh = false
	return d.adam.Step(out.DeviceGrads, lr)
}

func (d *deviceState) updateEMA(cs *ControlState) error {
	if d.ema == nil || cs.EMA == nil {
		return nil
	}
	return d.ema.Update(cs.EMA.Next())
}

func (d *deviceState) toHost() error {
	if d.fresh {
		return nil
	}
	if err := d.adam.SyncToHost(); err != nil {
		return err
	}
	if d.ema != nil {
		if err := d.ema.Download(d.w.byName(d.w.ema)); err != nil {
			return err
		}
	}
	d.fresh = true
	return nil
}

func (d *deviceState) toDevice() error { return d.adam.UploadWeights() }

func (d *deviceState) moments() ([]checkpoint.Named, int, error) { return exportDevice(d.adam) }

func (d *deviceState) onDevice() bool { return true }

func (d *deviceState) close() {
	if d.ema != nil {
		d.ema.Close()
	}
	if d.adam != nil {
		d.adam.Close()
	}
	d.w.afterSwap = nil
}

// newOptState keeps the training state on the device when the run's
// backend is a CUDA device and the options do not ask for the host.
func newOptState(o Options, be kernels.Backend, store *kernels.Store, opt *optim.AdamW, w *weightSets) (optState, error) {
	if gpu, ok := be.(*cuda.Backend); ok && !o.HostOptimizer {
		return newDeviceState(gpu, store, opt, w)
	}
	return &hostState{opt: opt, w: w}, nil
}

// deviceHyper is the device optimizer's form of an AdamW configuration
// (defaults applied as the host optimizer applies them).
func deviceHyper(c optim.AdamWConfig) cuda.AdamWHyper {
	c = optim.NewAdamW(c).Config()
	return cuda.AdamWHyper{Beta1: c.Beta1, Beta2: c.Beta2, Eps: c.Eps, WeightDecay: c.WeightDecay, Decay: c.Decay}
}

// newDeviceAdamW opens a device optimizer with the host optimizer's
// settings over store's params.
func newDeviceAdamW(gpu *cuda.Backend, store *kernels.Store, c optim.AdamWConfig, params []string) (*cuda.DeviceAdamW, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return cuda.NewDeviceAdamW(gpu, store, deviceHyper(c), params)
}

// exportDevice writes a device optimizer's state in optim.AdamW's
// checkpoint form (adam.m.*, adam.v.*, adam.step.*, sorted by name).
func exportDevice(d *cuda.DeviceAdamW) ([]checkpoint.Named, int, error) {
	ms, steps, err := d.Moments()
	if err != nil {
		return nil, 0, err
	}
	var out []checkpoint.Named
	for name, m := range ms {
		out = append(out,
			checkpoint.Named{Name: optim.PrefixM + name, Shape: []int{len(m.M)}, Data: m.M},
			checkpoint.Named{Name: optim.PrefixStep + name, Shape: []int{}, Data: []float32{float32(m.T)}},
			checkpoint.Named{Name: optim.PrefixV + name, Shape: []int{len(m.V)}, Data: m.V})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, steps, nil
}

// importDevice loads optim.AdamW's checkpoint form (validated by the host
// optimizer's Import first) into a device optimizer.
func importDevice(d *cuda.DeviceAdamW, c optim.AdamWConfig, ts []checkpoint.Named, steps int) error {
	if err := optim.NewAdamW(c).Import(ts, steps); err != nil {
		return err
	}
	ms := map[string]cuda.Moments{}
	for _, t := range ts {
		for _, f := range []struct {
			prefix string
			set    func(m *cuda.Moments)
		}{
			{optim.PrefixM, func(m *cuda.Moments) { m.M = t.Data }},
			{optim.PrefixV, func(m *cuda.Moments) { m.V = t.Data }},
			{optim.PrefixStep, func(m *cuda.Moments) { m.T = int(t.Data[0]) }},
		} {
			if name, ok := strings.CutPrefix(t.Name, f.prefix); ok {
				m := ms[name]
				f.set(&m)
				ms[name] = m
			}
		}
	}
	return d.SetMoments(ms, steps)
}
