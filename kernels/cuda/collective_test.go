package cuda

import (
	"fmt"
	"testing"
)

// TestCollectiveBuckets: the gradients' buckets are runs of the tensors in
// their order of at most BucketBytes, a larger tensor a bucket of its own;
// the plain and the overlapped all-reduce both reduce these.
func TestCollectiveBuckets(t *testing.T) {
	c := &Collective{BucketBytes: 100}
	for _, tc := range []struct {
		counts []int
		want   string
	}{
		{[]int{10, 10, 5}, "[[0 3]]"},
		{[]int{10, 10, 10}, "[[0 2] [2 3]]"},
		{[]int{30, 5, 5, 20, 1}, "[[0 1] [1 3] [3 5]]"},
		{[]int{25, 25, 25}, "[[0 1] [1 2] [2 3]]"},
		{nil, "[]"},
	} {
		if got := fmt.Sprint(c.Buckets(tc.counts)); got != tc.want {
			t.Errorf("buckets of %v (4-byte values, at most 100 bytes): %s, want %s", tc.counts, got, tc.want)
		}
	}
}
