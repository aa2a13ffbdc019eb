package driver

import (
	"fmt"
	"sync"
)

// LibNCCL is NVIDIA's collective library: the data-parallel training's
// all-reduce and broadcast between the job's ranks.
var LibNCCL = Library{Name: "NCCL", Files: []string{"libnccl.so.2", "libnccl.so"},
	Provide: "install NCCL (pip package nvidia-nccl-cu13 or nvidia-nccl-cu12, Debian non-free libnccl2) or point $RPAC_CUDA_LIBS at its folder"}

// UniqueID is ncclUniqueId: the rendezvous token rank 0 makes and every
// rank passes to NewComm.
type UniqueID struct {
	Internal [128]byte
}

// NCCLType is ncclDataType_t.
type NCCLType int32

// The element types rpac reduces.
const (
	NCCLInt32   NCCLType = 2
	NCCLFloat32 NCCLType = 7
	NCCLFloat64 NCCLType = 8
)

// Size is the bytes of one element.
func (t NCCLType) Size() int {
	if t == NCCLFloat64 {
		return 8
	}
	return 4
}

func (t NCCLType) String() string {
	switch t {
	case NCCLInt32:
		return "int32"
	case NCCLFloat32:
		return "float32"
	case NCCLFloat64:
		return "float64"
	}
	return fmt.Sprintf("ncclDataType(%d)", int32(t))
}

// NCCLOp is ncclRedOp_t.
type NCCLOp int32

// The reductions rpac uses.
const (
	NCCLSum NCCLOp = 0
	NCCLMax NCCLOp = 2
)

// NCCL is the collective library, bound at run time. Only the calls the
// data-parallel step needs are bound.
type NCCL struct {
	handle      uintptr
	getUniqueID func(id *UniqueID) int32
	commInit    func(comm *uintptr, nranks int32, id UniqueID, rank int32) int32
	allReduce   func(send, recv uint64, count uint64, dt NCCLType, op NCCLOp, comm uintptr, stream uintptr) int32
	broadcast   func(send, recv uint64, count uint64, dt NCCLType, root int32, comm uintptr, stream uintptr) int32
	groupStart  func() int32
	groupEnd    func() int32
	commAbort   func(comm uintptr) int32
	commDestroy func(comm uintptr) int32
	errorString func(r int32) *byte
}

// LoadNCCL binds NCCL (once per process).
func LoadNCCL() (*NCCL, error) { return loadNCCL() }

var loadNCCL = sync.OnceValues(func() (*NCCL, error) {
	n := &NCCL{}
	var err error
	n.handle, err = bind(LibNCCL, []symbol{
		{&n.getUniqueID, "ncclGetUniqueId"}, {&n.commInit, "ncclCommInitRank"}, {&n.allReduce, "ncclAllReduce"},
		{&n.broadcast, "ncclBroadcast"}, {&n.groupStart, "ncclGroupStart"}, {&n.groupEnd, "ncclGroupEnd"},
		{&n.commAbort, "ncclCommAbort"}, {&n.commDestroy, "ncclCommDestroy"}, {&n.errorString, "ncclGetErrorString"},
	})
	if err != nil {
		return nil, err
	}
	return n, nil
})

func (n *NCCL) check(r int32, what string) error {
	if r == 0 {
		return nil
	}
	msg := "unknown error"
	if s := n.errorString(r); s != nil {
		msg = cString(s)
	}
	return fmt.Errorf("NCCL %s: %s (%d)", what, msg, r)
}

// UniqueID makes a new rendezvous token (rank 0 only).
func (n *NCCL) UniqueID() (UniqueID, error) {
	var id UniqueID
	return id, n.check(n.getUniqueID(&id), "ncclGetUniqueId")
}

// Comm is a communicator (ncclComm_t) of one rank.
type Comm struct {
	n           *NCCL
	comm        uintptr
	Rank, World int
}

// NewComm joins rank of world ranks to the communicator of id. The
// device the communicator uses is the calling thread's current context.
func (n *NCCL) NewComm(id UniqueID, world, rank int) (*Comm, error) {
	var c uintptr
	if err := n.check(n.commInit(&c, int32(world), id, int32(rank)), fmt.Sprintf("ncclCommInitRank(rank %d of %d)", rank, world)); err != nil {
		return nil, err
	}
	return &Comm{n: n, comm: c, Rank: rank, World: world}, nil
}

// AllReduce reduces count elements of send over the ranks into recv (in
// place when they are the same) on the default stream.
func (c *Comm) AllReduce(send, recv uint64, count int, dt NCCLType, op NCCLOp) error {
	return c.AllReduceOn(DefaultStream, send, recv, count, dt, op)
}

// AllReduceOn is AllReduce enqueued on stream s.
func (c *Comm) AllReduceOn(s Stream, send, recv uint64, count int, dt NCCLType, op NCCLOp) error {
	return c.n.check(c.n.allReduce(send, recv, uint64(count), dt, op, c.comm, uintptr(s)),
		fmt.Sprintf("ncclAllReduce(%d %s, rank %d of %d)", count, dt, c.Rank, c.World))
}

// Broadcast copies root's count elements of send into every rank's recv.
func (c *Comm) Broadcast(send, recv uint64, count int, dt NCCLType, root int) error {
	return c.n.check(c.n.broadcast(send, recv, uint64(count), dt, int32(root), c.comm, 0),
		fmt.Sprintf("ncclBroadcast(%d %s from rank %d, rank %d of %d)", count, dt, root, c.Rank, c.World))
}

// Group runs f's collectives as one NCCL group (ncclGroupStart/End).
func (c *Comm) Group(f func() error) error {
	if err := c.n.check(c.n.groupStart(), "ncclGroupStart"); err != nil {
		return err
	}
	ferr := f()
	if err := c.n.check(c.n.groupEnd(), "ncclGroupEnd"); ferr == nil {
		ferr = err
	}
	return ferr
}

// Abort ends the communicator without waiting for the other ranks (the
// collectives in flight fail).
func (c *Comm) Abort() error { return c.n.check(c.n.commAbort(c.comm), "ncclCommAbort") }

// Destroy frees the communicator once its collectives are done.
func (c *Comm) Destroy() error { return c.n.check(c.n.commDestroy(c.comm), "ncclCommDestroy") }
