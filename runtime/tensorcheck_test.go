package runtime_test

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/runtime"
)

// poison rewrites the first float initializer of dir/name with mod and
// records the file's new hash; it returns the initializer's name.
func poison(t *testing.T, dir, name string, mod func(tp *onnxpb.TensorProto)) string {
	t.Helper()
	path := filepath.Join(dir, name)
	m, err := onnx.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range m.Graph.Initializer {
		if tp.GetDataType() == int32(onnxpb.TensorProto_FLOAT) && len(tp.RawData) >= 8 {
			mod(tp)
			if err := onnx.Write(path, m); err != nil {
				t.Fatal(err)
			}
			rehash(t, dir, name)
			return tp.GetName()
		}
	}
	t.Fatalf("%s has no float initializer stored in the file", name)
	return ""
}

// TestNonFiniteWeightsEveryPath: a NaN or +Inf weight is refused however
// the file stores it (float16, bfloat16 and double raw data, float_data,
// int32_data of float16, a Constant node, external data) and in the
// KV-cache graphs as in the full ones; the error names the tensor. An
// integer tensor where the stored bytes do not match the shape, and a
// tensor of a dtype no export writes, are refused as well.
func TestNonFiniteWeightsEveryPath(t *testing.T) {
	ctx := context.Background()
	half := func(bits uint16, n int) []byte {
		b := make([]byte, 2*n)
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint16(b[2*i:], 0x3c00) // 1.0
		}
		binary.LittleEndian.PutUint16(b[2*(n-1):], bits)
		return b
	}
	numel := func(tp *onnxpb.TensorProto) int {
		n := 1
		for _, d := range tp.Dims {
			n *= int(d)
		}
		return n
	}
	cases := []struct {
		name string
		mod  func(tp *onnxpb.TensorProto)
		want string
	}{
		{"float16 NaN", func(tp *onnxpb.TensorProto) {
			tp.DataType, tp.RawData = int32(onnxpb.TensorProto_FLOAT16), half(0x7e00, numel(tp))
		}, "NaN"},
		{"bfloat16 +Inf", func(tp *onnxpb.TensorProto) {
			tp.DataType, tp.RawData = int32(onnxpb.TensorProto_BFLOAT16), half(0x7f80, numel(tp))
		}, "NaN or +Inf"},
		{"double NaN", func(tp *onnxpb.TensorProto) {
			b := make([]byte, 8*numel(tp))
			binary.LittleEndian.PutUint64(b[8:], math.Float64bits(math.NaN()))
			tp.DataType, tp.RawData = int32(onnxpb.TensorProto_DOUBLE), b
		}, "NaN"},
		{"float_data NaN", func(tp *onnxpb.TensorProto) {
			tp.FloatData = make([]float32, numel(tp))
			tp.FloatData[len(tp.FloatData)-1] = float32(math.NaN())
			tp.RawData = nil
		}, "NaN"},
		{"float16 in int32_data", func(tp *onnxpb.TensorProto) {
			tp.DataType, tp.RawData = int32(onnxpb.TensorProto_FLOAT16), nil
			tp.Int32Data = make([]int32, numel(tp))
			tp.Int32Data[0] = 0x7c00 // +Inf
		}, "NaN or +Inf"},
		{"shape and bytes disagree", func(tp *onnxpb.TensorProto) { tp.RawData = tp.RawData[:len(tp.RawData)-4] }, "needs"},
		{"int32 bytes for a float shape", func(tp *onnxpb.TensorProto) {
			tp.DataType = int32(onnxpb.TensorProto_INT64)
		}, "needs"},
		{"string tensor", func(tp *onnxpb.TensorProto) {
			tp.DataType, tp.RawData, tp.StringData = int32(onnxpb.TensorProto_STRING), nil, [][]byte{[]byte("x")}
		}, "data type 8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := tinyExport(t, []int{4}, 1, nil)
			name := poison(t, dir, "model_L4.onnx", c.mod)
			err := runtime.Check(ctx, dir)
			wantErr(t, err, "model_L4.onnx", strconv.Quote(name), c.want)
		})
	}

	t.Run("constant node", func(t *testing.T) {
		dir := tinyExport(t, []int{4}, 1, nil)
		path := filepath.Join(dir, "model_L4.onnx")
		m, err := onnx.Read(path)
		if err != nil {
			t.Fatal(err)
		}
		nan := make([]byte, 4)
		binary.LittleEndian.PutUint32(nan, 0x7fc00000)
		m.Graph.Node = append(m.Graph.Node, &onnxpb.NodeProto{OpType: "Constant", Output: []string{"unused_c"},
			Attribute: []*onnxpb.AttributeProto{{Name: "value", Type: onnxpb.AttributeProto_TENSOR,
				T: &onnxpb.TensorProto{Name: "hidden_nan", DataType: int32(onnxpb.TensorProto_FLOAT), RawData: nan}}}})
		if err := onnx.Write(path, m); err != nil {
			t.Fatal(err)
		}
		rehash(t, dir, "model_L4.onnx")
		wantErr(t, runtime.Check(ctx, dir), `"hidden_nan"`, "NaN")
	})

	t.Run("external data", func(t *testing.T) {
		// Move a float initializer's values to an external data file
		// listed in the manifest, then poison them there.
		dir := tinyExport(t, []int{4}, 1, nil)
		path := filepath.Join(dir, "model_L4.onnx")
		m, err := onnx.Read(path)
		if err != nil {
			t.Fatal(err)
		}
		var tp *onnxpb.TensorProto
		for _, x := range m.Graph.Initializer {
			if x.GetDataType() == int32(onnxpb.TensorProto_FLOAT) && len(x.RawData) >= 8 {
				tp = x
				break
			}
		}
		data := append(make([]byte, 16), tp.RawData...)
		binary.LittleEndian.PutUint32(data[16+4:], 0x7f800000) // +Inf
		ext := func(loc string) []*onnxpb.StringStringEntryProto {
			return []*onnxpb.StringStringEntryProto{{Key: "location", Value: loc}, {Key: "offset", Value: "16"},
				{Key: "length", Value: strconv.Itoa(len(tp.RawData))}}
		}
		tp.RawData, tp.DataLocation, tp.ExternalData = nil, onnxpb.TensorProto_EXTERNAL, ext("model_L4.onnx.data")
		onnx.Write(path, m)
		os.WriteFile(path+".data", data, 0o644) // after Write, which removes a stale data file
		rewriteManifest(t, dir, func(man *runtime.Manifest) {
			f, err := runtime.NewFile(dir, "model_L4.onnx.data", 4)
			if err != nil {
				t.Fatal(err)
			}
			man.Files = append(man.Files, f)
		})
		rehash(t, dir, "model_L4.onnx")
		wantErr(t, runtime.Check(ctx, dir), strconv.Quote(tp.GetName()), "NaN or +Inf")

		// External data outside the manifest's files is refused.
		for _, loc := range []string{"../elsewhere.data", "other.data", "/etc/passwd"} {
			tp.ExternalData = ext(loc)
			onnx.Write(path, m)
			os.WriteFile(path+".data", data, 0o644)
			rehash(t, dir, "model_L4.onnx")
			wantErr(t, runtime.Check(ctx, dir), strconv.Quote(tp.GetName()), "external data", loc)
		}
	})

	t.Run("kv-cache graphs", func(t *testing.T) {
		dir := kvExport(t, kvVariant{kind: model.Baseline}, 8)
		name := ""
		for _, f := range []string{"prefill", "decode"} {
			entries, _ := filepath.Glob(filepath.Join(dir, "*"+f+"*.onnx"))
			if len(entries) != 1 {
				t.Fatalf("%s graphs: %v", f, entries)
			}
			if f == "decode" {
				name = poison(t, dir, filepath.Base(entries[0]), func(tp *onnxpb.TensorProto) {
					binary.LittleEndian.PutUint32(tp.RawData[4:], 0x7fc00000)
				})
			}
		}
		wantErr(t, runtime.Check(ctx, dir), "decode", strconv.Quote(name), "NaN")
		if !strings.Contains(name, ".") && name == "" {
			t.Fatal("no tensor name")
		}
	})
}
