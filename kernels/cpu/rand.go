package cpu

// Counter-based randomness: element i of a random op draws from
// mix(key + i·γ), key derived from (run seed, node ID). Values do not depend
// on how the work is split over cores, and the same seed repeats a run.

const golden = 0x9E3779B97F4A7C15

// mix64 is the SplitMix64 finaliser.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

func streamKey(seed uint64, nodeID int) uint64 {
	return mix64(mix64(seed+golden) ^ mix64(uint64(nodeID)*0xD1B54A32D192ED03+1))
}

// uniform returns the i-th draw of stream key in [0,1) (53 bits).
func uniform(key uint64, i int) float64 {
	return float64(mix64(key+uint64(i+1)*golden)>>11) * (1.0 / (1 << 53))
}
