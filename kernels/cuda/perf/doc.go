// Package perf is the CUDA backend's performance model: the events a
// trace of the backend records (Event: a launch, a GEMM or a copy with its
// FLOPs, bytes and cost class), the machines it knows (Hardware, Machines,
// LookupMachine: H100, H200, GH200) and Predict, which turns a step's
// events into its time on a machine, kernel by kernel and GEMM shape by
// shape. Recording the trace is the backend's (kernels/cuda's trace.go and
// dry-run device); the model's constants and where they were measured are
// in docs/PERFMODEL.md.
package perf
