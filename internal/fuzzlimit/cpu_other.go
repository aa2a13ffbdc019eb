//go:build !linux

package fuzzlimit

import "time"

// threadCPU is unknown here: Check falls back to wall time.
func threadCPU() time.Duration { return -1 << 62 }
