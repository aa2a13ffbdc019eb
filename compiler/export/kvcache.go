package export

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime/manifest"
)

// KVFileName is the file of length T's prefill or decode graph.
func KVFileName(T int, g manifest.GraphKind) string {
	return fmt.Sprintf("model_L%d.%s.onnx", T, g)
}

// kvGraphs pairs the manifest's graph kinds with the lowering's.
var kvGraphs = []struct {
	kind manifest.GraphKind
	kv   onnx.KVGraph
}{
	{manifest.GraphPrefill, onnx.KVPrefill},
	{manifest.GraphDecode, onnx.KVDecode},
}

// exportKV writes length T's prefill and decode graphs (onnx.LowerKV) and
// returns the cache layout and their manifest entries. g is the length's
// export graph; the KV-cache lowering needs its attention fused into
// FusedAttention nodes, so with another lowering the graph is built again
// with AttentionOp and the ONNX attention is spelled out as o.Attention
// says.
func exportKV(o *Options, T int, g *ir.Graph, meta Metadata) (onnx.KVLayout, []manifest.File, error) {
	if o.Attention != passes.AttentionOp {
		var err error
		g, _, err = Graph(&o.Config, T, 1, o.Store, GraphOptions{Fold: o.Fold, Attention: passes.AttentionOp})
		if err != nil {
			return onnx.KVLayout{}, nil, err
		}
	}
	var lay onnx.KVLayout
	var files []manifest.File
	for _, k := range kvGraphs {
		m := meta
		m.Batch, m.Graph = "", k.kind
		mp, l, err := onnx.LowerKV(g, storeWeights(o.Store), onnx.KVOptions{Graph: k.kv, PlainAttention: o.Attention == passes.AttentionPlain},
			onnx.Options{Opset: o.Opset, IRVersion: o.IRVersion, Metadata: m.Props(), GraphName: fmt.Sprintf("rpac_%s_L%d_%s", o.Config.Model, T, k.kind)})
		if err != nil {
			return onnx.KVLayout{}, nil, err
		}
		lay = l
		name := KVFileName(T, k.kind)
		path := filepath.Join(o.Out, name)
		if err := onnx.Write(path, mp); err != nil {
			return onnx.KVLayout{}, nil, err
		}
		f, err := manifest.NewFile(o.Out, name, T)
		if err != nil {
			return onnx.KVLayout{}, nil, err
		}
		f.Graph = k.kind
		files = append(files, f)
		if _, err := os.Stat(onnx.DataFile(path)); err == nil {
			df, err := manifest.NewFile(o.Out, filepath.Base(onnx.DataFile(path)), T)
			if err != nil {
				return onnx.KVLayout{}, nil, err
			}
			df.Graph = k.kind
			files = append(files, df)
		}
	}
	return lay, files, nil
}
