package cuda

import (
	"github.com/rpac-dev/rpac/ir"
)

// buildConcat writes each input into its slice of the output along the
// axis (scatter_view_f32 with the output's slice view; the slices tile the
// output, so nothing is zeroed).
func (p *program) buildConcat(n *ir.Node, in, out []*dval) (func() error, error) {
	o := out[0]
	_, ax, err := ir.ConcatShape(n.Inputs, n.Attrs.Int("axis", 0))
	if err != nil {
		return nil, err
	}
	type part struct {
		x    *dval
		meta Buffer
		rank int
	}
	parts := make([]part, 0, len(in))
	at := 0
	for _, x := range in {
		w := x.v.Shape[ax]
		v, err := sliceView(o.v.Shape, ax, at, at+w)
		if err != nil {
			return nil, err
		}
		meta, err := p.uploadView(v)
		if err != nil {
			return nil, err
		}
		parts = append(parts, part{x, meta, v.rank()})
		at += w
	}
	return func() error {
		for _, pt := range parts {
			if err := p.each("scatter_view_f32", pt.x.n, o.buf.Ptr, pt.x.buf.Ptr, pt.meta.Ptr, int32(pt.rank), int64(pt.x.n)); err != nil {
				return err
			}
		}
		return nil
	}, nil
}
