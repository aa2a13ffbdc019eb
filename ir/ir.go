// Package ir is rpac's graph intermediate representation: a static-shape
// dataflow graph of coarse tensor ops. The model is written once as an IR
// builder (compiler/model); training executes the graph and its gradient graph
// (passes.Autodiff), export transforms it (passes.StripTraining, FoldRPA, ...).
//
// A Graph is built for one context length T and batch B. Values carry a shape
// and dtype fixed at build time; every op has an entry in the op table (ops.go)
// giving its shape rule and whether it exists only in training.
package ir

import (
	"fmt"
	"sort"
	"strings"
)

// DType is the element type of a Value.
type DType uint8

const (
	F32 DType = iota // floating point (float32 in training, float64 in gradient checks)
	I32              // integer ids (token ids, targets)
)

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case I32:
		return "i32"
	}
	return fmt.Sprintf("dtype(%d)", d)
}

// Shape is a static tensor shape; a rank-0 shape is a scalar.
type Shape []int

// Numel is the number of elements.
func (s Shape) Numel() int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

// Equal reports whether two shapes are identical.
func (s Shape) Equal(o Shape) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

func (s Shape) String() string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// Clone returns a copy of s.
func (s Shape) Clone() Shape { return append(Shape(nil), s...) }

// Kind says where a Value's data comes from.
type Kind uint8

const (
	Intermediate Kind = iota // produced by a node
	Input                    // fed per step (token ids, targets)
	Param                    // trainable parameter, owned by the parameter store
	Buffer                   // non-trainable state owned by the store (running statistics, bias_scale)
	Const                    // data embedded in the graph (soft blocks Φ, folded biases)
)

func (k Kind) String() string {
	return [...]string{"tmp", "input", "param", "buffer", "const"}[k]
}

// Value is an SSA value of the graph.
type Value struct {
	ID    int
	Name  string
	Shape Shape
	DType DType
	Kind  Kind
	Def   *Node     // producing node, nil unless Kind == Intermediate
	Data  []float64 // Const data (row-major)
	// TrainingOnly marks buffers that only training changes (bias warm-in
	// scale, chaos factor); StripTraining freezes them into constants.
	TrainingOnly bool
}

func (v *Value) String() string {
	if v.Name != "" {
		return "%" + v.Name
	}
	return fmt.Sprintf("%%v%d", v.ID)
}

// Node is one op application.
type Node struct {
	ID      int
	Op      OpName
	Inputs  []*Value
	Outputs []*Value
	Attrs   Attrs
}

// Stream is the random stream a Random node draws from: its attribute
// "stream" (a builder that inserts nodes keeps its draws with it), else its
// id.
func (n *Node) Stream() int { return n.Attrs.Int("stream", n.ID) }

// Graph is a whole static-shape program.
type Graph struct {
	Name    string
	Nodes   []*Node
	Values  []*Value
	Outputs map[string]*Value // named results: "loss", "logits", stats
	Meta    map[string]string // builder facts (model kind, T, B, ...)
	nextID  int
}

// New returns an empty graph.
func New(name string) *Graph {
	return &Graph{Name: name, Outputs: map[string]*Value{}, Meta: map[string]string{}}
}

func (g *Graph) newValue(name string, s Shape, dt DType, k Kind) *Value {
	v := &Value{ID: g.nextID, Name: name, Shape: s.Clone(), DType: dt, Kind: k}
	g.nextID++
	g.Values = append(g.Values, v)
	return v
}

// Input adds a fed value.
func (g *Graph) Input(name string, s Shape, dt DType) *Value { return g.newValue(name, s, dt, Input) }

// Param adds a trainable parameter.
func (g *Graph) Param(name string, s Shape) *Value { return g.newValue(name, s, F32, Param) }

// Buffer adds non-trainable state held by the parameter store.
func (g *Graph) Buffer(name string, s Shape) *Value { return g.newValue(name, s, F32, Buffer) }

// Const adds constant data.
func (g *Graph) Const(name string, s Shape, data []float64) *Value {
	if len(data) != s.Numel() {
		panic(fmt.Sprintf("ir: const %s: %d values for shape %v", name, len(data), s))
	}
	v := g.newValue(name, s, F32, Const)
	v.Data = append([]float64(nil), data...)
	return v
}

// Scalar adds a rank-0 constant.
func (g *Graph) Scalar(x float64) *Value { return g.Const("", Shape{}, []float64{x}) }

// Lookup returns the value with the given name, or nil.
func (g *Graph) Lookup(name string) *Value {
	for _, v := range g.Values {
		if v.Name == name {
			return v
		}
	}
	return nil
}

// Apply adds a node and returns its outputs. Shapes come from the op table;
// a shape error panics, because it is a bug in a builder, not bad user input
// (builders validate configs before building).
func (g *Graph) Apply(op OpName, attrs Attrs, in ...*Value) []*Value {
	outs, err := g.TryApply(op, attrs, in...)
	if err != nil {
		panic(err)
	}
	return outs
}

// TryApply is Apply returning the shape error.
func (g *Graph) TryApply(op OpName, attrs Attrs, in ...*Value) ([]*Value, error) {
	def, ok := Ops[op]
	if !ok {
		return nil, fmt.Errorf("ir: unknown op %q", op)
	}
	if attrs == nil {
		attrs = Attrs{}
	}
	shapes, dts, err := def.Infer(in, attrs)
	if err != nil {
		names := make([]string, len(in))
		for i, v := range in {
			names[i] = v.String() + v.Shape.String()
		}
		return nil, fmt.Errorf("ir: %s(%s): %w", op, strings.Join(names, ", "), err)
	}
	n := &Node{ID: g.nextID, Op: op, Inputs: append([]*Value(nil), in...), Attrs: attrs}
	g.nextID++
	for i, s := range shapes {
		v := g.newValue("", s, dts[i], Intermediate)
		v.Def = n
		n.Outputs = append(n.Outputs, v)
	}
	g.Nodes = append(g.Nodes, n)
	return n.Outputs, nil
}

// Op1 applies a single-output op.
func (g *Graph) Op1(op OpName, attrs Attrs, in ...*Value) *Value { return g.Apply(op, attrs, in...)[0] }

// SetOutput names a result of the graph.
func (g *Graph) SetOutput(name string, v *Value) { g.Outputs[name] = v }

// OutputNames returns the output names sorted.
func (g *Graph) OutputNames() []string {
	names := make([]string, 0, len(g.Outputs))
	for k := range g.Outputs {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// ValuesOfKind lists the values of kind k in creation order.
func (g *Graph) ValuesOfKind(k Kind) []*Value {
	var out []*Value
	for _, v := range g.Values {
		if v.Kind == k {
			out = append(out, v)
		}
	}
	return out
}

// Uses maps each value to the nodes that read it.
func (g *Graph) Uses() map[*Value][]*Node {
	u := map[*Value][]*Node{}
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			u[in] = append(u[in], n)
		}
	}
	return u
}

// NewID hands out a fresh id (used by passes that add values or nodes).
func (g *Graph) NewID() int { id := g.nextID; g.nextID++; return id }

// AddValue registers a value built by a pass (its ID is assigned here).
func (g *Graph) AddValue(v *Value) *Value {
	v.ID = g.NewID()
	g.Values = append(g.Values, v)
	return v
}

// Prune drops values that are neither used, produced by a live node, nor an
// output. It keeps Params and Buffers that are still read.
func (g *Graph) Prune() {
	live := map[*Value]bool{}
	for _, n := range g.Nodes {
		for _, v := range n.Inputs {
			live[v] = true
		}
		for _, v := range n.Outputs {
			live[v] = true
		}
	}
	for _, v := range g.Outputs {
		live[v] = true
	}
	kept := g.Values[:0]
	for _, v := range g.Values {
		if live[v] || v.Kind == Input {
			kept = append(kept, v)
		}
	}
	g.Values = kept
}

// Attrs are an op's static attributes.
type Attrs map[string]any

// Int returns an int attribute or def.
func (a Attrs) Int(k string, def int) int {
	if v, ok := a[k]; ok {
		switch x := v.(type) {
		case int:
			return x
		case int64:
			return int(x)
		case float64:
			return int(x)
		}
	}
	return def
}

// Float returns a float attribute or def.
func (a Attrs) Float(k string, def float64) float64 {
	if v, ok := a[k]; ok {
		switch x := v.(type) {
		case float64:
			return x
		case float32:
			return float64(x)
		case int:
			return float64(x)
		}
	}
	return def
}

// Bool returns a bool attribute or def.
func (a Attrs) Bool(k string, def bool) bool {
	if v, ok := a[k]; ok {
		if b, ok := v.(bool); ok {
			return b
		}
	}
	return def
}

// Ints returns an []int attribute (nil when absent).
func (a Attrs) Ints(k string) []int {
	if v, ok := a[k]; ok {
		switch x := v.(type) {
		case []int:
			return x
		case Shape:
			return []int(x)
		}
	}
	return nil
}

// Clone copies the attribute map (values are treated as immutable).
func (a Attrs) Clone() Attrs {
	b := Attrs{}
	for k, v := range a {
		b[k] = v
	}
	return b
}
