package cuda

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"

	"github.com/rpac-dev/rpac/training/control"
)

// TestSimSatCounterMatchesHost: the device count of saturated rows equals
// control.SatFraction's on memberships placed on either side of the
// threshold (including the float32 neighbours of a threshold that float32
// cannot hold), for several R and row counts, several slots at once; Reset
// clears them. On the simulator it runs again in differential mode (reverse
// block and thread order, each launch compared bit for bit).
func TestSimSatCounterMatchesHost(t *testing.T) {
	d := parityDevice(t)
	if !d.Simulated() {
		checkSatCounter(t)
		return
	}
	for _, diff := range []int64{0, 1} { // then in differential mode: the atomics' order must not matter
		d.SimConfig("diff", diff)
		checkSatCounter(t)
	}
	d.SimConfig("diff", 0)
}

func checkSatCounter(t *testing.T) {
	t.Helper()
	be, err := New(0, ir.FP32, CandidateOptions())
	if err != nil {
		t.Fatal(err)
	}
	const thr = 0.9 // not a float32: 0.9f < 0.9
	near := []float32{float32(thr), math.Nextafter32(float32(thr), 2), math.Nextafter32(float32(thr), 0), 0.5, 1, 0.95}
	cases := []struct{ rows, R int }{{1, 1}, {7, 4}, {1000, 3}, {4099, 8}}
	c, err := NewSatCounter(be, len(cases))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 8))
	want := make([]uint64, len(cases))
	for slot, tc := range cases {
		mu := make([]float32, tc.rows*tc.R)
		for i := range mu {
			if r.IntN(3) == 0 {
				mu[i] = near[r.IntN(len(near))]
			} else {
				mu[i] = r.Float32() * 0.9
			}
		}
		want[slot] = uint64(math.Round(control.SatFraction(mu, tc.R, thr) * float64(tc.rows)))
		buf := upload(t, be, mu)
		if err := c.Count(slot, buf, tc.R, thr); err != nil {
			t.Fatal(err)
		}
	}
	got, err := c.Counts()
	if err != nil {
		t.Fatal(err)
	}
	for slot, tc := range cases {
		if got[slot] != want[slot] {
			t.Errorf("rows %d R %d: device counts %d saturated rows, host %d", tc.rows, tc.R, got[slot], want[slot])
		}
	}
	if want[len(cases)-1] == 0 || want[len(cases)-1] == uint64(cases[len(cases)-1].rows) {
		t.Fatalf("degenerate case: %d of %d rows saturated", want[len(cases)-1], cases[len(cases)-1].rows)
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.Counts(); got[0] != 0 || got[len(got)-1] != 0 {
		t.Errorf("after Reset: %v", got)
	}
	if err := c.Count(0, Buffer{Ptr: 1, Bytes: 12}, 5, thr); err == nil {
		t.Errorf("12 bytes as rows of 5 float32: no error")
	}
}

// upload copies x to a new device buffer freed with the test.
func upload(t *testing.T, be *Backend, x []float32) Buffer {
	t.Helper()
	unbind, err := be.bind()
	if err != nil {
		t.Fatal(err)
	}
	defer unbind()
	b, err := be.dev.alloc(uint64(4 * len(x)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if u, err := be.bind(); err == nil {
			be.dev.free(b)
			u()
		}
	})
	if err := be.dev.upload(b, f32Ptr(x), uint64(4*len(x))); err != nil {
		t.Fatal(err)
	}
	return Buffer{Ptr: b.Ptr, Bytes: uint64(4 * len(x))}
}

// TestSimDeviceEMAMatchesHost: ema_f32 against training/control's
// EMA.Update on the same weights and rates (bit for bit on amd64, where Go
// rounds each operation on its own; within one ulp elsewhere), in normal
// and, on the simulator, in differential mode; Upload replaces the shadows.
func TestSimDeviceEMAMatchesHost(t *testing.T) {
	d := parityDevice(t)
	maxUlp := uint32(0)
	if runtime.GOARCH != "amd64" {
		maxUlp = 1
	}
	modes := []int64{0}
	if d.Simulated() {
		modes = append(modes, 1)
	}
	for _, diff := range modes {
		if d.Simulated() {
			d.SimConfig("diff", diff)
		}
		be, err := New(0, ir.FP32, CandidateOptions())
		if err != nil {
			t.Fatal(err)
		}
		st := kernels.NewStore(ir.FP32)
		r := rand.New(rand.NewPCG(11, 12))
		sizes := map[string]int{"a.weight": 3000, "b.bias": 7}
		var names []string
		shadow, host := map[string][]float32{}, [][]float32{}
		var weights [][]float32
		for _, n := range []string{"a.weight", "b.bias"} {
			w, _ := st.Ensure(n, ir.Shape{sizes[n]})
			for i := range w.F32 {
				w.F32[i] = float32(r.NormFloat64())
			}
			names = append(names, n)
			s := make([]float32, sizes[n])
			for i := range s {
				s[i] = float32(r.NormFloat64())
			}
			shadow[n] = append([]float32(nil), s...)
			host = append(host, s)
			weights = append(weights, w.F32)
		}
		opt, err := NewDeviceAdamW(be, st, AdamWHyper{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}, names)
		if err != nil {
			t.Fatal(err)
		}
		ema, err := NewDeviceEMA(opt, shadow)
		if err != nil {
			t.Fatal(err)
		}
		h := &control.EMA{Decay: 0.99}
		for range 3 {
			dr := float32(h.Rate())
			h.Update(host, weights)
			if err := ema.Update(dr); err != nil {
				t.Fatal(err)
			}
		}
		got := map[string][]float32{"a.weight": make([]float32, 3000), "b.bias": make([]float32, 7)}
		if err := ema.Download(got); err != nil {
			t.Fatal(err)
		}
		for i, n := range names {
			ulps(t, "EMA of "+n, got[n], host[i], maxUlp)
		}
		if err := ema.Upload(shadow); err != nil {
			t.Fatal(err)
		}
		if err := ema.Download(got); err != nil {
			t.Fatal(err)
		}
		ulps(t, "uploaded shadow", got["b.bias"], shadow["b.bias"], 0)
		ema.Close()
		opt.Close()
	}
	if d.Simulated() {
		d.SimConfig("diff", 0)
	}
}
