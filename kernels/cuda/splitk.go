package cuda

// A weight gradient dW = dyᵀ·x of a Linear has the Linear's N×K output
// (a few 128×128 tiles: 16 for 510×510) and the step's rows as its depth
// (24,576 at the paper preset), so as one GEMM it leaves most SMs idle.
// Split along K into slices, it runs as a strided batch of GEMMs, one per
// slice of rows, into partial products that sum_slices_f32 adds in order:
// every SM busy, the sum fixed (a step still repeats bit for bit).
//
// It is off unless RPAC_CUDA_SPLITK=on. The sixth GPU run (H200) measured
// cuBLASLt splitting these GEMMs itself (its heuristic's first algorithm
// for 510×1020 over 24,576 rows takes a 16 MB workspace and 0.97 waves)
// faster than the slices: 0.113–0.121 ms for the whole GEMM against
// 0.152 ms for the batch of four slices, sum_slices_f32 apart (the weight
// gradients 12.8 → 9.3 ms per paper step at 768 tokens).

const (
	// splitKMinDepth: no slice is shallower than this many rows, so each
	// GEMM of the batch keeps a deep main loop.
	splitKMinDepth = 1024
	// splitKMax bounds the slices (and the partial products' memory).
	splitKMax = 16
)

// splitK is the number of slices for a GEMM of s's shape on a device with
// sms SMs: 1 unless s is a weight gradient's shape (Aᵀ·B of operands
// stored K rows deep, so a slice of K is a slice of rows of each) whose
// output tiles fill less than half the SMs; else the largest power of two
// that divides K, keeps each slice at least splitKMinDepth deep and brings
// the output tiles of all slices to no more than the SMs.
func splitK(s GemmShape, sms int) int {
	if sms == 0 {
		return 1
	}
	tiles := ceilDiv(s.M, gemmTile) * ceilDiv(s.N, gemmTile)
	if !s.TransA || s.TransB || s.Batch > 1 || 2*tiles >= sms {
		return 1
	}
	n := 1
	for n*2 <= splitKMax && tiles*n*2 <= sms && s.K%(n*2) == 0 && s.K/(n*2) >= splitKMinDepth {
		n *= 2
	}
	return n
}

// splitShape is s (splitK's kind: Aᵀ·B, dense) as slices GEMMs over
// consecutive slices of K, the rows of A and B, writing their partial
// products one after another.
func splitShape(s GemmShape, slices int) GemmShape {
	b := s
	b.K, b.Batch = s.K/slices, slices
	b.StrideA, b.StrideB, b.StrideC = int64(b.K*s.M), int64(b.K*s.N), int64(s.M*s.N)
	return b
}

// gemmSplit runs the GEMM of s on a and b into C as slices partial
// products in the reductions' workspace, then their sum.
func (p *program) gemmSplit(s GemmShape, slices int, a, b operand, C Buffer) error {
	parts := Buffer{Ptr: p.work.Ptr, Bytes: uint64(4 * slices * s.M * s.N)}
	if err := p.gemm(splitShape(s, slices), a, b, 0, parts); err != nil {
		return err
	}
	n := s.M * s.N
	return p.each("sum_slices_f32", n, C.Ptr, parts.Ptr, int32(slices), int64(n))
}

// splitKEnv: RPAC_CUDA_SPLITK=on splits the weight gradients (off, the
// default, leaves them to cuBLASLt).
func splitKEnv() (bool, error) {
	return envChoice("RPAC_CUDA_SPLITK", map[string]bool{"": false, "on": true, "off": false},
		"off (the default: cuBLASLt splits the weight gradients' GEMMs itself) or on (rpac's slices and sum_slices_f32)")
}
