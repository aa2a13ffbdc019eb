package passes

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// The fold modes that write the RPA prior into the attention dot product:
// FoldRankMode refuses a layer whose bias clip cuts any visible entry (the
// rank form would not be exact there); FoldRankApproxMode drops the clip
// where it is active, so the logits differ from the dense fold's and
// --verify measures the CE cost.

// rankTol is the largest deviation (absolute, on the visible entries) of
// the rank form from the dense folded bias that FoldRank accepts when the
// clip is inactive; beyond it the form is not the bias and the pass fails.
const rankTol = 1e-4

// FoldRank folds the RPA prior of an eval-mode graph into the attention
// dot product instead of a [T,T] constant (FoldRPA). In eval mode the bias
// of a layer is, on the entries attention can see (j <= i),
//
//	B = a·(M·Φᵀ) + r_i + g_j + c
//
// where M = mbar·P [T,K] (running mean membership times the Sinkhorn plan),
// Φ [T,K] the soft position blocks, and a, r, g, c come from the posmix
// weight, the z-score's mean and standard deviation (scalars of the whole
// [T,T] matrix), τ_att, bias_scale and the position term
// -β·|i-j|/(T-1) = β·(j-i)/(T-1) for j <= i: affine maps of M·Φᵀ plus a
// per-query and a per-key term. The ±bias_clip is the one step that is
// not affine; where it cuts nothing it is the identity. Per-query terms
// (r_i, c) do not change a softmax over j, so with the attention scale s
//
//	q' = [q, a·M_i/s, 1/s],  k' = [k, Φ_j, g_j]
//
// give s·q'·k'ᵀ = s·q·kᵀ + B_ij - r_i - c: the same attention, no mask but
// the causal one, no [T,T] constant. FoldRank derives the form by walking
// the bias subgraph (MatMul, Scale, Add, Sub, Mul and Div by scalars,
// ZScore, NanToNum, Clamp; [T,T] constants and other static values that
// are a per-query plus a per-key term), evaluates the pieces on be, checks
// the form against the dense bias and rewrites each attention core
// (MatMul, Scale, Add bias, CausalMask, Softmax, MatMul) to read Concat(q,
// q-extension) and Concat(k, k-extension). v keeps its width.
//
// A layer whose clip cuts a visible entry is refused unless approx is set;
// then the clip is dropped there and the report gives the largest
// deviation from the dense bias. Everything the rewrite leaves dead is
// removed; FoldRPA then folds what remains of the RPA path (the value
// gamma). The report has one entry per layer, with Rank (the components
// added to q and k) and RankErr.
func FoldRank(g *ir.Graph, info *ModelInfo, st *kernels.Store, be kernels.Backend, approx bool) (*FoldReport, error) {
	if info == nil {
		return nil, fmt.Errorf("fold rank: graph %s comes without its model description (passes.Context.Model)", g.Name)
	}
	if !info.Eval || info.BatchStats {
		return nil, fmt.Errorf("fold rank: graph %s is built for training or with batch statistics; folding needs an eval graph with running statistics (model.Eval without BatchStats)", g.Name)
	}
	if err := checkRunning(g, info, st); err != nil {
		return nil, fmt.Errorf("fold rank: %w", err)
	}
	static := staticValues(g)
	uses := g.Uses()
	rep := &FoldReport{}
	var cores []attnMatch
	for _, n := range g.Nodes {
		if m, ok := matchAttention(g, n, uses, false); ok && m.bias != nil {
			cores = append(cores, m)
		}
	}
	if len(cores) == 0 {
		return nil, fmt.Errorf("fold rank: graph %s has no attention core with a bias (the baseline has no prior; use --fold rpa)", g.Name)
	}
	for i, m := range cores {
		if !static[m.bias] {
			return nil, fmt.Errorf("fold rank: the attention bias of core %d depends on the input; only the eval-mode RPA prior folds", i)
		}
		w := &rankWalker{g: g, st: st, be: be, T: m.bias.Shape[0], layer: layerOfBias(m.bias, info, i), approx: approx, vals: map[*ir.Value][]float64{}}
		fl, err := w.foldCore(m)
		if err != nil {
			return nil, fmt.Errorf("fold rank: %w", err)
		}
		rep.Layers = append(rep.Layers, fl)
	}
	if err := DCE(g); err != nil {
		return nil, err
	}
	return rep, nil
}

// checkRunning reports running-statistics buffers of the graph that st
// lacks (or holds with another shape).
func checkRunning(g *ir.Graph, info *ModelInfo, st *kernels.Store) error {
	var missing []string
	for _, rb := range info.Running {
		v := g.Lookup(rb.Name)
		if v == nil || v.Kind != ir.Buffer {
			continue
		}
		if storedValue(st, v) == nil {
			missing = append(missing, v.Name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("no running statistics %s; calibrate them on data first (rpac export --calib-batches N)", strings.Join(missing, ", "))
	}
	return nil
}

// staticValues marks the values that depend on no graph input.
func staticValues(g *ir.Graph) map[*ir.Value]bool {
	static := map[*ir.Value]bool{}
	for _, v := range g.Values {
		if v.Kind == ir.Const || v.Kind == ir.Param || v.Kind == ir.Buffer {
			static[v] = true
		}
	}
	for _, n := range g.Nodes {
		ok := !ir.Ops[n.Op].Random
		for _, in := range n.Inputs {
			ok = ok && static[in]
		}
		if ok {
			for _, o := range n.Outputs {
				static[o] = true
			}
		}
	}
	return static
}

// layerOfBias is the layer of the first stored tensor (parameter or
// buffer) that the model description assigns to a layer among those the
// bias is computed from, or def when there is none.
func layerOfBias(b *ir.Value, info *ModelInfo, def int) int {
	owner := info.layerOwners()
	seen := map[*ir.Value]bool{}
	stack := []*ir.Value{b}
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[v] {
			continue
		}
		seen[v] = true
		if l, ok := owner[v.Name]; ok && v.Kind != ir.Intermediate {
			return l
		}
		if v.Def != nil {
			stack = append(stack, v.Def.Inputs...)
		}
	}
	return def
}

// rankForm is Σ_t coef_t·A_t·Φ_tᵀ + row_i + col_j + c over a [T,T] matrix
// (row and col nil when zero).
type rankForm struct {
	terms    []rankTerm
	row, col []float64
	c        float64
}

// rankTerm is coef·A·Φᵀ with A and Φ [T,K] row-major.
type rankTerm struct {
	coef   float64
	a, phi []float64
	k      int
}

func (f *rankForm) scale(s float64) *rankForm {
	for i := range f.terms {
		f.terms[i].coef *= s
	}
	for i := range f.row {
		f.row[i] *= s
	}
	for i := range f.col {
		f.col[i] *= s
	}
	f.c *= s
	return f
}

func (f *rankForm) add(o *rankForm) *rankForm {
	f.terms = append(f.terms, o.terms...)
	f.row = addVec(f.row, o.row)
	f.col = addVec(f.col, o.col)
	f.c += o.c
	return f
}

func addVec(a, b []float64) []float64 {
	if a == nil {
		return append([]float64(nil), b...)
	}
	for i := range b {
		a[i] += b[i]
	}
	return a
}

// at is the form's value at (i, j).
func (f *rankForm) at(T, i, j int) float64 {
	x := f.c
	if f.row != nil {
		x += f.row[i]
	}
	if f.col != nil {
		x += f.col[j]
	}
	for _, t := range f.terms {
		var d float64
		for k := 0; k < t.k; k++ {
			d += t.a[i*t.k+k] * t.phi[j*t.k+k]
		}
		x += t.coef * d
	}
	return x
}

// rankWalker derives the rank form of one layer's bias.
type rankWalker struct {
	g        *ir.Graph
	st       *kernels.Store
	be       kernels.Backend
	T, layer int
	approx   bool
	vals     map[*ir.Value][]float64
	clip     float64 // bound of the symmetric clip met on the way
	clipFrac float64 // fraction of visible entries it cut
}

func (w *rankWalker) eval(v *ir.Value) ([]float64, error) {
	if d, ok := w.vals[v]; ok {
		return d, nil
	}
	if v.Kind == ir.Const && v.Data != nil {
		w.vals[v] = v.Data
		return v.Data, nil
	}
	r, err := evalStatic(w.g, []*ir.Value{v}, w.st, w.be)
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", w.layer, err)
	}
	w.vals[v] = r[v]
	return r[v], nil
}

func (w *rankWalker) scalar(v *ir.Value) (float64, error) {
	d, err := w.eval(v)
	if err != nil {
		return 0, err
	}
	return d[0], nil
}

func (w *rankWalker) isBias(v *ir.Value) bool {
	return len(v.Shape) == 2 && v.Shape[0] == w.T && v.Shape[1] == w.T
}

// form derives the rank form of the [T,T] value v.
func (w *rankWalker) form(v *ir.Value) (*rankForm, error) {
	n := v.Def
	if n == nil || !w.isBias(v) {
		return w.separable(v)
	}
	in := n.Inputs
	switch n.Op {
	case ir.OpMatMul:
		if f, ok, err := w.product(n); ok || err != nil {
			return f, err
		}
	case ir.OpScale:
		f, err := w.form(in[0])
		if err != nil {
			return nil, err
		}
		f = f.scale(n.Attrs.Float("alpha", 1))
		f.c += n.Attrs.Float("beta", 0)
		return f, nil
	case ir.OpStopGradient:
		return w.form(in[0])
	case ir.OpNeg:
		f, err := w.form(in[0])
		if err != nil {
			return nil, err
		}
		return f.scale(-1), nil
	case ir.OpAdd, ir.OpSub:
		return w.sum(n)
	case ir.OpMul, ir.OpDiv:
		return w.product2(n)
	case ir.OpZScore:
		return w.zscore(in[0])
	case ir.OpNanToNum:
		x, err := w.eval(in[0])
		if err != nil {
			return nil, err
		}
		for _, e := range x {
			if math.IsNaN(e) || math.IsInf(e, 0) {
				return nil, fmt.Errorf("layer %d: the bias holds NaN or ±Inf before its nan guard; the rank form cannot reproduce the guard (use --fold rpa)", w.layer)
			}
		}
		return w.form(in[0])
	case ir.OpClamp:
		return w.clamp(n)
	}
	return w.separable(v)
}

// product is a [T,K]·[T,K]ᵀ (or [T,K]·[K,T]) MatMul: one term.
func (w *rankWalker) product(n *ir.Node) (*rankForm, bool, error) {
	a, b := n.Inputs[0], n.Inputs[1]
	if len(a.Shape) != 2 || len(b.Shape) != 2 || n.Attrs.Bool("transA", false) || a.Shape[0] != w.T {
		return nil, false, nil
	}
	K := a.Shape[1]
	ad, err := w.eval(a)
	if err != nil {
		return nil, true, err
	}
	bd, err := w.eval(b)
	if err != nil {
		return nil, true, err
	}
	phi := bd
	if !n.Attrs.Bool("transB", false) { // b is [K,T]
		phi = make([]float64, w.T*K)
		for k := 0; k < K; k++ {
			for j := 0; j < w.T; j++ {
				phi[j*K+k] = bd[k*w.T+j]
			}
		}
	}
	return &rankForm{terms: []rankTerm{{coef: 1, a: ad, phi: phi, k: K}}}, true, nil
}

// sum is Add or Sub of two [T,T] forms, or of a form and a scalar.
func (w *rankWalker) sum(n *ir.Node) (*rankForm, error) {
	sign := 1.0
	if n.Op == ir.OpSub {
		sign = -1
	}
	a, b := n.Inputs[0], n.Inputs[1]
	switch {
	case w.isBias(a) && w.isBias(b):
		fa, err := w.form(a)
		if err != nil {
			return nil, err
		}
		fb, err := w.form(b)
		if err != nil {
			return nil, err
		}
		return fa.add(fb.scale(sign)), nil
	case w.isBias(a) && b.Shape.Numel() == 1:
		f, err := w.form(a)
		if err != nil {
			return nil, err
		}
		s, err := w.scalar(b)
		f.c += sign * s
		return f, err
	case w.isBias(b) && a.Shape.Numel() == 1:
		f, err := w.form(b)
		if err != nil {
			return nil, err
		}
		s, err := w.scalar(a)
		f = f.scale(sign)
		f.c += s
		return f, err
	}
	return w.separable(n.Outputs[0])
}

// product2 is Mul of a form by a scalar (either side) or Div by a scalar.
func (w *rankWalker) product2(n *ir.Node) (*rankForm, error) {
	a, b := n.Inputs[0], n.Inputs[1]
	if n.Op == ir.OpMul && a.Shape.Numel() == 1 && w.isBias(b) {
		a, b = b, a
	}
	if !w.isBias(a) || b.Shape.Numel() != 1 {
		return w.separable(n.Outputs[0])
	}
	s, err := w.scalar(b)
	if err != nil {
		return nil, err
	}
	if n.Op == ir.OpDiv {
		s = 1 / s
	}
	if math.IsNaN(s) || math.IsInf(s, 0) {
		return nil, fmt.Errorf("layer %d: the bias is scaled by %g", w.layer, s)
	}
	f, err := w.form(a)
	if err != nil {
		return nil, err
	}
	return f.scale(s), nil
}

// zscore: (x - mean)/(std + 1e-6) over all T² entries (ir ZScore), an
// affine map with the scalars of the evaluated input.
func (w *rankWalker) zscore(x *ir.Value) (*rankForm, error) {
	d, err := w.eval(x)
	if err != nil {
		return nil, err
	}
	var mean float64
	for _, e := range d {
		mean += e
	}
	mean /= float64(len(d))
	var ss float64
	for _, e := range d {
		ss += (e - mean) * (e - mean)
	}
	sd := math.Sqrt(ss / float64(max(1, len(d)-1)))
	f, err := w.form(x)
	if err != nil {
		return nil, err
	}
	f = f.scale(1 / (sd + 1e-6))
	f.c -= mean / (sd + 1e-6)
	return f, nil
}

// clamp is the identity where it cuts no visible entry; otherwise an
// error, or (approx) dropped with its hit fraction recorded.
func (w *rankWalker) clamp(n *ir.Node) (*rankForm, error) {
	lo := n.Attrs.Float("lo", math.Inf(-1))
	hi := n.Attrs.Float("hi", math.Inf(1))
	if _, ok := n.Attrs["lo"]; !ok {
		lo = math.Inf(-1)
	}
	if _, ok := n.Attrs["hi"]; !ok {
		hi = math.Inf(1)
	}
	x, err := w.eval(n.Inputs[0])
	if err != nil {
		return nil, err
	}
	hit, cnt := 0, 0
	for i := 0; i < w.T; i++ {
		for j := 0; j <= i; j++ {
			if e := x[i*w.T+j]; e < lo || e > hi {
				hit++
			}
			cnt++
		}
	}
	frac := float64(hit) / float64(max(1, cnt))
	if lo == -hi {
		w.clip, w.clipFrac = hi, frac
	}
	if hit > 0 && !w.approx {
		return nil, fmt.Errorf("layer %d at T=%d: the bias clip [%g, %g] cuts %.3g%% of the visible entries, so the rank form would not be exact; use --fold rank-approx (--verify reports its CE cost) or --fold rpa",
			w.layer, w.T, lo, hi, 100*frac)
	}
	return w.form(n.Inputs[0])
}

// separable evaluates a static [T,T] value and writes it as row_i + col_j
// on the visible entries (j <= i), when it is one.
func (w *rankWalker) separable(v *ir.Value) (*rankForm, error) {
	what := "value " + v.Name
	if v.Def != nil {
		what = "the result of " + string(v.Def.Op)
	}
	if !w.isBias(v) {
		return nil, fmt.Errorf("layer %d: the bias is computed from %s %v, which the rank form does not take apart (--fold rank needs the RPA prior; use --fold rpa)", w.layer, what, v.Shape)
	}
	d, err := w.eval(v)
	if err != nil {
		return nil, err
	}
	T := w.T
	col := make([]float64, T)
	row := make([]float64, T)
	copy(col, d[(T-1)*T:])
	var scale float64
	for i := 0; i < T; i++ {
		row[i] = d[i*T] - col[0]
		for j := 0; j <= i; j++ {
			scale = math.Max(scale, math.Abs(d[i*T+j]))
		}
	}
	for i := 0; i < T; i++ {
		for j := 0; j <= i; j++ {
			if math.Abs(row[i]+col[j]-d[i*T+j]) > 1e-6*math.Max(1, scale) {
				return nil, fmt.Errorf("layer %d: the bias is computed from %s [%d,%d], which is neither a low-rank product nor a per-query plus per-key term (--fold rank needs the RPA prior; use --fold rpa)", w.layer, what, T, T)
			}
		}
	}
	return &rankForm{row: row, col: col}, nil
}

// foldCore derives the form of m's bias, checks it and rewrites the core.
func (w *rankWalker) foldCore(m attnMatch) (FoldLayer, error) {
	fl := FoldLayer{Layer: w.layer, T: w.T}
	f, err := w.form(m.bias)
	if err != nil {
		return fl, err
	}
	dense, err := w.eval(m.bias)
	if err != nil {
		return fl, err
	}
	qe, ke, width := rankFactors(f, w.T, m.scale)
	fl.Min, fl.Max, fl.Mean = visibleStats(dense, w.T)
	fl.Clip, fl.ClipFrac = w.clip, w.clipFrac
	fl.Rank = width
	fl.RankErr = rankError(qe, ke, dense, w.T, width, m.scale)
	if fl.ClipFrac == 0 && !(fl.RankErr <= rankTol*math.Max(1, math.Max(math.Abs(fl.Min), math.Abs(fl.Max)))) {
		return fl, fmt.Errorf("layer %d at T=%d: the rank form deviates from the dense bias by %g (over %g); use --fold rpa", w.layer, w.T, fl.RankErr, rankTol)
	}
	fl.Name = fmt.Sprintf("blocks.%d.attn.rpa_q.T%d", w.layer, w.T)
	if err := rewriteCore(w.g, m, qe, ke, width, fl.Name, fmt.Sprintf("blocks.%d.attn.rpa_k.T%d", w.layer, w.T)); err != nil {
		return fl, err
	}
	return fl, nil
}

// rankFactors lays the form out as the extra components of q and k
// ([T,width] each, row-major): per term coef·A/s (each row centred, the
// mean moved onto a per-query constant, see below) against Φ, then 1/s
// against col. Centring keeps the components small when A's rows are
// nearly uniform, which matters in half precision: Φ's rows sum to 1 up
// to 1e-6 relative, so the shift changes a product by at most that much
// of the row mean (inside the measured RankErr).
func rankFactors(f *rankForm, T int, s float64) (qe, ke []float64, width int) {
	for _, t := range f.terms {
		width += t.k
	}
	hasCol := f.col != nil
	if hasCol {
		width++
	}
	qe = make([]float64, T*width)
	ke = make([]float64, T*width)
	at := 0
	for _, t := range f.terms {
		for i := 0; i < T; i++ {
			var mean float64
			for k := 0; k < t.k; k++ {
				mean += t.a[i*t.k+k]
			}
			mean /= float64(t.k)
			for k := 0; k < t.k; k++ {
				qe[i*width+at+k] = t.coef * (t.a[i*t.k+k] - mean) / s
				ke[i*width+at+k] = t.phi[i*t.k+k]
			}
		}
		at += t.k
	}
	if hasCol {
		for i := 0; i < T; i++ {
			qe[i*width+at] = 1 / s
			ke[i*width+at] = f.col[i]
		}
	}
	return qe, ke, width
}

// rankError is the largest deviation, over the visible entries, of
// s·qe·keᵀ from the dense bias once each row's constant offset (which the
// softmax ignores) is removed: the offset is taken at the diagonal.
func rankError(qe, ke, dense []float64, T, width int, s float64) float64 {
	var worst float64
	dot := func(i, j int) float64 {
		var d float64
		for k := 0; k < width; k++ {
			d += qe[i*width+k] * ke[j*width+k]
		}
		return s * d
	}
	for i := 0; i < T; i++ {
		off := dense[i*T+i] - dot(i, i)
		for j := 0; j < i; j++ {
			worst = math.Max(worst, math.Abs(dot(i, j)+off-dense[i*T+j]))
		}
	}
	return worst
}

// rewriteCore makes m's scores read Concat(q, qe)·Concat(k, ke)ᵀ (qe and
// ke broadcast over batch and heads) instead of adding the bias.
func rewriteCore(g *ir.Graph, m attnMatch, qe, ke []float64, width int, qName, kName string) error {
	if m.add == nil {
		return errors.New("attention core without a bias Add")
	}
	T := m.q.Shape[2]
	at := nodeIndex(g, m.mask)
	widen := func(x *ir.Value, name string, data []float64) (*ir.Value, error) {
		c := newConst(g, name, ir.Shape{T, width}, data)
		s := x.Shape.Clone()
		s[3] = width
		b, err := insertAt(g, at, "BroadcastTo", ir.Attrs{"shape": []int(s)}, c)
		if err != nil {
			return nil, err
		}
		at++
		o, err := insertAt(g, at, "Concat", ir.Attrs{"axis": 3}, x, b)
		at++
		return o, err
	}
	q, err := widen(m.q, qName, qe)
	if err != nil {
		return fmt.Errorf("fold rank: %w", err)
	}
	k, err := widen(m.k, kName, ke)
	if err != nil {
		return fmt.Errorf("fold rank: %w", err)
	}
	s, err := insertAt(g, at, "MatMul", ir.Attrs{"transB": true}, q, k)
	if err != nil {
		return fmt.Errorf("fold rank: %w", err)
	}
	at++
	sc, err := insertAt(g, at, "Scale", ir.Attrs{"alpha": m.scale, "beta": 0.0}, s)
	if err != nil {
		return fmt.Errorf("fold rank: %w", err)
	}
	replaceUses(g, m.add.Outputs[0], sc)
	return nil
}
