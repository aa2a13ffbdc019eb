package cuda

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// KernelResources is ptxas's resource report for one kernel of a cubin:
// what limits its occupancy (registers, shared memory) and whether it
// keeps data in local memory (stack frame, spills), which is device
// memory behind the L1 cache.
type KernelResources struct {
	Kernel      string
	Registers   int
	SharedBytes int // static shared memory
	StackBytes  int // stack frame: register arrays indexed at run time, or spills
	SpillStores int // bytes
	SpillLoads  int // bytes
}

// LocalMemory says whether the kernel uses local memory at all.
func (r KernelResources) LocalMemory() bool {
	return r.StackBytes > 0 || r.SpillStores > 0 || r.SpillLoads > 0
}

func (r KernelResources) String() string {
	return fmt.Sprintf("%s: %d registers, %d B shared, %d B stack, %d B spill stores, %d B spill loads",
		r.Kernel, r.Registers, r.SharedBytes, r.StackBytes, r.SpillStores, r.SpillLoads)
}

// Resources compiles one embedded kernel source to a cubin for arch
// (sm_NN) with ptxas's verbose report and returns each kernel's
// resources, in name order.
func Resources(n *driver.NVRTC, name, arch string) ([]KernelResources, error) {
	src, err := Source(name)
	if err != nil {
		return nil, err
	}
	_, log, err := n.CompileCUBINLog(name, src, arch, []string{"--ptxas-options=-v"})
	if err != nil {
		return nil, err
	}
	res, err := parsePtxasReport(log)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", name, arch, err)
	}
	return res, nil
}

var (
	ptxasEntry = regexp.MustCompile(`Compiling entry function '([^']+)'`)
	ptxasFrame = regexp.MustCompile(`(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads`)
	ptxasUsed  = regexp.MustCompile(`Used (\d+) registers(?:.*?, (\d+) bytes smem)?`)
)

// parsePtxasReport reads ptxas -v output: per entry function a
// "Compiling entry function 'K'" line, then its stack frame and spills,
// then "Used N registers[, S bytes smem]".
func parsePtxasReport(log string) ([]KernelResources, error) {
	byName := map[string]*KernelResources{}
	var cur *KernelResources
	atoi := func(s string) int { v, _ := strconv.Atoi(s); return v }
	for _, line := range strings.Split(log, "\n") {
		if m := ptxasEntry.FindStringSubmatch(line); m != nil {
			cur = &KernelResources{Kernel: m[1]}
			byName[m[1]] = cur
			continue
		}
		if cur == nil {
			continue
		}
		if m := ptxasFrame.FindStringSubmatch(line); m != nil {
			cur.StackBytes, cur.SpillStores, cur.SpillLoads = atoi(m[1]), atoi(m[2]), atoi(m[3])
		} else if m := ptxasUsed.FindStringSubmatch(line); m != nil {
			cur.Registers = atoi(m[1])
			if m[2] != "" {
				cur.SharedBytes = atoi(m[2])
			}
		}
	}
	if len(byName) == 0 {
		return nil, fmt.Errorf("no entry function in the ptxas report:\n%s", log)
	}
	out := make([]KernelResources, 0, len(byName))
	for _, r := range byName {
		if r.Registers == 0 {
			return nil, fmt.Errorf("ptxas report has no register count for %s", r.Kernel)
		}
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Kernel < out[j].Kernel })
	return out, nil
}
