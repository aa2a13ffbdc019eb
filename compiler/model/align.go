package model

import (
	"fmt"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/passes"
)

// Aligned widths (Opts.Align): a backend whose GEMMs run fastest when every
// dimension is a multiple of some number (cuBLASLt's Hopper kernels: 8)
// asks for graphs whose activations are stored padded to such widths. The
// parameters stay as the model defines them; the graph pads each one with
// zeros where it is read (ir's Pad, whose gradient drops the padding), so the
// store, the optimizer and checkpoints see the model's own shapes.
//
// The padding is exact: every padded entry of an activation is zero in the
// forward pass (zero weight rows and biases, LayerNorm's width attribute,
// elementwise ops that keep 0 at 0 on them), so no real entry depends on
// it, and the gradients that reach the padded entries of the weights are
// dropped by Pad's gradient. With dropout the masks are drawn over the padded
// layout: the same distribution, other draws than the unpadded graph's.

// span is a width the model computes over: blocks of size entries, each
// stored in padded (≥ size) entries whose tail is zero (ir.PadSpan). The
// attention's heads are H blocks of the head size; the residual stream and
// the feed-forward width one block each.
type span = ir.PadSpan

// plain is a width the graph keeps as it is.
func plain(n int) span { return span{Blocks: 1, Size: n, Padded: n} }

// span is n entries in blocks, each padded to the graph's alignment.
func (b *builder) span(n, blocks int) span {
	size := n / blocks
	return span{Blocks: blocks, Size: size, Padded: alignUp(size, b.o.Align)}
}

// alignUp rounds n up to a multiple of a (a < 2: n).
func alignUp(n, a int) int {
	if a < 2 {
		return n
	}
	return (n + a - 1) / a * a
}

// padParam is parameter p (a vector or a matrix) read with its rows and
// last axis widened to the spans' stored widths (nil: as it is): one Pad
// node per parameter and graph, placed first in the graph (placePads).
func (b *builder) padParam(p *ir.Value, rows, cols *span) *ir.Value {
	key := "align:" + p.Name
	if v, ok := b.seen[key]; ok {
		return v
	}
	a := ir.Attrs{}
	if rows != nil && rows.Padded != rows.Size {
		a["rows"] = rows.Attr()
	}
	if cols != nil && cols.Padded != cols.Size {
		a["cols"] = cols.Attr()
	}
	v := p
	if len(a) > 0 {
		v = b.op("Pad", a, p)
	}
	b.seen[key] = v
	return v
}

// placePads moves the Pad nodes (which read parameters only) to the front
// of the graph: their gradients then come last in the backward, after
// every weight gradient, as the parameters' own do, and the passes that
// join sibling gradients find them unread until then.
func placePads(g *ir.Graph) {
	var pads, rest []*ir.Node
	for _, n := range g.Nodes {
		if n.Op == ir.OpPad {
			pads = append(pads, n)
		} else {
			rest = append(rest, n)
		}
	}
	g.Nodes = append(pads, rest...)
}

// padTable pads the last axis of a constant table [..., n] (n = s's
// logical width) to s's stored width with zeros in Go, for the constants
// the builder makes itself.
func padTable(data []float64, s span) []float64 {
	if s.Padded == s.Size {
		return data
	}
	rows := len(data) / s.Logical()
	out := make([]float64, 0, rows*s.Stored())
	for r := 0; r < rows; r++ {
		for k := 0; k < s.Blocks; k++ {
			at := r*s.Logical() + k*s.Size
			out = append(out, data[at:at+s.Size]...)
			out = append(out, make([]float64, s.Padded-s.Size)...)
		}
	}
	return out
}

// keepStreams gives the random nodes of the graph the streams their twins
// draw from in the unaligned graph of the dense form (the id of each
// there), so that the padding's extra nodes and the routed experts change
// no draw: the Gumbel noise of the experts' gates is the same. A routed
// expert (ExpertFFN) with dropout is the twin of its network's two
// Dropouts: stream and stream2. (Dropout over a padded tensor still draws
// other masks: its elements are numbered in the padded layout.)
func (b *builder) keepStreams(cfg *Config, o Opts) error {
	o.Align, o.Experts = 0, passes.DispatchDense
	ref, err := Build(cfg, o)
	if err != nil {
		return err
	}
	var want []*ir.Node
	for _, n := range ref.Nodes {
		if ir.Ops[n.Op].Random {
			want = append(want, n)
		}
	}
	k := 0
	for _, n := range b.g.Nodes {
		if !ir.Ops[n.Op].Random {
			continue
		}
		twin, ok := n.Op, 1
		if n.Op == ir.OpExpertFFN {
			twin, ok = ir.OpDropout, 0
			if n.Attrs.Float("p", 0) > 0 {
				ok = 2
			}
		}
		if k+ok > len(want) || (ok > 0 && (want[k].Op != twin || want[k+ok-1].Op != twin)) {
			return fmt.Errorf("graph: random node %d (%s) has no twin in the unaligned dense graph", k, n.Op)
		}
		if n.Attrs == nil {
			n.Attrs = ir.Attrs{}
		}
		if ok > 0 {
			n.Attrs["stream"] = want[k].Stream()
		}
		if ok == 2 {
			n.Attrs["stream2"] = want[k+1].Stream()
		}
		k += ok
	}
	if k != len(want) {
		return fmt.Errorf("graph: %d random nodes' twins, the unaligned dense one has %d", k, len(want))
	}
	return nil
}
