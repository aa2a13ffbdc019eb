package cuda

import (
	"fmt"

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
	if n == nil || n.Op != "Pad" {
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
	if st, _ := p.paddedOf(o); st == nil || p.be.gemm != GEMMBF16 {
		return false
	}
	for _, v := range p.g.Outputs {
		if v == o {
			return false
		}
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
	case "Linear", "LinearGradX":
		s, _ := gemmShapeOf(m.Op, m.Inputs)
		return p.bf16GEMM(s)
	case "LMHeadCrossEntropy": // chunks of rows rows, the last of last (buildLMHead)
		x, w := m.Inputs[0].Shape, m.Inputs[1].Shape
		rows := ir.LMHeadChunkRows(m)
		last := x[0] - (x[0]+rows-1)/rows*rows + rows
		return p.bf16GEMM(GemmShape{M: rows, N: x[1], K: w[0]}) && p.bf16GEMM(GemmShape{M: last, N: x[1], K: w[0]})
	}
	return false
}

func (p *program) buildPad(n *ir.Node, in, out []*dval) (func() error, error) {
	x, o := in[0], out[0]
	rows, cols, err := ir.PadSpans(x.v.Shape, n.Attrs)
	if err != nil {
		return nil, err
	}
	if p.padSkipped(n) {
		return func() error { return nil }, nil
	}
	return func() error {
		return p.each("pad_f32", o.n, o.buf.Ptr, x.buf.Ptr, int32(rows.Size), int32(rows.Padded),
			int32(cols.Stored()), int32(cols.Size), int32(cols.Padded), int64(o.n))
	}, nil
}

func (p *program) buildPadGrad(n *ir.Node, in, out []*dval) (func() error, error) {
	dy, o := in[0], out[0]
	rows, cols, err := ir.PadSpans(o.v.Shape, n.Attrs)
	if err != nil {
		return nil, err
	}
	return func() error {
		return p.each("pad_grad_f32", o.n, o.buf.Ptr, dy.buf.Ptr, int32(rows.Size), int32(rows.Padded),
			int32(cols.Logical()), int32(cols.Size), int32(cols.Padded), int64(o.n))
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
