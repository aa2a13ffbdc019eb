//go:build cgo

package runtime_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	cexport "github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/runtime"
)

// hfExport writes, from one checkpoint of cfg at length T, rpac's export
// with KV-cache graphs and the Hugging Face export, with v's fold and
// attention, and opens both.
func hfExport(t *testing.T, cfg model.Config, v kvVariant, T int) (*runtime.Model, *runtime.HFModel) {
	t.Helper()
	st := kvStore(t, &cfg, T)
	own, hfDir := t.TempDir(), t.TempDir()
	o := cexport.Options{Config: cfg, Store: st, Lengths: []int{T}, Fold: v.fold, Attention: v.attention, Out: own, Tokenizer: "test", EOS: 0}
	kv := o
	kv.KVCache = true
	if _, err := cexport.Export(context.Background(), kv); err != nil {
		t.Fatal(err)
	}
	o.Out = hfDir
	if _, err := cexport.HF(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	hm, err := runtime.OpenHF(hfDir, runtime.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := hm.Close(); err != nil {
			t.Error(err)
		}
	})
	return openT(t, own, runtime.Options{}), hm
}

// TestHFDecoderMatchesRPAC: the Hugging Face decoder, driven the Hugging
// Face way (a prompt, a chunk of several tokens against the past, then one
// token a call, the cache and the attention mask growing), gives at every
// position the logits of rpac's full graph and of rpac's own KV-cache
// Decoder, within 1e-4, up to the export's length (every cache variant,
// and a model with rotary positions); a token past it is refused.
func TestHFDecoderMatchesRPAC(t *testing.T) {
	requireORT(t)
	const T, tol = 24, 1e-4
	rope := kvCfg(model.Fuzzy)
	rope.RoPE, rope.PosInit = true, "none"
	for i, v := range append(kvVariants, kvVariants[0]) {
		cfg, name := kvCfg(v.kind), fmt.Sprintf("%v/%v/%v", v.kind, v.fold, v.attention)
		if i == len(kvVariants) {
			cfg, name = rope, name+"/rope"
		}
		t.Run(name, func(t *testing.T) {
			m, hm := hfExport(t, cfg, v, T)
			ctx := context.Background()
			V := m.VocabSize()
			if hm.Vocab != V || hm.Length != T || hm.Layers != 2 || hm.Heads != 3 || hm.HeadSize != 8 {
				t.Fatalf("HF decoder: vocabulary %d, length %d, %d layers of %d heads of %d", hm.Vocab, hm.Length, hm.Layers, hm.Heads, hm.HeadSize)
			}
			r := rand.New(rand.NewPCG(3, 4))
			seq := randomIDs(r, T, V)
			full, err := m.Logits(ctx, [][]int32{seq})
			if err != nil {
				t.Fatal(err)
			}
			d, err := m.NewDecoder(T, 1)
			if err != nil {
				t.Fatal(err)
			}
			const prompt = 5
			slot, last, err := d.Prefill(ctx, seq[:prompt])
			if err != nil {
				t.Fatal(err)
			}
			hs := hm.NewSequence()
			worst := 0.0
			// check compares position pos's HF row with the full graph's
			// and, where it has one, rpac's decoder's (own).
			check := func(pos int, got, own []float32) {
				t.Helper()
				diff := maxDiff(t, got, full[0].Row(pos))
				if own != nil {
					diff = max(diff, maxDiff(t, got, own))
				}
				if diff > tol {
					t.Fatalf("position %d: the HF decoder's logits differ from rpac's by %.3g", pos, diff)
				}
				worst = max(worst, diff)
			}
			feeds := []int{prompt, 4} // the prompt, a chunk against the past, then one at a time
			for n := prompt + 4; n < T; n++ {
				feeds = append(feeds, 1)
			}
			for _, n := range feeds {
				at := hs.Len()
				logits, err := hs.Feed(ctx, seq[at:at+n])
				if err != nil {
					t.Fatal(err)
				}
				for i := 0; i < n; i++ {
					p := at + i
					var own []float32
					switch {
					case p == prompt-1:
						own = last
					case p >= prompt: // rpac's decoder steps the same token
						rows, err := d.Step(ctx, []int{slot}, []int32{seq[p]})
						if err != nil {
							t.Fatal(err)
						}
						own = rows[0]
					}
					check(p, logits[i*V:(i+1)*V], own)
				}
			}
			if hs.Len() != T {
				t.Fatalf("fed %d tokens, want %d", hs.Len(), T)
			}
			if _, err := hs.Feed(ctx, seq[:1]); err == nil || !strings.Contains(err.Error(), "exceed the export's length") {
				t.Fatalf("token %d: error %v, want a refusal", T+1, err)
			}
			t.Logf("worst |Δlogit| %.3g over %d positions", worst, T)
		})
	}
}
