package training

import (
	"fmt"
	"time"

	"github.com/rpac-dev/rpac/kernels/cuda"
)

// gradBuckets is one step's overlapped gradient all-reduce: the
// collective's buckets of the step's gradients (the same buckets, in the
// parameters' order, as the all-reduce after the backward), each started
// on the communication stream once the backward has finished all of its
// gradients. Every rank runs the same program, so the ranks start the
// buckets in the same order.
type gradBuckets struct {
	coll   *cuda.Collective
	bufs   []cuda.Buffer
	counts []int
	ranges [][2]int
	// of: each parameter's bucket; left: each bucket's gradients not yet
	// final; started: the buckets started, in order.
	of      map[string]int
	left    []int
	started []bool
	spent   time.Duration // the time the starts took (the stand-in's all-reduce runs in them)
}

func newGradBuckets(coll *cuda.Collective, names []string, bufs []cuda.Buffer, counts []int) *gradBuckets {
	b := &gradBuckets{coll: coll, bufs: bufs, counts: counts, ranges: coll.Buckets(counts), of: map[string]int{}}
	b.left = make([]int, len(b.ranges))
	b.started = make([]bool, len(b.ranges))
	for i, r := range b.ranges {
		b.left[i] = r[1] - r[0]
		for _, name := range names[r[0]:r[1]] {
			b.of[name] = i
		}
	}
	return b
}

// final notes that param's gradient is final and starts its bucket when it
// was the bucket's last.
func (b *gradBuckets) final(param string) error {
	i, ok := b.of[param]
	if !ok {
		return fmt.Errorf("the overlapped all-reduce: %s has no gradient bucket", param)
	}
	if b.left[i]--; b.left[i] == 0 {
		return b.start(i)
	}
	return nil
}

// start starts bucket i's all-reduce on the communication stream.
func (b *gradBuckets) start(i int) error {
	t0 := time.Now()
	defer func() { b.spent += time.Since(t0) }()
	r := b.ranges[i]
	b.started[i] = true
	return b.coll.SumBucketAsync(b.bufs[r[0]:r[1]], b.counts[r[0]:r[1]])
}

// finish checks that the backward finished every bucket: a gradient the
// program never reported would leave its bucket unsummed.
func (b *gradBuckets) finish() error {
	for i, done := range b.started {
		if !done {
			return fmt.Errorf("the overlapped all-reduce: bucket %d (%d of its %d gradients not final) never started", i, b.left[i], b.ranges[i][1]-b.ranges[i][0])
		}
	}
	return nil
}
