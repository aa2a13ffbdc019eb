package model

import (
	"fmt"
	"math"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/passes"
)

// Mode selects training or evaluation semantics.
type Mode int

const (
	Train Mode = iota // dropout, Gumbel noise, batch statistics, loss with penalties
	Eval              // deterministic; running statistics unless BatchStats
)

// Opts says what graph to build.
type Opts struct {
	T, B int
	Mode Mode
	// BatchStats evaluates the paper's way: every sequence- or batch-level
	// statistic of the RPA path comes from the evaluated batch (as in the
	// listing) instead of the running statistics. Not causal.
	BatchStats bool
	// Logits adds the output "logits" [B,T,V].
	Logits bool
	// NoLoss omits targets and the loss (inference graphs for export).
	NoLoss bool
	// LossScaleInput (training): the CE term of "loss" is the smoothed CE
	// sum times the scalar input LossScale (the trainer feeds 1 over the
	// targets the sum counts, so ignored targets do not dilute the mean)
	// instead of the sum over B·T.
	LossScaleInput bool
	// Align, when above 1, stores the residual stream, each attention
	// head and the feed-forward width padded with zeros to multiples of
	// Align (align.go): the same model and gradients, GEMM dimensions a
	// backend's fastest kernels take. Parameters keep their shapes.
	Align int
	// Experts is the dispatch of the fuzzy blocks' experts in Train graphs
	// (passes.DispatchRouted: ExpertFFN nodes; any other value, and every
	// Eval graph: the listing's dense form). The random nodes keep the
	// dense graph's streams (keepStreams), so both draw the same masks.
	Experts passes.Dispatch
}

// LossScale is the scalar input of a graph built with Opts.LossScaleInput.
const LossScale = "loss_scale"

// Init says how a parameter or buffer starts.
type Init struct {
	Kind  string  // "normal", "uniform", "const", "sinusoid"
	Scale float64 // std (normal), bound (uniform), the value (const) or the amplitude (sinusoid)
}

// Spec is a parameter or buffer the graph reads from the store.
type Spec struct {
	Name  string
	Shape ir.Shape
	Init  Init
	Param bool // trainable (else buffer)
	// Decay: AdamW's weight decay applies (linear and embedding matrices;
	// not norms, biases or the paper's scalars).
	Decay bool
	// Running marks a running-statistics buffer: updated from the stat
	// output of the same name during training, used by eval graphs.
	Running string
}

// Names of the running statistics of layer i at length T.
func RunningMuName(layer, T int) string {
	return fmt.Sprintf("blocks.%d.attn.rpa_mu_mean.T%d", layer, T)
}
func RunningSimName(layer, T int) string {
	return fmt.Sprintf("blocks.%d.attn.legacy_sim.T%d", layer, T)
}

// StatMu is the stat output holding layer i's batch-mean membership per position [T,R].
func StatMu(layer int) string  { return fmt.Sprintf("stat:blocks.%d.mu_mean", layer) }
func StatSim(layer int) string { return fmt.Sprintf("stat:blocks.%d.legacy_sim", layer) }

// LambdaSat is the training-only buffer through which Guardian's λ_sat
// scales the entropy-floor penalty.
const LambdaSat = "train.lambda_sat"

type builder struct {
	g      *ir.Graph
	cfg    *Config
	o      Opts
	specs  []Spec
	seen   map[string]*ir.Value
	layers []Layer
	cur    *Layer   // the fuzzy block being built
	hooks  []string // outputs only training reads
	rope   *ropeConsts
}

// hook makes v the output name that only training reads (the loss, the
// statistics of controllers and running statistics).
func (b *builder) hook(name string, v *ir.Value) {
	b.g.SetOutput(name, v)
	b.hooks = append(b.hooks, name)
}

func (b *builder) param(name string, s ir.Shape, init Init) *ir.Value {
	return b.paramDecay(name, s, init, false)
}

// paramDecay adds a parameter that weight decay applies to when decay is
// set (linear and embedding matrices).
func (b *builder) paramDecay(name string, s ir.Shape, init Init, decay bool) *ir.Value {
	if v, ok := b.seen[name]; ok {
		return v
	}
	v := b.g.Param(name, s)
	b.seen[name] = v
	b.specs = append(b.specs, Spec{Name: name, Shape: s.Clone(), Init: init, Param: true, Decay: decay})
	return v
}

func (b *builder) buffer(name string, s ir.Shape, init Init, trainingOnly bool, running string) *ir.Value {
	if v, ok := b.seen[name]; ok {
		return v
	}
	v := b.g.Buffer(name, s)
	v.TrainingOnly = trainingOnly
	b.seen[name] = v
	b.specs = append(b.specs, Spec{Name: name, Shape: s.Clone(), Init: init, Running: running})
	return v
}

// linear is nn.Linear(in, out) with PyTorch's default initialisation, x
// holding in's stored width and the result out's.
func (b *builder) linear(x *ir.Value, name string, in, out span, bias bool) *ir.Value {
	w, bv := b.linearParams(name, in, out, bias)
	if bias {
		return b.g.Op1("Linear", nil, x, w, bv)
	}
	return b.g.Op1("Linear", nil, x, w)
}

// linearParams are nn.Linear(in, out)'s weight and bias (nil without) at
// the stored widths.
func (b *builder) linearParams(name string, in, out span, bias bool) (w, bv *ir.Value) {
	bound := 1 / math.Sqrt(float64(in.Logical()))
	w = b.paramDecay(name+".weight", ir.Shape{out.Logical(), in.Logical()}, Init{"uniform", bound}, true)
	w = b.padParam(w, &out, &in)
	if bias {
		bv = b.param(name+".bias", ir.Shape{out.Logical()}, Init{"uniform", bound})
		bv = b.padParam(bv, nil, &out)
	}
	return w, bv
}

// resid is the residual stream's width; heads the attention's, H blocks of
// the head size.
func (b *builder) resid() span { return b.span(b.cfg.DModel, 1) }
func (b *builder) heads() span { return b.span(b.cfg.DModel, b.cfg.Heads) }

func (b *builder) op(name ir.OpName, a ir.Attrs, in ...*ir.Value) *ir.Value {
	return b.g.Op1(name, a, in...)
}

func (b *builder) scale(x *ir.Value, alpha, beta float64) *ir.Value {
	return b.op("Scale", ir.Attrs{"alpha": alpha, "beta": beta}, x)
}

func (b *builder) clamp(x *ir.Value, lo, hi float64) *ir.Value {
	a := ir.Attrs{}
	if !math.IsInf(lo, -1) {
		a["lo"] = lo
	}
	if !math.IsInf(hi, 1) {
		a["hi"] = hi
	}
	return b.op("Clamp", a, x)
}

func (b *builder) dropout(x *ir.Value) *ir.Value {
	if b.o.Mode != Train || b.cfg.Dropout == 0 {
		return x
	}
	return b.g.Apply("Dropout", ir.Attrs{"p": b.cfg.Dropout}, x)[0]
}

// layerNorm normalises the residual stream over its logical width, with
// parameters of that width.
func (b *builder) layerNorm(x *ir.Value, name string) *ir.Value {
	s := b.resid()
	gw := b.param(name+".weight", ir.Shape{s.Logical()}, Init{"const", 1})
	gb := b.param(name+".bias", ir.Shape{s.Logical()}, Init{"const", 0})
	a := ir.Attrs{"eps": 1e-5}
	if s.Stored() != s.Logical() {
		a["width"] = s.Logical()
	}
	return b.op("LayerNorm", a, x, gw, gb)
}

// Graph is a built model graph with typed handles on the values and
// tensors that training and the export passes act on, so that no caller
// has to find them by name or parse them back out of strings.
type Graph struct {
	*ir.Graph
	Specs []Spec
	Opts  Opts
	// Layers holds one entry per fuzzy block (none for the baseline).
	Layers []Layer
	// Hooks are the outputs only training reads: the loss and the
	// statistics that controllers and running statistics consume.
	Hooks []string
}

// Layer holds the handles of one fuzzy block.
type Layer struct {
	Index int
	// Mu is the block's memberships μ [B,T,R] (the GaussianMembership output).
	Mu *ir.Value
	// Bias is the attention bias [T,T] before the warm-in scale.
	Bias *ir.Value
	// TauAtt is the parameter τ_att [] and BiasScale the training-only
	// warm-in scale buffer [] that multiplies the bias.
	TauAtt, BiasScale string
	// Entropy (H(μ) []) and Usage (expert usage [E]) are graph outputs.
	Entropy, Usage string
	// Running are the block's running statistics at this graph's length:
	// the mean membership (RPA prior and value gamma) and, with the legacy
	// bias, the mean similarity.
	Running []RunningStat
}

// RunningStatKind says which statistic a running buffer holds.
type RunningStatKind int

const (
	RunningMu  RunningStatKind = iota // RPA: batch-mean membership per position [T,R]
	RunningSim                        // legacy bias: mean_b μ_b μ_bᵀ [T,T]
)

// RunningStat is one running-statistics buffer and the graph output that
// estimates it from a batch.
type RunningStat struct {
	Layer, T int
	Kind     RunningStatKind
	// Buffer names the store tensor; Stat the graph output holding this
	// batch's value (present in training graphs and with batch statistics).
	Buffer, Stat string
}

// RunningStats lists the layers' running statistics.
func (g *Graph) RunningStats() []RunningStat {
	var out []RunningStat
	for _, l := range g.Layers {
		out = append(out, l.Running...)
	}
	return out
}

// Info returns what the passes need to know of this graph.
func (g *Graph) Info() *passes.ModelInfo {
	mi := &passes.ModelInfo{T: g.Opts.T, B: g.Opts.B, Eval: g.Opts.Mode == Eval, BatchStats: g.Opts.BatchStats, Hooks: g.Hooks}
	for _, l := range g.Layers {
		if l.Bias == nil {
			continue
		}
		li := passes.LayerInfo{Index: l.Index, Stored: []string{l.TauAtt, l.BiasScale}}
		for _, r := range l.Running {
			li.Stored = append(li.Stored, r.Buffer)
		}
		mi.Layers = append(mi.Layers, li)
	}
	if mi.Eval && !mi.BatchStats {
		for _, r := range g.RunningStats() {
			mi.Running = append(mi.Running, passes.RunningBuffer{Name: r.Buffer, Layer: r.Layer})
		}
	}
	return mi
}

// Decayed reports, for AdamW, whether weight decay applies to a parameter.
func (g *Graph) Decayed() func(name string) bool {
	set := map[string]bool{}
	for _, s := range g.Specs {
		if s.Param && s.Decay {
			set[s.Name] = true
		}
	}
	return func(name string) bool { return set[name] }
}

// Params lists the names of the trainable parameters, in build order.
func (g *Graph) Params() []string {
	var out []string
	for _, s := range g.Specs {
		if s.Param {
			out = append(out, s.Name)
		}
	}
	return out
}

// Build returns the graph of cfg at opts with its specs and handles.
func Build(cfg *Config, o Opts) (*Graph, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if o.T < 1 || o.B < 1 {
		return nil, fmt.Errorf("context %d and batch %d must be positive", o.T, o.B)
	}
	if o.T > cfg.MaxLen {
		return nil, fmt.Errorf("context %d exceeds the model's maximum length %d", o.T, cfg.MaxLen)
	}
	mode := "train"
	if o.Mode == Eval {
		mode = "eval"
		if o.BatchStats {
			mode = "eval-batchstats"
		}
	}
	g := ir.New(fmt.Sprintf("%s_%s_T%d_B%d", cfg.Model, mode, o.T, o.B))
	g.Meta["model"], g.Meta["mode"] = cfg.Model.String(), mode
	g.Meta["T"], g.Meta["B"] = fmt.Sprint(o.T), fmt.Sprint(o.B)
	b := &builder{g: g, cfg: cfg, o: o, seen: map[string]*ir.Value{}}
	if err := b.build(); err != nil {
		return nil, err
	}
	if o.Align > 1 {
		placePads(g)
	}
	if o.Align > 1 || (o.Mode == Train && o.Experts == passes.DispatchRouted) {
		if err := b.keepStreams(cfg, o); err != nil {
			return nil, err
		}
	}
	if err := ir.Verify(g, false); err != nil {
		return nil, err
	}
	return &Graph{Graph: g, Specs: b.specs, Opts: o, Layers: b.layers, Hooks: b.hooks}, nil
}

func (b *builder) build() error {
	c, o, g := b.cfg, b.o, b.g
	D, T, B := c.DModel, o.T, o.B
	rs := b.resid()
	ids := g.Input("input_ids", ir.Shape{B, T}, ir.I32)
	tok := b.paramDecay("tok_emb.weight", ir.Shape{c.Vocab, D}, Init{"normal", 0.02}, true)
	tok = b.padParam(tok, nil, &rs)
	var pos *ir.Value
	if c.PosInit != "none" {
		posInit := Init{"normal", 0.02}
		if c.PosInit == "sinusoid" {
			posInit = Init{"sinusoid", 0.02 * math.Sqrt2} // RMS 0.02, as the normal init
		}
		pos = b.padParam(b.paramDecay("pos_emb.weight", ir.Shape{c.MaxLen, D}, posInit, true), nil, &rs)
	}
	x := b.op("Gather", nil, tok, ids)
	if pos != nil {
		p := pos
		if T < c.MaxLen {
			p = b.op("Slice", ir.Attrs{"axis": 0, "start": 0, "end": T}, pos)
		}
		x = b.op("Add", nil, x, p)
	}
	x = b.dropout(x)

	var entropies []*ir.Value
	for i := 0; i < c.Layers; i++ {
		var h *ir.Value
		if c.Model == Fuzzy {
			x, h = b.fuzzyBlock(x, i)
			entropies = append(entropies, h)
		} else {
			x = b.baselineBlock(x, i)
		}
	}
	x = b.layerNorm(x, "ln_f")
	var logits *ir.Value
	if o.Logits {
		logits = b.op("Linear", nil, x, tok) // tied LM head
		g.SetOutput("logits", logits)
	}
	if o.NoLoss {
		return nil
	}
	targets := g.Input("targets", ir.Shape{B * T}, ir.I32)
	ls := 0.0
	if o.Mode == Train {
		ls = c.LabelSmooth
	}
	var ce []*ir.Value
	if o.Logits {
		flat := b.op("Reshape", ir.Attrs{"shape": []int{B * T, c.Vocab}}, logits)
		ce = g.Apply("CrossEntropy", ir.Attrs{"label_smoothing": ls}, flat, targets)
	} else {
		// tied LM head and loss in one op: the [B·T, V] logits are never held at once
		xf := b.op("Reshape", ir.Attrs{"shape": []int{B * T, rs.Stored()}}, x)
		ce = g.Apply("LMHeadCrossEntropy", ir.Attrs{"label_smoothing": ls}, xf, tok, targets)
		g.SetOutput("pred", ce[2]) // argmax of each row's logits [B·T]
	}
	g.SetOutput("ce_sm_sum", ce[0])
	g.SetOutput("ce_sum", ce[1])
	if o.Mode != Train {
		return nil
	}
	// lm_loss_from_xy: smoothed CE plus the entropy floor. The listing adds the
	// penalty to a token SUM; rpac uses the per-token mean CE so the floor
	// keeps the weight its coefficients suggest at any batch size.
	var loss *ir.Value
	if o.LossScaleInput {
		loss = b.op("Mul", nil, ce[0], g.Input(LossScale, ir.Shape{}, ir.F32))
	} else {
		loss = b.scale(ce[0], 1/float64(B*T), 0)
	}
	if c.Model == Fuzzy && c.R >= 2 && c.EntFloorAlpha > 0 {
		var hsum *ir.Value
		for _, h := range entropies {
			if hsum == nil {
				hsum = h
			} else {
				hsum = b.op("Add", nil, hsum, h)
			}
		}
		hmean := b.scale(hsum, 1/float64(len(entropies)), 0)
		b.hook("stat:mu_entropy", hmean)
		hmax := math.Log(math.Max(2, float64(c.R)))
		pen := b.op("ReLU", nil, b.scale(hmean, -1, c.EntFloorEta*hmax))
		lam := b.buffer(LambdaSat, ir.Shape{}, Init{"const", 0}, true, "")
		w := b.scale(lam, c.EntFloorAlpha*0.5, c.EntFloorAlpha*0.5) // (α/2)(1+λ_sat)
		loss = b.op("Add", nil, loss, b.op("Mul", nil, w, pen))
	}
	b.hook("loss", loss)
	return nil
}

// attention computes causal multi-head attention of xn with an optional
// additive [T,T] bias; returns [B,T,D] before out_proj.
func (b *builder) attention(xn *ir.Value, prefix string, bias *ir.Value) *ir.Value {
	c, o := b.cfg, b.o
	H, Hd, T, B := c.Heads, c.HeadDim(), o.T, o.B
	rs, hs := b.resid(), b.heads()
	heads := func(v *ir.Value, rotate bool) *ir.Value {
		v = b.op("Reshape", ir.Attrs{"shape": []int{B, T, H, hs.Padded}}, v)
		if rotate && c.RoPE {
			v = b.rotary(v)
		}
		return v
	}
	toBHTD := func(v *ir.Value) *ir.Value { return b.op("Transpose", ir.Attrs{"perm": []int{0, 2, 1, 3}}, v) }
	q := toBHTD(heads(b.linear(xn, prefix+".Wq", rs, hs, false), true))
	k := heads(b.linear(xn, prefix+".Wk", rs, hs, false), true)
	if c.SmearKeys {
		k = b.smear(k, prefix)
	}
	k = toBHTD(k)
	v := toBHTD(heads(b.linear(xn, prefix+".Wv", rs, hs, false), false))
	s := b.op("MatMul", ir.Attrs{"transB": true}, q, k)
	s = b.scale(s, 1/math.Sqrt(float64(Hd)), 0)
	if bias != nil {
		s = b.op("Add", nil, s, bias)
	}
	s = b.op("CausalMask", nil, s)
	a := b.dropout(b.op("Softmax", nil, s))
	out := b.op("MatMul", nil, a, v)
	out = b.op("Transpose", ir.Attrs{"perm": []int{0, 2, 1, 3}}, out)
	out = b.op("Reshape", ir.Attrs{"shape": []int{B, T, hs.Stored()}}, out)
	return b.linear(out, prefix+".out_proj", hs, rs, false)
}

// ropeConsts are the rotary tables of one graph, shared by its layers.
type ropeConsts struct{ cos, sin, rot *ir.Value }

// rotary applies the rotary position embedding to v [B,T,H,Hd] as
// v⊙cos + (v·Rᵀ)⊙sin, with cos and sin [T,1,Hd] tables and R the [Hd,Hd]
// rotate-half matrix: plain Mul, Linear and Add nodes, so every backend,
// the gradient and the ONNX export need nothing of their own.
func (b *builder) rotary(v *ir.Value) *ir.Value {
	if b.rope == nil {
		T, Hd := b.o.T, b.cfg.HeadDim()
		hd := b.span(Hd, 1) // one head, padded: the tables' padding is zero
		cos, sin := RotaryTables(T, Hd, b.cfg.RoPEBase)
		rot := append(padTable(RotateHalf(Hd), hd), make([]float64, (hd.Padded-Hd)*hd.Padded)...)
		P := hd.Padded
		b.rope = &ropeConsts{
			cos: b.g.Const(fmt.Sprintf("rope.cos.T%d", T), ir.Shape{T, 1, P}, padTable(cos, hd)),
			sin: b.g.Const(fmt.Sprintf("rope.sin.T%d", T), ir.Shape{T, 1, P}, padTable(sin, hd)),
			rot: b.g.Const(fmt.Sprintf("rope.rotate_half.D%d", P), ir.Shape{P, P}, rot),
		}
	}
	r := b.rope
	return b.op("Add", nil, b.op("Mul", nil, v, r.cos), b.op("Mul", nil, b.op("Linear", nil, v, r.rot), r.sin))
}

// smear mixes each key of k [B,T,H,Hd] with the one before it, per head
// (Config.SmearKeys): σ(a)·k_t + (1−σ(a))·k_{t−1}, the key before position
// 0 being zero. The zero row is computed from k (0·k_0), not a constant,
// so that the graph holds nothing of the batch size (a variable-batch
// export).
func (b *builder) smear(k *ir.Value, prefix string) *ir.Value {
	T, H := k.Shape[1], k.Shape[2]
	prev := b.scale(b.op("Slice", ir.Attrs{"axis": 1, "start": 0, "end": 1}, k), 0, 0)
	if T > 1 {
		prev = b.op("Concat", ir.Attrs{"axis": 1}, prev, b.op("Slice", ir.Attrs{"axis": 1, "start": 0, "end": T - 1}, k))
	}
	s := b.op("Sigmoid", nil, b.param(prefix+".smear", ir.Shape{H, 1}, Init{"const", 0}))
	return b.op("Add", nil, b.op("Mul", nil, s, k), b.op("Mul", nil, b.scale(s, -1, 1), prev))
}

func (b *builder) baselineBlock(x *ir.Value, i int) *ir.Value {
	c := b.cfg
	rs := b.resid()
	pre := fmt.Sprintf("blocks.%d", i)
	a := b.attention(b.layerNorm(x, pre+".norm1"), pre+".attn", nil)
	x = b.op("Add", nil, x, b.dropout(a))
	// Dense FFN whose hidden width equals the fuzzy model's active expert
	// width (top_k experts of ff_mult·d), so the two compare at equal compute.
	ff := b.span(c.FFMult*c.DModel*max(1, c.TopK), 1)
	h := b.op("GELU", nil, b.linear(b.layerNorm(x, pre+".norm2"), pre+".ffn.net.0", rs, ff, true))
	h = b.linear(b.dropout(h), pre+".ffn.net.3", ff, rs, true)
	return b.op("Add", nil, x, b.dropout(h))
}

// fuzzyBlock is FuzzyTransformerBlock.forward; it returns the new residual
// stream and the layer's membership entropy H(μ).
func (b *builder) fuzzyBlock(x *ir.Value, i int) (*ir.Value, *ir.Value) {
	c, o := b.cfg, b.o
	D, R, T := c.DModel, c.R, o.T
	rs := b.resid()
	pre := fmt.Sprintf("blocks.%d", i)
	b.cur = &Layer{Index: i, Entropy: fmt.Sprintf("stat:blocks.%d.mu_entropy", i), Usage: fmt.Sprintf("stat:blocks.%d.expert_usage", i)}
	defer func() { b.layers = append(b.layers, *b.cur); b.cur = nil }()

	// GaussianFuzzy on the raw residual stream (the listing calls mem(x)).
	z := b.linear(x, pre+".mem.proj", rs, rs, true)
	centers := b.param(pre+".mem.centers", ir.Shape{R, D}, Init{"normal", 1 / math.Sqrt(float64(D))})
	centers = b.padParam(centers, nil, &rs)
	logSigma := b.param(pre+".mem.log_sigma", ir.Shape{R}, Init{"const", 0})
	mu := b.op("GaussianMembership", nil, z, centers, logSigma) // [B,T,R], nan guard inside
	b.cur.Mu = mu
	if c.Type2 {
		u := b.op("Sigmoid", nil, b.linear(b.op("ReLU", nil, b.linear(x, pre+".mem.uncert.0", rs, rs, true)), pre+".mem.uncert.2", rs, plain(1), true))
		b.hook(fmt.Sprintf("stat:blocks.%d.type2_u", i), b.op("ReduceMean", nil, u))
	}
	eta := b.op("Sigmoid", nil, b.linear(mu, pre+".res_gate", plain(R), plain(1), false)) // [B,T,1]

	// Statistics of the RPA path: batch statistics while training (and in
	// --eval-stats batch), running statistics in eval mode (DESIGN.md,
	// "Causality"). mbar is the batch-mean membership per position [T,R].
	useBatch := o.Mode == Train || o.BatchStats
	batchMu := b.op("ReduceMean", ir.Attrs{"axes": []int{0}}, mu)
	b.hook(StatMu(i), batchMu)
	b.cur.Running = []RunningStat{{Layer: i, T: T, Kind: RunningMu, Buffer: RunningMuName(i, T), Stat: StatMu(i)}}
	if !c.UseRPA {
		b.cur.Running = append(b.cur.Running, RunningStat{Layer: i, T: T, Kind: RunningSim, Buffer: RunningSimName(i, T), Stat: StatSim(i)})
	}
	var mbar *ir.Value
	if useBatch {
		mbar = batchMu
	} else {
		mbar = b.buffer(RunningMuName(i, T), ir.Shape{T, R}, Init{"const", 1 / float64(R)}, false, StatMu(i))
	}

	var bias *ir.Value
	if c.UseRPA {
		bias = b.rpaBias(mbar, pre+".attn")
	} else {
		var sim *ir.Value
		if useBatch {
			// fuzz_sim = mean_b μ_b μ_bᵀ
			sim = b.op("ReduceMean", ir.Attrs{"axes": []int{0}}, b.op("MatMul", ir.Attrs{"transB": true}, mu, mu))
			b.hook(StatSim(i), sim)
		} else {
			sim = b.buffer(RunningSimName(i, T), ir.Shape{T, T}, Init{"const", 1 / float64(R)}, false, StatSim(i))
		}
		bias = b.legacyBias(sim, pre+".attn")
	}

	// FuzzyMHA
	a := b.attention(b.layerNorm(x, pre+".norm1"), pre+".attn", bias)
	// value_gamma: gamma_s = mean_h sigmoid(mean_t(μ)·W_gᵀ); per sequence with
	// batch statistics, from the running per-position mean otherwise.
	var mt *ir.Value
	if useBatch {
		mt = b.op("ReduceMean", ir.Attrs{"axes": []int{1}, "keepdims": true}, mu) // [B,1,R]
	} else {
		mt = b.op("ReduceMean", ir.Attrs{"axes": []int{0}, "keepdims": true}, mbar) // [1,R]
	}
	gam := b.op("Sigmoid", nil, b.linear(mt, pre+".attn.value_gamma", plain(R), plain(c.Heads), false))
	gam = b.op("ReduceMean", ir.Attrs{"axes": []int{-1}, "keepdims": true}, gam)
	a = b.dropout(b.op("Mul", nil, a, gam)) // FuzzyMHA returns dropout(out)
	x = b.op("Add", nil, x, b.op("Mul", nil, eta, b.dropout(a)))

	m := b.fuzzyMoE(b.layerNorm(x, pre+".norm2"), mu, pre+".moe", i)
	x = b.op("Add", nil, x, b.op("Mul", nil, eta, b.dropout(m)))

	// H_mu = -(μ·log(clamp_min(μ,1e-8))).sum(-1).mean()
	ent := b.op("Mul", nil, mu, b.op("Log", nil, b.clamp(mu, 1e-8, math.Inf(1))))
	h := b.scale(b.op("ReduceMean", nil, b.op("ReduceSum", ir.Attrs{"axes": []int{-1}}, ent)), -1, 0)
	b.hook(b.cur.Entropy, h)
	return x, h
}

// rpaBias is FuzzyMHA._rpa_bias expressed on mbar = mean_b μ_b [T,R]:
// S = mbarᵀΦ, P = Sinkhorn(exp(S/τ_align)), B = mbar·P·Φᵀ (= mean_b μ_b P Φᵀ).
func (b *builder) rpaBias(mbar *ir.Value, prefix string) *ir.Value {
	c, T := b.cfg, b.o.T
	K := c.K()
	phi := b.g.Const(fmt.Sprintf("rpa.phi.T%d.K%d", T, K), ir.Shape{T, K}, SoftBlocks(T, K))
	S := b.op("MatMul", ir.Attrs{"transA": true}, mbar, phi) // [R,K]
	if c.RPADetach {
		S = b.op("StopGradient", nil, S)
	}
	km := b.clamp(b.op("Exp", nil, b.scale(S, 1/math.Max(1e-6, c.TauAlign), 0)), 1e-9, 1e9)
	P := b.op("Sinkhorn", ir.Attrs{"iters": c.SinkhornIters}, km)
	bm := b.op("MatMul", ir.Attrs{"transB": true}, b.op("MatMul", nil, mbar, P), phi) // [T,T]
	if c.RPAPosmix > 0 {
		bm = b.scale(bm, 1-c.RPAPosmix, 0)
		bm = b.op("Add", nil, bm, b.scale(b.posBias(prefix), c.RPAPosmix, 0))
	}
	return b.finishBias(bm, prefix)
}

// legacyBias is FuzzyMHA._legacy_bias on sim = mean_b μ_b μ_bᵀ.
func (b *builder) legacyBias(sim *ir.Value, prefix string) *ir.Value {
	kappa := b.param(prefix+".kappa", ir.Shape{}, Init{"const", b.cfg.KappaInit})
	ks := b.op("Sigmoid", nil, kappa)
	fz := b.op("ZScore", nil, sim)
	curve := b.op("Add", nil, b.op("Mul", nil, ks, fz), b.op("Mul", nil, b.scale(ks, -1, 1), b.posBias(prefix)))
	return b.finishBias(curve, prefix)
}

// posBias is -clamp_min(pos_beta, 0)·|i-j|/max(1,T-1).
func (b *builder) posBias(prefix string) *ir.Value {
	T := b.o.T
	beta := b.param(prefix+".pos_beta", ir.Shape{}, Init{"const", b.cfg.PosBeta})
	dist := b.g.Const(fmt.Sprintf("rpa.posdist.T%d", T), ir.Shape{T, T}, PosDistance(T))
	return b.op("Mul", nil, b.scale(b.clamp(beta, 0, math.Inf(1)), -1, 0), dist)
}

// finishBias: z-score (RPA path), nan guard, divide by clamp(τ_att, 0.6, τ_max),
// clip to ±bias_clip, times clamp(bias_scale, 0, 1).
func (b *builder) finishBias(bm *ir.Value, prefix string) *ir.Value {
	c := b.cfg
	if c.UseRPA {
		bm = b.op("ZScore", nil, bm)
	}
	bm = b.op("NanToNum", ir.Attrs{"nan": 0.0, "posinf": c.BiasClip, "neginf": -c.BiasClip}, bm)
	tau := b.param(prefix+".tau_att", ir.Shape{}, Init{"const", c.TauAttInit})
	bm = b.op("Div", nil, bm, b.clamp(tau, 0.6, c.TauMax))
	bm = b.clamp(bm, -c.BiasClip, c.BiasClip)
	bs := b.buffer(prefix+".bias_scale", ir.Shape{}, Init{"const", 1}, true, "")
	b.cur.Bias, b.cur.TauAtt, b.cur.BiasScale = bm, tau.Name, bs.Name
	return b.op("Mul", nil, bm, b.clamp(bs, 0, 1))
}

// fuzzyMoE is FuzzyMoE.forward (all experts evaluated, weights zero outside
// the top-k, as in the listing; with Opts.Experts routed, each expert on
// its routed tokens only). Eval draws no Gumbel noise.
func (b *builder) fuzzyMoE(x, mu *ir.Value, prefix string, layer int) *ir.Value {
	c, o := b.cfg, b.o
	E := c.Experts
	logits := b.clamp(b.linear(mu, prefix+".gate", plain(c.R), plain(E), false), -30, 30)
	if o.Mode == Train {
		logits = b.op("GumbelNoise", nil, logits)
	}
	y := b.op("Softmax", nil, b.scale(logits, 2, 0)) // softmax((logits+g)/0.5)
	mask := b.op("TopKMask", ir.Attrs{"k": min(c.TopK, E)}, y)
	// The listing divides by the sum of the *unmasked* softmax (≈ 1 + 1e-6),
	// so kept weights are not renormalised; followed as written.
	den := b.scale(b.op("ReduceSum", ir.Attrs{"axes": []int{-1}, "keepdims": true}, y), 1, 1e-6)
	y = b.op("Div", nil, b.op("Mul", nil, y, mask), den)
	b.hook(b.cur.Usage, b.op("ReduceMean", ir.Attrs{"axes": []int{0, 1}}, y))
	rs, ff := b.resid(), b.span(c.DModel*c.FFMult, 1)
	var out *ir.Value
	for e := 0; e < E; e++ {
		en := fmt.Sprintf("%s.experts.%d.net", prefix, e)
		var t *ir.Value
		if o.Mode == Train && o.Experts == passes.DispatchRouted {
			t = b.routedExpert(x, y, en, e, rs, ff)
		} else {
			h := b.op("GELU", nil, b.linear(x, en+".0", rs, ff, true))
			h = b.dropout(b.linear(b.dropout(h), en+".3", ff, rs, true))
			ye := b.op("Slice", ir.Attrs{"axis": 2, "start": e, "end": e + 1}, y)
			t = b.op("Mul", nil, ye, h)
		}
		if out == nil {
			out = t
		} else {
			out = b.op("Add", nil, out, t)
		}
	}
	return out
}

// routedExpert is expert e's weighted output y[...,e]·net(x) as one
// ExpertFFN: the network runs on the tokens with y[t,e] ≠ 0 only. Its
// dropouts draw from two streams of their own (keepStreams gives them the
// dense form's).
func (b *builder) routedExpert(x, y *ir.Value, en string, e int, rs, ff span) *ir.Value {
	w1, b1 := b.linearParams(en+".0", rs, ff, true)
	w2, b2 := b.linearParams(en+".3", ff, rs, true)
	a := ir.Attrs{"expert": e, "top_k": min(b.cfg.TopK, b.cfg.Experts)}
	if b.cfg.Dropout > 0 {
		a["p"], a["stream"], a["stream2"] = b.cfg.Dropout, b.g.NewID(), b.g.NewID()
	}
	return b.g.Apply(ir.OpExpertFFN, a, x, y, w1, b1, w2, b2)[0]
}

// SoftBlocks is FuzzyMHA._soft_blocks: raised-cosine blocks Φ(T) [T,K]
// centred on linspace(0, T-1, K) with half-width max(1, 1.5·T/K), rows
// normalised (+1e-6). Computed in float32 like the reference.
func SoftBlocks(T, K int) []float64 {
	phi := make([]float64, T*K)
	w := math.Max(1, float64(T)/float64(max(1, K))*1.5)
	for t := 0; t < T; t++ {
		var sum float32
		row := make([]float32, K)
		for k := 0; k < K; k++ {
			ck := 0.0
			if K > 1 {
				ck = float64(k) * float64(T-1) / float64(K-1)
			}
			d := math.Abs(float64(t)-ck) / w
			if d <= 1 {
				row[k] = float32(0.5 * (1 + math.Cos(math.Min(d, 1)*math.Pi)))
			}
			sum += row[k]
		}
		for k := 0; k < K; k++ {
			phi[t*K+k] = float64(row[k] / (sum + 1e-6))
		}
	}
	return phi
}

// PosDistance is FuzzyMHA._pos_distance: |i-j| / max(1, T-1).
func PosDistance(T int) []float64 {
	d := make([]float64, T*T)
	den := math.Max(1, float64(T-1))
	for i := 0; i < T; i++ {
		for j := 0; j < T; j++ {
			d[i*T+j] = math.Abs(float64(i-j)) / den
		}
	}
	return d
}

// RotaryTables returns the [T,Hd] cosine and sine tables of the rotary
// embedding: with h = ⌊Hd/2⌋, dimensions i and i+h (i < h) of position t
// turn by the angle t·base^(-i/h). A last, odd dimension does not turn
// (cos 1, sin 0). base 0 means 10000.
func RotaryTables(T, Hd int, base float64) (cos, sin []float64) {
	if base == 0 {
		base = 10000
	}
	h := Hd / 2
	cos, sin = make([]float64, T*Hd), make([]float64, T*Hd)
	for t := 0; t < T; t++ {
		row := t * Hd
		for i := 0; i < Hd; i++ {
			cos[row+i] = 1
		}
		for i := 0; i < h; i++ {
			s, c := math.Sincos(float64(t) * math.Pow(base, -float64(i)/float64(h)))
			cos[row+i], cos[row+i+h] = c, c
			sin[row+i], sin[row+i+h] = s, s
		}
	}
	return cos, sin
}

// RotateHalf returns the [Hd,Hd] matrix R with (v·Rᵀ)[i] = -v[i+h] and
// (v·Rᵀ)[i+h] = v[i] for i < h = ⌊Hd/2⌋ (a last, odd dimension maps to 0).
func RotateHalf(Hd int) []float64 {
	h := Hd / 2
	r := make([]float64, Hd*Hd)
	for i := 0; i < h; i++ {
		r[i*Hd+i+h] = -1
		r[(i+h)*Hd+i] = 1
	}
	return r
}

// CountParams sums the element counts of trainable specs.
func CountParams(specs []Spec) int {
	n := 0
	for _, s := range specs {
		if s.Param {
			n += s.Shape.Numel()
		}
	}
	return n
}
