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

// FoldLayer describes the folded attention bias of one layer at one length.
type FoldLayer struct {
	Layer int    `json:"layer"`
	T     int    `json:"T"`
	Name  string `json:"name"` // the constant's name in the graph
	// Min, Max and Mean are taken over the entries attention can see
	// (j <= i); the entries above the diagonal are masked anyway.
	Min  float64 `json:"min"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
	// Clip is the bound of the symmetric clip (bias_clip) and ClipFrac the
	// fraction of the visible entries whose value before the clip lay
	// beyond it (|x| > Clip).
	Clip     float64 `json:"clip"`
	ClipFrac float64 `json:"clip_frac"`
	// Rank is the number of components a rank fold (FoldRank) adds to q
	// and k, and RankErr the largest deviation of that form from the
	// dense bias on the visible entries (each row's constant aside); zero
	// for the dense fold. Name is then the q-side constant.
	Rank    int     `json:"rank,omitempty"`
	RankErr float64 `json:"rank_err,omitempty"`
}

// FoldReport collects FoldLayer entries (per layer, per length).
type FoldReport struct {
	Layers []FoldLayer `json:"layers"`
}

// FoldRPA folds the RPA path of an eval-mode graph. In eval mode the
// attention prior of every layer is a function of the running statistics
// (the per-position mean membership of that layer and length), of
// parameters and of constants only, so it is the same for every input: the
// pass turns the running-statistics buffers into constants with their
// values from st, evaluates everything that depends on them and on nothing
// the input feeds (the [T,T] additive bias of each layer and the layer's
// value gamma), and puts constants in their place. The old subgraph is left
// dead for DCE.
//
// info is the graph's model description (its length and running-statistics
// buffers). It refuses a graph built with batch statistics or for training:
// those statistics depend on the batch and cannot be folded. A
// running-statistics buffer missing from st is an error naming it (see
// Calibrate). The report gives the range of each folded [T,T] bias and the
// fraction of its entries that the bias clip cut.
func FoldRPA(g *ir.Graph, info *ModelInfo, st *kernels.Store, be kernels.Backend) (*FoldReport, error) {
	if info == nil {
		return nil, fmt.Errorf("fold rpa: graph %s comes without its model description (passes.Context.Model)", g.Name)
	}
	if !info.Eval || info.BatchStats {
		return nil, fmt.Errorf("fold rpa: graph %s is built for training or with batch statistics; folding needs an eval graph with running statistics (model.Eval without BatchStats)", g.Name)
	}
	if err := checkRunning(g, info, st); err != nil {
		return nil, fmt.Errorf("fold rpa: %w", err)
	}
	// Running statistics become constants.
	layerOf := map[*ir.Value]int{}
	for _, rb := range info.Running {
		v := g.Lookup(rb.Name)
		if v == nil || v.Kind != ir.Buffer {
			continue // a layer whose statistic the graph no longer reads
		}
		v.Kind = ir.Const
		v.Data = st.Get(v.Name).Float64s()
		layerOf[v] = rb.Layer
	}
	rep := &FoldReport{}
	if len(layerOf) == 0 {
		return rep, nil
	}
	// dep: nodes computable without the input that read a running statistic
	// (directly or through another dep node).
	dep := map[*ir.Node]bool{}
	static := map[*ir.Value]bool{}
	for _, v := range g.Values {
		if v.Kind == ir.Const || v.Kind == ir.Param || v.Kind == ir.Buffer {
			static[v] = true
		}
	}
	for _, n := range g.Nodes {
		ok, reads := true, false
		layer := -1
		for _, in := range n.Inputs {
			if !static[in] {
				ok = false
				break
			}
			if l, has := layerOf[in]; has {
				reads = true
				if layer < 0 {
					layer = l
				}
			}
		}
		if !ok || ir.Ops[n.Op].Random {
			continue
		}
		for _, o := range n.Outputs {
			static[o] = true
		}
		if reads {
			dep[n] = true
			for _, o := range n.Outputs {
				layerOf[o] = layer
			}
		}
	}
	T := info.T
	isBias := func(s ir.Shape) bool { return len(s) == 2 && s[0] == s[1] && (s[0] == T || T == 0 && s[0] > 1) }
	uses := g.Uses()
	targets := readOutside(g, dep, uses)
	var clipIn []*ir.Value
	clipOf := map[int]*ir.Node{}
	for _, n := range g.Nodes {
		if !dep[n] {
			continue
		}
		if n.Op == ir.OpClamp && isBias(n.Outputs[0].Shape) {
			_, hasLo := n.Attrs["lo"]
			_, hasHi := n.Attrs["hi"]
			lo, hi := n.Attrs.Float("lo", 0), n.Attrs.Float("hi", 0)
			if hasLo && hasHi && lo == -hi && hi > 0 {
				clipOf[layerOf[n.Outputs[0]]] = n
				clipIn = append(clipIn, n.Inputs[0])
			}
		}
	}
	vals, err := evalStatic(g, append(append([]*ir.Value(nil), targets...), clipIn...), st, be)
	if err != nil {
		return nil, fmt.Errorf("fold rpa: %w", err)
	}
	extra := map[int]int{}
	for _, v := range targets {
		l := layerOf[v]
		var name string
		if isBias(v.Shape) {
			name = fmt.Sprintf("blocks.%d.attn.rpa_bias.T%d", l, v.Shape[0])
		} else if base := paramBase(v, dep); base != "" {
			name = fmt.Sprintf("%s.T%d", base, T)
		} else {
			extra[l]++
			name = fmt.Sprintf("blocks.%d.attn.rpa_folded%d.T%d", l, extra[l], T)
		}
		c := newConst(g, name, v.Shape, vals[v])
		replaceUses(g, v, c)
		if !isBias(v.Shape) {
			continue
		}
		fl := FoldLayer{Layer: l, T: v.Shape[0], Name: c.Name}
		fl.Min, fl.Max, fl.Mean = visibleStats(vals[v], v.Shape[0])
		if cn := clipOf[l]; cn != nil {
			fl.Clip = cn.Attrs.Float("hi", 0)
			fl.ClipFrac = clipFraction(vals[cn.Inputs[0]], v.Shape[0], fl.Clip)
		}
		rep.Layers = append(rep.Layers, fl)
	}
	sort.Slice(rep.Layers, func(i, j int) bool { return rep.Layers[i].Layer < rep.Layers[j].Layer })
	return rep, nil
}

// paramBase names a folded value after the nearest parameter it is
// computed from ("blocks.0.attn.value_gamma" for the value gamma), or "".
func paramBase(v *ir.Value, dep map[*ir.Node]bool) string {
	queue := []*ir.Node{v.Def}
	seen := map[*ir.Node]bool{}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		if n == nil || seen[n] || !dep[n] {
			continue
		}
		seen[n] = true
		for _, in := range n.Inputs {
			if in.Kind == ir.Param {
				return strings.TrimSuffix(in.Name, ".weight")
			}
		}
		for _, in := range n.Inputs {
			queue = append(queue, in.Def)
		}
	}
	return ""
}

func visibleStats(x []float64, T int) (lo, hi, mean float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	var s float64
	n := 0
	for i := 0; i < T; i++ {
		for j := 0; j <= i; j++ {
			v := x[i*T+j]
			lo, hi = math.Min(lo, v), math.Max(hi, v)
			s += v
			n++
		}
	}
	return lo, hi, s / float64(max(n, 1))
}

func clipFraction(x []float64, T int, clip float64) float64 {
	hit, n := 0, 0
	for i := 0; i < T; i++ {
		for j := 0; j <= i; j++ {
			if math.Abs(x[i*T+j]) > clip {
				hit++
			}
			n++
		}
	}
	return float64(hit) / float64(max(n, 1))
}

// Calibrate fills running-statistics buffers from data, for a checkpoint
// that has none at some length: it runs g, an eval graph of that length
// built with batch statistics (model.Eval with BatchStats), over the
// batches of token ids (each B·T ids for g's input "input_ids" [B,T]) and
// stores in st, for every entry buffer → stat output of stats, the mean of
// the stat output over the batches.
func Calibrate(g *ir.Graph, be kernels.Backend, st *kernels.Store, batches [][]int32, stats map[string]string) error {
	if len(batches) == 0 {
		return errors.New("calibrate: no data batches")
	}
	ids := g.Lookup("input_ids")
	if ids == nil || ids.Kind != ir.Input {
		return fmt.Errorf("calibrate: graph %s has no input_ids", g.Name)
	}
	names := make([]string, 0, len(stats))
	for buf, out := range stats {
		if g.Outputs[out] == nil {
			return fmt.Errorf("calibrate: graph %s has no output %q for %s", g.Name, out, buf)
		}
		names = append(names, buf)
	}
	sort.Strings(names)
	prog, err := be.Compile(g, Plan(g), st)
	if err != nil {
		return fmt.Errorf("calibrate: %w", err)
	}
	defer prog.Close()
	sums := map[string][]float64{}
	for bi, b := range batches {
		if len(b) != ids.Shape.Numel() {
			return fmt.Errorf("calibrate: batch %d has %d ids, the graph wants %v", bi, len(b), ids.Shape)
		}
		if err := prog.Run(map[string]*kernels.Tensor{"input_ids": kernels.IntTensor(ids.Shape, b)}, 0); err != nil {
			return fmt.Errorf("calibrate: %w", err)
		}
		for _, buf := range names {
			t := prog.Output(stats[buf])
			s := sums[buf]
			if s == nil {
				s = make([]float64, t.Len())
				sums[buf] = s
			}
			for i := range s {
				s[i] += t.At(i)
			}
		}
	}
	for _, buf := range names {
		s := sums[buf]
		dst, err := st.Ensure(buf, g.Outputs[stats[buf]].Shape)
		if err != nil {
			return fmt.Errorf("calibrate: %w", err)
		}
		for i, x := range s {
			dst.Set(i, x/float64(len(batches)))
		}
	}
	return nil
}

// DropFoldedBias removes the folded attention biases that rep names from
// g, a graph FoldRPA has folded: every Add of such a constant to the
// attention scores is bypassed, so attention keeps its causal mask and
// nothing else (FuseAttention then gives the Attention op no mask, and
// the plain lowering one causal mask shared by all layers). The rest of
// the fold (the value gamma) stays. The result is the folded model
// without its prior, which measures what the prior costs (rpac bench
// infer); it computes other logits and is never exported for serving. It
// returns the number of biases dropped.
func DropFoldedBias(g *ir.Graph, rep *FoldReport) (int, error) {
	if rep == nil || len(rep.Layers) == 0 {
		return 0, errors.New("drop bias: no folded bias (the graph has no RPA prior, or it was not folded)")
	}
	uses := g.Uses()
	n := 0
	for _, fl := range rep.Layers {
		c := g.Lookup(fl.Name)
		if c == nil || c.Kind != ir.Const {
			return n, fmt.Errorf("drop bias: no folded bias %q in graph %s", fl.Name, g.Name)
		}
		if isOutput(g, c) || len(uses[c]) == 0 {
			return n, fmt.Errorf("drop bias: folded bias %q is not read by an Add of the attention scores", fl.Name)
		}
		for _, u := range uses[c] {
			if u.Op != ir.OpAdd || len(u.Inputs) != 2 || u.Inputs[0] == u.Inputs[1] {
				return n, fmt.Errorf("drop bias: folded bias %q is read by %s, want an Add of the attention scores", fl.Name, u.Op)
			}
			scores := u.Inputs[0]
			if scores == c {
				scores = u.Inputs[1]
			}
			if !scores.Shape.Equal(u.Outputs[0].Shape) {
				return n, fmt.Errorf("drop bias: %q is added to a %v value, want the [B,H,T,T] scores", fl.Name, scores.Shape)
			}
			replaceUses(g, u.Outputs[0], scores)
		}
		n++
	}
	return n, nil
}
