package cuda

import (
	"maps"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/rpac-dev/rpac/training/optim"
)

// TestSimDeviceAdamWMatchesHost: clipping and AdamW on the device against
// training/optim on the host, same gradients, four steps (two of them
// clipped; in the third one parameter has no gradient, so the fourth
// updates parameters of two step counts): the weights and moments agree bit for bit on amd64 (the kernel
// rounds every double operation on its own, like Go there; where Go fuses
// multiply-adds, within one float32 ulp), the norms to double rounding;
// the exported state imports into the host optimizer, and a host export
// imports back. On the simulator or a GPU (the kernel's explicit _rn
// intrinsics keep a GPU from fusing them). On the simulator all of it
// again in differential mode.
func TestSimDeviceAdamWMatchesHost(t *testing.T) {
	parityDevice(t)
	differentially(t, []string{"adamw_multi_f64_f32", "scale_multi_f32", "sumsq_parts_f32", "sum_part_f64"}, func() { deviceAdamWMatchesHost(t) })
}

func deviceAdamWMatchesHost(t *testing.T) {
	be, err := New(0, ir.FP32, CandidateOptions())
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[string]int{"a.weight": 3*(1<<14) + 77, "b.bias": 5, "c.norm.weight": 1029, "d.weight": 1 << 14}
	r := rand.New(rand.NewPCG(5, 6))
	dst, host := kernels.NewStore(ir.FP32), map[string][]float32{}
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
	dev, err := NewDeviceAdamW(be, dst, hyperOf(cfg), names)
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
		gb := maps.Clone(gbuf)
		if step == 2 { // a parameter without a gradient: two step counts in the next update
			delete(grads, "b.bias")
			delete(gb, "b.bias")
		}
		hn := optim.ClipGlobalNorm(grads, 1)
		dn, err := dev.ClipGlobalNorm(gb, 1)
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
		if err := dev.Step(gb, lr); err != nil {
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
	dm, dsteps, err := dev.Moments()
	if err != nil {
		t.Fatal(err)
	}
	hexp, hsteps := hopt.Export()
	host3 := momentsOf(hexp)
	if dsteps != hsteps || len(dm) != len(host3) || len(dm) != len(sizes) {
		t.Fatalf("moments: device %d parameters after %d steps, host %d after %d", len(dm), dsteps, len(host3), hsteps)
	}
	for n, h := range host3 {
		d := dm[n]
		if d.T != h.T {
			t.Errorf("%s: device step %d, host %d", n, d.T, h.T)
		}
		ulps(t, "m of "+n, d.M, h.M, maxUlp)
		ulps(t, "v of "+n, d.V, h.V, maxUlp)
	}
	if err := dev.SetMoments(host3, hsteps); err != nil {
		t.Fatal(err)
	}
	back, bsteps, err := dev.Moments()
	if err != nil || bsteps != hsteps {
		t.Fatalf("after SetMoments: %d steps, %v", bsteps, err)
	}
	for n, h := range host3 {
		ulps(t, "round trip m of "+n, back[n].M, h.M, 0)
		ulps(t, "round trip v of "+n, back[n].V, h.V, 0)
	}
	if err := dev.SetMoments(map[string]Moments{"a.weight": {M: make([]float32, 3), V: make([]float32, 3)}}, 1); err == nil {
		t.Errorf("SetMoments took 3 values for a parameter of %d", sizes["a.weight"])
	}
}

// hyperOf is a host AdamW configuration as the device optimizer takes it.
func hyperOf(c optim.AdamWConfig) AdamWHyper {
	c = optim.NewAdamW(c).Config()
	return AdamWHyper{Beta1: c.Beta1, Beta2: c.Beta2, Eps: c.Eps, WeightDecay: c.WeightDecay, Decay: c.Decay}
}

// momentsOf reads the host optimizer's export (adam.m.*, adam.v.*,
// adam.step.*) by parameter.
func momentsOf(ts []checkpoint.Named) map[string]Moments {
	out := map[string]Moments{}
	for _, t := range ts {
		for _, p := range []string{optim.PrefixM, optim.PrefixV, optim.PrefixStep} {
			name, ok := strings.CutPrefix(t.Name, p)
			if !ok {
				continue
			}
			m := out[name]
			switch p {
			case optim.PrefixM:
				m.M = t.Data
			case optim.PrefixV:
				m.V = t.Data
			default:
				m.T = int(t.Data[0])
			}
			out[name] = m
		}
	}
	return out
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
