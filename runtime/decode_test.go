package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	cexport "github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
)

// kvCfg is a small model of the tiny preset's kind (fuzzy or baseline).
func kvCfg(kind model.Kind) model.Config {
	p, _ := model.LookupPreset("tiny")
	c := p.Config
	c.Model = kind
	c.Vocab, c.DModel, c.Heads, c.Layers, c.MaxLen = 61, 24, 3, 2, 32
	c.Experts, c.TopK = 3, 2
	return c
}

// kvStore is a random-init checkpoint of cfg with random running
// statistics at every length of ls and a warm-in scale of 1.
func kvStore(t *testing.T, cfg *model.Config, ls ...int) *kernels.Store {
	t.Helper()
	st := kernels.NewStore(ir.FP32)
	r := rand.New(rand.NewPCG(5, 6))
	for _, T := range ls {
		mg, err := model.Build(cfg, model.Opts{T: T, B: 1, Mode: model.Eval})
		if err != nil {
			t.Fatal(err)
		}
		if err := model.InitStore(mg.Specs, st, 3); err != nil {
			t.Fatal(err)
		}
		for _, s := range mg.Specs {
			if s.Running == "" {
				continue
			}
			d := st.Get(s.Name)
			R := s.Shape[1]
			for i := 0; i < d.Len(); i += R {
				w := make([]float64, R)
				var sum float64
				for j := range w {
					w[j] = 0.05 + r.Float64()
					sum += w[j]
				}
				for j := range w {
					d.Set(i+j, w[j]/sum)
				}
			}
		}
	}
	// Larger projections than the initialisation's, so that attention moves
	// the logits well above the tolerance.
	for name, tt := range st.Tensors {
		if strings.HasSuffix(name, ".weight") && len(tt.Shape) == 2 && !strings.HasSuffix(name, "_emb.weight") {
			for i := 0; i < tt.Len(); i++ {
				tt.Set(i, 6*tt.At(i))
			}
		}
	}
	return st
}

type kvVariant struct {
	kind      model.Kind
	fold      passes.FoldMode
	attention passes.AttentionMode
}

// kvVariants are the models and lowerings the cache tests cover.
var kvVariants = []kvVariant{
	{model.Fuzzy, passes.FoldRPAMode, passes.AttentionOp},
	{model.Fuzzy, passes.FoldRPAMode, passes.AttentionPlain},
	{model.Fuzzy, passes.FoldNoneMode, passes.AttentionOp},
	{model.Baseline, passes.FoldRPAMode, passes.AttentionOp},
	{model.Baseline, passes.FoldRPAMode, passes.AttentionPlain},
}

// kvExport writes an export with KV-cache graphs at lengths ls.
func kvExport(t *testing.T, v kvVariant, ls ...int) string {
	t.Helper()
	cfg := kvCfg(v.kind)
	dir := t.TempDir()
	_, err := cexport.Export(context.Background(), cexport.Options{Config: cfg, Store: kvStore(t, &cfg, ls...), Lengths: ls,
		Fold: v.fold, Attention: v.attention, KVCache: true, Out: dir, Tokenizer: "test", EOS: 0})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func randomIDs(r *rand.Rand, n, V int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(r.IntN(V))
	}
	return ids
}

// maxDiff is the largest |a-b|.
func maxDiff(t *testing.T, a, b []float32) float64 {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%d values against %d", len(a), len(b))
	}
	var m float64
	for i := range a {
		d := math.Abs(float64(a[i]) - float64(b[i]))
		if d != d {
			t.Fatalf("NaN at %d: %v against %v", i, a[i], b[i])
		}
		m = max(m, d)
	}
	return m
}

// TestDecoderMatchesRecompute: a batch of sequences at different positions
// (prompts of different lengths, steps that skip a sequence, a slot reused
// after Release over stale cache entries) gets, at every step, the logits
// the full graph of length T computes for the whole sequence.
func TestDecoderMatchesRecompute(t *testing.T) {
	requireORT(t)
	const T, tol = 24, 1e-4
	for _, v := range kvVariants {
		t.Run(fmt.Sprintf("%v/%v/%v", v.kind, v.fold, v.attention), func(t *testing.T) {
			dir := kvExport(t, v, T)
			m := openT(t, dir, runtime.Options{})
			ctx := context.Background()
			V := m.VocabSize()
			d, err := m.NewDecoder(T, 3)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			worst, ctxEffect := 0.0, math.Inf(1)
			check := func(what string, seq []int32, got []float32) {
				t.Helper()
				want, err := m.Logits(ctx, [][]int32{seq})
				if err != nil {
					t.Fatal(err)
				}
				if diff := maxDiff(t, got, want[0].Row(len(seq)-1)); diff > tol {
					t.Fatalf("%s (%d tokens): cached logits differ from the recomputed ones by %.3g", what, len(seq), diff)
				} else {
					worst = max(worst, diff)
				}
				// The context matters: another history before the same last
				// token at the same position changes its logits.
				if len(seq) > 1 {
					other := append(randomIDs(r, len(seq)-1, V), seq[len(seq)-1])
					alt, err := m.Logits(ctx, [][]int32{other})
					if err != nil {
						t.Fatal(err)
					}
					ctxEffect = min(ctxEffect, maxDiff(t, got, alt[0].Row(len(seq)-1)))
				}
			}
			seqs := map[int][]int32{}
			prefill := func(n int) {
				p := randomIDs(r, n, V)
				slot, last, err := d.Prefill(ctx, p)
				if err != nil {
					t.Fatal(err)
				}
				seqs[slot] = p
				check("prefill", p, last)
			}
			for _, n := range []int{11, 1, 5} {
				prefill(n)
			}
			for round := 0; round < 10; round++ {
				if round == 5 { // slot 0 again, over the stale entries of its longer sequence
					if err := d.Release(0); err != nil {
						t.Fatal(err)
					}
					delete(seqs, 0)
					prefill(2)
				}
				var slots []int
				var toks []int32
				for s := 0; s < 3; s++ {
					if round%3 == 1 && s == 1 {
						continue // sequence 1 falls behind
					}
					slots = append(slots, s)
					toks = append(toks, int32(r.IntN(V)))
				}
				rows, err := d.Step(ctx, slots, toks)
				if err != nil {
					t.Fatal(err)
				}
				for i, s := range slots {
					seqs[s] = append(seqs[s], toks[i])
					check("step", seqs[s], rows[i])
					if n, err := d.Len(s); err != nil || n != len(seqs[s]) {
						t.Fatalf("Len(%d) = %d, %v; want %d", s, n, err, len(seqs[s]))
					}
				}
			}
			t.Logf("largest logit difference to recompute: %.3g; smallest effect of the context: %.3g", worst, ctxEffect)
			if ctxEffect < 100*tol {
				t.Fatalf("the context changes the logits by only %.3g: the test cannot tell a cache from none", ctxEffect)
			}
		})
	}
}

// TestDecoderErrors: misuse is an error that says what to do, never a panic,
// and leaves the decoder usable.
func TestDecoderErrors(t *testing.T) {
	requireORT(t)
	dir := kvExport(t, kvVariant{model.Fuzzy, passes.FoldRPAMode, passes.AttentionOp}, 8, 16)
	m, err := runtime.Open(dir, runtime.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err = m.NewDecoder(12, 1)
	wantErr(t, err, "length 12", "[8 16]")
	_, err = m.NewDecoder(8, 0)
	wantErr(t, err, "capacity 0")
	d, err := m.NewDecoder(8, 2)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = d.Prefill(ctx, make([]int32, 9))
	wantErr(t, err, "9 tokens", "length 8", "LengthFor")
	_, _, err = d.Prefill(ctx, nil)
	wantErr(t, err, "empty")
	_, _, err = d.Prefill(ctx, []int32{1, 61})
	wantErr(t, err, "position 1", "token id 61")
	_, err = d.Step(ctx, []int{0}, []int32{1})
	wantErr(t, err, "slot 0 is not in use", "Prefill")
	a, _, err := d.Prefill(ctx, []int32{1, 2, 3, 4, 5, 6, 7})
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := d.Prefill(ctx, []int32{1})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = d.Prefill(ctx, []int32{1})
	wantErr(t, err, "all 2 slots", "Release")
	_, err = d.Step(ctx, []int{a, a}, []int32{1, 2})
	wantErr(t, err, "twice")
	_, err = d.Step(ctx, []int{a, b}, []int32{1})
	wantErr(t, err, "2 slots and 1 tokens")
	_, err = d.Step(ctx, nil, nil)
	wantErr(t, err, "at least one slot")
	_, err = d.Step(ctx, []int{5}, []int32{1})
	wantErr(t, err, "slot 5 is outside")
	_, err = d.Step(ctx, []int{b}, []int32{-1})
	wantErr(t, err, "token id -1")
	if _, err := d.Step(ctx, []int{a, b}, []int32{1, 2}); err != nil { // a now holds 8 = T tokens
		t.Fatal(err)
	}
	_, err = d.Step(ctx, []int{a}, []int32{1})
	wantErr(t, err, "slot 0 holds 8 tokens", "longer length")
	if err := d.Release(a); err != nil {
		t.Fatal(err)
	}
	wantErr(t, d.Release(a), "not in use")
	_, err = d.Len(a)
	wantErr(t, err, "not in use")
	if n, err := d.Len(b); err != nil || n != 2 {
		t.Fatalf("Len(%d) = %d, %v; want 2", b, n, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := d.Step(cctx, []int{b}, []int32{1}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Step: %v", err)
	}
	if n, _ := d.Len(b); n != 2 {
		t.Fatalf("a cancelled Step moved the slot to %d tokens", n)
	}
	if L, err := m.LengthFor(9); err != nil || L != 16 {
		t.Fatalf("LengthFor(9) = %d, %v; want 16", L, err)
	}
	_, err = m.LengthFor(17)
	wantErr(t, err, "17 tokens", "[8 16]")
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = d.Step(ctx, []int{b}, []int32{1})
	wantErr(t, err, "closed")
	_, err = m.NewDecoder(8, 1)
	wantErr(t, err, "closed")

	plain := tinyExport(t, []int{4}, 1, nil)
	pm := openT(t, plain, runtime.Options{})
	_, err = pm.NewDecoder(4, 1)
	wantErr(t, err, "no KV-cache graphs", "--kv-cache")
}

// TestGenerateOnCache: Generate samples the same tokens on the cache as by
// running the full graph for every token (GenerateOptions.Recompute), at the
// one length that holds prompt and new tokens, greedy and sampled; from
// many goroutines at once (go test -race).
func TestGenerateOnCache(t *testing.T) {
	requireORT(t)
	dir := kvExport(t, kvVariant{model.Fuzzy, passes.FoldRPAMode, passes.AttentionOp}, 8, 24)
	m := openT(t, dir, runtime.Options{Parallel: 2})
	if got := m.KVCacheLengths(); len(got) != 2 || got[0] != 8 || got[1] != 24 {
		t.Fatalf("KVCacheLengths = %v", got)
	}
	ctx := context.Background()
	prompt := []int32{3, 14, 15, 9, 26}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := runtime.GenerateOptions{MaxNewTokens: 14, Temperature: float64(g % 2), TopK: 5, Seed: uint64(g)}
			cached, err := m.Generate(ctx, prompt, o)
			if err != nil {
				errs <- err
				return
			}
			o.Recompute = true
			full, err := m.Generate(ctx, prompt, o)
			if err != nil {
				errs <- err
				return
			}
			if fmt.Sprint(cached) != fmt.Sprint(full) || len(cached) != 14 {
				errs <- fmt.Errorf("options %+v: cached %v, recomputed %v", o, cached, full)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
