package fuzzlimit

import (
	"testing"
	"time"
)

// TestThreadCPU: the thread clock counts work, not waiting.
func TestThreadCPU(t *testing.T) {
	c := Start()
	time.Sleep(50 * time.Millisecond)
	x := 0
	for i := 0; i < 50_000_000; i++ {
		x += i ^ x
	}
	cpu := threadCPU() - c.cpu
	c.Check(t)
	if threadCPU() > 0 && (cpu <= 0 || cpu > time.Since(c.wall)) {
		t.Fatalf("thread CPU %v, wall %v (x=%d)", cpu, time.Since(c.wall), x)
	}
}
