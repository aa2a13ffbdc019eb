package optim

import (
	"sync"
	"sync/atomic"
)

// parallelFor calls fn(i) for i in [0, n) on up to workers goroutines.
// Items are handed out in order; fn must only touch item i's data.
func parallelFor(n, workers int, fn func(i int)) {
	workers = min(workers, n)
	if workers <= 1 {
		for i := range n {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				fn(i)
			}
		})
	}
	wg.Wait()
}
