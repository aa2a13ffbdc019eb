package cuda

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"unsafe"

	"github.com/rpac-dev/rpac/kernels"
)

// AdamWHyper are the settings of a DeviceAdamW (what training/optim's
// AdamWConfig holds, given by the caller: a backend imports no training
// package).
type AdamWHyper struct {
	Beta1, Beta2 float64
	Eps          float64
	// WeightDecay is the decoupled decay λ, applied to the parameters
	// Decay selects.
	WeightDecay float64
	Decay       func(name string) bool
}

// Validate reports settings the update cannot use.
func (h AdamWHyper) Validate() error {
	switch {
	case !(h.Beta1 >= 0 && h.Beta1 < 1) || !(h.Beta2 >= 0 && h.Beta2 < 1):
		return fmt.Errorf("device AdamW: betas %g, %g must lie in [0, 1)", h.Beta1, h.Beta2)
	case !(h.Eps > 0) || math.IsInf(h.Eps, 0):
		return fmt.Errorf("device AdamW: eps %g must be positive and finite", h.Eps)
	case !(h.WeightDecay >= 0) || math.IsInf(h.WeightDecay, 0):
		return fmt.Errorf("device AdamW: weight decay %g must be finite and non-negative", h.WeightDecay)
	case h.WeightDecay != 0 && h.Decay == nil:
		return fmt.Errorf("device AdamW: weight decay %g without a selection of decayed parameters", h.WeightDecay)
	}
	return nil
}

// Moments are one parameter's AdamW state: the first and second moments
// and the number of updates it has had.
type Moments struct {
	M, V []float32
	T    int
}

// DeviceAdamW keeps a model's training state on the GPU: the fp32 master
// weights (the backend's device copies of the store's parameters, which
// become authoritative: no program uploads them again), the AdamW moments,
// and the global-norm clipping. It computes what training/optim's AdamW
// and ClipGlobalNorm compute: the update in double with every operation
// rounded on its own (adamw_f64_f32), so a step equals the host's for the
// same gradients, and the norm as fixed-order partial sums (a step repeats
// bit for bit). Per step only the norm (8 bytes) comes back; the weights
// come to the host only through SyncToHost.
type DeviceAdamW struct {
	be    *Backend
	store *kernels.Store
	cfg   AdamWHyper
	names []string // sorted
	w     map[string]Buffer
	n     map[string]int
	st    map[string]*devMoments
	part  Buffer // one double per chunk of every tensor
	// table: sumsq_parts_f32's entries (address, length, first chunk) of
	// the gradients of the last ClipGlobalNorm; tableHost its host copy.
	table     Buffer
	tableHost []uint64
	// stepTable: adamw_multi_f64_f32's entries (seven words each) of the
	// last Step, a group of entries per step count; stepHost its host copy.
	stepTable Buffer
	stepHost  []uint64
	chunks    map[string]int
	first     map[string]int // each tensor's first chunk
	total     int            // chunks in all
	norm      Buffer         // one double
	steps     int
	err       error
}

type devMoments struct {
	m, v Buffer
	t    int
}

// normChunk is the number of elements of one partial sum of squares (the
// host's GlobalNorm uses the same chunking).
const normChunk = 1 << 14

// NewDeviceAdamW moves the named parameters of store to the device (their
// current values) and makes their device copies authoritative.
func NewDeviceAdamW(be *Backend, store *kernels.Store, cfg AdamWHyper, params []string) (*DeviceAdamW, error) {
	o := &DeviceAdamW{be: be, store: store, cfg: cfg, w: map[string]Buffer{}, n: map[string]int{},
		st: map[string]*devMoments{}, chunks: map[string]int{}, first: map[string]int{}, err: cfg.Validate()}
	o.names = append([]string(nil), params...)
	sort.Strings(o.names)
	unbind, err := be.bind()
	if err != nil {
		return nil, err
	}
	defer unbind()
	for _, name := range o.names {
		t := store.Get(name)
		if t == nil || t.F32 == nil {
			return nil, fmt.Errorf("device AdamW: parameter %q is not float32 data in the store", name)
		}
		buf, err := be.stored(store, name, t.Shape)
		if err != nil {
			return nil, err
		}
		o.w[name], o.n[name] = buf, len(t.F32)
		o.first[name] = o.total
		o.chunks[name] = max(1, (len(t.F32)+normChunk-1)/normChunk)
		o.total += o.chunks[name]
	}
	if o.part, err = be.dev.alloc(uint64(8 * max(1, o.total))); err != nil {
		return nil, err
	}
	if o.norm, err = be.dev.alloc(8); err != nil {
		return nil, err
	}
	if o.table, err = be.dev.alloc(uint64(24 * max(1, len(o.names)))); err != nil {
		return nil, err
	}
	if o.stepTable, err = be.dev.alloc(uint64(8 * stepWords * max(1, len(o.names)))); err != nil {
		return nil, err
	}
	be.setResident(store, o.names, true)
	return o, o.uploadLocked()
}

// Params lists the parameters the optimizer owns, sorted.
func (o *DeviceAdamW) Params() []string { return o.names }

// Steps is the number of successful Step calls.
func (o *DeviceAdamW) Steps() int { return o.steps }

// UploadWeights copies the store's values of the parameters to the device
// (after the host changed them: a resumed checkpoint, a controller).
func (o *DeviceAdamW) UploadWeights() error {
	unbind, err := o.be.bind()
	if err != nil {
		return err
	}
	defer unbind()
	return o.uploadLocked()
}

func (o *DeviceAdamW) uploadLocked() error {
	for _, name := range o.names {
		t := o.store.Get(name)
		if t == nil || len(t.F32) != o.n[name] {
			return fmt.Errorf("device AdamW: %s changed size in the store", name)
		}
		if err := o.be.dev.upload(o.w[name], f32Ptr(t.F32), uint64(4*o.n[name])); err != nil {
			return err
		}
		o.be.touch(o.store, name)
	}
	return nil
}

// SyncToHost copies the device weights into the store (for a checkpoint,
// an evaluation on the host, EMA/SWA).
func (o *DeviceAdamW) SyncToHost() error {
	unbind, err := o.be.bind()
	if err != nil {
		return err
	}
	defer unbind()
	for _, name := range o.names {
		t := o.store.Get(name)
		if err := o.be.dev.download(f32Ptr(t.F32), o.w[name], uint64(4*o.n[name])); err != nil {
			return err
		}
	}
	return nil
}

// ClipGlobalNorm is training/optim's ClipGlobalNorm on device gradients: the global
// L2 norm (fixed-order sums in double; only the norm comes back), and when
// maxNorm > 0 and coef = maxNorm/(norm + 1e-6) < 1, every gradient scaled
// by float32(coef). A non-finite norm leaves the gradients as they are.
func (o *DeviceAdamW) ClipGlobalNorm(grads map[string]Buffer, maxNorm float64) (float64, error) {
	unbind, err := o.be.bind()
	if err != nil {
		return 0, err
	}
	defer unbind()
	used, err := o.sumSquares(grads)
	if err != nil {
		return 0, err
	}
	if err := o.be.dev.launch("sum_part_f64", [3]uint32{1, 1, 1}, [3]uint32{1024, 1, 1}, 0, o.norm.Ptr, o.part.Ptr, int64(used)); err != nil {
		return 0, err
	}
	var sumsq float64
	if err := o.be.dev.download(unsafe.Pointer(&sumsq), o.norm, 8); err != nil {
		return 0, err
	}
	norm := math.Sqrt(sumsq)
	if !(maxNorm > 0) || math.IsNaN(norm) || math.IsInf(norm, 0) {
		return norm, nil
	}
	coef := maxNorm / (norm + 1e-6)
	if coef >= 1 {
		return norm, nil
	}
	// every gradient of sumSquares' table, in one launch
	elems := 0
	for i := 1; i < len(o.tableHost); i += 3 {
		elems += int(o.tableHost[i])
	}
	return norm, o.be.dev.launch("scale_multi_f32", [3]uint32{uint32(used), 1, 1}, [3]uint32{256, 1, 1}, 0,
		o.table.Ptr, int32(len(o.tableHost)/3), int32(normChunk), float32(coef), int64(elems))
}

// sumSquares launches the partial sums of squares of every gradient in
// grads (in the order of names, each tensor's chunks of normChunk) in one
// launch, and returns the number of partials. The table of gradients goes
// to the device only when it changed.
func (o *DeviceAdamW) sumSquares(grads map[string]Buffer) (int, error) {
	var table []uint64
	used, elems := 0, 0
	for _, name := range o.names {
		g, ok := grads[name]
		if !ok {
			continue
		}
		table = append(table, g.Ptr, uint64(o.n[name]), uint64(used))
		used += o.chunks[name]
		elems += o.n[name]
	}
	if used == 0 {
		return 0, nil
	}
	if !slices.Equal(table, o.tableHost) {
		if err := o.be.dev.upload(o.table, unsafe.Pointer(&table[0]), uint64(8*len(table))); err != nil {
			return 0, err
		}
		o.tableHost = table
	}
	return used, o.be.dev.launch("sumsq_parts_f32", [3]uint32{uint32(used), 1, 1}, [3]uint32{256, 1, 1}, 0,
		o.part.Ptr, o.table.Ptr, int32(len(table)/3), int32(normChunk), int64(elems))
}

func f64bits(x float64) uint64 { return math.Float64bits(x) }

// Step applies one AdamW update on the device to every parameter with a
// gradient in grads (device buffers of the parameters' sizes).
func (o *DeviceAdamW) Step(grads map[string]Buffer, lr float64) error {
	if o.err != nil {
		return o.err
	}
	if !(lr >= 0) || math.IsInf(lr, 0) {
		return fmt.Errorf("device AdamW: learning rate %g must be finite and non-negative", lr)
	}
	for name := range grads {
		if _, ok := o.n[name]; !ok {
			return fmt.Errorf("device AdamW: gradient for %q has no parameter", name)
		}
	}
	unbind, err := o.be.bind()
	if err != nil {
		return err
	}
	defer unbind()
	var entries []stepEntry
	for _, name := range o.names {
		g, ok := grads[name]
		if !ok {
			continue
		}
		st, err := o.moments(name)
		if err != nil {
			return err
		}
		st.t++
		entries = append(entries, stepEntry{name: name, g: g, st: st})
	}
	if err := o.update(entries, lr); err != nil {
		return err
	}
	o.steps++
	return nil
}

// stepEntry is one parameter of a Step: its gradient and moments.
type stepEntry struct {
	name string
	g    Buffer
	st   *devMoments
}

// stepWords: the words of an adamw_multi_f64_f32 table entry.
const stepWords = 9

// stepChunk: the elements one block of adamw_multi_f64_f32 updates.
const stepChunk = 4096

// moments returns a parameter's moments, zeros allocated on its first
// update.
func (o *DeviceAdamW) moments(name string) (*devMoments, error) {
	if st := o.st[name]; st != nil {
		return st, nil
	}
	n := o.n[name]
	st := &devMoments{}
	var err error
	if st.m, err = o.be.dev.alloc(uint64(4 * n)); err != nil {
		return nil, err
	}
	if st.v, err = o.be.dev.alloc(uint64(4 * n)); err != nil {
		return nil, err
	}
	if err := o.be.dev.zero(st.m, uint64(4*n)); err != nil {
		return nil, err
	}
	if err := o.be.dev.zero(st.v, uint64(4*n)); err != nil {
		return nil, err
	}
	o.st[name] = st
	return st, nil
}

// update applies AdamW to the entries (their step counts already
// advanced): one adamw_multi_f64_f32 launch per distinct step count (one
// in a run where every parameter has a gradient at every step), the
// entries' table uploaded only when it changed.
func (o *DeviceAdamW) update(entries []stepEntry, lr float64) error {
	var ts []int
	for _, e := range entries {
		if !slices.Contains(ts, e.st.t) {
			ts = append(ts, e.st.t)
		}
	}
	slices.Sort(ts)
	var table []uint64
	type group struct{ at, entries, blocks, elems, copied, t int }
	var groups []group
	copies := map[string]*bf16Copy{} // the GEMMs' bf16 copies the update writes too
	for _, t := range ts {
		gr := group{at: len(table), t: t}
		for _, e := range entries {
			if e.st.t != t {
				continue
			}
			n := o.n[e.name]
			decays := uint64(0)
			if o.cfg.WeightDecay != 0 && o.cfg.Decay(e.name) {
				decays = 1
			}
			table = append(table, o.w[e.name].Ptr, e.g.Ptr, e.st.m.Ptr, e.st.v.Ptr, uint64(n), uint64(gr.blocks), decays)
			if c, cols := o.be.maintainedCopy(o.store, e.name); c != nil {
				copies[e.name] = c
				gr.copied += n
				table = append(table, c.buf.Ptr, uint64(cols))
			} else {
				table = append(table, 0, 0)
			}
			gr.blocks += (n + stepChunk - 1) / stepChunk
			gr.elems += n
			gr.entries++
		}
		groups = append(groups, gr)
	}
	if len(table) == 0 {
		return nil
	}
	if !slices.Equal(table, o.stepHost) {
		if err := o.be.dev.upload(o.stepTable, unsafe.Pointer(&table[0]), uint64(8*len(table))); err != nil {
			return err
		}
		o.stepHost = table
	}
	b1, b2 := o.cfg.Beta1, o.cfg.Beta2
	decay := 1 - lr*o.cfg.WeightDecay
	for _, gr := range groups {
		if h, ok := o.be.dev.(costHinter); ok { // p, g, m, v read; p, m, v written; the copies' bf16
			h.hintBytes(28*float64(gr.elems) + 2*float64(gr.copied))
		}
		t := float64(gr.t)
		step := lr / (1 - math.Pow(b1, t))
		bc2 := math.Sqrt(1 - math.Pow(b2, t))
		if err := o.be.dev.launch("adamw_multi_f64_f32", [3]uint32{uint32(gr.blocks), 1, 1}, [3]uint32{256, 1, 1}, 0,
			o.stepTable.Ptr+uint64(8*gr.at), int32(gr.entries), int32(stepChunk), int64(gr.elems),
			f64bits(decay), f64bits(b1), f64bits(b2), f64bits(step), f64bits(bc2), f64bits(o.cfg.Eps)); err != nil {
			return err
		}
	}
	for _, e := range entries {
		o.be.updated(o.store, e.name, copies[e.name])
	}
	return nil
}

// Moments downloads every parameter's moments (those that have had an
// update) and the number of Step calls: a checkpoint of a device run in any
// form the caller writes (training writes optim.AdamW's), which resumes on
// the host optimizer and back.
func (o *DeviceAdamW) Moments() (map[string]Moments, int, error) {
	unbind, err := o.be.bind()
	if err != nil {
		return nil, 0, err
	}
	defer unbind()
	out := map[string]Moments{}
	for _, name := range o.names {
		st := o.st[name]
		if st == nil {
			continue
		}
		n := o.n[name]
		m, v := make([]float32, n), make([]float32, n)
		if err := o.be.dev.download(f32Ptr(m), st.m, uint64(4*n)); err != nil {
			return nil, 0, err
		}
		if err := o.be.dev.download(f32Ptr(v), st.v, uint64(4*n)); err != nil {
			return nil, 0, err
		}
		out[name] = Moments{M: m, V: v, T: st.t}
	}
	return out, o.steps, nil
}

// SetMoments replaces the moments with ms (each of its parameter's size)
// and the Step count with steps.
func (o *DeviceAdamW) SetMoments(ms map[string]Moments, steps int) error {
	for name, s := range ms {
		n, ok := o.n[name]
		if !ok {
			return fmt.Errorf("device AdamW: state for %q, which the optimizer does not own", name)
		}
		if len(s.M) != n || len(s.V) != n || s.T < 0 {
			return fmt.Errorf("device AdamW: state for %s has %d and %d values (step %d), the parameter %d", name, len(s.M), len(s.V), s.T, n)
		}
	}
	unbind, err := o.be.bind()
	if err != nil {
		return err
	}
	defer unbind()
	o.freeMoments()
	for name, s := range ms {
		n := o.n[name]
		st := &devMoments{t: s.T}
		if st.m, err = o.be.dev.alloc(uint64(4 * n)); err != nil {
			return err
		}
		if st.v, err = o.be.dev.alloc(uint64(4 * n)); err != nil {
			return err
		}
		o.st[name] = st
		if err := o.be.dev.upload(st.m, f32Ptr(s.M), uint64(4*n)); err != nil {
			return err
		}
		if err := o.be.dev.upload(st.v, f32Ptr(s.V), uint64(4*n)); err != nil {
			return err
		}
	}
	o.steps = steps
	return nil
}

func (o *DeviceAdamW) freeMoments() {
	for name, st := range o.st {
		o.be.dev.free(st.m)
		o.be.dev.free(st.v)
		delete(o.st, name)
	}
}

// Close frees the moments and work buffers and hands the parameters back
// to the host (the store is not updated: SyncToHost first).
func (o *DeviceAdamW) Close() {
	unbind, err := o.be.bind()
	if err != nil {
		return
	}
	defer unbind()
	o.freeMoments()
	if o.part.Ptr != 0 {
		o.be.dev.free(o.part)
		o.be.dev.free(o.norm)
		o.be.dev.free(o.table)
		o.part, o.norm, o.table, o.tableHost = Buffer{}, Buffer{}, Buffer{}, nil
	}
	o.be.setResident(o.store, o.names, false)
}

// GradAccumulator holds a step's gradients on the device across
// micro-batches: Add(k, w, g) sets acc = w·g for k = 0 and acc += w·g
// after, rounding as the host does.
type GradAccumulator struct {
	be  *Backend
	acc map[string]Buffer
	n   map[string]int
}

// NewGradAccumulator allocates one device buffer per parameter of store.
func NewGradAccumulator(be *Backend, store *kernels.Store, params []string) (*GradAccumulator, error) {
	unbind, err := be.bind()
	if err != nil {
		return nil, err
	}
	defer unbind()
	a := &GradAccumulator{be: be, acc: map[string]Buffer{}, n: map[string]int{}}
	for _, name := range params {
		t := store.Get(name)
		if t == nil {
			continue
		}
		b, err := be.dev.alloc(uint64(4 * max(1, len(t.F32))))
		if err != nil {
			a.Close()
			return nil, err
		}
		a.acc[name], a.n[name] = b, len(t.F32)
	}
	return a, nil
}

// Add accumulates one micro-batch's gradient of name.
func (a *GradAccumulator) Add(name string, k int, w float32, g Buffer) error {
	b, ok := a.acc[name]
	if !ok {
		return fmt.Errorf("gradient accumulator: no buffer for %q", name)
	}
	n := a.n[name]
	first := int32(0)
	if k == 0 {
		first = 1
	}
	unbind, err := a.be.bind()
	if err != nil {
		return err
	}
	defer unbind()
	return a.be.dev.launch("axpy_acc_f32", grid1(n), block1, 0, b.Ptr, g.Ptr, w, first, int64(n))
}

// Buffers are the accumulated gradients by parameter name.
func (a *GradAccumulator) Buffers() map[string]Buffer { return a.acc }

// Close frees the accumulators.
func (a *GradAccumulator) Close() {
	unbind, err := a.be.bind()
	if err != nil {
		return
	}
	defer unbind()
	for name, b := range a.acc {
		a.be.dev.free(b)
		delete(a.acc, name)
	}
}

// DeviceOutput is a program's output as a device buffer (no download);
// ok is false for a name the graph does not output.
type DeviceOutput interface {
	DeviceOutput(name string) (Buffer, bool)
}

// DeviceOutput returns the device buffer of a named output of the last Run.
func (p *program) DeviceOutput(name string) (Buffer, bool) {
	d := p.outV[name]
	if d == nil || p.vals == nil {
		return Buffer{}, false
	}
	return Buffer{Ptr: d.buf.Ptr, Bytes: uint64(4 * d.n)}, true
}

var errNotCUDA = errors.New("not a CUDA backend")

// AsBackend returns be as a CUDA backend.
func AsBackend(be kernels.Backend) (*Backend, error) {
	b, ok := be.(*Backend)
	if !ok {
		return nil, errNotCUDA
	}
	return b, nil
}
