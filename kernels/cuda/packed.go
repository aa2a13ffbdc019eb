package cuda

import (
	"slices"

	"github.com/rpac-dev/rpac/ir"
)

// Values written as bf16 by their producers. Under bf16 GEMMs a value that
// only GEMMs read (a Linear's x, a LinearGradX's dy, either input of a
// LinearGradW) is needed only as its padded bf16 copy: rows of bf16LD(cols)
// elements, which f32_to_bf16_pad_kernel would make from the fp32 value
// before each GEMM that reads it (twice for a forward activation: its
// Linear, then its weight gradient in the backward, the staging buffer
// long reused in between). When the producer is a generated elementwise
// chain or a LayerNorm, it writes that copy itself, into the value's own
// buffer (2·rows·bf16LD(cols) bytes fit in the 4·rows·cols of its fp32
// slot), and the GEMMs read it as it is: no fp32 write, no conversion. The
// producer rounds each result with the conversion kernel's f32_to_bf16, so
// the GEMMs see the same bits. Options.Pack off keeps the fp32 value (to
// compare), and the twins below too.

// gemmShapeOf is the GEMM a Linear, LinearGradX or LinearGradW node runs
// (before any split), from its inputs' shapes; ok is false for other ops.
func gemmShapeOf(op ir.OpName, in []*ir.Value) (s GemmShape, ok bool) {
	switch op {
	case ir.OpLinear: // y = x·Wᵀ
		N, K := in[1].Shape[0], in[1].Shape[1]
		return GemmShape{TransB: true, M: in[0].Shape.Numel() / max(1, K), N: N, K: K, Batch: 1}, true
	case ir.OpLinearGradX: // dx = dy·W
		N, K := in[1].Shape[0], in[1].Shape[1]
		return GemmShape{M: in[0].Shape.Numel() / max(1, N), N: K, K: N, Batch: 1}, true
	case ir.OpLinearGradW: // dW = dyᵀ·x
		N, K := lastDim(in[0].Shape), lastDim(in[1].Shape)
		return GemmShape{TransA: true, M: N, N: K, K: in[0].Shape.Numel() / max(1, N), Batch: 1}, true
	}
	return GemmShape{}, false
}

// gemmReads sorts v's reads: gemm counts those as a dense operand of a
// Linear-family GEMM that runs in bf16 and sees v as rows of its last
// dimension (so one padded copy serves them all), other every other read
// (a graph output counts as one); last is the index in the graph's nodes
// of the last GEMM read. dyOnly admits only the dy of LinearGradX and
// LinearGradW (the lazy Concats of joined gradients).
func (p *program) gemmReads(v *ir.Value, dyOnly bool) (gemm, other, last int) {
	for _, o := range p.g.Outputs {
		if o == v {
			other++
		}
	}
	for k, m := range p.g.Nodes {
		for i, x := range m.Inputs {
			if x != v {
				continue
			}
			if !p.bf16Operand(m, i, v, dyOnly) {
				other++
				continue
			}
			gemm, last = gemm+1, k
		}
	}
	return gemm, other, last
}

// bf16Operand: input i of node m, value v, is a read gemmReads counts as
// a bf16 GEMM's.
func (p *program) bf16Operand(m *ir.Node, i int, v *ir.Value, dyOnly bool) bool {
	if !operandSlot(m.Op, i, dyOnly) {
		return false
	}
	s, _ := gemmShapeOf(m.Op, m.Inputs)
	r, c := s.StoredA()
	if i == 1 {
		r, c = s.StoredB()
	}
	return p.bf16GEMM(s) && c == lastDim(v.Shape) && r*c == v.Shape.Numel()
}

// bf16Candidate: v is an fp32 intermediate of rows of at least 8 elements
// under bf16 GEMMs, a value whose producer may write a bf16 copy.
func (p *program) bf16Candidate(v *ir.Value) bool {
	return p.be.gemm == ir.BF16 && v.Kind == ir.Intermediate && v.DType == ir.F32 && len(v.Shape) > 0 && lastDim(v.Shape) >= 8
}

// onlyBF16GEMMsRead: v is an intermediate value, no graph output, read at
// least once and only by GEMMs gemmReads counts.
func (p *program) onlyBF16GEMMsRead(v *ir.Value, dyOnly bool) bool {
	if !p.bf16Candidate(v) {
		return false
	}
	gemm, other, _ := p.gemmReads(v, dyOnly)
	return gemm > 0 && other == 0
}

// operandSlot: input i of op is a GEMM operand onlyBF16GEMMsRead admits
// (not a weight, which has its persistent copy, nor a bias).
func operandSlot(op ir.OpName, i int, dyOnly bool) bool {
	switch op {
	case ir.OpLinear:
		return i == 0 && !dyOnly
	case ir.OpLinearGradX:
		return i == 0
	case ir.OpLinearGradW:
		return i == 0 || (i == 1 && !dyOnly)
	}
	return false
}

// packsOutput: node n writes its result as the padded bf16 copy its GEMM
// readers take: a generated chain (FusedElementwise) or a LayerNorm.
func (p *program) packsOutput(n *ir.Node) bool {
	if !p.be.pack || len(n.Outputs) != 1 {
		return false
	}
	switch n.Op {
	case ir.OpFusedElementwise, ir.OpLayerNorm:
	default:
		return false
	}
	o := n.Outputs[0]
	if s := p.vals[o.ID].slot; s >= 0 {
		for _, x := range n.Inputs { // in place: the bf16 rows would overrun inputs not yet read
			if p.vals[x.ID].slot == s {
				return false
			}
		}
	}
	return p.onlyBF16GEMMsRead(o, false)
}

// outputType is the type the GEMM s (a Linear's or a LinearGradX's, with
// the bias epilogue where biased) writes its result o in: BF16 where
// halfOutput says so and the device's cuBLASLt has a bf16 result with an
// fp32 bias (halfBiasOK), o then marked half for the chains that read it;
// else F32.
func (p *program) outputType(s GemmShape, o *dval, biased bool) DType {
	if (biased && !p.be.halfBiasOK()) || !p.halfOutput(s, o) {
		return F32
	}
	p.markHalf(o.v)
	return BF16
}

// halfBiasOK: the device's cuBLASLt offers an algorithm for a bf16 GEMM
// with a bf16 result and the fp32 bias epilogue (asked once, on a probe
// plan of every pointer 256-byte aligned); without one, biased GEMMs keep
// fp32 results.
func (b *Backend) halfBiasOK() bool {
	b.probeOnce.Do(func() {
		k := GemmKey{Shape: GemmShape{TransB: true, M: 256, N: 256, K: 256, Batch: 1}, AB: BF16, Align: [3]uint16{256, 256, 256},
			BiasAlign: 256, C: BF16}
		b.biasBF16 = b.dev.hasAlgo(k)
	})
	return b.biasBF16
}

// halfOutput: the bf16 GEMM s writes its result o rounded to bf16 in its
// epilogue (Options.BF16Act): o is an fp32 intermediate, no
// graph output, read only by generated chains, each reading it whole (o
// has their output's shape) and writing elsewhere than o's plan slot
// (bf16 elements under an fp32 result would be overwritten before they
// are read), or through a Reshape sharing its buffer by attentions that
// take the GEMM path, as their q, k or v (which they pack to bf16
// themselves: the same bits). The Reshape's result is marked half too.
func (p *program) halfOutput(s GemmShape, o *dval) bool {
	if !p.be.bf16Act || !p.bf16GEMM(s) || !p.bf16Candidate(o.v) || p.isOutput(o.v) {
		return false
	}
	readers := 0
	var views []*ir.Value
	for _, m := range p.g.Nodes {
		if !slices.Contains(m.Inputs, o.v) {
			continue
		}
		r := m.Outputs[0]
		switch {
		case m.Op == ir.OpReshape && p.vals[r.ID].buf.Ptr == o.buf.Ptr && !p.isOutput(r) && p.packedByAttention(r):
			views = append(views, r)
		case m.Op != ir.OpFusedElementwise || !r.Shape.Equal(o.v.Shape) || (o.slot >= 0 && p.vals[r.ID].slot == o.slot):
			return false
		}
		readers++
	}
	if readers == 0 {
		return false
	}
	for _, r := range views {
		p.markHalf(r)
	}
	return true
}

// isOutput: v is a graph output.
func (p *program) isOutput(v *ir.Value) bool {
	for _, o := range p.g.Outputs {
		if o == v {
			return true
		}
	}
	return false
}

// markHalf records that v's buffer holds bf16 elements.
func (p *program) markHalf(v *ir.Value) {
	if p.half == nil {
		p.half = map[int]bool{}
	}
	p.half[v.ID] = true
}

// packedByAttention: v is read only as the q, k or v of FusedAttention or
// FusedAttentionGrad nodes that take the GEMM path (attngemm.go), whose
// kernels read those operands only to pack them to bf16.
func (p *program) packedByAttention(v *ir.Value) bool {
	reads := 0
	for _, m := range p.g.Nodes {
		in, first := m.Inputs, 0
		switch m.Op {
		case ir.OpFusedAttention:
		case ir.OpFusedAttentionGrad:
			in, _, _ = ir.SplitAttentionGrad(m.Attrs, m.Inputs)
			first = 1 // after dO
		default:
			if slices.Contains(m.Inputs, v) {
				return false
			}
			continue
		}
		for i, x := range in {
			if x != v {
				continue
			}
			if i < first || i > first+2 || len(in) < first+3 || !p.attentionTakesGEMM(m, in[first:], m.Op == ir.OpFusedAttentionGrad) {
				return false
			}
			reads++
		}
	}
	return reads > 0
}

// attentionTakesGEMM: attention node m, of inputs q, k, v and (a fourth)
// the mask, runs on the GEMM path (newAttention's choice, which the mask's
// partial sums in the work buffer take part in).
func (p *program) attentionTakesGEMM(m *ir.Node, in []*ir.Value, grad bool) bool {
	var mask *dval
	if len(in) > 3 {
		mask = p.vals[in[3].ID]
	}
	a, err := newAttention(m, p.vals[in[0].ID], p.vals[in[1].ID], p.vals[in[2].ID], mask, p.be.gemm, p.be.attention, grad || p.hasAttentionGrad())
	return err == nil && a.path == attnGEMM
}

// packInto marks o as written packed, rows of cols. On the simulator,
// whose plan slots are allocations of their own that end flush against a
// guard page (so start 4-byte aligned), o gets an allocation of exactly
// its padded bf16 rows instead: 16-byte aligned for the chain's 16-byte
// stores, the guard page right after the last row. The device's slots
// (offsets in one arena) are 256-byte aligned.
func (p *program) packInto(o *dval, cols int) error {
	if p.packed == nil {
		p.packed = map[int]bool{}
	}
	p.packed[o.v.ID] = true
	if !p.be.dev.separateSlots() {
		return nil
	}
	b, err := p.alloc(o.n / cols * bf16LD(cols) / 2)
	if err != nil {
		return err
	}
	o.buf = b
	return nil
}

// Twins. A value that bf16 GEMMs read and something else reads too (the
// column sum of a bias gradient, a LayerNorm, a graph output) keeps its
// fp32 result; when a generated chain produces it, the chain also writes
// the bf16 copy the GEMMs take, into a buffer of its own: no fp32 re-read
// and no conversion launch. Where the value is a part of a lazy Concat
// that only bf16 GEMMs read (the joined gradients' D), and every part
// comes from a generated chain, each chain writes its columns of the
// Concat's bf16 rows, and the Concat needs no f32_cat_to_bf16_pad_kernel.
// The copies' buffers are the program's, each reused by a later copy of
// the same size once the last GEMM that reads it has run, twinPoolBytes
// at most in all (a value past that is converted as before). The padding
// columns of a copy are never written and never read by the GEMMs; a
// buffer starts zeroed, so they hold zeros or an earlier copy's
// values, never the uninitialised bytes of a fresh allocation.

// twin is where a bf16 copy goes: rows of ld elements in buf, the value's
// columns from off on (a Concat's part: its place in the Concat's rows).
type twin struct {
	buf     Buffer
	ld, off int
}

// twinPoolBytes bounds the twins' buffers of one program (at the paper
// preset the step's peak is a few hundred MB).
const twinPoolBytes = 1 << 30

// pooled is a twin buffer and the index of the last node that reads what
// it holds now.
type pooled struct {
	buf       Buffer
	freeAfter int
}

// twinFor is where the generated chain of node n writes a bf16 copy of
// its result beside the fp32 one; ok is false for none.
func (p *program) twinFor(n *ir.Node) (t twin, ok bool, err error) {
	o := n.Outputs[0]
	if !p.be.pack || p.be.gemm != ir.BF16 || o.Kind != ir.Intermediate || o.DType != ir.F32 {
		return twin{}, false, nil
	}
	if t, ok := p.parts[o.ID]; ok { // a Concat's part, placed with the first
		return t, true, nil
	}
	if c := p.twinnedConcat(o); c != nil {
		return p.placeConcat(c, o, p.index(n))
	}
	if !p.bf16Candidate(o) {
		return twin{}, false, nil
	}
	gemm, other, last := p.gemmReads(o, false)
	if gemm == 0 || other == 0 { // no GEMM wants it, or packsOutput's case
		return twin{}, false, nil
	}
	return p.newTwin(o, p.index(n), last)
}

// newTwin gives v a bf16 copy of its own (rows of bf16LD of its last dim)
// in a pool buffer, written at node index first and read last at last;
// ok is false when the pool is full.
func (p *program) newTwin(v *ir.Value, first, last int) (twin, bool, error) {
	cols := lastDim(v.Shape)
	t := twin{ld: bf16LD(cols)}
	buf, ok, err := p.twinBuffer(uint64(2*v.Shape.Numel()/cols*t.ld), first, last)
	if !ok || err != nil {
		return twin{}, false, err
	}
	t.buf = buf
	if p.twins == nil {
		p.twins = map[int]twin{}
	}
	p.twins[v.ID] = t
	return t, true, nil
}

// twinnedConcat is the lazy Concat among v's readers whose parts can all
// write its bf16 rows: it folds (foldsConcat), each part is a distinct
// fp32 intermediate made by a FusedElementwise node. Nil if none.
func (p *program) twinnedConcat(v *ir.Value) *ir.Node {
	for _, m := range p.g.Nodes {
		if m.Op != ir.OpConcat || !slices.Contains(m.Inputs, v) || !p.foldsConcat(m) {
			continue
		}
		seen := map[*ir.Value]bool{}
		all := true
		for _, x := range m.Inputs {
			prod := p.producer[x.ID]
			if seen[x] || x.DType != ir.F32 || prod == nil || prod.Op != ir.OpFusedElementwise {
				all = false
				break
			}
			seen[x] = true
		}
		if all {
			return m
		}
	}
	return nil
}

// placeConcat allocates the bf16 rows of lazy Concat c, whose first part
// o its producer, node index first, writes now, and records where every
// part goes. A part already placed in another Concat's rows (a value
// joined twice) leaves c to f32_cat_to_bf16_pad_kernel.
func (p *program) placeConcat(c *ir.Node, o *ir.Value, first int) (twin, bool, error) {
	for _, x := range c.Inputs {
		if _, taken := p.parts[x.ID]; taken {
			return twin{}, false, nil
		}
	}
	out := c.Outputs[0]
	gemm, _, last := p.gemmReads(out, true)
	if gemm == 0 {
		return twin{}, false, nil
	}
	t, ok, err := p.newTwin(out, first, last)
	if !ok || err != nil {
		return twin{}, false, err
	}
	if p.parts == nil {
		p.parts = map[int]twin{}
	}
	for _, x := range c.Inputs {
		p.parts[x.ID] = t
		t.off += lastDim(x.Shape)
	}
	return p.parts[o.ID], true, nil
}

// twinBuffer is a buffer of bytes for a copy (or a folded column sum's
// partials, chainsum.go) written at node index first and read last at
// node index last: one of the pool's of that size free by
// then, or a new one while the pool stays within twinPoolBytes (ok is
// false past that).
func (p *program) twinBuffer(bytes uint64, first, last int) (Buffer, bool, error) {
	for i, b := range p.twinPool {
		if b.buf.Bytes == bytes && b.freeAfter < first {
			p.twinPool[i].freeAfter = last
			return b.buf, true, nil
		}
	}
	if p.twinBytes+bytes > twinPoolBytes {
		return Buffer{}, false, nil
	}
	b, err := p.alloc(int((bytes + 3) / 4))
	if err != nil {
		return Buffer{}, false, err
	}
	b.Bytes = bytes
	if err := p.be.dev.zero(b, bytes); err != nil { // the padding columns, never written, hold zeros as the staging copies' do
		return Buffer{}, false, err
	}
	p.twinBytes += bytes
	p.twinPool = append(p.twinPool, pooled{buf: b, freeAfter: last})
	return b, true, nil
}

// index is node n's place in the graph's node order (the steps' order),
// found by ID (n may stand in for the graph's node: oneStepChain).
func (p *program) index(n *ir.Node) int {
	if p.nodeIndex == nil {
		p.nodeIndex = map[int]int{}
		for k, m := range p.g.Nodes {
			p.nodeIndex[m.ID] = k
		}
	}
	return p.nodeIndex[n.ID]
}

// attnGradRows: the GEMM attention's backward (FusedAttentionGrad node n,
// [B,T,H,Hd] operands) writes dq, dk and dv as bf16 straight into the rows
// of the lazy Concat that joins them (the q, k, v projections' joined
// gradients), when each of the Concat's parts is a Reshape to [B,T,H·Hd]
// of one of n's first three outputs that nothing else reads. cols[j] is
// output j's first column in those rows, -1 for an output not among them.
func (p *program) attnGradRows(n *ir.Node) (t twin, cols [3]int, ok bool, err error) {
	cols = [3]int{-1, -1, -1}
	if !p.be.pack || p.be.gemm != ir.BF16 {
		return twin{}, cols, false, nil
	}
	var c *ir.Node
	for _, m := range p.g.Nodes {
		if m.Op == ir.OpConcat && p.foldsConcat(m) && p.partsFrom(m, n) {
			c = m
			break
		}
	}
	if c == nil {
		return twin{}, cols, false, nil
	}
	out := c.Outputs[0]
	for _, x := range c.Inputs {
		if _, taken := p.parts[x.ID]; taken {
			return twin{}, cols, false, nil
		}
	}
	gemm, _, last := p.gemmReads(out, true)
	if gemm == 0 {
		return twin{}, cols, false, nil
	}
	if t, ok, err = p.newTwin(out, p.index(n), last); !ok || err != nil {
		return twin{}, cols, false, err
	}
	off := 0
	for _, x := range c.Inputs {
		src := p.producer[x.ID].Inputs[0]
		cols[slices.Index(n.Outputs, src)] = off
		off += lastDim(x.Shape)
	}
	return t, cols, true, nil
}

// partsFrom: every part of Concat c is a Reshape of a distinct one of
// node n's first three outputs (dq, dk, dv of [B,T,H,Hd]) to rows of H·Hd,
// the Reshape's only reader c and the output's only reader the Reshape.
func (p *program) partsFrom(c, n *ir.Node) bool {
	seen := map[*ir.Value]bool{}
	for _, x := range c.Inputs {
		r := p.producer[x.ID]
		if r == nil || r.Op != ir.OpReshape || seen[r.Inputs[0]] {
			return false
		}
		src := r.Inputs[0]
		j := slices.Index(n.Outputs, src)
		if j < 0 || j > 2 || len(src.Shape) != 4 || lastDim(x.Shape) != src.Shape[2]*src.Shape[3] ||
			p.readers(src) != 1 || p.readers(x) != 1 {
			return false
		}
		seen[src] = true
	}
	return len(seen) > 0
}

// readers counts v's reads by nodes and as a graph output.
func (p *program) readers(v *ir.Value) int {
	k := 0
	for _, m := range p.g.Nodes {
		for _, x := range m.Inputs {
			if x == v {
				k++
			}
		}
	}
	for _, o := range p.g.Outputs {
		if o == v {
			k++
		}
	}
	return k
}

// attnOutTwin: the GEMM attention's forward (FusedAttention node n,
// [B,T,H,Hd]) also writes its output as bf16 for the GEMMs that read it
// through a Reshape to [B,T,H·Hd] (the output projection, and its weight
// gradient in the backward), the fp32 output staying for its other
// readers (the attention's backward); ok is false for none.
func (p *program) attnOutTwin(n *ir.Node) (t twin, ok bool, err error) {
	o := n.Outputs[0]
	if !p.be.pack || p.be.gemm != ir.BF16 || len(o.Shape) != 4 {
		return twin{}, false, nil
	}
	for _, m := range p.g.Nodes {
		if m.Op != ir.OpReshape || m.Inputs[0] != o {
			continue
		}
		r := m.Outputs[0]
		if !p.bf16Candidate(r) || lastDim(r.Shape) != o.Shape[2]*o.Shape[3] {
			continue
		}
		gemm, _, last := p.gemmReads(r, false)
		if gemm == 0 {
			continue
		}
		return p.newTwin(r, p.index(n), last)
	}
	return twin{}, false, nil
}
