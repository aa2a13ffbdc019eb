package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// Backend runs IR graphs on one NVIDIA GPU. Parameters and buffers live on
// the host in the Store (the optimizer and the controllers work there);
// each Run uploads them into a device mirror shared by every program of the
// backend, and Output downloads what the caller asks for.
type Backend struct {
	dev device
	// gemm is the element type of the GEMM inputs: ir.BF16 rounds both
	// inputs of every GEMM to bfloat16 and accumulates in float32 (the
	// tensor cores' fast path); any other (ir.FP32) multiplies float32
	// inputs (parity with the CPU backend). Everything else (activations
	// between ops, accumulation, master weights) is float32.
	gemm ir.Precision
	// The paths Options chose (Options' fields say which is which);
	// resolved for the device where they depend on it (ceShared).
	attention                                                  AttentionPath
	joinGrads, pack, sums, headPad, padGradW, padModel, agLean bool
	bf16Act, remat, lnFused, agSave                            bool
	// biasBF16: the device's cuBLASLt has a GEMM with a bf16 result and
	// the fp32 bias epilogue (halfBiasOK, probed once, for bf16Act)
	biasBF16  bool
	probeOnce sync.Once
	// ceShared: the most dynamic shared memory softmax_ce_smem_f32 may
	// keep a row of logits in (the device's opt-in less the kernel's
	// static arrays), 0 without Options.CESmem
	ceShared int

	mu     sync.Mutex
	mirror map[mirrorKey]*mirrorEntry
}

type mirrorKey struct {
	store *kernels.Store
	name  string
}

type mirrorEntry struct {
	buf   Buffer
	shape ir.Shape
	// resident: the device copy is authoritative (a DeviceAdamW owns it);
	// programs do not upload the store's value.
	resident bool
	// version counts the writes to buf (uploads, optimizer steps); a bf16
	// copy made at an older version is stale.
	version uint64
	// bf16 holds the tensor's padded bf16 copies for GEMMs, by row length.
	bf16 map[int]*bf16Copy
	// padded holds its bf16 copies in the layouts of Pads (pad.go).
	padded map[padding]*bf16Copy
}

// bf16Copy is a store tensor's bf16 copy, rows of bf16LD(cols) elements.
type bf16Copy struct {
	buf   Buffer
	entry *mirrorEntry
	made  uint64 // the entry's version the copy was made from (0: never)
}

// stale: the tensor changed since the copy was made (0 when it never was);
// it returns the version a conversion now would hold.
func (b *Backend) stale(c *bf16Copy) (uint64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return c.entry.version, c.made == 0 || c.made != c.entry.version
}

// refreshed records that the copy holds the tensor's value of version v.
func (b *Backend) refreshed(c *bf16Copy, v uint64) {
	b.mu.Lock()
	c.made = v
	b.mu.Unlock()
}

// touch records that the device copies of store tensors were written.
func (b *Backend) touch(st *kernels.Store, names ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, n := range names {
		if e := b.mirror[mirrorKey{st, n}]; e != nil {
			e.version++
		}
	}
}

// maintainedCopy is the one bf16 copy of a store tensor that a device
// optimizer step can write beside the tensor (adamw_multi_f64_f32), and
// its row length; nil when the tensor has none, several (seen with
// different rows), or one never converted (whose padding columns are not
// yet zero).
func (b *Backend) maintainedCopy(st *kernels.Store, name string) (*bf16Copy, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.mirror[mirrorKey{st, name}]
	if e == nil || len(e.bf16) != 1 {
		return nil, 0
	}
	for cols, c := range e.bf16 {
		if c.made != 0 {
			return c, cols
		}
	}
	return nil, 0
}

// updated records a device write of a store tensor (touch) that also
// wrote copy c (nil: none) whole: c holds the new version.
func (b *Backend) updated(st *kernels.Store, name string, c *bf16Copy) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.mirror[mirrorKey{st, name}]; e != nil {
		e.version++
		if c != nil && c.entry == e {
			c.made = e.version
		}
	}
}

// bf16Copy returns the bf16 copy of a store tensor seen as rows×cols,
// allocated on first use; the caller converts it when it is stale. The
// copy has bf16LD(rows) rows of bf16LD(cols), zero where the tensor has
// none (the conversions and the optimizer write the tensor's rows and
// columns only), so a GEMM may read it as bf16LD(rows) rows (the LM
// head's over the vocabulary rounded up, headPad).
func (b *Backend) bf16Copy(st *kernels.Store, name string, rows, cols int) (*bf16Copy, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.mirror[mirrorKey{st, name}]
	if e == nil {
		return nil, fmt.Errorf("%s: no device copy", name)
	}
	if rows*cols != e.shape.Numel() {
		return nil, fmt.Errorf("%s%v seen as %d×%d for a GEMM", name, e.shape, rows, cols)
	}
	if c := e.bf16[cols]; c != nil {
		return c, nil
	}
	c, err := b.newCopy(e, rows, cols)
	if err != nil {
		return nil, err
	}
	if e.bf16 == nil {
		e.bf16 = map[int]*bf16Copy{}
	}
	e.bf16[cols] = c
	return c, nil
}

// newCopy allocates a zeroed bf16 copy of entry e: bf16LD(rows) rows of
// bf16LD(cols) elements. The caller holds b.mu.
func (b *Backend) newCopy(e *mirrorEntry, rows, cols int) (*bf16Copy, error) {
	bytes := uint64(2 * bf16LD(rows) * bf16LD(cols))
	buf, err := b.dev.alloc(bytes)
	if err != nil {
		return nil, err
	}
	if err := b.dev.zero(buf, bytes); err != nil {
		b.dev.free(buf)
		return nil, err
	}
	return &bf16Copy{buf: buf, entry: e}, nil
}

// setResident marks store tensors' device copies authoritative or not.
func (b *Backend) setResident(st *kernels.Store, names []string, on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, n := range names {
		if e := b.mirror[mirrorKey{st, n}]; e != nil {
			e.resident = on
		}
	}
}

// resident reports whether a store tensor's device copy is authoritative.
func (b *Backend) resident(st *kernels.Store, name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.mirror[mirrorKey{st, name}]
	return e != nil && e.resident
}

// New opens device ordinal, loads every kernel (compiled by NVRTC for the
// device, cached on disk) and cuBLASLt, and takes the paths o chooses.
// gemm is the GEMM inputs' type: ir.FP32 or ir.BF16.
func New(ordinal int, gemm ir.Precision, o Options) (*Backend, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	d, err := driver.LoadDriver()
	if err != nil {
		return nil, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c, err := d.NewContext(ordinal)
	if err != nil {
		return nil, err
	}
	n, err := driver.LoadNVRTC()
	if err != nil {
		return nil, err
	}
	srcs, err := KernelSources()
	if err != nil {
		return nil, err
	}
	if err := c.LoadKernels(n, srcs); err != nil {
		return nil, err
	}
	b, err := driver.LoadBLAS()
	if err != nil {
		return nil, err
	}
	choices, err := newGemmChooser(o, c.Dev.Name+" "+c.Dev.SM)
	if err != nil {
		return nil, err
	}
	return newBackend(&gpu{ctx: c, blas: b, nv: n, syncEach: o.Sync, choices: choices}, gemm, o), nil
}

// newBackend is the backend on dev taking the paths o chooses (validated).
func newBackend(dev device, gemm ir.Precision, o Options) *Backend {
	ceShared := 0
	if o.CESmem {
		ceShared = max(0, dev.Info().SharedOptin-ceStaticShared)
	}
	return &Backend{dev: dev, gemm: gemm, mirror: map[mirrorKey]*mirrorEntry{}, attention: o.Attention, joinGrads: o.JoinGrads,
		pack: o.Pack, sums: o.Sums, headPad: o.HeadPad, padGradW: o.PadGradW, padModel: o.PadModel, remat: o.Remat, bf16Act: o.BF16Act,
		agLean: o.AGLean, lnFused: o.LNFused, agSave: o.AGSave, ceShared: ceShared}
}

// lmHeadChunk is the rows the fused LM head computes at once on the GPU:
// its input-gradient GEMM (chunk × d_model, over the vocabulary) has
// ⌈chunk/128⌉·⌈d/128⌉ output tiles, which at 1,024 rows and the paper's
// d of 510 fill 32 of an H100's 132 SMs (the fifth run measured the head's
// 1,024-row GEMMs at 85–125 TFLOP/s); 4,096 rows fill 128. A chunk of
// logits is then 823 MB at 50,257 tokens (the plan counts it).
const lmHeadChunk = 4096

// Name says "cuda" and the device.
func (b *Backend) Name() string {
	d := b.dev.Info()
	gemm := b.gemm.String()
	if g, ok := b.dev.(*gpu); ok && g.choices != nil { // Options.GEMMAlgos: which file chose the algorithms
		gemm += ", algorithms from " + g.choices.path
	}
	if b.gemm == ir.BF16 && b.attention == AttentionFlash {
		return fmt.Sprintf("cuda (%s, %s, gemm %s, attention %s)", d.Name, d.Arch, gemm, b.attention)
	}
	return fmt.Sprintf("cuda (%s, %s, gemm %s)", d.Name, d.Arch, gemm)
}

// Precision is F32: the backend has no float64 kernels.
func (b *Backend) Precision() ir.Precision { return ir.FP32 }

// Capabilities: training and eval graphs on this backend fuse each
// attention core, whose kernels hold the weights of one node at a time at
// most (attngemm.go) instead of a [B,H,T,T] tensor per node; programs live
// in the device's memory; the training state can stay on the device
// (DeviceAdamW); the fused LM head takes lmHeadChunk rows at a time; the
// backward GEMMs of Linears that read one input are joined; under bf16
// GEMMs the model's widths are stored padded to multiples of 8
// (Options.PadModel).
func (b *Backend) Capabilities() kernels.Capabilities {
	align := 0
	if b.padModel && b.gemm == ir.BF16 {
		align = 8
	}
	return kernels.Capabilities{FusedAttention: true, FusedElementwise: true, AttentionBTHD: true, DeviceMemory: int64(b.dev.Info().TotalMemory), DeviceState: true,
		LMHeadChunk: lmHeadChunk, JoinGrads: b.joinGrads, Align: align, RematDropout: b.remat}
}

// ceStaticShared: softmax_ce_smem_f32's static shared arrays (32 floats
// and 32 ints), bytes.
const ceStaticShared = 256

// Device describes the GPU.
func (b *Backend) Device() DeviceInfo { return b.dev.Info() }

// bind makes the device current for the calling goroutine.
func (b *Backend) bind() (func(), error) { return b.dev.bind() }

// stored returns the device mirror of a store tensor, allocating it once.
func (b *Backend) stored(st *kernels.Store, name string, shape ir.Shape) (Buffer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := mirrorKey{st, name}
	if e, ok := b.mirror[k]; ok {
		if !e.shape.Equal(shape) {
			return Buffer{}, fmt.Errorf("%s: device copy has shape %v, graph wants %v", name, e.shape, shape)
		}
		return e.buf, nil
	}
	buf, err := b.dev.alloc(uint64(4 * shape.Numel()))
	if err != nil {
		return Buffer{}, err
	}
	b.mirror[k] = &mirrorEntry{buf: buf, shape: shape.Clone()}
	return buf, nil
}

// Simulated reports whether the backend runs on rpac's CUDA simulator.
func (b *Backend) Simulated() bool {
	dev := b.dev
	if td, ok := dev.(*tracedDevice); ok {
		dev = td.device
	}
	g, ok := dev.(*gpu)
	return ok && g.ctx.Simulated()
}

// Release frees the device copies of st's tensors (after the programs that
// read them are closed).
func (b *Backend) Release(st *kernels.Store) {
	unbind, err := b.bind()
	if err != nil {
		return
	}
	defer unbind()
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, e := range b.mirror {
		if k.store == st {
			b.dev.free(e.buf)
			for _, c := range e.bf16 {
				b.dev.free(c.buf)
			}
			for _, c := range e.padded {
				b.dev.free(c.buf)
			}
			delete(b.mirror, k)
		}
	}
}

// dval is the device storage of one IR value.
type dval struct {
	v    *ir.Value
	buf  Buffer
	n    int
	slot int // plan slot, or -1
}

func (d *dval) i32() bool { return d.v.DType == ir.I32 }

type program struct {
	be     *Backend
	gen    map[string]string // generated kernels (name → source), loaded by loadGenerated
	g      *ir.Graph
	store  *kernels.Store
	vals   map[int]*dval
	inputs []*dval
	stored []*dval
	steps  []step
	owned  []Buffer // freed by Close
	arena  Buffer
	// slots: the plan slots' own allocations (separateSlots), poisoned at
	// the start of every Run and each once its values are dead.
	slots []Buffer

	feeds map[string][]int32 // this Run's i32 feeds (for host-side id work)
	// reuse: the next Run skips uploading the stored tensors (ReuseStored)
	reuse bool
	pre   []func() error // host work after the feeds are bound, before the steps
	outs  map[string]*kernels.Tensor
	outV  map[string]*dval
	fresh map[string]bool // output downloaded since the last Run
	seed  uint64

	producer map[int]*ir.Node // value ID -> the node that defines it
	lmHeads  map[int]*lmHead  // LMHeadCrossEntropy node ID -> its state
	// GEMM input staging for ir.BF16: the largest padded A and B
	// activation operand (in elements) of any GEMM, and per side
	// stageSlots bf16 buffers of that size.
	bf16Need [2]int
	bf16     [2][stageSlots]Buffer
	// The two-pass reductions' partials (doubles): the most any node
	// needs, one allocation shared by every node (reduce.go).
	workNeed   int
	workUsers  int // nodes that asked for it (needWork)
	work       Buffer
	staging    [2][stageSlots]stagedCopy // what each bf16 staging buffer holds
	stageUse   [2][stageSlots]uint64     // when each was last read (stageClock)
	stageClock uint64
	runs       uint64 // Runs started
	// plans: one cuBLASLt plan per GEMM key, made on first use; ws: their
	// workspace.
	plans map[GemmKey]gemmPlan
	ws    Buffer
	// The tensor-core attention paths' work buffer (bytes): flash.cu's
	// bias-gradient partial sums or the GEMM path's operands, one buffer
	// shared by every attention node.
	attnWorkNeed int64
	attnWork     Buffer
	// agLayouts: the GEMM path's layout of the work buffer, while every
	// attention node of the program takes the GEMM path with that one
	// layout (agUpperZero; attngemm.go's noteAttnWork)
	agLayouts   *agLayout
	agUpperZero bool
	agOther     bool // an attention node of another path or layout
	// agSaved: the packed q, k, v a forward attention keeps for its
	// backward (by the values' IDs, agSaveKey), agSavedBytes in all
	agSaved      map[[3]int]*agPacks
	agSavedBytes int64
	// attnLSE: each FusedAttention output's row log-sum-exp, which the
	// forward writes and a FusedAttentionGrad given that output reads.
	attnLSE map[*dval]Buffer
	// cats: the lazy Concats left unwritten (value ID → parts), joincat.go.
	cats map[int]catParts
	// packed: the values their producers write as padded bf16 (packed.go);
	// twins: the bf16 copies producers write beside fp32 values (and a
	// lazy Concat's, which its parts write: parts says where each goes),
	// in the buffers of twinPool (twinBytes in all); nodeIndex: each
	// node's place in the step order.
	packed    map[int]bool
	half      map[int]bool // values a GEMM writes as bf16 for the chains that read them (halfOutput)
	twins     map[int]twin
	parts     map[int]twin
	twinPool  []pooled
	twinBytes uint64
	nodeIndex map[int]int
	// pads: the runs of consecutive Pads and PadGrads, by member node ID
	// (pad.go)
	pads map[int]*padRun
	// sums: the reductions the chains making their inputs folded
	// (reduction node ID → partials, chainsum.go)
	sums map[int]chainSum
	// written: the WhenWritten hook, nil without one
	written *written
}

type step struct {
	node *ir.Node
	exec func() error
}

// Compile lays the graph's values out in device memory (plan slots in one
// arena) and prepares one launch sequence per node.
func (b *Backend) Compile(g *ir.Graph, plan *kernels.Plan, store *kernels.Store) (kernels.Program, error) {
	if g == nil {
		return nil, errors.New("cuda: nil graph")
	}
	if err := ir.Verify(g, false); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	unbind, err := b.bind()
	if err != nil {
		return nil, err
	}
	defer unbind()
	p := &program{be: b, g: g, store: store, vals: map[int]*dval{}, outs: map[string]*kernels.Tensor{},
		outV: map[string]*dval{}, fresh: map[string]bool{}}
	if err := p.layout(plan); err != nil {
		p.free()
		return nil, fmt.Errorf("cuda: compile %s: %w", g.Name, err)
	}
	if err := p.buildSteps(plan); err != nil {
		p.free()
		return nil, fmt.Errorf("cuda: compile %s: %w", g.Name, err)
	}
	for name, v := range g.Outputs {
		p.outV[name] = p.vals[v.ID]
		p.outs[name] = &kernels.Tensor{Shape: v.Shape.Clone()}
	}
	return p, nil
}

// alloc allocates device memory owned by the program.
func (p *program) alloc(elems int) (Buffer, error) {
	b, err := p.be.dev.alloc(uint64(4 * max(1, elems)))
	if err != nil {
		return Buffer{}, err
	}
	p.owned = append(p.owned, b)
	return b, nil
}

// upload copies host words (float32 or int32 or int64 data) into a new
// program-owned buffer.
func (p *program) uploadNew(ptr unsafe.Pointer, bytes int) (Buffer, error) {
	b, err := p.be.dev.alloc(uint64(max(1, bytes)))
	if err != nil {
		return Buffer{}, err
	}
	p.owned = append(p.owned, b)
	if bytes > 0 {
		if err := p.be.dev.upload(b, ptr, uint64(bytes)); err != nil {
			return Buffer{}, err
		}
	}
	return b, nil
}

// allValues lists every value the graph mentions, by ID.
func allValues(g *ir.Graph) []*ir.Value {
	seen := map[int]*ir.Value{}
	for _, v := range g.Values {
		seen[v.ID] = v
	}
	for _, n := range g.Nodes {
		for _, v := range n.Inputs {
			seen[v.ID] = v
		}
		for _, v := range n.Outputs {
			seen[v.ID] = v
		}
	}
	for _, v := range g.Outputs {
		seen[v.ID] = v
	}
	ids := make([]int, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	out := make([]*ir.Value, len(ids))
	for i, id := range ids {
		out[i] = seen[id]
	}
	return out
}

// layout gives every value its device memory: plan slots are carved from
// one arena; stored tensors point at the backend's mirror; consts are
// uploaded once; inputs and unplanned intermediates get their own buffers.
func (p *program) layout(plan *kernels.Plan) error {
	var slotOff []uint64
	separate := p.be.dev.separateSlots()
	if plan != nil {
		var total uint64
		for s, n := range plan.SlotElems {
			if n < 0 {
				return fmt.Errorf("plan slot %d has %d elements", s, n)
			}
			slotOff = append(slotOff, total)
			total += align256(uint64(4 * n))
			if separate {
				b, err := p.alloc(n)
				if err != nil {
					return fmt.Errorf("plan slot %d of %d elements: %w", s, n, err)
				}
				p.slots = append(p.slots, b)
			}
		}
		if total > 0 && !separate {
			a, err := p.be.dev.alloc(total)
			if err != nil {
				return fmt.Errorf("arena of %d bytes: %w", total, err)
			}
			p.arena = a
		}
	}
	readers := map[int]bool{}
	for _, n := range p.g.Nodes {
		for _, v := range n.Inputs {
			readers[v.ID] = true
		}
	}
	for _, v := range p.g.Outputs {
		readers[v.ID] = true
	}
	var problems []string
	for _, v := range allValues(p.g) {
		d := &dval{v: v, n: v.Shape.Numel(), slot: -1}
		p.vals[v.ID] = d
		var err error
		switch v.Kind {
		case ir.Input:
			d.buf, err = p.alloc(d.n)
			if readers[v.ID] {
				p.inputs = append(p.inputs, d)
			}
		case ir.Param, ir.Buffer:
			err = p.bindStored(d)
			p.stored = append(p.stored, d)
		case ir.Const:
			if len(v.Data) != d.n {
				err = fmt.Errorf("const %s has %d values for shape %v", v, len(v.Data), v.Shape)
				break
			}
			f := make([]float32, d.n)
			for i, x := range v.Data {
				f[i] = float32(x)
			}
			d.buf, err = p.uploadNew(f32Ptr(f), 4*len(f))
		case ir.Intermediate:
			s, ok := -1, false
			if plan != nil && v.DType != ir.I32 {
				s, ok = plan.Slot[v.ID]
			}
			if !ok {
				d.buf, err = p.alloc(d.n)
				break
			}
			if s < 0 || s >= len(plan.SlotElems) {
				err = fmt.Errorf("value %s: plan slot %d out of range (%d slots)", v, s, len(plan.SlotElems))
				break
			}
			if plan.SlotElems[s] < d.n {
				err = fmt.Errorf("value %s%v needs %d elements, plan slot %d has %d", v, v.Shape, d.n, s, plan.SlotElems[s])
				break
			}
			d.slot = s
			if separate {
				d.buf = Buffer{Ptr: p.slots[s].Ptr, Bytes: uint64(4 * d.n)}
			} else {
				d.buf = Buffer{Ptr: p.arena.Ptr + slotOff[s], Bytes: uint64(4 * d.n)}
			}
		}
		if err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

func align256(n uint64) uint64 { return (n + 255) &^ 255 }

func f32Ptr(f []float32) unsafe.Pointer {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Pointer(&f[0])
}

func i32Ptr(f []int32) unsafe.Pointer {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Pointer(&f[0])
}

// bindStored points a Param/Buffer value at its device mirror.
func (p *program) bindStored(d *dval) error {
	v := d.v
	st, err := p.store.Bind(v)
	if err != nil {
		return err
	}
	if st.F32 == nil || len(st.F32) != d.n {
		return fmt.Errorf("%s %q: store tensor is not float32 data of %d elements", v.Kind, v.Name, d.n)
	}
	buf, err := p.be.stored(p.store, v.Name, v.Shape)
	if err != nil {
		return err
	}
	d.buf = buf
	return nil
}

// buildSteps compiles each node (resolving plan-slot clashes between a
// node's outputs and inputs as the CPU backend does: in-place ops run in
// place, others write a private temporary copied into the slot).
func (p *program) buildSteps(plan *kernels.Plan) error {
	used := map[int]bool{}
	for _, n := range p.g.Nodes {
		for _, v := range n.Inputs {
			used[v.ID] = true
		}
	}
	for _, v := range p.g.Outputs {
		used[v.ID] = true
	}
	p.producer = map[int]*ir.Node{}
	for _, n := range p.g.Nodes {
		for _, v := range n.Outputs {
			p.producer[v.ID] = n
		}
	}
	missing := map[ir.OpName]bool{}
	for _, n := range p.g.Nodes {
		in := make([]*dval, len(n.Inputs))
		for i, v := range n.Inputs {
			in[i] = p.vals[v.ID]
		}
		out := make([]*dval, len(n.Outputs))
		for i, v := range n.Outputs {
			out[i] = p.vals[v.ID]
		}
		out, post, err := p.resolveAliases(n, in, out, used)
		if err != nil {
			return err
		}
		workUsers := p.workUsers
		exec, err := p.build(n, in, out)
		if errors.Is(err, errUnsupported) {
			missing[n.Op] = true
			continue
		}
		if err != nil {
			return fmt.Errorf("%s node %d: %w", n.Op, n.ID, err)
		}
		if post != nil {
			run := exec
			exec = func() error {
				if err := run(); err != nil {
					return err
				}
				return post()
			}
		}
		p.steps = append(p.steps, step{node: n, exec: p.poisoning(n, exec, p.workUsers > workUsers, plan)})
	}
	if len(missing) > 0 {
		var ops []string
		for op := range missing {
			ops = append(ops, string(op))
		}
		sort.Strings(ops)
		return fmt.Errorf("no cuda kernel for op(s) %s", strings.Join(ops, ", "))
	}
	if err := p.loadGenerated(); err != nil {
		return err
	}
	if err := p.stageWork(); err != nil {
		return err
	}
	if err := p.stageAttention(); err != nil {
		return err
	}
	return p.stageBF16()
}

// poisoning wraps a node's step on the simulator (separate slots): the
// reductions' workspace is poisoned before it when the node uses it, and
// the plan slots it gives back after it, so that whatever reuses them
// next finds NaN, not the last value's data.
func (p *program) poisoning(n *ir.Node, exec func() error, usesWork bool, plan *kernels.Plan) func() error {
	var freed []Buffer
	if plan != nil {
		for _, s := range plan.FreedAfter[n.ID] {
			if s >= 0 && s < len(p.slots) {
				freed = append(freed, p.slots[s])
			}
		}
	}
	if !p.be.dev.separateSlots() || (len(freed) == 0 && !usesWork) {
		return exec
	}
	return func() error {
		if usesWork && p.work.Bytes > 0 {
			if err := p.be.dev.poison(p.work); err != nil {
				return err
			}
		}
		if err := exec(); err != nil {
			return err
		}
		for _, b := range freed {
			if err := p.be.dev.poison(b); err != nil {
				return err
			}
		}
		return nil
	}
}

func (p *program) resolveAliases(n *ir.Node, in, out []*dval, used map[int]bool) ([]*dval, func() error, error) {
	res := append([]*dval(nil), out...)
	var copies [][2]*dval
	slot := func(v *ir.Value) int { return p.vals[v.ID].slot }
	for i, o := range out {
		if !kernels.SlotClash(n, i, slot) {
			continue
		}
		buf, err := p.alloc(o.n)
		if err != nil {
			return nil, nil, err
		}
		tmp := &dval{v: o.v, buf: buf, n: o.n, slot: -1}
		res[i] = tmp
		if used[o.v.ID] {
			copies = append(copies, [2]*dval{tmp, o})
		} else {
			p.vals[o.v.ID] = tmp
		}
	}
	if len(copies) == 0 {
		return res, nil, nil
	}
	return res, func() error {
		for _, c := range copies {
			if err := p.copy(c[1].buf, c[0].buf, c[0].n); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

// Run uploads the stored tensors and the feeds, then launches every node.
func (p *program) Run(feeds map[string]*kernels.Tensor, seed uint64) error {
	if p.vals == nil {
		return errors.New("cuda: Run on a closed program")
	}
	unbind, err := p.be.bind()
	if err != nil {
		return err
	}
	defer unbind()
	for _, b := range p.slots { // the last Run's values are dead
		if err := p.be.dev.poison(b); err != nil {
			return fmt.Errorf("cuda: run %s: %w", p.g.Name, err)
		}
	}
	p.seed = seed
	p.runs++
	clear(p.fresh)
	if !p.reuse {
		if err := p.uploadStored(); err != nil {
			return fmt.Errorf("cuda: run %s: %w", p.g.Name, err)
		}
	}
	p.reuse = false
	p.feeds = map[string][]int32{}
	for _, d := range p.inputs {
		if err := p.uploadFeed(d, feeds); err != nil {
			return fmt.Errorf("cuda: run %s: %w", p.g.Name, err)
		}
	}
	for _, f := range p.pre {
		if err := f(); err != nil {
			return fmt.Errorf("cuda: run %s: %w", p.g.Name, err)
		}
	}
	if err := p.written.report(-1); err != nil {
		return fmt.Errorf("cuda: run %s: %w", p.g.Name, err)
	}
	for i, s := range p.steps {
		if err := s.exec(); err != nil {
			return fmt.Errorf("cuda: run %s: %s node %d: %w", p.g.Name, s.node.Op, s.node.ID, err)
		}
		if err := p.written.report(i); err != nil {
			return fmt.Errorf("cuda: run %s: after %s node %d: %w", p.g.Name, s.node.Op, s.node.ID, err)
		}
	}
	if err := p.be.dev.sync(); err != nil {
		return fmt.Errorf("cuda: run %s: %w", p.g.Name, err)
	}
	return nil
}

func (p *program) uploadStored() error {
	for _, d := range p.stored {
		if p.be.resident(p.store, d.v.Name) {
			continue
		}
		st := p.store.Get(d.v.Name)
		if st == nil || len(st.F32) != d.n {
			return fmt.Errorf("%s %q is missing from the store or changed size", d.v.Kind, d.v.Name)
		}
		if err := p.be.dev.upload(d.buf, f32Ptr(st.F32), uint64(4*d.n)); err != nil {
			return err
		}
		p.be.touch(p.store, d.v.Name)
	}
	return nil
}

func (p *program) uploadFeed(d *dval, feeds map[string]*kernels.Tensor) error {
	v := d.v
	ft, ok := feeds[v.Name]
	if !ok || ft == nil {
		return fmt.Errorf("input %q (%s%v) is not fed", v.Name, v.DType, v.Shape)
	}
	if !ft.Shape.Equal(v.Shape) {
		return fmt.Errorf("input %q fed with shape %v, graph wants %v", v.Name, ft.Shape, v.Shape)
	}
	if v.DType == ir.I32 {
		if len(ft.I32) != d.n {
			return fmt.Errorf("input %q wants i32 data of %d elements (%v)", v.Name, d.n, v.Shape)
		}
		p.feeds[v.Name] = ft.I32
		return p.be.dev.upload(d.buf, i32Ptr(ft.I32), uint64(4*d.n))
	}
	f := ft.F32
	if f == nil && ft.F64 != nil {
		f = ft.Float32s()
	}
	if len(f) != d.n {
		return fmt.Errorf("input %q wants float data of %d elements (%v)", v.Name, d.n, v.Shape)
	}
	return p.be.dev.upload(d.buf, f32Ptr(f), uint64(4*d.n))
}

// ReuseStored says that the store has not changed since this program's
// last Run and that no other program of the backend ran in between (the
// next micro-batch of a step): the next Run skips uploading the stored
// tensors. It applies to one Run.
func (p *program) ReuseStored() { p.reuse = true }

// Output downloads a named output (once per Run) and returns it; nil for a
// name the graph does not output or when the download fails.
func (p *program) Output(name string) *kernels.Tensor {
	o, d := p.outs[name], p.outV[name]
	if o == nil || d == nil || p.vals == nil {
		return nil
	}
	if p.fresh[name] {
		return o
	}
	unbind, err := p.be.bind()
	if err != nil {
		return nil
	}
	defer unbind()
	var ptr unsafe.Pointer
	if d.i32() {
		if len(o.I32) != d.n {
			o.I32 = make([]int32, d.n)
		}
		ptr = i32Ptr(o.I32)
	} else {
		if len(o.F32) != d.n {
			o.F32 = make([]float32, d.n)
		}
		ptr = f32Ptr(o.F32)
	}
	if d.n > 0 {
		if err := p.be.dev.download(ptr, d.buf, uint64(4*d.n)); err != nil {
			return nil
		}
	}
	p.fresh[name] = true
	return o
}

// Close frees the program's device memory (the stored tensors' mirror
// stays with the backend).
func (p *program) Close() {
	if p.vals == nil {
		return
	}
	if unbind, err := p.be.bind(); err == nil {
		p.free()
		unbind()
	}
	p.vals, p.steps, p.inputs, p.stored = nil, nil, nil, nil
}

func (p *program) free() {
	p.freePlans()
	for _, b := range p.owned {
		p.be.dev.free(b)
	}
	p.owned = nil
	if p.arena.Ptr != 0 {
		p.be.dev.free(p.arena)
		p.arena = Buffer{}
	}
}
