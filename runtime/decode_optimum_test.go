//go:build cgo

package runtime_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	ort "github.com/yalue/onnxruntime_go"

	cexport "github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
)

// feedDecode runs a decode graph once, for one sequence at position 2 of a
// 3-slot cache, as a driver that names the cache tensors past and present
// (each a %d pattern) would; onnxruntime allocates the outputs.
func feedDecode(path string, layers, heads, hd int, past, present string) error {
	in := []string{runtime.KVInputIDs, runtime.KVPositionIDs}
	out := []string{runtime.KVLogits}
	for l := 0; l < layers; l++ {
		in = append(in, fmt.Sprintf(past, l), fmt.Sprintf(strings.Replace(past, "key", "value", 1), l))
		out = append(out, fmt.Sprintf(present, l), fmt.Sprintf(strings.Replace(present, "key", "value", 1), l))
	}
	sess, err := ort.NewDynamicAdvancedSession(path, in, out, nil)
	if err != nil {
		return err
	}
	defer sess.Destroy()
	var vals []ort.Value
	defer func() {
		for _, v := range vals {
			v.Destroy()
		}
	}()
	ids, err := ort.NewTensor(ort.NewShape(1, 1), []int64{5})
	if err != nil {
		return err
	}
	pos, err := ort.NewTensor(ort.NewShape(1, 1), []int64{2})
	if err != nil {
		return err
	}
	vals = append(vals, ids, pos)
	for range 2 * layers {
		c, err := ort.NewTensor(ort.NewShape(1, int64(heads), 3, int64(hd)), make([]float32, heads*3*hd))
		if err != nil {
			return err
		}
		vals = append(vals, c)
	}
	return sess.Run(vals, make([]ort.Value, len(out)))
}

// TestKVGraphRefusesOptimumFeed: the fixed-slot decode graph does not take
// Hugging Face Optimum's cache names, so a driver written for Optimum's
// graphs (past_key_values.{i}.* in, present.{i}.* out) stops with an error
// naming the tensor instead of running with wrong logits; the same driver
// with the manifest's names runs.
func TestKVGraphRefusesOptimumFeed(t *testing.T) {
	requireORT(t)
	const T = 8
	dir := kvExport(t, kvVariant{model.Fuzzy, passes.FoldRPAMode, passes.AttentionOp}, T)
	m := openT(t, dir, runtime.Options{}) // loads onnxruntime for this process
	cfg := kvCfg(model.Fuzzy)
	path := filepath.Join(dir, cexport.KVFileName(T, runtime.GraphDecode))
	if _, err := m.NewDecoder(T, 1); err != nil {
		t.Fatal(err)
	}
	if err := feedDecode(path, cfg.Layers, cfg.Heads, cfg.HeadDim(), runtime.KVPastKey, runtime.KVPresentKey); err != nil {
		t.Fatalf("the manifest's names: %v", err)
	}
	err := feedDecode(path, cfg.Layers, cfg.Heads, cfg.HeadDim(), "past_key_values.%d.key", "present.%d.key")
	if err == nil || !strings.Contains(err.Error(), "past_key_values.0.key") {
		t.Fatalf("Optimum's names: error %v, want one naming past_key_values.0.key", err)
	}
	t.Logf("Optimum's names: %v", err)
}
