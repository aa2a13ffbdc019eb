// Package fuzzlimit bounds the time one fuzz input may take, so that an
// input that makes a parser slow fails the fuzz target like a crash (and is
// saved by go test as a regression case). The bound is on the CPU time of
// the fuzzing goroutine's thread where the system can tell it (Linux), so
// that a busy machine does not turn ordinary inputs into failures; elsewhere
// it is on wall-clock time.
package fuzzlimit

import (
	"runtime"
	"testing"
	"time"
)

// Budget is the CPU time one input may take.
const Budget = 2 * time.Second

// wallBudget bounds wall-clock time as well (a blocked input).
const wallBudget = time.Minute

// Clock measures one input.
type Clock struct {
	cpu  time.Duration
	wall time.Time
}

// Start begins measuring an input; the calling goroutine stays on its
// thread until Check.
func Start() Clock {
	runtime.LockOSThread()
	return Clock{cpu: threadCPU(), wall: time.Now()}
}

// Check fails tb when the input took more than Budget of CPU time (or a
// minute of wall time).
func (c Clock) Check(tb testing.TB) {
	tb.Helper()
	wall, cpu := time.Since(c.wall), time.Since(c.wall) // without a thread clock: wall time
	if now := threadCPU(); c.cpu >= 0 && now >= 0 {
		cpu = now - c.cpu
	}
	runtime.UnlockOSThread()
	if cpu > Budget || wall > wallBudget {
		tb.Fatalf("slow input: %v of CPU time, %v in all (limits %v and %v)", cpu.Round(time.Millisecond), wall.Round(time.Millisecond), Budget, wallBudget)
	}
}
