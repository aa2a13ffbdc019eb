package cuda

import (
	"fmt"
	"slices"
	"unsafe"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// Padded parameters (ir's Pad; compiler/model's aligned widths). A Pad
// reads a store tensor and widens its rows and columns with zero blocks.
// Where only bf16 GEMMs read it as their weight, it runs nothing: the
// GEMMs take the tensor's bf16 copy in the padded layout (paddedOf). A
// layout with zeros at the ends of the rows and columns only (the residual
// stream's 510 → 512, an expert's 1,020 → 1,024) is the tensor's own bf16
// copy, which the device optimizer keeps current (bf16Copy: its rows and
// columns are rounded up to 8 with zeros); a layout with zeros after each
// block (the heads' 85 → 88) is a copy of its own, made by pad_bf16 when
// the tensor changed (once a step). Other readers (a Gather of the
// embedding, the biases, LayerNorm's parameters) get the fp32 value.

// padding is the layout a Pad gives its store tensor: rows and columns.
type padding struct{ rows, cols ir.PadSpan }

// endOnly: every padded axis is one block padded to a multiple of 8, the
// layout of the tensor's own bf16 copy.
func (pd padding) endOnly() bool {
	own := func(s ir.PadSpan) bool { return s.Padded == s.Size || (s.Blocks == 1 && s.Padded == bf16LD(s.Size)) }
	return own(pd.rows) && own(pd.cols)
}

// paddedOf is the store tensor a value is a Pad of, and the layout; nil
// for any other value.
func (p *program) paddedOf(v *ir.Value) (*dval, *padding) {
	n := v.Def
	if n == nil || n.Op != ir.OpPad {
		return nil, nil
	}
	x := n.Inputs[0]
	if x.Kind != ir.Param && x.Kind != ir.Buffer {
		return nil, nil
	}
	rows, cols, err := ir.PadSpans(x.Shape, n.Attrs)
	if err != nil {
		return nil, nil
	}
	return p.vals[x.ID], &padding{rows, cols}
}

// padSkipped: the Pad's result is read only as the weight of bf16 GEMMs
// (which take the padded bf16 copy instead): no graph output, no other
// reader.
func (p *program) padSkipped(n *ir.Node) bool {
	o := n.Outputs[0]
	if st, _ := p.paddedOf(o); st == nil || p.be.gemm != ir.BF16 {
		return false
	}
	if p.isOutput(o) {
		return false
	}
	reads := 0
	for _, m := range p.g.Nodes {
		for i, x := range m.Inputs {
			if x != o {
				continue
			}
			if i != 1 || !p.bf16Weight(m) {
				return false
			}
			reads++
		}
	}
	return reads > 0
}

// bf16Weight: node m's GEMMs read its input 1 as a bf16 weight.
func (p *program) bf16Weight(m *ir.Node) bool {
	switch m.Op {
	case ir.OpLinear, ir.OpLinearGradX:
		s, _ := gemmShapeOf(m.Op, m.Inputs)
		return p.bf16GEMM(s)
	case ir.OpLMHeadCrossEntropy: // chunks of rows rows, the last of last (buildLMHead)
		x, w := m.Inputs[0].Shape, m.Inputs[1].Shape
		rows := ir.LMHeadChunkRows(m)
		last := x[0] - (x[0]+rows-1)/rows*rows + rows
		return p.bf16GEMM(GemmShape{M: rows, N: x[1], K: w[0]}) && p.bf16GEMM(GemmShape{M: last, N: x[1], K: w[0]})
	}
	return false
}

// padKernel is a Pad's or PadGrad's launch arguments after the pointers:
// the row and column spans and the width of its output's rows as pad_f32
// and pad_grad_f32 take them (a Pad's are stored: x logical, y padded; a
// PadGrad's logical: dy padded, dx logical), and the output's length.
type padKernel struct {
	rows, cols ir.PadSpan
	width, n   int
}

func padKernelOf(n *ir.Node, x, o *dval) (padKernel, error) {
	shape, grad := x.v.Shape, n.Op == ir.OpPadGrad
	if grad {
		shape = o.v.Shape
	}
	rows, cols, err := ir.PadSpans(shape, n.Attrs)
	if err != nil {
		return padKernel{}, err
	}
	k := padKernel{rows: rows, cols: cols, width: cols.Stored(), n: o.n}
	if grad {
		k.width = cols.Logical()
	}
	return k, nil
}

// args are the kernel's arguments from rsize on.
func (k padKernel) args() []any {
	return []any{int32(k.rows.Size), int32(k.rows.Padded), int32(k.width), int32(k.cols.Size), int32(k.cols.Padded), int64(k.n)}
}

// buildPad and buildPadGrad: one pad_f32 or pad_grad_f32 launch, or a
// share of a run's pad_multi_f32 (buildPadRun); a skipped Pad none.
func (p *program) buildPad(n *ir.Node, in, out []*dval) (func() error, error) {
	if p.padSkipped(n) {
		return func() error { return nil }, nil
	}
	return p.buildPadKernel(n, "pad_f32", in[0], out[0])
}

func (p *program) buildPadGrad(n *ir.Node, in, out []*dval) (func() error, error) {
	return p.buildPadKernel(n, "pad_grad_f32", in[0], out[0])
}

func (p *program) buildPadKernel(n *ir.Node, kernel string, x, o *dval) (func() error, error) {
	k, err := padKernelOf(n, x, o)
	if err != nil {
		return nil, err
	}
	if run, err := p.buildPadRun(n); run != nil || err != nil {
		return run, err
	}
	tail := k.args()
	return func() error { return p.each(kernel, o.n, append([]any{o.buf.Ptr, x.buf.Ptr}, tail...)...) }, nil
}

// Batched Pads. The aligned graphs' Pads come first in the step and their
// gradients last (compiler/model's placePads): at the paper preset 206
// Pads and 278 PadGrads of a few kB to a few MB each, which one launch
// apiece would leave at the launch floor. A run of consecutive ones (the
// skipped Pads between them aside) runs as one pad_multi_f32 launch at its
// first member, the others running nothing. A run ends where a member
// would write a plan slot an earlier member reads or writes (a PadGrad's
// dy freed for a later one's result), so running them together reads what
// running them one by one reads.

// padChunk: the elements a block of pad_multi_f32 takes.
const padChunk = 4096

// padRun is a run of consecutive Pads, or PadGrads, that launch.
type padRun struct {
	grad    bool
	members []*ir.Node
}

// padRuns finds the program's runs (by member node ID), once.
func (p *program) padRuns() map[int]*padRun {
	if p.pads != nil {
		return p.pads
	}
	p.pads = map[int]*padRun{}
	var cur *padRun
	var used map[int]bool // the plan slots the run's members read and write
	for _, n := range p.g.Nodes {
		if n.Op == ir.OpPad && p.padSkipped(n) {
			continue
		}
		if n.Op != ir.OpPad && n.Op != ir.OpPadGrad {
			cur = nil
			continue
		}
		grad := n.Op == ir.OpPadGrad
		in, out := p.vals[n.Inputs[0].ID].slot, p.vals[n.Outputs[0].ID].slot
		if cur == nil || cur.grad != grad || (out >= 0 && used[out]) || (in >= 0 && used[in] && cur.writes(p, in)) {
			cur, used = &padRun{grad: grad}, map[int]bool{}
		}
		cur.members = append(cur.members, n)
		for _, s := range []int{in, out} {
			if s >= 0 {
				used[s] = true
			}
		}
		p.pads[n.ID] = cur
	}
	return p.pads
}

// writes: a member of the run writes plan slot s.
func (r *padRun) writes(p *program, s int) bool {
	for _, m := range r.members {
		if p.vals[m.Outputs[0].ID].slot == s {
			return true
		}
	}
	return false
}

// buildPadRun is node n's step where it belongs to a run of two or more:
// the run's pad_multi_f32 launch for its first member, nothing for the
// others; nil where it runs alone.
func (p *program) buildPadRun(n *ir.Node) (func() error, error) {
	r := p.padRuns()[n.ID]
	if r == nil || len(r.members) < 2 {
		return nil, nil
	}
	if r.members[0] != n {
		return func() error { return nil }, nil
	}
	const words = 9
	table, err := p.alloc(2 * words * len(r.members)) // uint64 words
	if err != nil {
		return nil, err
	}
	// the entries but their pointers, which the run reads when it runs
	t := make([]uint64, 0, words*len(r.members))
	blocks, elems, bytes := 0, 0, 0.0
	for _, m := range r.members {
		x, o := p.vals[m.Inputs[0].ID], p.vals[m.Outputs[0].ID]
		k, err := padKernelOf(m, x, o)
		if err != nil {
			return nil, err
		}
		t = append(t, 0, 0, uint64(k.rows.Size), uint64(k.rows.Padded), uint64(k.width), uint64(k.cols.Size),
			uint64(k.cols.Padded), uint64(k.n), uint64(blocks))
		blocks += (k.n + padChunk - 1) / padChunk
		elems += k.n
		bytes += 4 * float64(k.n+min(k.n, x.n))
	}
	grad := int32(0)
	if r.grad {
		grad = 1
	}
	var host []uint64 // the table as last uploaded
	return func() error {
		for i, m := range r.members {
			t[words*i], t[words*i+1] = p.vals[m.Outputs[0].ID].buf.Ptr, p.vals[m.Inputs[0].ID].buf.Ptr
		}
		if !slices.Equal(t, host) {
			if err := p.be.dev.upload(table, unsafe.Pointer(&t[0]), uint64(8*len(t))); err != nil {
				return err
			}
			host = slices.Clone(t)
		}
		if h, ok := p.be.dev.(costHinter); ok {
			h.hintBytes(bytes)
		}
		return p.be.dev.launch("pad_multi_f32", [3]uint32{uint32(blocks), 1, 1}, [3]uint32{256, 1, 1}, 0,
			table.Ptr, int32(len(r.members)), int32(padChunk), grad, int64(elems))
	}, nil
}

// storedPaddedBF16 is the bf16 copy of store tensor d in layout pd, made
// again when the tensor changed.
func (p *program) storedPaddedBF16(d *dval, pd padding) (Buffer, error) {
	if pd.endOnly() {
		return p.storedBF16(d, pd.rows.Logical(), pd.cols.Logical())
	}
	c, err := p.be.paddedCopy(p.store, d.v.Name, pd)
	if err != nil {
		return Buffer{}, err
	}
	v, stale := p.be.stale(c)
	if !stale {
		return c.buf, nil
	}
	ld := bf16LD(pd.cols.Stored())
	n := pd.rows.Stored() * ld
	if err := p.each("pad_bf16", n, c.buf.Ptr, d.buf.Ptr, int32(pd.rows.Size), int32(pd.rows.Padded),
		int32(pd.cols.Stored()), int32(pd.cols.Size), int32(pd.cols.Padded), int32(ld), int64(n)); err != nil {
		return Buffer{}, err
	}
	p.be.refreshed(c, v)
	return c.buf, nil
}

// paddedCopy is the bf16 copy of a store tensor in layout pd (rows of
// bf16LD of its stored columns, zero rows to bf16LD of its stored rows),
// allocated on first use; the caller converts it when it is stale.
func (b *Backend) paddedCopy(st *kernels.Store, name string, pd padding) (*bf16Copy, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.mirror[mirrorKey{st, name}]
	if e == nil {
		return nil, fmt.Errorf("%s: no device copy", name)
	}
	if pd.rows.Logical()*pd.cols.Logical() != e.shape.Numel() {
		return nil, fmt.Errorf("%s%v padded as %+v", name, e.shape, pd)
	}
	if c := e.padded[pd]; c != nil {
		return c, nil
	}
	c, err := b.newCopy(e, pd.rows.Stored(), pd.cols.Stored())
	if err != nil {
		return nil, err
	}
	if e.padded == nil {
		e.padded = map[padding]*bf16Copy{}
	}
	e.padded[pd] = c
	return c, nil
}
