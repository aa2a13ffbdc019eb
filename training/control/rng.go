package control

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
)

// RNG is a PCG generator whose state serialises to JSON, so that a resumed
// run draws the same numbers a run without the interruption would.
type RNG struct {
	pcg *rand.PCG
	r   *rand.Rand
}

// NewRNG returns a generator seeded by (seed, stream).
func NewRNG(seed, stream uint64) *RNG {
	p := rand.NewPCG(seed, stream^0xda3e39cb94b95bdb)
	return &RNG{pcg: p, r: rand.New(p)}
}

func (g *RNG) ensure() {
	if g.pcg == nil {
		g.pcg = rand.NewPCG(0, 0xda3e39cb94b95bdb)
		g.r = rand.New(g.pcg)
	}
}

// Float64 is uniform in [0, 1).
func (g *RNG) Float64() float64 { g.ensure(); return g.r.Float64() }

// Norm is a standard normal draw.
func (g *RNG) Norm() float64 { g.ensure(); return g.r.NormFloat64() }

// rngJSON is the serialised state: the two 64-bit words of the PCG state.
type rngJSON struct {
	Hi uint64 `json:"hi"`
	Lo uint64 `json:"lo"`
}

// MarshalJSON writes the generator's state.
func (g *RNG) MarshalJSON() ([]byte, error) {
	g.ensure()
	b, err := g.pcg.MarshalBinary()
	if err != nil || len(b) != 20 {
		return nil, fmt.Errorf("control: unexpected PCG state encoding (%v)", err)
	}
	return json.Marshal(rngJSON{Hi: binary.BigEndian.Uint64(b[4:]), Lo: binary.BigEndian.Uint64(b[12:])})
}

// UnmarshalJSON restores a state written by MarshalJSON.
func (g *RNG) UnmarshalJSON(data []byte) error {
	var s rngJSON
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("control: RNG state: %w", err)
	}
	b := make([]byte, 0, 20)
	b = append(b, "pcg:"...)
	b = binary.BigEndian.AppendUint64(b, s.Hi)
	b = binary.BigEndian.AppendUint64(b, s.Lo)
	g.ensure()
	if err := g.pcg.UnmarshalBinary(b); err != nil {
		return fmt.Errorf("control: RNG state: %w", err)
	}
	return nil
}

// F is a float64 that survives JSON as a number or, for NaN and ±Inf (which
// JSON cannot hold), as the strings "NaN", "Inf" and "-Inf".
type F float64

// MarshalJSON writes finite values as numbers, others as strings.
func (f F) MarshalJSON() ([]byte, error) {
	x := float64(f)
	switch {
	case math.IsNaN(x):
		return []byte(`"NaN"`), nil
	case math.IsInf(x, 1):
		return []byte(`"Inf"`), nil
	case math.IsInf(x, -1):
		return []byte(`"-Inf"`), nil
	}
	return json.Marshal(x)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (f *F) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case `"NaN"`:
		*f = F(math.NaN())
		return nil
	case `"Inf"`:
		*f = F(math.Inf(1))
		return nil
	case `"-Inf"`:
		*f = F(math.Inf(-1))
		return nil
	}
	var x float64
	if err := json.Unmarshal(b, &x); err != nil {
		return err
	}
	*f = F(x)
	return nil
}
