package optim

import (
	"math"
	"runtime"
	"sort"
)

// GlobalNorm is the L2 norm of all gradients together, accumulated in
// float64. The sum runs in a fixed order (names sorted, then fixed-size
// chunks), so the result does not depend on the number of cores.
func GlobalNorm(grads map[string][]float32) float64 {
	names := make([]string, 0, len(grads))
	total := 0
	for n, g := range grads {
		names = append(names, n)
		total += len(g)
	}
	sort.Strings(names)
	var parts [][]float32
	for _, n := range names {
		g := grads[n]
		for lo := 0; lo < len(g); lo += chunk {
			parts = append(parts, g[lo:min(lo+chunk, len(g))])
		}
	}
	sums := make([]float64, len(parts))
	workers := runtime.GOMAXPROCS(0)
	if total < 4*chunk {
		workers = 1
	}
	parallelFor(len(parts), workers, func(i int) {
		var s float64
		for _, x := range parts[i] {
			s += float64(x) * float64(x)
		}
		sums[i] = s
	})
	var s float64
	for _, x := range sums {
		s += x
	}
	return math.Sqrt(s)
}

// ClipGlobalNorm scales all gradients in place so that their global L2 norm
// is at most maxNorm, as torch.nn.utils.clip_grad_norm_ does: with
// coef = maxNorm / (norm + 1e-6), gradients are multiplied by coef when it is
// below 1. It returns the norm before clipping. A maxNorm <= 0 only measures.
// A non-finite norm (NaN or Inf in a gradient) leaves the gradients untouched
// so the caller can see it and skip the step.
func ClipGlobalNorm(grads map[string][]float32, maxNorm float64) (norm float64) {
	norm = GlobalNorm(grads)
	if !(maxNorm > 0) || math.IsNaN(norm) || math.IsInf(norm, 0) {
		return norm
	}
	coef := maxNorm / (norm + 1e-6)
	if coef >= 1 {
		return norm
	}
	c := float32(coef)
	for _, g := range grads {
		for i := range g {
			g[i] *= c
		}
	}
	return norm
}
