//go:build unix

package inferbench_test

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/rpac-dev/rpac/app/inferbench"
	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/runtime"
)

func requireORT(t testing.TB) {
	t.Helper()
	if err := runtime.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and %v", err)
		}
		t.Skipf("%v", err)
	}
}

// BenchmarkEvalTinyL128 times what rpac eval does per chunk at the tiny
// preset and L = 128 (random weights, one sequence per call, onnxruntime
// on every core): the model's forward (model-ns/token) and the scorer on
// its logits (score-ns/token, runtime.Logits.NLL over the 50,257-token
// rows), and reports score/model, their ratio, from the same iterations;
// the same for the process's CPU time (model-cpu-ns/token, ...,
// score/model-cpu), which other jobs on the machine disturb less.
//
//	go test ./app/inferbench -run '^$' -bench EvalTinyL128 -count 5
func BenchmarkEvalTinyL128(b *testing.B) {
	requireORT(b)
	const T = 128
	ctx := context.Background()
	p, err := model.LookupPreset("tiny")
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	if _, err := inferbench.ExportRandom(ctx, export.Options{Config: p.Config, Lengths: []int{T}, Batch: 1, Out: dir}); err != nil {
		b.Fatal(err)
	}
	m, err := runtime.OpenContext(ctx, dir, runtime.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	r := rand.New(rand.NewPCG(1, 2))
	ids := make([]int32, T+1)
	for i := range ids {
		ids[i] = int32(r.IntN(p.Config.Vocab))
	}
	var inModel, scoring, cpuModel, cpuScoring time.Duration
	var nll float64
	for i := -1; i == -1 || b.Loop(); i++ { // one untimed warm-up call first
		t0, c0 := time.Now(), cpuTime(b)
		out, err := m.Logits(ctx, [][]int32{ids[:T]})
		if err != nil {
			b.Fatal(err)
		}
		t1, c1 := time.Now(), cpuTime(b)
		nll = out[0].NLL(ids[1:])
		if i >= 0 {
			inModel += t1.Sub(t0)
			scoring += time.Since(t1)
			cpuModel += c1 - c0
			cpuScoring += cpuTime(b) - c1
		}
	}
	if math.IsNaN(nll) || math.IsInf(nll, 0) {
		b.Fatalf("NLL %v", nll)
	}
	tokens := float64(b.N * T)
	b.ReportMetric(float64(inModel.Nanoseconds())/tokens, "model-ns/token")
	b.ReportMetric(float64(scoring.Nanoseconds())/tokens, "score-ns/token")
	b.ReportMetric(scoring.Seconds()/inModel.Seconds(), "score/model")
	b.ReportMetric(float64(cpuModel.Nanoseconds())/tokens, "model-cpu-ns/token")
	b.ReportMetric(float64(cpuScoring.Nanoseconds())/tokens, "score-cpu-ns/token")
	b.ReportMetric(cpuScoring.Seconds()/cpuModel.Seconds(), "score/model-cpu")
}

// cpuTime is the CPU time (user and system) the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
