package driver

import "errors"

// Stream is a CUDA stream (CUstream); DefaultStream is the legacy default
// stream every kernel and copy of a Context runs on.
type Stream uintptr

// DefaultStream is the stream Launch, Upload and Download use.
const DefaultStream Stream = 0

// Event is a CUDA event (CUevent): a point in a stream's work that another
// stream can wait for.
type Event uintptr

// streamNonBlocking is CU_STREAM_NON_BLOCKING: the stream does not
// synchronise with the legacy default stream, so its work runs beside the
// default stream's and is ordered only by events.
const streamNonBlocking = 1

// eventDisableTiming is CU_EVENT_DISABLE_TIMING, the cheapest event.
const eventDisableTiming = 2

var errNoStreams = errors.New("the CUDA driver has no streams or events (cuStreamCreate, cuEventRecord, cuStreamWaitEvent)")

// NewStream creates a stream that runs beside the default stream
// (non-blocking), ordered with it only by events.
func (c *Context) NewStream() (Stream, error) {
	s, err := c.create(c.d.streamCreate, streamNonBlocking, "cuStreamCreate")
	return Stream(s), err
}

// create makes a stream or an event with create(&handle, flags).
func (c *Context) create(create func(*uintptr, uint32) int32, flags uint32, what string) (uintptr, error) {
	if !c.d.streams {
		return 0, errNoStreams
	}
	var h uintptr
	err := c.d.check(create(&h, flags), what)
	return h, err
}

// DestroyStream frees s once its work is done.
func (c *Context) DestroyStream(s Stream) error {
	return c.d.check(c.d.streamDestroy(uintptr(s)), "cuStreamDestroy")
}

// SyncStream waits for s's work.
func (c *Context) SyncStream(s Stream) error {
	return c.d.check(c.d.streamSync(uintptr(s)), "cuStreamSynchronize")
}

// NewEvent creates an event (without timing).
func (c *Context) NewEvent() (Event, error) {
	e, err := c.create(c.d.eventCreate, eventDisableTiming, "cuEventCreate")
	return Event(e), err
}

// DestroyEvent frees e.
func (c *Context) DestroyEvent(e Event) error {
	return c.d.check(c.d.eventDestroy(uintptr(e)), "cuEventDestroy")
}

// Record marks in e the point s's work has reached.
func (c *Context) Record(e Event, s Stream) error {
	return c.d.check(c.d.eventRecord(uintptr(e), uintptr(s)), "cuEventRecord")
}

// Wait makes s's later work wait until e's point is reached.
func (c *Context) Wait(s Stream, e Event) error {
	return c.d.check(c.d.streamWait(uintptr(s), uintptr(e), 0), "cuStreamWaitEvent")
}
