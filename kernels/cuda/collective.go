package cuda

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// Collective is a data-parallel job's NCCL communicator on this backend's
// device: the gradients' all-reduce (in buckets), the sums of the host
// scalars every rank must agree on, and the broadcast of rank 0's
// parameters. Every call waits for its collectives to finish on the
// device, within Timeout: a rank that died or hangs makes the call abort
// the communicator and fail instead of waiting for ever.
type Collective struct {
	be      *Backend
	comm    *driver.Comm
	timeout time.Duration
	// BucketBytes bounds one group of gradient all-reduces (the
	// gradients are reduced bucket by bucket, each bucket one NCCL group).
	BucketBytes int
	stage       Buffer // host values staged for a reduction or broadcast
	broken      error
	aborted     bool
	ctx         *driver.Context
	// overlap: the communication stream of the overlapped gradient
	// all-reduce (Overlap), nil without it.
	overlap *commStream
}

// commStream is the second stream the overlapped all-reduce runs on, and
// its two events: ready (the gradients of a bucket are final on the
// default stream) and done (the last bucket's all-reduce has finished).
type commStream struct {
	ctx         *driver.Context
	stream      driver.Stream
	ready, done driver.Event
}

// DefaultBucketBytes is the gradient bucket: 25 MiB, PyTorch DDP's default.
const DefaultBucketBytes = 25 << 20

// NewCollectiveID makes the job's NCCL unique id (rank 0 makes it and
// hands it to the other ranks).
func NewCollectiveID() (driver.UniqueID, error) {
	n, err := driver.LoadNCCL()
	if err != nil {
		return driver.UniqueID{}, err
	}
	return n.UniqueID()
}

// JoinCollective joins this backend's device, as rank of world ranks, to
// the communicator of id; every collective of it fails after timeout.
func (b *Backend) JoinCollective(id driver.UniqueID, world, rank int, timeout time.Duration) (*Collective, error) {
	if _, ok := b.dev.(*gpu); !ok {
		return nil, errors.New("data-parallel training needs a CUDA device (a GPU or the simulator), not the dry-run device")
	}
	n, err := driver.LoadNCCL()
	if err != nil {
		return nil, err
	}
	c := &Collective{be: b, timeout: timeout, BucketBytes: DefaultBucketBytes}
	c.ctx = b.dev.(*gpu).ctx
	err = c.guard("joining the communicator", func() error {
		var err error
		c.comm, err = n.NewComm(id, world, rank)
		return err
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Rank and World are this rank and the job's number of ranks.
func (c *Collective) Rank() int  { return c.comm.Rank }
func (c *Collective) World() int { return c.comm.World }

// guard runs f with the device bound, then waits for the device, within
// the timeout; past it the communicator is aborted and every later call
// fails.
func (c *Collective) guard(what string, f func() error) error {
	return c.watch(what, func() error {
		if err := f(); err != nil {
			return err
		}
		return c.be.dev.sync()
	})
}

// watch runs f with the device bound, within the timeout: past it the
// communicator is aborted and every later call fails.
func (c *Collective) watch(what string, f func() error) error {
	if c.broken != nil {
		return c.broken
	}
	done := make(chan error, 1)
	go func() {
		unbind, err := c.be.bind()
		if err != nil {
			done <- err
			return
		}
		defer unbind()
		done <- f()
	}()
	timer := time.NewTimer(c.timeout)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil {
			c.broken = fmt.Errorf("%s: %w", what, err)
			return c.broken
		}
		return nil
	case <-timer.C:
		if c.comm != nil {
			_ = c.comm.Abort()
			c.aborted = true
		}
		c.broken = fmt.Errorf("%s did not finish within %v: another rank has died or stopped answering; the communicator is aborted", what, c.timeout)
		return c.broken
	}
}

// Buckets splits tensors of counts[i] float32 values, in their order,
// into the all-reduce's buckets: runs [lo, hi) of at most BucketBytes
// (a larger tensor is a bucket of its own).
func (c *Collective) Buckets(counts []int) [][2]int {
	var out [][2]int
	for lo := 0; lo < len(counts); {
		hi, bytes := lo, 0
		for hi < len(counts) && (hi == lo || bytes+4*counts[hi] <= c.BucketBytes) {
			bytes += 4 * counts[hi]
			hi++
		}
		out = append(out, [2]int{lo, hi})
		lo = hi
	}
	return out
}

// SumGrads replaces each of bufs (counts[i] float32 values) with its sum
// over the ranks, in place, bucket by bucket, on the default stream.
func (c *Collective) SumGrads(bufs []Buffer, counts []int) error {
	for _, b := range c.Buckets(counts) {
		if err := c.guard(bucketName(counts[b[0]:b[1]]), func() error {
			return c.sumBucket(driver.DefaultStream, bufs[b[0]:b[1]], counts[b[0]:b[1]])
		}); err != nil {
			return err
		}
	}
	return nil
}

// bucketName names the all-reduce of a bucket in errors.
func bucketName(counts []int) string {
	bytes := 0
	for _, n := range counts {
		bytes += 4 * n
	}
	return fmt.Sprintf("the gradients' all-reduce (bucket of %d tensors, %d bytes)", len(counts), bytes)
}

// sumBucket enqueues one bucket's all-reduces, one NCCL group, on s.
func (c *Collective) sumBucket(s driver.Stream, bufs []Buffer, counts []int) error {
	return c.comm.Group(func() error {
		for i, b := range bufs {
			if err := c.comm.AllReduceOn(s, b.Ptr, b.Ptr, counts[i], driver.NCCLFloat32, driver.NCCLSum); err != nil {
				return err
			}
		}
		return nil
	})
}

// Overlap gives the collective its communication stream: SumBucketAsync
// then runs a bucket's all-reduce there, beside the backward that goes on
// on the default stream.
func (c *Collective) Overlap() error {
	if c.overlap != nil {
		return nil
	}
	cs := &commStream{ctx: c.ctx}
	err := c.watch("creating the communication stream", func() error {
		var err error
		if cs.stream, err = cs.ctx.NewStream(); err != nil {
			return err
		}
		if cs.ready, err = cs.ctx.NewEvent(); err != nil {
			return err
		}
		cs.done, err = cs.ctx.NewEvent()
		return err
	})
	if err != nil {
		return err
	}
	c.overlap = cs
	return nil
}

// Overlapped reports whether the collective has its communication stream.
func (c *Collective) Overlapped() bool { return c.overlap != nil }

// SumBucketAsync starts one bucket's all-reduce (bufs of counts[i] float32
// values, summed in place) on the communication stream, once the work the
// default stream has so far (the backward up to the bucket's last
// gradient) is done: an event recorded on the default stream that the
// communication stream waits for. It does not wait for the sums:
// WaitGrads does.
func (c *Collective) SumBucketAsync(bufs []Buffer, counts []int) error {
	cs := c.overlap
	if cs == nil {
		return errors.New("SumBucketAsync without a communication stream (Overlap)")
	}
	return c.watch(bucketName(counts), func() error {
		if err := cs.ctx.Record(cs.ready, driver.DefaultStream); err != nil {
			return err
		}
		if err := cs.ctx.Wait(cs.stream, cs.ready); err != nil {
			return err
		}
		return c.sumBucket(cs.stream, bufs, counts)
	})
}

// WaitGrads makes the default stream's later work (the optimizer) wait
// for every bucket SumBucketAsync started, and waits for them on the host
// within the timeout.
func (c *Collective) WaitGrads() error {
	cs := c.overlap
	if cs == nil {
		return nil
	}
	return c.watch("the gradients' all-reduce on the communication stream", func() error {
		if err := cs.ctx.Record(cs.done, cs.stream); err != nil {
			return err
		}
		if err := cs.ctx.Wait(driver.DefaultStream, cs.done); err != nil {
			return err
		}
		return cs.ctx.SyncStream(cs.stream)
	})
}

// close frees the stream and its events.
func (cs *commStream) close() {
	_ = cs.ctx.DestroyEvent(cs.ready)
	_ = cs.ctx.DestroyEvent(cs.done)
	_ = cs.ctx.DestroyStream(cs.stream)
}

// stageBuffer returns the staging buffer, grown to bytes.
func (c *Collective) stageBuffer(bytes uint64) (Buffer, error) {
	if c.stage.Bytes >= bytes {
		return c.stage, nil
	}
	unbind, err := c.be.bind()
	if err != nil {
		return Buffer{}, err
	}
	defer unbind()
	if c.stage.Ptr != 0 {
		c.be.dev.free(c.stage)
	}
	c.stage, err = c.be.dev.alloc(bytes)
	return c.stage, err
}

// SumHost replaces x with its element-wise sum over the ranks (in rank
// order on every rank, so every rank holds the same values).
func (c *Collective) SumHost(x []float64) error {
	if len(x) == 0 {
		return nil
	}
	return c.staged(fmt.Sprintf("the all-reduce of %d scalars", len(x)), unsafe.Pointer(&x[0]), uint64(8*len(x)), func(b Buffer) error {
		return c.comm.AllReduce(b.Ptr, b.Ptr, len(x), driver.NCCLFloat64, driver.NCCLSum)
	})
}

// BroadcastHost replaces x with rank 0's x.
func (c *Collective) BroadcastHost(x []float32) error {
	if len(x) == 0 {
		return nil
	}
	return c.staged(fmt.Sprintf("the broadcast of %d parameters", len(x)), unsafe.Pointer(&x[0]), uint64(4*len(x)), func(b Buffer) error {
		return c.comm.Broadcast(b.Ptr, b.Ptr, len(x), driver.NCCLFloat32, 0)
	})
}

// staged runs collective (what) in place on the staging buffer holding
// the n host bytes at p, and copies the result back to p.
func (c *Collective) staged(what string, p unsafe.Pointer, n uint64, collective func(Buffer) error) error {
	buf, err := c.stageBuffer(n)
	if err != nil {
		return err
	}
	return c.guard(what, func() error {
		if err := c.be.dev.upload(buf, p, n); err != nil {
			return err
		}
		if err := collective(buf); err != nil {
			return err
		}
		if err := c.be.dev.sync(); err != nil {
			return err
		}
		return c.be.dev.download(p, buf, n)
	})
}

// Close frees the communicator (aborting it when a collective failed).
func (c *Collective) Close() {
	if c.stage.Ptr != 0 {
		if unbind, err := c.be.bind(); err == nil {
			c.be.dev.free(c.stage)
			unbind()
		}
		c.stage = Buffer{}
	}
	if c.overlap != nil && !c.aborted {
		if unbind, err := c.be.bind(); err == nil {
			c.overlap.close()
			unbind()
		}
		c.overlap = nil
	}
	if c.comm == nil {
		return
	}
	switch {
	case c.aborted: // a collective may still hold it
	case c.broken != nil:
		_ = c.comm.Abort()
	default:
		_ = c.comm.Destroy()
	}
	c.comm = nil
}
