package cuda

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/training/optim"
)

// TestSimDeviceAdamWMatchesHost: clipping and AdamW on the device against
// training/optim on the host, same gradients, four steps (two of them
// clipped): the weights and moments agree bit for bit on amd64 (the kernel
// rounds every double operation on its own, like Go there; where Go fuses
// multiply-adds, within one float32 ulp), the norms to double rounding;
// the exported state imports into the host optimizer, and a host export
// imports back.
func TestSimDeviceAdamWMatchesHost(t *testing.T) {
	simOnly(t)
	be, err := New(0, GEMMF32)
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[string]int{"a.weight": 3*(1<<14) + 77, "b.bias": 5, "c.norm.weight": 1029, "d.weight": 1 << 14}
	r := rand.New(rand.NewPCG(5, 6))
	dst, host := kernels.NewStore(kernels.F32), map[string][]float32{}
	var names []string
	for n, k := range sizes {
		dst.Ensure(n, ir.Shape{k})
		w := dst.Get(n).F32
		for i := range w {
			w[i] = float32(r.NormFloat64())
		}
		host[n] = append([]float32(nil), w...)
		names = append(names, n)
	}
	cfg := optim.DefaultAdamW()
	dev, err := NewDeviceAdamW(be, dst, cfg, names)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	hopt := optim.NewAdamW(cfg)
	gbuf := map[string]Buffer{}
	unbind, _ := be.bind()
	for n, k := range sizes {
		b, err := be.dev.alloc(uint64(4 * k))
		if err != nil {
			t.Fatal(err)
		}
		gbuf[n] = b
		defer be.dev.free(b)
	}
	unbind()
	maxUlp := uint32(0)
	if runtime.GOARCH != "amd64" {
		maxUlp = 1
	}
	for step, scale := range []float64{0.01, 3, 0.02, 5} {
		grads := map[string][]float32{}
		for n, k := range sizes {
			g := make([]float32, k)
			for i := range g {
				g[i] = float32(scale * r.NormFloat64() / 300)
			}
			grads[n] = g
			unbind, _ := be.bind()
			if err := be.dev.upload(gbuf[n], f32Ptr(g), uint64(4*k)); err != nil {
				t.Fatal(err)
			}
			unbind()
		}
		hn := optim.ClipGlobalNorm(grads, 1)
		dn, err := dev.ClipGlobalNorm(gbuf, 1)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(dn-hn) > 1e-12*hn {
			t.Fatalf("step %d: device norm %.17g, host %.17g", step, dn, hn)
		}
		lr := 1e-3 * float64(step+1)
		if err := hopt.Step(host, grads, lr); err != nil {
			t.Fatal(err)
		}
		if err := dev.Step(gbuf, lr); err != nil {
			t.Fatal(err)
		}
		if err := dev.SyncToHost(); err != nil {
			t.Fatal(err)
		}
		for n := range sizes {
			ulps(t, "weights of "+n, dst.Get(n).F32, host[n], maxUlp)
		}
		t.Logf("step %d: norm %.6g (clipped: %v)", step, hn, hn > 1)
	}
	dexp, dsteps, err := dev.Export()
	if err != nil {
		t.Fatal(err)
	}
	hexp, hsteps := hopt.Export()
	if dsteps != hsteps || len(dexp) != len(hexp) {
		t.Fatalf("export: device %d tensors after %d steps, host %d after %d", len(dexp), dsteps, len(hexp), hsteps)
	}
	for i := range hexp {
		if dexp[i].Name != hexp[i].Name {
			t.Fatalf("export order: %s against %s", dexp[i].Name, hexp[i].Name)
		}
		ulps(t, hexp[i].Name, dexp[i].Data, hexp[i].Data, maxUlp)
	}
	if err := optim.NewAdamW(cfg).Import(dexp, dsteps); err != nil {
		t.Errorf("the host optimizer does not import the device's export: %v", err)
	}
	if err := dev.Import(hexp, hsteps); err != nil {
		t.Fatal(err)
	}
	back, _, err := dev.Export()
	if err != nil {
		t.Fatal(err)
	}
	for i := range hexp {
		ulps(t, "round trip "+hexp[i].Name, back[i].Data, hexp[i].Data, 0)
	}
}

func ulps(t *testing.T, what string, got, want []float32, most uint32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		a, b := math.Float32bits(got[i]), math.Float32bits(want[i])
		d := a - b
		if b > a {
			d = b - a
		}
		if d > most {
			t.Fatalf("%s[%d] = %v, host %v (%d ulps apart, at most %d allowed)", what, i, got[i], want[i], d, most)
		}
	}
}
