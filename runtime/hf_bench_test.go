//go:build cgo

package runtime_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/rpac-dev/rpac/app/inferbench"
	cexport "github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/runtime"
)

// benchPrompt is the prompt length of the decode-step benchmarks.
const benchPrompt = 8

// stepExports writes a preset's random weights at length L as rpac's
// export with KV-cache graphs and as the Hugging Face export, and opens
// both with one onnxruntime thread.
func stepExports(b *testing.B, preset string, L int) (*runtime.Model, *runtime.HFModel) {
	b.Helper()
	p, err := model.LookupPreset(preset)
	if err != nil {
		b.Fatal(err)
	}
	cfg := p.Config
	st, err := inferbench.RandomStore(&cfg, 1, L)
	if err != nil {
		b.Fatal(err)
	}
	own, hfDir := b.TempDir(), b.TempDir()
	o := cexport.Options{Config: cfg, Store: st, Lengths: []int{L}, Out: own, Tokenizer: "none", KVCache: true}
	if _, err := cexport.Export(context.Background(), o); err != nil {
		b.Fatal(err)
	}
	o.Out, o.KVCache = hfDir, false
	if _, err := cexport.HF(context.Background(), o); err != nil {
		b.Fatal(err)
	}
	m, err := runtime.Open(own, runtime.Options{Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	hm, err := runtime.OpenHF(hfDir, runtime.Options{Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { hm.Close() })
	return m, hm
}

// benchTokens are the benchmark's token ids: a prompt and the tokens fed
// after it.
func benchTokens(n, V int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32((i*7919 + 13) % V)
	}
	return ids
}

// BenchmarkDecodeStep: one decode step (one new token of one sequence) of
// the Hugging Face decoder, fed as transformers.js feeds it
// (HFSequence.Feed: the past in, the past and the new key and value out,
// the attention mask one longer), against one step of rpac's own decoder
// (Decoder.Step, fixed slots), at the tiny (L 128) and paper (L 768)
// presets with random weights, one onnxruntime thread each. An op is a
// generation from an 8-token prompt to L (its prefill not timed); ns/step
// and cpu-ns/step are the mean over its steps.
//
//	go test -run '^$' -bench DecodeStep ./runtime
func BenchmarkDecodeStep(b *testing.B) {
	requireORT(b)
	for _, c := range []struct {
		preset string
		L      int
	}{{"tiny", 128}, {"paper", 768}} {
		b.Run(fmt.Sprintf("%s/L=%d", c.preset, c.L), func(b *testing.B) {
			m, hm := stepExports(b, c.preset, c.L)
			ids := benchTokens(c.L, m.VocabSize())
			b.Run("hf", func(b *testing.B) { benchHFSteps(b, hm, ids) })
			b.Run("rpac", func(b *testing.B) { benchOwnSteps(b, m, ids) })
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchSteps times, b.N times, a generation of steps calls of step after
// an untimed restart (a prefill), and reports the wall and the CPU time
// per step (ns/step, cpu-ns/step: the process's CPU time, which a loaded
// machine disturbs less than the wall time).
func benchSteps(b *testing.B, restart, step func(), steps int) {
	restart()
	step() // onnxruntime's first run of a shape is not a step's cost
	var cpu time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		restart()
		at := cpuTime()
		b.StartTimer()
		for k := 0; k < steps; k++ {
			step()
		}
		b.StopTimer()
		cpu += cpuTime() - at
		b.StartTimer()
	}
	b.StopTimer()
	n := float64(b.N * steps)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/step")
	b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/step")
}

// benchHFSteps times HFSequence.Feed of one token.
func benchHFSteps(b *testing.B, hm *runtime.HFModel, ids []int32) {
	ctx := context.Background()
	var s *runtime.HFSequence
	benchSteps(b, func() {
		s = hm.NewSequence()
		if _, err := s.Feed(ctx, ids[:benchPrompt]); err != nil {
			b.Fatal(err)
		}
	}, func() {
		if _, err := s.Feed(ctx, ids[s.Len():s.Len()+1]); err != nil {
			b.Fatal(err)
		}
	}, len(ids)-benchPrompt)
}

// benchOwnSteps times Decoder.Step of one token.
func benchOwnSteps(b *testing.B, m *runtime.Model, ids []int32) {
	ctx := context.Background()
	d, err := m.NewDecoder(len(ids), 1)
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	benchSteps(b, func() {
		if n > 0 {
			if err := d.Release(0); err != nil {
				b.Fatal(err)
			}
		}
		if _, _, err := d.Prefill(ctx, ids[:benchPrompt]); err != nil {
			b.Fatal(err)
		}
		n = benchPrompt
	}, func() {
		if _, err := d.Step(ctx, []int{0}, ids[n:n+1]); err != nil {
			b.Fatal(err)
		}
		n++
	}, len(ids)-benchPrompt)
}
