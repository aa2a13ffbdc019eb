package cpu

import "github.com/rpac-dev/rpac/kernels"

// Randomness is kernels' counter-based stream (shared with the CUDA
// backend, so a seed draws the same masks on both).

const golden = kernels.Golden

func mix64(z uint64) uint64 { return kernels.Mix64(z) }

func streamKey(seed uint64, nodeID int) uint64 { return kernels.StreamKey(seed, nodeID) }

// uniform returns the i-th draw of stream key in [0,1) (53 bits).
func uniform(key uint64, i int) float64 {
	return float64(mix64(key+uint64(i+1)*golden)>>11) * (1.0 / (1 << 53))
}
