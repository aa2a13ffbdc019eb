package model

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/rpac-dev/rpac/ir"

	"github.com/rpac-dev/rpac/kernels"
)

// InitStore creates every spec's tensor in st that is not there yet and
// fills it from its Init with a generator seeded by seed (the same seed gives
// the same model). Tensors already present (loaded from a checkpoint) are
// kept; a present tensor of the wrong shape is an error.
func InitStore(specs []Spec, st *kernels.Store, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	for _, s := range specs {
		if t := st.Get(s.Name); t != nil {
			if !t.Shape.Equal(s.Shape) {
				return fmt.Errorf("%s: stored shape %v, model wants %v", s.Name, t.Shape, s.Shape)
			}
			continue
		}
		t, err := st.Ensure(s.Name, s.Shape)
		if err != nil {
			return err
		}
		// Each tensor draws from its own stream so adding a tensor does not
		// change the others' initial values.
		r := rand.New(rand.NewPCG(rng.Uint64()^hashName(s.Name), seed))
		n := s.Shape.Numel()
		for i := 0; i < n; i++ {
			var v float64
			switch s.Init.Kind {
			case "normal":
				v = r.NormFloat64() * s.Init.Scale
			case "uniform":
				v = (2*r.Float64() - 1) * s.Init.Scale
			case "const":
				v = s.Init.Scale
			case "sinusoid":
				v = s.Init.Scale * sinusoid(i, s.Shape)
			default:
				return fmt.Errorf("%s: unknown init %q", s.Name, s.Init.Kind)
			}
			t.Set(i, v)
		}
	}
	return nil
}

// sinusoid is element i of the [rows, D] sinusoidal position table:
// row p, column 2k is sin(p/10000^(2k/D)), column 2k+1 the cosine.
func sinusoid(i int, shape ir.Shape) float64 {
	d := shape[len(shape)-1]
	p, j := i/d, i%d
	f := math.Pow(10000, -float64(j-j%2)/float64(d))
	if j%2 == 0 {
		return math.Sin(float64(p) * f)
	}
	return math.Cos(float64(p) * f)
}

func hashName(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
