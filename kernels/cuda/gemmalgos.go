package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// AlgoTime is one cuBLASLt algorithm's time on a GEMM (TimeGemmAlgos).
type AlgoTime struct {
	Rank      int     // its place in the heuristic's list (0: the one a plan takes)
	Workspace uint64  // bytes
	Waves     float32 // the heuristic's wave count
	Seconds   float64 // median of the timed runs, each between two synchronizations
	// MaxDiff: the largest |C − C₀| over the first rows of C, relative to
	// max |C₀|, C₀ the result of rank 0 (the algorithms must agree to the
	// precision's rounding).
	MaxDiff float64
}

// gemmProbeWorkspace is the workspace the candidates may use: the plans'
// (bf16Workspace in ops.go).
const gemmProbeWorkspace = 32 << 20

// gemmProbeCompare is how many elements of C are compared between ranks.
const gemmProbeCompare = 1 << 20

// TimeGemmAlgos times the first algos algorithms cuBLASLt's heuristic
// lists for C = A·B of shape s (operands of dtype ab, random in [−1, 1),
// fresh 256-byte-aligned buffers, β = 0, no bias), each the median of reps
// runs after one warm-up, and checks each result against rank 0's. It is
// what a plan would gain from timing the candidates instead of taking the
// heuristic's first (on a GPU; the simulator lists two, which differ in
// their order of summation only).
func (b *Backend) TimeGemmAlgos(s GemmShape, ab DType, algos, reps int) ([]AlgoTime, error) {
	g, ok := b.dev.(*gpu)
	if !ok {
		return nil, fmt.Errorf("timing GEMM algorithms needs a GPU or the simulator")
	}
	if s.Batch > 1 || s.M <= 0 || s.N <= 0 || s.K <= 0 || algos < 1 || reps < 1 {
		return nil, fmt.Errorf("GEMM %dx%dx%d (batch %d), %d algorithms, %d runs: want one positive problem, ≥ 1 of each", s.M, s.N, s.K, s.Batch, algos, reps)
	}
	s.Batch = 1
	return g.timeAlgos(GemmKey{Shape: s, AB: ab, Align: [3]uint16{256, 256, 256}}, gemmProbeWorkspace, algos, reps)
}

// timeAlgos times the first algos candidates for key k that need at most
// maxWorkspace bytes of workspace, on operands of its own (A and B random
// in [−1, 1), C and a bias zero, each matrix of the batch where k's
// strides put it, each pointer of exactly the key's alignment, β = 0),
// each the median of reps runs after a warm-up, and compares each
// result's first rows with rank 0's.
func (g *gpu) timeAlgos(k GemmKey, maxWorkspace uint64, algos, reps int) ([]AlgoTime, error) {
	unbind, err := g.bind()
	if err != nil {
		return nil, err
	}
	defer unbind()
	var bufs []Buffer
	defer func() {
		for _, x := range bufs {
			g.free(x)
		}
	}()
	// a buffer whose address has exactly the alignment align (ptrAlign),
	// as the plan's key says its operand has
	aligned := func(align uint16) func(uint64) (Buffer, error) {
		return func(bytes uint64) (Buffer, error) {
			x, err := g.alloc(bytes + 512 + 256)
			if err != nil {
				return Buffer{}, err
			}
			bufs = append(bufs, x)
			ptr := (x.Ptr + 511) &^ 511
			if align < 256 {
				ptr += uint64(align)
			}
			return Buffer{Ptr: ptr, Bytes: bytes}, nil
		}
	}
	na, nb, nc := gemmKeyElems(k.Shape)
	call := GemmCall{Alpha: 1, CType: k.C}
	if call.A, err = randomOperand(g, aligned(k.Align[0]), int(na), k.AB); err != nil {
		return nil, err
	}
	if call.B, err = randomOperand(g, aligned(k.Align[1]), int(nb), k.AB); err != nil {
		return nil, err
	}
	if call.C, err = aligned(k.Align[2])(uint64(k.C.Size() * nc)); err != nil {
		return nil, err
	}
	alloc := aligned(256)
	if k.BiasAlign != 0 {
		if call.Bias, err = aligned(k.BiasAlign)(uint64(4 * k.Shape.N)); err != nil {
			return nil, err
		}
		if err := g.zero(call.Bias, call.Bias.Bytes); err != nil {
			return nil, err
		}
	}
	if call.WS, err = alloc(max(1, maxWorkspace)); err != nil {
		return nil, err
	}
	plans, err := g.blas.CandidatePlans(k, maxWorkspace, algos)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, p := range plans {
			g.blas.DestroyPlan(p)
		}
	}()
	var ref []float32
	out := make([]AlgoTime, 0, len(plans))
	for rank, p := range plans {
		at := AlgoTime{Rank: rank, Workspace: p.Workspace(), Waves: p.Waves()}
		if at.Seconds, err = timeGemm(g, p, call, reps); err != nil {
			return out, fmt.Errorf("algorithm %d: %w", rank, err)
		}
		c, err := downloadC(g, call.C, k.C, min(int(nc), gemmProbeCompare))
		if err != nil {
			return out, err
		}
		if rank == 0 {
			ref = c
		}
		at.MaxDiff = relMaxDiff(c, ref)
		out = append(out, at)
	}
	return out, nil
}

// downloadC reads the first n elements of a GEMM's result of type t.
func downloadC(g *gpu, c Buffer, t DType, n int) ([]float32, error) {
	out := make([]float32, n)
	if t != BF16 {
		return out, g.download(unsafe.Pointer(&out[0]), c, uint64(4*n))
	}
	h := make([]uint16, n)
	if err := g.download(unsafe.Pointer(&h[0]), c, uint64(2*n)); err != nil {
		return nil, err
	}
	for i, v := range h {
		out[i] = math.Float32frombits(uint32(v) << 16)
	}
	return out, nil
}

// randomOperand allocates elems values of dtype ab, uniform in [−1, 1).
func randomOperand(g *gpu, alloc func(uint64) (Buffer, error), elems int, ab DType) (Buffer, error) {
	r := rand.New(rand.NewPCG(uint64(elems), 7))
	if ab == BF16 {
		h := make([]uint16, elems)
		for i := range h {
			h[i] = uint16(math.Float32bits(2*r.Float32()-1) >> 16)
		}
		x, err := alloc(uint64(2 * elems))
		if err != nil {
			return Buffer{}, err
		}
		return x, g.upload(x, unsafe.Pointer(&h[0]), uint64(2*elems))
	}
	h := make([]float32, elems)
	for i := range h {
		h[i] = 2*r.Float32() - 1
	}
	x, err := alloc(uint64(4 * elems))
	if err != nil {
		return Buffer{}, err
	}
	return x, g.upload(x, unsafe.Pointer(&h[0]), uint64(4*elems))
}

// timeGemm is the median wall time of reps calls of p, each between two
// synchronizations, after one untimed call.
func timeGemm(g *gpu, p *driver.GemmPlan, call GemmCall, reps int) (float64, error) {
	if err := g.gemm(gpuPlan{p}, call); err != nil {
		return 0, err
	}
	ts := make([]float64, reps)
	for i := range ts {
		if err := g.sync(); err != nil {
			return 0, err
		}
		t0 := time.Now()
		if err := g.gemm(gpuPlan{p}, call); err != nil {
			return 0, err
		}
		if err := g.sync(); err != nil {
			return 0, err
		}
		ts[i] = time.Since(t0).Seconds()
	}
	slices.Sort(ts)
	return ts[len(ts)/2], nil
}

// relMaxDiff is max|a − b| / max(max|b|, tiny); NaN anywhere counts as +Inf.
func relMaxDiff(a, b []float32) float64 {
	var d, m float64
	for i := range b {
		x, y := float64(a[i]), float64(b[i])
		if math.IsNaN(x) || math.IsNaN(y) {
			return math.Inf(1)
		}
		d = max(d, math.Abs(x-y))
		m = max(m, math.Abs(y))
	}
	return d / max(m, 1e-30)
}

// ParseGemmShape reads "MxNxK", "MxNxK:TT" or "MxNxK:TT:LDC" (TT: N or T
// for A and for B, "NT": C = A·Bᵀ; LDC: C's row length, ≥ N, as the
// backend gives the LM head's logits) as the backend would run it in dtype
// ab: bf16 operands in rows padded to 16 bytes (bf16LD), C in rows of N
// floats unless LDC says otherwise.
func ParseGemmShape(spec string, ab DType) (GemmShape, error) {
	var s GemmShape
	bad := func() (GemmShape, error) {
		return s, fmt.Errorf("GEMM shape %q: want MxNxK[:TT[:LDC]] with positive sizes, TT one of NN, NT, TN, TT, LDC ≥ N (e.g. 24576x510x510:NT)", spec)
	}
	parts := strings.Split(spec, ":")
	if len(parts) > 3 {
		return bad()
	}
	if _, err := fmt.Sscanf(parts[0], "%dx%dx%d", &s.M, &s.N, &s.K); err != nil || s.M <= 0 || s.N <= 0 || s.K <= 0 ||
		fmt.Sprintf("%dx%dx%d", s.M, s.N, s.K) != parts[0] {
		return bad()
	}
	if len(parts) > 1 {
		switch parts[1] {
		case "NN":
		case "NT":
			s.TransB = true
		case "TN":
			s.TransA = true
		case "TT":
			s.TransA, s.TransB = true, true
		default:
			return bad()
		}
	}
	if len(parts) > 2 {
		if _, err := fmt.Sscanf(parts[2], "%d", &s.LDC); err != nil || s.LDC < s.N || fmt.Sprint(s.LDC) != parts[2] {
			return bad()
		}
	}
	s.Batch = 1
	if ab == BF16 {
		_, ca := s.StoredA()
		_, cb := s.StoredB()
		s.LDA, s.LDB = bf16LD(ca), bf16LD(cb)
	}
	return s, nil
}
