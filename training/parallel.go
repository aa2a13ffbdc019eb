package training

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/rpac-dev/rpac/kernels/cuda/driver"
	"github.com/rpac-dev/rpac/training/dist"
)

// Parallel places a run in a data-parallel job (the zero value: a job of
// one rank). Each rank is a process on its own GPU (its LOCAL_RANK's);
// every rank reads the same global batches and trains on its shard of
// each, the gradients and the scalars the controllers read are summed
// over NCCL, and rank 0 alone writes the run directory.
type Parallel struct {
	Env dist.Env
	// Timeout bounds the rendezvous and every collective
	// (0: DefaultCollectiveTimeout): a rank that died or hangs ends the
	// job with an error instead of a hang.
	Timeout time.Duration
	// Overlap all-reduces the gradients bucket by bucket during the
	// backward, on a second stream, as each bucket's gradients are final
	// (off by default: no GPU has measured it).
	Overlap bool
}

// DefaultCollectiveTimeout is Parallel.Timeout's default.
const DefaultCollectiveTimeout = 10 * time.Minute

// Ranks is the number of ranks (1 without a launcher).
func (p Parallel) Ranks() int { return max(1, p.Env.World) }

// primary reports whether this rank writes the run directory (rank 0).
func (p Parallel) primary() bool { return p.Env.Rank == 0 }

func (p Parallel) timeout() time.Duration {
	if p.Timeout > 0 {
		return p.Timeout
	}
	return DefaultCollectiveTimeout
}

// job is a run's link to the other ranks: nil in a job of one rank.
type job struct {
	coll *cuda.Collective
	// reduced counts the steps reduced, spent the time their
	// collectives took (waiting for the slowest rank included) and bytes
	// the gradients' size.
	reduced int
	spent   time.Duration
	bytes   int64
	// buckets: the step's gradient buckets in flight while the backward
	// runs (Parallel.Overlap), nil otherwise.
	buckets *gradBuckets
}

// joinJob meets the other ranks and joins the NCCL communicator on be's
// device: rank 0 makes the unique id and hands it out at MASTER_ADDR:
// MASTER_PORT.
func joinJob(ctx context.Context, p Parallel, be kernels.Backend) (*job, error) {
	if !p.Env.Multi() {
		return nil, nil
	}
	gpu, ok := be.(*cuda.Backend)
	if !ok {
		return nil, fmt.Errorf("a data-parallel job (%d ranks) runs on CUDA devices (--device cuda or cuda-sim), not %s", p.Env.World, be.Name())
	}
	id, err := dist.Rendezvous(ctx, p.Env, func() ([dist.IDBytes]byte, error) {
		id, err := cuda.NewCollectiveID()
		return id.Internal, err
	}, p.timeout())
	if err != nil {
		return nil, err
	}
	coll, err := gpu.JoinCollective(driver.UniqueID{Internal: id}, p.Env.World, p.Env.Rank, p.timeout())
	if err != nil {
		return nil, fmt.Errorf("rank %d of %d: %w", p.Env.Rank, p.Env.World, err)
	}
	j := &job{coll: coll}
	if p.Overlap {
		if err := coll.Overlap(); err != nil {
			coll.Close()
			return nil, fmt.Errorf("rank %d of %d: the overlapped all-reduce: %w", p.Env.Rank, p.Env.World, err)
		}
	}
	return j, nil
}

func (j *job) close() {
	if j != nil {
		j.coll.Close()
	}
}

// jobField is one figure every rank of a job must agree on.
type jobField struct {
	name  string
	value float64
}

// checkSame fails, naming the first rank that differs and how, unless
// every rank gives the same fields: ranks launched with other flags would
// otherwise call collectives of other sizes.
func (j *job) checkSame(fields []jobField) error {
	if j == nil {
		return nil
	}
	n, me := len(fields), j.coll.Rank()
	all := make([]float64, j.coll.World()*n) // every rank fills its own row: the sum gathers them
	for i, f := range fields {
		all[me*n+i] = f.value
	}
	if err := j.coll.SumHost(all); err != nil {
		return err
	}
	if r, i := firstDiffering(all, n); r > 0 {
		return fmt.Errorf("rank %d runs another job than rank 0: its %s is %v, rank 0's %v; launch every rank with the same flags",
			r, fields[i].name, all[r*n+i], all[i])
	}
	return nil
}

// firstDiffering finds the first row of rows (each n values) that differs
// from row 0, and the first value where: 0, 0 when they are all equal.
func firstDiffering(rows []float64, n int) (row, field int) {
	for r := 1; r*n < len(rows); r++ {
		for i := range n {
			if rows[r*n+i] != rows[i] {
				return r, i
			}
		}
	}
	return 0, 0
}

// broadcast gives every rank rank 0's values of the store's tensors.
func (j *job) broadcast(store *kernels.Store) error {
	if j == nil {
		return nil
	}
	for _, name := range store.Order {
		if t := store.Tensors[name]; t != nil && len(t.F32) > 0 {
			if err := j.coll.BroadcastHost(t.F32); err != nil {
				return err
			}
		}
	}
	return nil
}

// fromRank0 gives every rank rank 0's values of xs (the other ranks add
// zeros to them), so that every rank's controllers decide alike.
func (j *job) fromRank0(xs ...*float64) error {
	if j == nil {
		return nil
	}
	v := make([]float64, len(xs))
	if j.coll.Rank() == 0 {
		for i, x := range xs {
			v[i] = *x
		}
	}
	if err := j.coll.SumHost(v); err != nil {
		return err
	}
	for i, x := range xs {
		*x = v[i]
	}
	return nil
}

// begin readies a step for the job before it runs: with the overlapped
// all-reduce, the step hands each gradient to the buckets as the backward
// finishes it.
func (j *job) begin(s *Step) error {
	if j == nil || !j.coll.Overlapped() {
		return nil
	}
	names, bufs, counts := s.GradBuffers()
	j.buckets = newGradBuckets(j.coll, names, bufs, counts)
	return s.OnGradFinal(j.buckets.final)
}

// reduce sums a step's gradients and statistics over the ranks: each rank
// weighted its micro-batches by the job's count, so the sums are the
// whole batch's.
func (j *job) reduce(s *Step, out *StepResult) error {
	if j == nil {
		return nil
	}
	if out.DeviceGrads == nil {
		return errors.New("a data-parallel step keeps its gradients on the device (the device optimizer: no --host-optimizer)")
	}
	t0 := time.Now()
	defer func() { j.reduced, j.spent = j.reduced+1, j.spent+time.Since(t0) }()
	if err := j.sumGrads(s); err != nil {
		return err
	}
	v := packStats(out)
	if err := j.coll.SumHost(v); err != nil {
		return err
	}
	unpackStats(out, v)
	return nil
}

// sumGrads sums the step's gradients over the ranks: after the backward
// on the default stream, or (overlapped) by waiting for the buckets the
// backward started.
func (j *job) sumGrads(s *Step) error {
	_, bufs, counts := s.GradBuffers()
	j.bytes = 0
	for _, n := range counts {
		j.bytes += 4 * int64(n)
	}
	if b := j.buckets; b != nil {
		j.buckets, j.spent = nil, j.spent+b.spent
		if err := s.OnGradFinal(nil); err != nil {
			return err
		}
		if err := b.finish(); err != nil {
			return err
		}
		return j.coll.WaitGrads()
	}
	return j.coll.SumGrads(bufs, counts)
}

// event reports the job's collectives of this invocation.
func (j *job) event() ParallelEvent {
	ev := ParallelEvent{Rank: j.coll.Rank(), Ranks: j.coll.World(), Steps: j.reduced, GradBytes: j.bytes, Overlapped: j.coll.Overlapped()}
	if j.reduced > 0 {
		ev.PerStep = j.spent.Seconds() / float64(j.reduced)
	}
	return ev
}

// packStats lists a step's scalars and statistics in a fixed order.
func packStats(out *StepResult) []float64 {
	v := []float64{out.Loss, out.CE}
	for _, l := range out.Layers {
		v = append(append(v, l.H, l.Sat), l.Usage...)
	}
	for _, r := range out.Running {
		for _, x := range r {
			v = append(v, float64(x))
		}
	}
	return v
}

// unpackStats is packStats's inverse.
func unpackStats(out *StepResult, v []float64) {
	out.Loss, out.CE = v[0], v[1]
	v = v[2:]
	for i := range out.Layers {
		l := &out.Layers[i]
		l.H, l.Sat = v[0], v[1]
		v = v[2:]
		v = v[copy(l.Usage, v):]
	}
	for _, r := range out.Running {
		for i := range r {
			r[i] = float32(v[i])
		}
		v = v[len(r):]
	}
}
