package cuda

import (
	"unsafe"

	"github.com/rpac-dev/rpac/ir"
)

// catParts is a lazy Concat along the last axis that only bf16 GEMMs read
// as their A operand (the joined gradients' D of passes.JoinSiblingGrads):
// it is never written in fp32; each GEMM's staging conversion reads the
// parts (f32_cat_to_bf16_pad_kernel), which the memory plan keeps live as
// long as the Concat's result.
type catParts struct {
	table Buffer // per part its address and its columns (int64 pairs)
	n     int    // parts
}

// buildLazyConcat records n's parts when its result can stay unwritten and
// returns a step that does nothing; ok is false otherwise (the Concat is
// built as any other).
func (p *program) buildLazyConcat(n *ir.Node, in []*dval) (func() error, bool, error) {
	if !p.foldsConcat(n) {
		return nil, false, nil
	}
	if _, ok := p.twins[n.Outputs[0].ID]; ok { // its parts' chains wrote its bf16 rows
		return func() error { return nil }, true, nil
	}
	table := make([]int64, 0, 2*len(in))
	for _, x := range in {
		table = append(table, int64(x.buf.Ptr), int64(lastDim(x.v.Shape)))
	}
	buf, err := p.uploadNew(unsafe.Pointer(&table[0]), 8*len(table))
	if err != nil {
		return nil, false, err
	}
	if p.cats == nil {
		p.cats = map[int]catParts{}
	}
	p.cats[n.Outputs[0].ID] = catParts{table: buf, n: len(in)}
	return func() error { return nil }, true, nil
}

// foldsConcat: n is a lazy Concat along the last axis of intermediate
// values whose result only bf16 GEMMs read, as the dy (A operand) of
// LinearGradX and LinearGradW nodes (packed.go).
func (p *program) foldsConcat(n *ir.Node) bool {
	if !n.Attrs.Bool("lazy", false) {
		return false
	}
	o := n.Outputs[0]
	if ax := n.Attrs.Int("axis", 0); ax != -1 && ax != len(o.Shape)-1 {
		return false
	}
	for _, x := range n.Inputs {
		if x.Kind != ir.Intermediate { // parts in plan slots, whose addresses stay
			return false
		}
	}
	return p.onlyBF16GEMMsRead(o, true)
}

// operandOf is the operand for a value, with its parts when it is a lazy
// Concat left unwritten.
func (p *program) operandOf(d *dval) operand {
	o := operandOf(d)
	if st, pd := p.paddedOf(d.v); st != nil {
		o.stored, o.pad = st, pd
	}
	if c, ok := p.cats[d.v.ID]; ok {
		o.cat = &c
	}
	if p.packed[d.v.ID] {
		o.bf16 = d.buf
	} else if t, ok := p.twins[d.v.ID]; ok {
		o.bf16 = t.buf
	}
	return o
}

// catToBF16 converts the parts of a lazy Concat (rows × cols in all) into
// dst with leading dimension bf16LD(cols).
func (p *program) catToBF16(dst Buffer, c *catParts, rows, cols int) error {
	ld := bf16LD(cols)
	return p.each("f32_cat_to_bf16_pad_kernel", rows*ld/8, dst.Ptr, c.table.Ptr, int32(c.n), int64(rows), int32(cols), int32(ld))
}
