// Package kernels defines the seam between rpac's IR and the machines that
// execute it. A Backend compiles a planned ir.Graph into a Program; the
// Program runs the graph's nodes in order over buffers laid out by the Plan
// (passes.Plan), reading parameters and buffers from a Store.
//
// Backends: kernels/cpu (Go, parallel over cores, GEMM through OpenBLAS with a
// pure-Go fallback when cgo is off).
package kernels

import (
	"fmt"

	"github.com/rpac-dev/rpac/ir"
)

// Tensor is host data with a shape. Exactly one of F32, F64, I32 is set.
type Tensor struct {
	Shape ir.Shape
	F32   []float32
	F64   []float64
	I32   []int32
}

// NewTensor allocates a zero float tensor of the given precision: float64
// for ir.FP64, float32 for any other.
func NewTensor(p ir.Precision, s ir.Shape) *Tensor {
	t := &Tensor{Shape: s.Clone()}
	if p == ir.FP64 {
		t.F64 = make([]float64, s.Numel())
	} else {
		t.F32 = make([]float32, s.Numel())
	}
	return t
}

// IntTensor wraps ids.
func IntTensor(s ir.Shape, ids []int32) *Tensor { return &Tensor{Shape: s.Clone(), I32: ids} }

// Len is the element count.
func (t *Tensor) Len() int { return t.Shape.Numel() }

// Float64s copies the float data out as float64.
func (t *Tensor) Float64s() []float64 {
	if t.F64 != nil {
		return append([]float64(nil), t.F64...)
	}
	out := make([]float64, len(t.F32))
	for i, x := range t.F32 {
		out[i] = float64(x)
	}
	return out
}

// Float32s copies the float data out as float32.
func (t *Tensor) Float32s() []float32 {
	if t.F32 != nil {
		return append([]float32(nil), t.F32...)
	}
	out := make([]float32, len(t.F64))
	for i, x := range t.F64 {
		out[i] = float32(x)
	}
	return out
}

// SetFloat64s writes float data (converting to the tensor's precision).
func (t *Tensor) SetFloat64s(x []float64) {
	if t.F64 != nil {
		copy(t.F64, x)
		return
	}
	for i, v := range x {
		t.F32[i] = float32(v)
	}
}

// At returns element i as float64.
func (t *Tensor) At(i int) float64 {
	if t.F64 != nil {
		return t.F64[i]
	}
	return float64(t.F32[i])
}

// Set writes element i.
func (t *Tensor) Set(i int, v float64) {
	if t.F64 != nil {
		t.F64[i] = v
	} else {
		t.F32[i] = float32(v)
	}
}

// Store holds the persistent named tensors of a model: parameters and
// buffers. Programs of different lengths share one Store.
type Store struct {
	Prec    ir.Precision
	Tensors map[string]*Tensor
	Order   []string // insertion order (stable checkpoints)
}

// NewStore returns an empty store.
func NewStore(p ir.Precision) *Store { return &Store{Prec: p, Tensors: map[string]*Tensor{}} }

// Get returns a tensor or nil.
func (s *Store) Get(name string) *Tensor { return s.Tensors[name] }

// Ensure returns the named tensor, creating zeros of the shape if absent; a
// present tensor of another shape is an error.
func (s *Store) Ensure(name string, shape ir.Shape) (*Tensor, error) {
	if t, ok := s.Tensors[name]; ok {
		if !t.Shape.Equal(shape) {
			return nil, fmt.Errorf("store: %s has shape %v, graph wants %v", name, t.Shape, shape)
		}
		return t, nil
	}
	t := NewTensor(s.Prec, shape)
	s.Tensors[name] = t
	s.Order = append(s.Order, name)
	return t, nil
}

// Bind returns the tensor a Param or Buffer value of a graph reads, checked
// against the value's shape (a nil store, a missing name or another shape is
// an error that names the value).
func (s *Store) Bind(v *ir.Value) (*Tensor, error) {
	if s == nil {
		return nil, fmt.Errorf("%s %q: no store given", v.Kind, v.Name)
	}
	t := s.Get(v.Name)
	if t == nil {
		return nil, fmt.Errorf("%s %q%v is not in the store (initialise or load it first)", v.Kind, v.Name, v.Shape)
	}
	if !t.Shape.Equal(v.Shape) {
		return nil, fmt.Errorf("%s %q has shape %v in the store, graph wants %v", v.Kind, v.Name, t.Shape, v.Shape)
	}
	return t, nil
}

// Plan is the memory plan of a graph: every intermediate value lives in a
// slot, and slots are reused once their values are dead, so the memory of a
// training step is bounded by the plan, not by the number of ops.
type Plan struct {
	Slot      map[int]int // value ID -> slot index (intermediates only)
	SlotElems []int       // elements per slot
	// Peak is the element count of all slots together.
	Peak int
	// Naive is the element count without reuse (for reporting).
	Naive int
	// ScratchElems is the float element count that kernels allocate for
	// themselves outside the slots (ir.OpDef.Scratch summed over the nodes).
	// A compiled program holds (Peak + ScratchElems) floats besides the
	// stored tensors.
	ScratchElems int
	// FreedAfter lists, by node ID, the slots given back once that node has
	// run: every value in them is dead, and the next value to take one
	// finds whatever the last left there.
	FreedAfter map[int][]int
}

// SlotClash reports whether output i of node n must not be computed in its
// plan slot: the slot is shared with another output of n, or with an input
// that the op cannot overwrite in place (ir.OpDef.InPlace, same shape) and
// whose elements it does not give unchanged (ir.OpDef.Alias: the planner
// gave the output its input's slot, and there is nothing to do).
// slot gives a value's plan slot (-1: none). A backend computes such an
// output into a temporary and copies it into the slot afterwards.
func SlotClash(n *ir.Node, i int, slot func(*ir.Value) int) bool {
	o := n.Outputs[i]
	s := slot(o)
	if s < 0 {
		return false
	}
	def := ir.Ops[n.Op]
	inPlace := def != nil && def.InPlace
	alias := def != nil && def.Alias
	for _, x := range n.Inputs {
		if slot(x) == s && !(inPlace && x.Shape.Equal(o.Shape)) && !(alias && x.Shape.Numel() == o.Shape.Numel()) {
			return true
		}
	}
	for j, o2 := range n.Outputs {
		if j != i && slot(o2) == s {
			return true
		}
	}
	return false
}

// Program is a compiled graph.
type Program interface {
	// Run executes the graph once. feeds holds the Input values by name;
	// seed draws this run's randomness (Dropout, GumbelNoise).
	Run(feeds map[string]*Tensor, seed uint64) error
	// Output returns a named graph output, valid until the next Run.
	Output(name string) *Tensor
	// Close releases the program's memory.
	Close()
}

// Backend compiles graphs for one kind of machine.
type Backend interface {
	Name() string
	Precision() ir.Precision
	// Capabilities are what the graphs compiled for the backend, and the
	// memory plan sized for them, depend on.
	Capabilities() Capabilities
	Compile(g *ir.Graph, plan *Plan, store *Store) (Program, error)
}

// Capabilities describe a backend to the code that builds its graphs and
// plans its memory, resolved once when the backend opens.
type Capabilities struct {
	// FusedAttention: the backend runs each attention core as one
	// FusedAttention node (FusedAttentionGrad in the backward) that
	// recomputes the weights instead of holding a [B,H,T,T] tensor; its
	// graphs, and the memory planned for them, are the fused ones.
	FusedAttention bool
	// FusedElementwise: the backend runs FusedElementwise nodes in one
	// pass over memory; its graphs fuse chains of elementwise ops
	// (passes.FuseElementwise).
	FusedElementwise bool
	// AttentionBTHD: the backend's FusedAttention(Grad) kernels take the
	// [B,T,H,D] layout (ir.AttnBTHD); its graphs keep the projections' rows
	// as they are (passes.AttentionLayout).
	AttentionBTHD bool
	// DeviceMemory is the memory of the device the programs run on, in
	// bytes (0: they run in the host's memory).
	DeviceMemory int64
	// DeviceState: the backend can keep the training state (weights,
	// moments, gradients) on its device between steps.
	DeviceState bool
	// LMHeadChunk: the rows an LMHeadCrossEntropy(Grad) node of the
	// backend's graphs computes at once (0: ir.LMHeadChunk); the train and
	// eval pipelines set it on the nodes (passes.LMHeadChunk).
	LMHeadChunk int
	// JoinGrads: the backend's GEMMs gain from fewer, larger ones; the
	// train pipeline joins the backward GEMMs of Linears that read one
	// input (passes.JoinSiblingGrads).
	JoinGrads bool
	// Align: the backend's GEMMs run fastest when every dimension is a
	// multiple of Align; its train and eval graphs store the model's
	// widths padded to it (compiler/model's Opts.Align; 0: as they are).
	Align int
	// RematDropout: the backend's fused chains draw a dropout mask at
	// little cost beside the memory traffic; its train graphs give each
	// chain that reads a Dropout's result a copy of the Dropout instead
	// (passes.FuseElementwiseRemat).
	RematDropout bool
	// RoutedExperts: the backend's training steps run each expert of a
	// mixture of experts on its routed tokens only (ir.OpExpertFFN) unless
	// a dispatch is asked for (passes.Dispatch): a backend whose routed
	// kernels are measured faster than the dense form.
	RoutedExperts bool
}
