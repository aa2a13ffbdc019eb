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
		if err := f(); err != nil {
			done <- err
			return
		}
		done <- c.be.dev.sync()
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

// SumGrads replaces each of bufs (counts[i] float32 values) with its sum
// over the ranks, in place, bucket by bucket.
func (c *Collective) SumGrads(bufs []Buffer, counts []int) error {
	for lo := 0; lo < len(bufs); {
		hi, bytes := lo, 0
		for hi < len(bufs) && (hi == lo || bytes+4*counts[hi] <= c.BucketBytes) {
			bytes += 4 * counts[hi]
			hi++
		}
		err := c.guard(fmt.Sprintf("the gradients' all-reduce (bucket of %d tensors, %d bytes)", hi-lo, bytes), func() error {
			return c.comm.Group(func() error {
				for i := lo; i < hi; i++ {
					if err := c.comm.AllReduce(bufs[i].Ptr, bufs[i].Ptr, counts[i], driver.NCCLFloat32, driver.NCCLSum); err != nil {
						return err
					}
				}
				return nil
			})
		})
		if err != nil {
			return err
		}
		lo = hi
	}
	return nil
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
