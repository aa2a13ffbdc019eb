package serve

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"
)

// Deadline-aware admission. Each batcher keeps a running estimate of what
// one unit of its work costs, from the model calls it has made: the
// scorer the time of one sequence of a Model.Each call (a window of a
// score, a row of an inference), the decoder the time of one decoding
// step. A request that would have to wait behind other work is refused at
// once (429, with Retry-After) when the work ahead of it and its own, at
// the estimated cost, would end past what remains of its timeout: it would
// otherwise be answered 504 at its timeout, having taken a place in the
// queue and in the model calls for nothing. A request with nothing ahead
// of it, and every request before the first model call has been timed, is
// admitted as before.

// costAlpha is the weight of the newest observation in a cost estimate.
const costAlpha = 0.25

// admitHeadroom is the share of a request's remaining time that its
// estimated completion may take: the estimate is an average, and a request
// admitted to end just at its deadline would often miss it.
const admitHeadroom = 0.9

// costEstimate is an exponentially weighted moving average of the time of
// one unit of work. One goroutine observes; any may read.
type costEstimate struct {
	bits atomic.Uint64 // float64 seconds; 0 before the first observation
}

// observe records a call of d that did units of work.
func (c *costEstimate) observe(d time.Duration, units int) {
	if units <= 0 || d <= 0 {
		return
	}
	x := d.Seconds() / float64(units)
	if prev := math.Float64frombits(c.bits.Load()); prev > 0 {
		x = prev + costAlpha*(x-prev)
	}
	c.bits.Store(math.Float64bits(x))
}

// get is the estimate; false before the first observation.
func (c *costEstimate) get() (time.Duration, bool) {
	x := math.Float64frombits(c.bits.Load())
	return time.Duration(x * float64(time.Second)), x > 0
}

// overloadError refuses a request the server estimates it cannot finish
// within the request's timeout (HTTP 429 with Retry-After).
type overloadError struct {
	msg        string
	retryAfter time.Duration // the estimated time for the work ahead of it to drain
}

func (e *overloadError) Error() string { return e.msg }

// retryAfterSeconds is the Retry-After value: whole seconds, rounded up,
// at least 1.
func (e *overloadError) retryAfterSeconds() string {
	return strconv.Itoa(max(1, int(math.Ceil(e.retryAfter.Seconds()))))
}

// deadlineRefusal returns an overloadError when a request with ahead of
// work queued before it (what: a description of that work) and own of its
// own would end past admitHeadroom of the time left before ctx's deadline;
// nil when it would not, when nothing is ahead of it, or when ctx has no
// deadline.
func deadlineRefusal(ctx context.Context, timeout, ahead, own time.Duration, what string) *overloadError {
	dl, ok := ctx.Deadline()
	if !ok || ahead <= 0 {
		return nil
	}
	left := max(0, time.Until(dl))
	budget := time.Duration(float64(left) * admitHeadroom)
	if ahead+own <= budget {
		return nil
	}
	e := &overloadError{retryAfter: ahead}
	e.msg = fmt.Sprintf("the server is too busy to answer this request within its timeout of %v: the work queued ahead of it (%s, about %v) and its own (about %v) would take longer than the %v it may take (%.0f%% of the %v left); retry after %s s",
		timeout, what, ahead.Round(time.Millisecond), own.Round(time.Millisecond), budget.Round(time.Millisecond), 100*admitHeadroom, left.Round(time.Millisecond), e.retryAfterSeconds())
	return e
}
