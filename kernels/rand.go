package kernels

// Counter-based randomness shared by every backend, so a seed draws the
// same Dropout masks and Gumbel noise on the CPU and on a GPU: element i of
// a random op draws from Mix64(key + (i+1)·Golden), key = StreamKey(run
// seed, node ID). Draws do not depend on how the work is split.

// Golden is the stream's counter increment (2⁶⁴/φ).
const Golden = 0x9E3779B97F4A7C15

// Mix64 is the SplitMix64 finaliser.
func Mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// StreamKey is the key of node nodeID's draws in a run with seed.
func StreamKey(seed uint64, nodeID int) uint64 {
	return Mix64(Mix64(seed+Golden) ^ Mix64(uint64(nodeID)*0xD1B54A32D192ED03+1))
}
