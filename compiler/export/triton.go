package export

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/passes"
	"google.golang.org/protobuf/proto"
)

// Defaults of TritonOptions.
const (
	DefaultTritonName       = "rpac"
	DefaultTritonMaxBatch   = 8
	DefaultTritonQueueDelay = 100 * time.Microsecond
)

// TritonOptions describe an export to a Triton Inference Server model
// repository. Options.Out is the repository; Options.Batch is ignored (the
// graphs take any batch up to MaxBatch).
type TritonOptions struct {
	Options
	// Name prefixes the model names: one model NAME_L{T} per length.
	Name string
	// MaxBatch is each model's max_batch_size.
	MaxBatch int
	// QueueDelay is the dynamic batcher's max_queue_delay_microseconds.
	QueueDelay time.Duration
}

// TritonModel is one model of the repository.
type TritonModel struct {
	Name   string // NAME_L{T}, also its folder under the repository
	T      int
	Config string // path of config.pbtxt
	Model  string // path of 1/model.onnx
	Bytes  int64  // of the ONNX file(s)
	Nodes  int
}

// batchDimName is the symbolic batch dimension of Triton's graphs.
const batchDimName = "batch"

// Triton writes a Triton model repository: for every length T a model
// NAME_L{T} with config.pbtxt (platform onnxruntime_onnx, max_batch_size,
// dynamic batching, inputs and outputs without the batch dimension) and
// version 1's model.onnx, whose batch dimension is variable (Triton
// batches only along a variable first dimension). The graph is lowered at
// batch 1 and 2; the two must differ only in shape constants whose first
// element grows with the batch, which are then computed from the input's
// batch at run time.
func Triton(ctx context.Context, o TritonOptions) ([]TritonModel, error) {
	o.Batch = 1
	if err := o.defaults(); err != nil {
		return nil, err
	}
	if o.Name == "" {
		o.Name = DefaultTritonName
	}
	if err := checkTritonName(o.Name); err != nil {
		return nil, err
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = DefaultTritonMaxBatch
	}
	if o.MaxBatch < 1 {
		return nil, fmt.Errorf("export: triton max_batch_size %d: want at least 1", o.MaxBatch)
	}
	if o.QueueDelay == 0 {
		o.QueueDelay = DefaultTritonQueueDelay
	}
	if o.DropBias {
		return nil, errors.New("export: a Triton repository holds the model itself; DropBias is for benchmarks")
	}
	if o.Quantize != onnx.QuantizeNone {
		return nil, fmt.Errorf("export: --quantize %s is not available for Triton: the int8 graph's per-token zero points are sized by the batch, which Triton varies; export fp32", o.Quantize)
	}
	if o.Fold == passes.FoldRankMode || o.Fold == passes.FoldRankApproxMode {
		return nil, fmt.Errorf("export: --fold %s is not available for Triton yet (its broadcast query/key components fix the batch); use --fold rpa", o.Fold)
	}
	if o.DType.Reduced() {
		return nil, fmt.Errorf("export: --dtype %s is not available for Triton yet; export fp32 (--format onnx takes it)", o.DType)
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	lengths := append([]int(nil), o.Lengths...)
	sort.Ints(lengths)
	var out []TritonModel
	for _, T := range lengths {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		tm, err := tritonLength(&o, T)
		if err != nil {
			return nil, fmt.Errorf("export: triton length %d: %w", T, err)
		}
		out = append(out, tm)
	}
	return out, nil
}

// checkTritonName keeps model names to what a folder and Triton accept.
func checkTritonName(name string) error {
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return fmt.Errorf("export: triton model name %q: use letters, digits, '_' and '-'", name)
		}
	}
	if name == "" {
		return errors.New("export: empty triton model name")
	}
	return nil
}

// tritonLength writes the model of one length.
func tritonLength(o *TritonOptions, T int) (TritonModel, error) {
	if _, err := EnsureRunning(&o.Config, T, o.Store, o.Trained, o.CalibIDs, o.CalibBatches, o.CalibBatch); err != nil {
		return TritonModel{}, err
	}
	lowered := make([]*onnxpb.ModelProto, 2)
	cfgJSON, err := json.Marshal(o.Config)
	if err != nil {
		return TritonModel{}, err
	}
	meta := Metadata{Length: T, Batch: batchDimName, MaxBatch: o.MaxBatch, VocabSize: o.Config.Vocab,
		Tokenizer: o.Tokenizer, EOS: o.EOS, Model: o.Config.Model, Config: cfgJSON, FoldMode: o.Fold, Attention: o.Attention}
	if o.Provenance != nil {
		meta.Provenance = o.provenance()
	}
	for i, B := range []int{1, 2} {
		g, _, err := Graph(&o.Config, T, B, o.Store, GraphOptions{Fold: o.Fold, Attention: o.Attention})
		if err != nil {
			return TritonModel{}, err
		}
		lowered[i], err = Lower(g, o.Store, onnx.Options{Opset: o.Opset, IRVersion: o.IRVersion, Metadata: meta.Props(),
			GraphName: fmt.Sprintf("rpac_%s_L%d", o.Config.Model, T)})
		if err != nil {
			return TritonModel{}, err
		}
	}
	m, err := DynamicBatch(lowered[0], lowered[1])
	if err != nil {
		return TritonModel{}, err
	}
	tm := TritonModel{Name: fmt.Sprintf("%s_L%d", o.Name, T), T: T}
	dir := filepath.Join(o.Out, tm.Name)
	if err := os.MkdirAll(filepath.Join(dir, "1"), 0o755); err != nil {
		return TritonModel{}, err
	}
	tm.Model = filepath.Join(dir, "1", "model.onnx")
	tm.Nodes = len(m.GetGraph().GetNode())
	conf, err := TritonConfig(tm.Name, m, o.MaxBatch, o.QueueDelay)
	if err != nil {
		return TritonModel{}, err
	}
	if err := onnx.Write(tm.Model, m); err != nil {
		return TritonModel{}, err
	}
	for _, p := range []string{tm.Model, onnx.DataFile(tm.Model)} {
		if st, err := os.Stat(p); err == nil {
			tm.Bytes += st.Size()
		}
	}
	tm.Config = filepath.Join(dir, "config.pbtxt")
	if err := os.WriteFile(tm.Config, []byte(conf), 0o644); err != nil {
		return TritonModel{}, fmt.Errorf("writing %s: %w", tm.Config, err)
	}
	return tm, nil
}

// DynamicBatch turns a graph lowered at batch 1 (b1) into one that takes
// any batch, using the same graph lowered at batch 2 (b2) to find what
// depends on the batch: the two must be identical but for the first
// dimension of the graph's inputs and outputs and for int64 shape
// constants whose first element doubles; those constants are replaced by
// Concat(Shape(input)[0:1]·k, rest), computed at run time. b1 is changed
// and returned.
func DynamicBatch(b1, b2 *onnxpb.ModelProto) (*onnxpb.ModelProto, error) {
	g1, g2 := b1.GetGraph(), b2.GetGraph()
	if len(g1.GetNode()) != len(g2.GetNode()) || len(g1.GetInitializer()) != len(g2.GetInitializer()) ||
		len(g1.GetInput()) != 1 || len(g2.GetInput()) != 1 {
		return nil, errors.New("the graphs lowered at batch 1 and 2 differ in structure; this model cannot take a variable batch")
	}
	for i := range g1.GetNode() {
		if !proto.Equal(g1.Node[i], g2.Node[i]) {
			return nil, fmt.Errorf("node %d (%s) differs between batch 1 and 2; this model cannot take a variable batch", i, g1.Node[i].GetOpType())
		}
	}
	input := g1.GetInput()[0].GetName()
	repl := map[string]string{}
	var pre []*onnxpb.NodeProto
	var inits []*onnxpb.TensorProto
	batch := ""
	for i, t1 := range g1.GetInitializer() {
		t2 := g2.GetInitializer()[i]
		if proto.Equal(t1, t2) {
			inits = append(inits, t1)
			continue
		}
		k, rest, err := batchShape(t1, t2)
		if err != nil {
			return nil, err
		}
		if batch == "" {
			batch = "rpac.batch"
			pre = append(pre, &onnxpb.NodeProto{Name: batch, OpType: "Shape", Input: []string{input}, Output: []string{batch},
				Attribute: []*onnxpb.AttributeProto{
					{Name: "start", Type: onnxpb.AttributeProto_INT, I: 0},
					{Name: "end", Type: onnxpb.AttributeProto_INT, I: 1},
				}})
		}
		name := t1.GetName()
		lead := batch
		if k != 1 {
			kc := name + ".k"
			inits = append(inits, int64Tensor(kc, []int64{k}))
			lead = name + ".lead"
			pre = append(pre, &onnxpb.NodeProto{Name: lead, OpType: "Mul", Input: []string{batch, kc}, Output: []string{lead}})
		}
		shape := lead
		if len(rest) > 0 {
			rc := name + ".rest"
			inits = append(inits, int64Tensor(rc, rest))
			shape = name + ".dyn"
			pre = append(pre, &onnxpb.NodeProto{Name: shape, OpType: "Concat", Input: []string{lead, rc}, Output: []string{shape},
				Attribute: []*onnxpb.AttributeProto{{Name: "axis", Type: onnxpb.AttributeProto_INT, I: 0}}})
		}
		repl[name] = shape
	}
	for _, n := range g1.GetNode() {
		for j, in := range n.Input {
			if r, ok := repl[in]; ok {
				n.Input[j] = r
			}
		}
	}
	g1.Node = append(pre, g1.Node...)
	g1.Initializer = inits
	g1.ValueInfo = nil // shape hints of the batch-1 graph
	for _, vs := range [][]*onnxpb.ValueInfoProto{g1.GetInput(), g1.GetOutput()} {
		for _, v := range vs {
			dims := v.GetType().GetTensorType().GetShape().GetDim()
			if len(dims) == 0 || dims[0].GetDimValue() != 1 {
				return nil, fmt.Errorf("%s: the first dimension is not the batch of 1", v.GetName())
			}
			dims[0].Value = &onnxpb.TensorShapeProto_Dimension_DimParam{DimParam: batchDimName}
		}
	}
	return b1, nil
}

// batchShape checks that an int64 vector constant holds a shape whose
// first element grows with the batch (k at batch 1, 2k at batch 2, the
// rest equal) and returns k and the rest.
func batchShape(t1, t2 *onnxpb.TensorProto) (int64, []int64, error) {
	bad := fmt.Errorf("constant %s differs between batch 1 and 2 beyond a leading batch dimension; this model cannot take a variable batch", t1.GetName())
	if t1.GetDataType() != int32(onnxpb.TensorProto_INT64) || len(t1.GetDims()) != 1 || t1.GetDataLocation() == onnxpb.TensorProto_EXTERNAL {
		return 0, nil, bad
	}
	v1, v2 := int64s(t1), int64s(t2)
	if len(v1) == 0 || len(v1) != len(v2) || v1[0] < 1 || v2[0] != 2*v1[0] {
		return 0, nil, bad
	}
	for i := 1; i < len(v1); i++ {
		if v1[i] != v2[i] {
			return 0, nil, bad
		}
	}
	return v1[0], v1[1:], nil
}

func int64s(t *onnxpb.TensorProto) []int64 {
	if raw := t.GetRawData(); len(raw) > 0 {
		out := make([]int64, len(raw)/8)
		for i := range out {
			out[i] = int64(binary.LittleEndian.Uint64(raw[8*i:]))
		}
		return out
	}
	return t.GetInt64Data()
}

func int64Tensor(name string, vals []int64) *onnxpb.TensorProto {
	raw := make([]byte, 8*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint64(raw[8*i:], uint64(v))
	}
	return &onnxpb.TensorProto{Name: name, DataType: int32(onnxpb.TensorProto_INT64), Dims: []int64{int64(len(vals))}, RawData: raw}
}

// tritonTypes maps ONNX element types to Triton's data types.
var tritonTypes = map[int32]string{
	int32(onnxpb.TensorProto_FLOAT): "TYPE_FP32", int32(onnxpb.TensorProto_FLOAT16): "TYPE_FP16",
	int32(onnxpb.TensorProto_BFLOAT16): "TYPE_BF16", int32(onnxpb.TensorProto_DOUBLE): "TYPE_FP64",
	int32(onnxpb.TensorProto_INT64): "TYPE_INT64", int32(onnxpb.TensorProto_INT32): "TYPE_INT32",
	int32(onnxpb.TensorProto_INT16): "TYPE_INT16", int32(onnxpb.TensorProto_INT8): "TYPE_INT8",
	int32(onnxpb.TensorProto_UINT8): "TYPE_UINT8", int32(onnxpb.TensorProto_BOOL): "TYPE_BOOL",
}

// TritonConfig renders a model's config.pbtxt (protobuf text format of
// Triton's ModelConfig) from the graph's inputs and outputs: with
// max_batch_size > 0 the dims leave out the first, batch, dimension.
func TritonConfig(name string, m *onnxpb.ModelProto, maxBatch int, queueDelay time.Duration) (string, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "name: %q\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: %d\n", name, maxBatch)
	section := func(kind string, vs []*onnxpb.ValueInfoProto) error {
		fmt.Fprintf(&b, "%s [\n", kind)
		for i, v := range vs {
			tt := v.GetType().GetTensorType()
			typ, ok := tritonTypes[tt.GetElemType()]
			if !ok {
				return fmt.Errorf("%s %s: element type %s has no Triton data type", kind, v.GetName(), onnx.ElemTypeName(tt.GetElemType()))
			}
			dims := tt.GetShape().GetDim()
			if len(dims) < 2 || dims[0].GetDimParam() != batchDimName {
				return fmt.Errorf("%s %s: want a variable first (batch) dimension and at least one more", kind, v.GetName())
			}
			var ds []string
			for _, d := range dims[1:] {
				if d.GetDimValue() < 1 {
					return fmt.Errorf("%s %s: dimensions after the batch must be static", kind, v.GetName())
				}
				ds = append(ds, strconv.FormatInt(d.GetDimValue(), 10))
			}
			sep := ","
			if i == len(vs)-1 {
				sep = ""
			}
			fmt.Fprintf(&b, "  {\n    name: %q\n    data_type: %s\n    dims: [ %s ]\n  }%s\n", v.GetName(), typ, strings.Join(ds, ", "), sep)
		}
		b.WriteString("]\n")
		return nil
	}
	if err := section("input", m.GetGraph().GetInput()); err != nil {
		return "", err
	}
	if err := section("output", m.GetGraph().GetOutput()); err != nil {
		return "", err
	}
	fmt.Fprintf(&b, "dynamic_batching {\n  max_queue_delay_microseconds: %d\n}\n", queueDelay.Microseconds())
	return b.String(), nil
}
