package cuda

import (
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// ExpertFFN and ExpertFFNGrad (src/expert.cu): the expert's tokens listed
// on the device, fp32 tiled products over those rows only, whose count the
// kernels read on the device (nothing goes to the host). The dense form's
// GEMMs run on cuBLASLt in bf16; these run on the CUDA cores in fp32: the
// path is opt-in (passes.DispatchRouted) until a GPU has measured it.

// expertGEMM is one product of expert_gemm_f32: C = A·B (+ bias) with
// the operands' element strides, M (dyn 1) or K (dyn 2) the routed count.
type expertGEMM struct {
	c, a, b, bias uint64
	dyn, m, n, k  int
	sai, sak, sbk int64
	sbj, ldc      int64
	rows          uint64
	capRows       int
	expectedRows  float64 // for the performance model: the rows the routing is expected to give
}

func (p *program) expertGEMM(g expertGEMM) error {
	m := g.m
	if g.dyn == 1 {
		m = g.capRows
	}
	grid := [3]uint32{uint32((g.n + expertTile - 1) / expertTile), uint32(max(1, (m+expertTile-1)/expertTile)), 1}
	if h, ok := p.be.dev.(workHinter); ok {
		M, K := float64(g.m), float64(g.k)
		if g.dyn == 1 {
			M = g.expectedRows
		} else {
			K = g.expectedRows
		}
		h.hintWork(4*(M*K+K*float64(g.n)+M*float64(g.n)), 2*M*K*float64(g.n))
	}
	return p.launch("expert_gemm_f32", grid, [3]uint32{expertTile * expertTile, 1, 1}, 0, g.c, g.a, g.b, g.bias, g.rows,
		int64(g.capRows), int32(g.dyn), int32(g.m), int32(g.n), int32(g.k), g.sai, g.sak, g.sbk, g.sbj, g.ldc)
}

// expertTile is expert_gemm_f32's tile (EXPERT_TILE).
const expertTile = 16

// expertRoute is what an ExpertFFN node and its gradient share on the
// device: the geometry, the expert, the dropout and the routed rows
// (rows[0..N), the count at rows[N]) and the gathered x, both in the
// program's workspace (p.work, which the nodes share: they run one at a
// time, and these run no reduction), set by scratch when the node runs.
type expertRoute struct {
	s         ir.ExpertShape
	e, s1, s2 int
	thresh    uint64
	scale     float32
	rows, xg  Buffer
	expected  float64
}

func (p *program) newExpertRoute(n *ir.Node, x, w, w1 ir.Shape) (*expertRoute, error) {
	s, err := ir.ExpertShapeOf(x, w, w1)
	if err != nil {
		return nil, err
	}
	r := &expertRoute{s: s, e: ir.ExpertOf(n), expected: float64(s.N) * ir.ExpertShare(n, s.E)}
	r.s1, r.s2 = ir.ExpertStreams(n)
	r.thresh, r.scale = dropoutThreshold(n.Attrs.Float("p", 0))
	return r, nil
}

// scratch places the rows, the gathered x and then parts of sizes floats
// each in the program's workspace (needScratch said how much): their
// buffers for this run.
func (p *program) scratch(r *expertRoute, sizes ...int) []Buffer {
	off := uint64(4 * (r.s.N + 1 + r.s.N*r.s.D))
	r.rows, r.xg = Buffer{Ptr: p.work.Ptr}, Buffer{Ptr: p.work.Ptr + uint64(4*(r.s.N+1))}
	var out []Buffer
	for _, n := range sizes {
		out = append(out, Buffer{Ptr: p.work.Ptr + off})
		off += uint64(4 * n)
	}
	return out
}

// needScratch records the workspace a node of r needs: the rows, the
// gathered x and extra floats.
func (p *program) needScratch(r *expertRoute, extra int) {
	p.needWork((r.s.N + 1 + r.s.N*r.s.D + extra + 1) / 2)
}

// route lists the expert's tokens and gathers their rows of x.
func (p *program) expertRoute(r *expertRoute, w, x Buffer) error {
	s := r.s
	if err := p.launch("expert_route_i32", [3]uint32{1, 1, 1}, [3]uint32{threads, 1, 1}, 0, r.rows.Ptr, w.Ptr,
		int32(s.E), int32(r.e), int64(s.N)); err != nil {
		return err
	}
	return p.expertEach(r, 2, "expert_gather_f32", s.N*s.D, r.xg.Ptr, x.Ptr, r.rows.Ptr, int32(s.D), int64(s.N*s.D))
}

// key is the stream key of this run's draws from stream id.
func (p *program) key(id int) uint64 { return kernels.StreamKey(p.seed, id) }

func (p *program) buildExpertFFN(n *ir.Node, in, out []*dval) (func() error, error) {
	r, err := p.newExpertRoute(n, in[0].v.Shape, in[1].v.Shape, in[2].v.Shape)
	if err != nil {
		return nil, err
	}
	s := r.s
	p.needScratch(r, 0)
	return func() error {
		p.scratch(r)
		x, w, w1, b1, w2, b2 := in[0].buf, in[1].buf, in[2].buf, in[3].buf, in[4].buf, in[5].buf
		o, u, a, h := out[0].buf, out[1].buf, out[2].buf, out[3].buf
		if err := p.expertRoute(r, w, x); err != nil {
			return err
		}
		nt := func(c, a, b, bias uint64, n, k int) expertGEMM { // C[R,n] = A[R,k]·B[n,k]ᵀ + bias
			return expertGEMM{c: c, a: a, b: b, bias: bias, dyn: 1, m: s.N, n: n, k: k, sai: int64(k), sak: 1, sbk: 1, sbj: int64(k),
				ldc: int64(n), rows: r.rows.Ptr, capRows: s.N, expectedRows: r.expected}
		}
		if err := p.expertGEMM(nt(u.Ptr, r.xg.Ptr, w1.Ptr, b1.Ptr, s.F, s.D)); err != nil {
			return err
		}
		if err := p.expertEach(r, 2, "expert_act_f32", s.N*s.F, a.Ptr, u.Ptr, r.rows.Ptr, int32(s.F), p.key(r.s1), r.thresh, r.scale, int64(s.N*s.F)); err != nil {
			return err
		}
		if err := p.expertGEMM(nt(h.Ptr, a.Ptr, w2.Ptr, b2.Ptr, s.D, s.F)); err != nil {
			return err
		}
		if err := p.expertEach(r, 2, "expert_drop_f32", s.N*s.D, h.Ptr, r.rows.Ptr, int32(s.D), p.key(r.s2), r.thresh, r.scale, int64(s.N*s.D)); err != nil {
			return err
		}
		if err := p.zero(o, s.N*s.D); err != nil {
			return err
		}
		return p.expertEach(r, 2, "expert_scatter_f32", s.N*s.D, o.Ptr, h.Ptr, w.Ptr, r.rows.Ptr, int32(s.D), int32(s.E), int32(r.e), int64(s.N*s.D))
	}, nil
}

func (p *program) buildExpertFFNGrad(n *ir.Node, in, out []*dval) (func() error, error) {
	r, err := p.newExpertRoute(n, in[1].v.Shape, in[2].v.Shape, in[3].v.Shape)
	if err != nil {
		return nil, err
	}
	s := r.s
	p.needScratch(r, s.N*s.D+s.N*s.F)
	return func() error {
		sc := p.scratch(r, s.N*s.D, s.N*s.F)
		dh, dz := sc[0], sc[1]
		dout, x, w, w1, w2, u, a, h := in[0].buf, in[1].buf, in[2].buf, in[3].buf, in[4].buf, in[5].buf, in[6].buf, in[7].buf
		dx, dw, dw1, db1, dw2, db2 := out[0].buf, out[1].buf, out[2].buf, out[3].buf, out[4].buf, out[5].buf
		if err := p.expertRoute(r, w, x); err != nil {
			return err
		}
		if err := p.zero(dw, s.N*s.E); err != nil {
			return err
		}
		if err := p.expertEach(r, 3*float64(s.D), "expert_out_grad_f32", s.N, dh.Ptr, dw.Ptr, dout.Ptr, w.Ptr, h.Ptr, r.rows.Ptr, int32(s.D), int32(s.E), int32(r.e),
			p.key(r.s2), r.thresh, r.scale, int64(s.N)); err != nil {
			return err
		}
		rows := r.rows.Ptr
		tn := func(c, a, b uint64, m, n int) expertGEMM { // C[m,n] = A[R,m]ᵀ·B[R,n]
			return expertGEMM{c: c, a: a, b: b, dyn: 2, m: m, n: n, k: s.N, sai: 1, sak: int64(m), sbk: int64(n), sbj: 1, ldc: int64(n),
				rows: rows, capRows: s.N, expectedRows: r.expected}
		}
		nn := func(c, a, b uint64, n, k int) expertGEMM { // C[R,n] = A[R,k]·B[k,n]
			return expertGEMM{c: c, a: a, b: b, dyn: 1, m: s.N, n: n, k: k, sai: int64(k), sak: 1, sbk: int64(n), sbj: 1, ldc: int64(n),
				rows: rows, capRows: s.N, expectedRows: r.expected}
		}
		steps := []func() error{
			func() error { return p.expertGEMM(tn(dw2.Ptr, dh.Ptr, a.Ptr, s.D, s.F)) },
			func() error { return p.expertColSum(r, db2, dh, s.D) },
			func() error { return p.expertGEMM(nn(dz.Ptr, dh.Ptr, w2.Ptr, s.F, s.D)) },
			func() error {
				return p.expertEach(r, 3, "expert_hidden_grad_f32", s.N*s.F, dz.Ptr, u.Ptr, rows, int32(s.F), p.key(r.s1), r.thresh, r.scale, int64(s.N*s.F))
			},
			func() error { return p.expertGEMM(tn(dw1.Ptr, dz.Ptr, r.xg.Ptr, s.F, s.D)) },
			func() error { return p.expertColSum(r, db1, dz, s.F) },
			func() error { return p.expertGEMM(nn(dh.Ptr, dz.Ptr, w1.Ptr, s.D, s.F)) },
			func() error { return p.zero(dx, s.N*s.D) },
			func() error {
				return p.expertEach(r, 2, "expert_scatter_f32", s.N*s.D, dx.Ptr, dh.Ptr, uint64(0), rows, int32(s.D), int32(s.E), int32(r.e), int64(s.N*s.D))
			},
		}
		for _, f := range steps {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

// expertColSum sets db[j] = Σ over the routed rows of m[r,j].
func (p *program) expertColSum(r *expertRoute, db, m Buffer, W int) error {
	return p.expertEach(r, float64(r.s.N), "expert_colsum_f32", W, db.Ptr, m.Ptr, r.rows.Ptr, int64(r.s.N), int32(W))
}

// expertEach launches a grid-stride kernel of src/expert.cu over n
// elements of the capacity, stating the DRAM traffic of the rows the
// routing is expected to give: words fp32 words per element of a full
// capacity, scaled to the expected rows.
func (p *program) expertEach(r *expertRoute, words float64, name string, n int, args ...any) error {
	if h, ok := p.be.dev.(costHinter); ok && n > 0 {
		h.hintBytes(4 * words * float64(n) * r.expected / float64(max(1, r.s.N)))
	}
	return p.each(name, n, args...)
}
