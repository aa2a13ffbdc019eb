package export_test

import (
	"context"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
)

// TestExportKVCache: --kv-cache adds a prefill and a decode graph per
// length, listed in the manifest with their kind and hash and described by
// its kv_cache record; each file says which graph it is; plain attention
// spells attention out in them too; a model with rotary positions and no
// position embedding decodes with the rows of its tables at each position.
func TestExportKVCache(t *testing.T) {
	for _, c := range cacheCases {
		att := c.att
		cfg := c.config()
		st := smallStore(t, &cfg, lengths...)
		dir := t.TempDir()
		res, err := export.Export(context.Background(), export.Options{Config: cfg, Store: st, Lengths: lengths, Attention: att,
			KVCache: true, Out: dir, Tokenizer: "test", EOS: 3})
		if err != nil {
			t.Fatal(err)
		}
		man := res.Manifest
		if want := runtime.NewKVCache(cfg.Layers, cfg.Heads, cfg.HeadDim(), lengths); !reflect.DeepEqual(man.KVCache, want) {
			t.Fatalf("kv_cache %+v, want %+v", man.KVCache, want)
		}
		for _, T := range lengths {
			for _, g := range []runtime.GraphKind{runtime.GraphPrefill, runtime.GraphDecode} {
				f, ok := man.GraphFile(T, g)
				if !ok || f.Path != export.KVFileName(T, g) {
					t.Fatalf("%s graph of length %d: %+v, %v", g, T, f, ok)
				}
				m, err := onnx.Read(filepath.Join(dir, f.Path))
				if err != nil {
					t.Fatal(err)
				}
				s := onnx.Inspect(m)
				if s.Metadata["graph"] != string(g) || s.Metadata["length"] != strconv.Itoa(T) {
					t.Errorf("%s: metadata graph %q length %q", f.Path, s.Metadata["graph"], s.Metadata["length"])
				}
				if n := s.Ops["Attention"]; (att == passes.AttentionOp) != (n == cfg.Layers) || (att == passes.AttentionPlain && n != 0) {
					t.Errorf("%s with attention %s: %d Attention nodes", f.Path, att, n)
				}
			}
			if got := res.Lengths[indexOf(lengths, T)].KVFiles; len(got) != 2 {
				t.Errorf("length %d: KVFiles %v", T, got)
			}
		}
		if err := runtime.Check(context.Background(), dir); err != nil {
			t.Fatal(err)
		}
		requireORT(t)
		ids := make([]int32, 4*24+1)
		for i := range ids {
			ids[i] = int32((i * 37) % cfg.Vocab)
		}
		vr, err := export.Verify(context.Background(), export.VerifyOptions{Dir: dir, Config: cfg, Store: st, IDs: ids, Batches: 1, Batch: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range vr {
			// sequence r decodes its last 16+r positions (fewer when T is short)
			want := min(16, r.T-1) + min(17, r.T-1)
			if r.KVSteps != want || r.KVMaxAbsDiff > 1e-4 {
				t.Errorf("verify L=%d with %s (rope %v): %d KV decode steps (want %d), max|Δlogit| %.3g", r.T, att, c.rope, r.KVSteps, want, r.KVMaxAbsDiff)
			}
		}
	}
	cfg := smallCfg(model.Fuzzy)
	for _, o := range []export.Options{{Quantize: onnx.QuantizeInt8}, {DropBias: true}} {
		o.Config, o.Store, o.Lengths, o.KVCache, o.Out, o.EOS = cfg, smallStore(t, &cfg, 8), []int{8}, true, t.TempDir(), 3
		if _, err := export.Export(context.Background(), o); err == nil || !strings.Contains(err.Error(), "KV-cache") {
			t.Errorf("KV cache with quantize %q, drop bias %v: %v", o.Quantize, o.DropBias, err)
		}
	}
	// smeared keys mix each key with the one before: no exact cache
	cfg.SmearKeys = true
	o := export.Options{Config: cfg, Store: smallStore(t, &cfg, 8), Lengths: []int{8}, KVCache: true, Out: t.TempDir(), EOS: 3}
	if _, err := export.Export(context.Background(), o); err == nil || !strings.Contains(err.Error(), "smear_keys") {
		t.Errorf("KV cache with smeared keys: %v", err)
	}
}

// cacheCase is a lowering of attention and whether the model has rotary
// positions instead of a position embedding.
type cacheCase struct {
	att  passes.AttentionMode
	rope bool
}

// cacheCases are the cases the cache graphs' export tests cover.
var cacheCases = []cacheCase{{passes.AttentionOp, false}, {passes.AttentionPlain, false}, {passes.AttentionOp, true}}

// config is the small fuzzy model of the case.
func (c cacheCase) config() model.Config {
	cfg := smallCfg(model.Fuzzy)
	if c.rope {
		cfg.RoPE, cfg.PosInit = true, "none"
	}
	return cfg
}

func indexOf(xs []int, x int) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return -1
}
