package cuda

import (
	"fmt"
	"unsafe"
)

// SatCounter counts, on the device, the rows of membership tensors whose
// largest membership exceeds a threshold (the saturation fraction the
// controllers read): one counter per slot, set to zero by Reset, added to
// by Count, and brought to the host in one download of 8 bytes a slot by
// Counts. A step then moves a few bytes instead of every block's [B·T, R]
// memberships.
type SatCounter struct {
	be     *Backend
	counts Buffer
	slots  int
	host   []uint64
}

// NewSatCounter allocates slots counters.
func NewSatCounter(be *Backend, slots int) (*SatCounter, error) {
	if slots < 1 {
		return nil, fmt.Errorf("saturation counter: %d slots", slots)
	}
	unbind, err := be.bind()
	if err != nil {
		return nil, err
	}
	defer unbind()
	c := &SatCounter{be: be, slots: slots, host: make([]uint64, slots)}
	if c.counts, err = be.dev.alloc(uint64(8 * slots)); err != nil {
		return nil, err
	}
	return c, nil
}

// Reset sets every counter to zero.
func (c *SatCounter) Reset() error {
	unbind, err := c.be.bind()
	if err != nil {
		return err
	}
	defer unbind()
	return c.be.dev.zero(c.counts, uint64(8*c.slots))
}

// Count adds to counter slot the rows of mu (a device buffer of rows·R
// float32) whose largest entry exceeds thr.
func (c *SatCounter) Count(slot int, mu Buffer, R int, thr float64) error {
	if slot < 0 || slot >= c.slots {
		return fmt.Errorf("saturation counter: slot %d of %d", slot, c.slots)
	}
	if R < 1 || mu.Bytes%uint64(4*R) != 0 {
		return fmt.Errorf("saturation counter: %d bytes are not rows of %d float32", mu.Bytes, R)
	}
	rows := int64(mu.Bytes / uint64(4*R))
	unbind, err := c.be.bind()
	if err != nil {
		return err
	}
	defer unbind()
	return c.be.dev.launch("sat_count_f32", grid1(int(rows)), block1, 0, c.counts.Ptr+uint64(8*slot), mu.Ptr, int32(R),
		f64bits(thr), rows)
}

// Counts downloads the counters (valid until the next call).
func (c *SatCounter) Counts() ([]uint64, error) {
	unbind, err := c.be.bind()
	if err != nil {
		return nil, err
	}
	defer unbind()
	if err := c.be.dev.download(unsafe.Pointer(&c.host[0]), c.counts, uint64(8*c.slots)); err != nil {
		return nil, err
	}
	return c.host, nil
}

// Close frees the counters.
func (c *SatCounter) Close() {
	unbind, err := c.be.bind()
	if err != nil {
		return
	}
	defer unbind()
	if c.counts.Ptr != 0 {
		c.be.dev.free(c.counts)
		c.counts = Buffer{}
	}
}
