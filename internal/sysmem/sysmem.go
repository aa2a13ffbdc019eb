// Package sysmem tells how much memory this process can still take and
// how much it holds.
package sysmem

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Available returns the memory this process can still take, in bytes: the
// kernel's MemAvailable, lowered to what the cgroup (v2 or v1) memory limit
// leaves, when one is set.
func Available() (int64, error) {
	avail, err := memAvailable("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	if left, ok := cgroupLeft(); ok && left < avail {
		avail = left
	}
	return avail, nil
}

func memAvailable(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			if fs := strings.Fields(rest); len(fs) >= 1 {
				kb, err := strconv.ParseInt(fs[0], 10, 64)
				if err != nil {
					return 0, fmt.Errorf("%s: %v", path, err)
				}
				return kb << 10, nil
			}
		}
	}
	return 0, fmt.Errorf("%s has no MemAvailable line", path)
}

// cgroupLeft returns limit − usage of the process's memory cgroup.
func cgroupLeft() (int64, bool) {
	for _, p := range [][2]string{
		{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
		{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"},
	} {
		lim, err1 := readInt(p[0])
		use, err2 := readInt(p[1])
		if err1 == nil && err2 == nil && lim > 0 && lim < 1<<60 {
			return max(0, lim-use), true
		}
	}
	return 0, false
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, errors.New("no limit")
	}
	return strconv.ParseInt(s, 10, 64)
}

// RSS is this process's resident set size in bytes (Linux /proc; an error
// elsewhere).
func RSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, fmt.Errorf("sysmem: reading the resident set size: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("sysmem: /proc/self/statm reads %q", b)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("sysmem: /proc/self/statm reads %q", b)
	}
	return pages * int64(os.Getpagesize()), nil
}
