package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// A small parallel-for over the machine's cores. Work is cut into chunks of
// at least grain items that persistent workers claim through an atomic
// counter; the caller works too. Sends to workers never block: when every
// worker is busy (for example a nested parallelFor) the caller simply runs
// the remaining chunks itself, so nesting cannot deadlock.

type pjob struct {
	fn    func(lo, hi int)
	n     int
	chunk int
	next  atomic.Int64
	wg    sync.WaitGroup
}

func (j *pjob) work() {
	for {
		c := int(j.next.Add(1) - 1)
		lo := c * j.chunk
		if lo >= j.n {
			return
		}
		j.fn(lo, min(lo+j.chunk, j.n))
	}
}

var (
	poolMu   sync.Mutex
	poolSize int
	poolCh   = make(chan *pjob)
	jobPool  = sync.Pool{New: func() any { return new(pjob) }}
)

// ensureWorkers starts workers until there are n of them.
func ensureWorkers(n int) {
	poolMu.Lock()
	for poolSize < n {
		poolSize++
		go func() {
			for j := range poolCh {
				j.work()
				j.wg.Done()
			}
		}()
	}
	poolMu.Unlock()
}

// numWorkers is the parallelism parallelFor aims for.
func numWorkers() int { return runtime.GOMAXPROCS(0) }

// parallelFor calls fn over disjoint ranges covering [0,n). Below 2·grain
// items it runs serially in the caller.
func parallelFor(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	p := numWorkers()
	if p <= 1 || n < 2*grain {
		fn(0, n)
		return
	}
	chunks := min(n/grain, 16*p)
	chunk := (n + chunks - 1) / chunks
	chunks = (n + chunk - 1) / chunk
	helpers := min(p, chunks) - 1
	ensureWorkers(p - 1)
	j := jobPool.Get().(*pjob)
	j.fn, j.n, j.chunk = fn, n, chunk
	j.next.Store(0)
	for i := 0; i < helpers; i++ {
		j.wg.Add(1)
		sent := false
		select {
		case poolCh <- j:
			sent = true
		default:
		}
		if !sent {
			j.wg.Done()
			break
		}
	}
	j.work()
	j.wg.Wait()
	j.fn = nil
	jobPool.Put(j)
}

// parallelParts splits [0,n) into exactly parts contiguous ranges (some may
// be empty) and runs fn(part, lo, hi) for each, in parallel when n is at
// least 2·grain. Used by reductions that keep one partial result per part,
// so the result does not depend on scheduling.
func parallelParts(n, parts, grain int, fn func(part, lo, hi int)) {
	if parts < 1 {
		parts = 1
	}
	bound := func(i int) int { return int(int64(n) * int64(i) / int64(parts)) }
	if n < 2*grain || parts == 1 {
		for w := 0; w < parts; w++ {
			fn(w, bound(w), bound(w+1))
		}
		return
	}
	parallelFor(parts, 1, func(lo, hi int) {
		for w := lo; w < hi; w++ {
			fn(w, bound(w), bound(w+1))
		}
	})
}

// partsFor is the number of partial accumulators a reduction kernel keeps.
func partsFor() int { return min(max(numWorkers(), 1), 16) }
