package runtime_test

import (
	"context"
	"log"

	"github.com/rpac-dev/rpac/runtime"
)

// A server's decoding loop over one KV cache: prompts join as slots free
// up, and every Step advances all running sequences by one token in one
// onnxruntime call, each at its own position (greedy here).
func ExampleDecoder() {
	m, err := runtime.Open("model/", runtime.Options{}) // written by rpac export --kv-cache
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	prompts := [][]int32{{464, 2106, 286}, {15496}}
	const maxNew = 32
	T, err := m.LengthFor(3 + maxNew) // the longest prompt plus the new tokens
	if err != nil {
		log.Fatal(err)
	}
	d, err := m.NewDecoder(T, len(prompts))
	if err != nil {
		log.Fatal(err)
	}
	var slots []int
	var next []int32
	for _, p := range prompts {
		slot, logits, err := d.Prefill(ctx, p)
		if err != nil {
			log.Fatal(err)
		}
		slots, next = append(slots, slot), append(next, argmax(logits))
	}
	for step := 1; step < maxNew; step++ {
		rows, err := d.Step(ctx, slots, next)
		if err != nil {
			log.Fatal(err)
		}
		for i, row := range rows {
			next[i] = argmax(row)
		}
	}
	for _, s := range slots {
		d.Release(s)
	}
}

func argmax(row []float32) int32 {
	best := 0
	for i, x := range row {
		if x > row[best] {
			best = i
		}
	}
	return int32(best)
}
