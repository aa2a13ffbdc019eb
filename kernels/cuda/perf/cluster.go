package perf

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Cluster is a data-parallel machine: GPUs of one kind, GPUsPerNode to a
// node, joined within a node by NVLink and between nodes by InfiniBand
// (one NIC per GPU, as in NVIDIA's DGX H100). docs/PERFMODEL.md gives the
// source of every constant.
type Cluster struct {
	Name        string
	GPU         Hardware
	GPUs        int
	GPUsPerNode int
	// NVLinkGBs is one GPU's NVLink bandwidth per direction (datasheet);
	// NICGBs one NIC's per direction (datasheet).
	NVLinkGBs, NICGBs float64
}

// Achieved fractions and latencies of the collective.
const (
	// nvlinkAchieved: NCCL's ring all-reduce within an 8-GPU NVLink node
	// reaches about 80% of the per-direction NVLink bandwidth as bus
	// bandwidth (nccl-tests' definition).
	nvlinkAchieved = 0.80
	// nicAchieved: InfiniBand NDR links carry about 90% of their line
	// rate in NCCL's ring.
	nicAchieved = 0.90
	// Per ring step (2(n−1) steps): an NVLink hop and a network hop.
	// Estimates: they matter only for small gradients.
	nvlinkHop = 2e-6
	nicHop    = 6e-6
	// backwardShare is the backward's share of a step's GPU time (its
	// GEMMs do twice the forward's work): the window the gradient
	// all-reduce overlaps with.
	backwardShare = 2.0 / 3
)

// H100 SXM: NVLink 4, 900 GB/s bidirectional (NVIDIA H100 datasheet);
// DGX H100: eight ConnectX-7 400 Gb/s NDR InfiniBand ports, one per GPU
// (NVIDIA DGX H100 user guide).
const (
	h100NVLinkGBs = 450
	ndrNICGBs     = 50
)

// LookupCluster reads "MACHINExN" (h100x8, h100x64): N GPUs of the
// machine of Machines, 8 to a node. ok is false for a name without "xN".
func LookupCluster(name string) (c Cluster, ok bool, err error) {
	base, n, found := strings.Cut(strings.ToLower(name), "x")
	if !found {
		return Cluster{}, false, nil
	}
	gpus, err := strconv.Atoi(n)
	if err != nil || gpus < 1 {
		return Cluster{}, true, fmt.Errorf("--predict %q: want MACHINExN with N GPUs (h100x8, h100x64)", name)
	}
	hw, err := LookupMachine(base)
	if err != nil {
		return Cluster{}, true, err
	}
	return Cluster{Name: strings.ToLower(name), GPU: hw, GPUs: gpus, GPUsPerNode: 8, NVLinkGBs: h100NVLinkGBs, NICGBs: ndrNICGBs}, true, nil
}

// Nodes is the number of nodes.
func (c Cluster) Nodes() int { return (c.GPUs + c.GPUsPerNode - 1) / c.GPUsPerNode }

// BusGBs is the ring all-reduce's bus bandwidth: NVLink's within a node;
// across nodes the smaller of NVLink's and the node's NICs' together (each
// of NCCL's rings leaves a node through its own NIC).
func (c Cluster) BusGBs() float64 {
	nv := c.NVLinkGBs * nvlinkAchieved
	if c.Nodes() == 1 {
		return nv
	}
	return math.Min(nv, float64(min(c.GPUs, c.GPUsPerNode))*c.NICGBs*nicAchieved)
}

// AllReduce is the time of a ring all-reduce of bytes over the cluster:
// 2(n−1)/n of the bytes through the bus bandwidth, plus 2(n−1) hops.
func (c Cluster) AllReduce(bytes float64) float64 {
	n := float64(c.GPUs)
	if c.GPUs < 2 {
		return 0
	}
	hops := 2 * (n - 1) * nvlinkHop
	if c.Nodes() > 1 {
		hops += 2 * float64(c.Nodes()-1) * nicHop
	}
	return 2*(n-1)/n*bytes/(c.BusGBs()*1e9) + hops
}

// Scaling is a data-parallel step predicted from one GPU's: every GPU runs
// the traced step on its shard (the global batch is GPUs times the
// traced one), then the gradients are all-reduced in buckets, overlapped
// with the backward (rpac train --overlap-allreduce, training.Parallel's
// Overlap).
type Scaling struct {
	Cluster   Cluster
	GradBytes float64 // the gradients all-reduced per step
	Buckets   int
	Comm      float64 // the all-reduce of every bucket, back to back
	Exposed   float64 // what the backward does not hide
	Step1     float64 // one GPU's step
	Step      float64 // the data-parallel step
	// Efficiency is Step1/Step: the throughput of the cluster over GPUs
	// times one GPU's.
	Efficiency float64
	// StepAfter and EfficiencyAfter are the same with every bucket
	// all-reduced after the backward (no overlap): rpac's step by default,
	// without --overlap-allreduce.
	StepAfter, EfficiencyAfter float64
}

// Scale predicts the data-parallel step of p on c with gradBytes of
// gradients in buckets of bucketBytes. The buckets are all-reduced as the
// backward produces them: all but the last overlap the backward
// (backwardShare of the GPU time), and the last is always exposed.
func (c Cluster) Scale(p *Prediction, gradBytes, bucketBytes float64) Scaling {
	s := Scaling{Cluster: c, GradBytes: gradBytes, Step1: p.Step}
	s.Buckets = max(1, int(math.Ceil(gradBytes/bucketBytes)))
	per := c.AllReduce(gradBytes / float64(s.Buckets))
	s.Comm = per * float64(s.Buckets)
	if c.GPUs > 1 {
		hidden := backwardShare * p.GPU * float64(s.Buckets-1) / float64(s.Buckets)
		s.Exposed = math.Max(s.Comm-hidden, per)
	}
	s.Step = p.Step + s.Exposed
	s.Efficiency = s.Step1 / s.Step
	s.StepAfter = p.Step + s.Comm
	s.EfficiencyAfter = s.Step1 / s.StepAfter
	return s
}
