package optim

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/training/checkpoint"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol*math.Max(1, math.Abs(b)) }

// TestAdamWTwoSteps checks two updates against torch.optim.AdamW's
// formulas written out element by element, and against values computed
// independently in float64.
func TestAdamWTwoSteps(t *testing.T) {
	const lr, wd, b1, b2, eps = 0.1, 0.1, 0.9, 0.999, 1e-8
	opt := NewAdamW(AdamWConfig{WeightDecay: wd})
	// "x.weight" and "y.weight" are decayed; "norm1.weight" is not.
	names := []string{"x.weight", "y.weight", "norm1.weight"}
	params := map[string][]float32{"x.weight": {1}, "y.weight": {-2}, "norm1.weight": {0.5}}
	gradSteps := [][]float32{{0.5, -1, 0.2}, {0.1, 0.3, -0.4}}

	// Reference: PyTorch's single-tensor AdamW.
	ref := []float64{1, -2, 0.5}
	m := make([]float64, 3)
	v := make([]float64, 3)
	for step, gs := range gradSteps {
		tt := float64(step + 1)
		grads := map[string][]float32{}
		for i, n := range names {
			grads[n] = []float32{gs[i]}
			g := float64(gs[i])
			if i < 2 {
				ref[i] *= 1 - lr*wd // param.mul_(1 - lr*weight_decay)
			}
			m[i] = b1*m[i] + (1-b1)*g   // exp_avg.lerp_(grad, 1-beta1)
			v[i] = b2*v[i] + (1-b2)*g*g // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1-beta2)
			bc1 := 1 - math.Pow(b1, tt)
			bc2 := 1 - math.Pow(b2, tt)
			denom := math.Sqrt(v[i])/math.Sqrt(bc2) + eps
			ref[i] -= lr / bc1 * m[i] / denom // param.addcdiv_(exp_avg, denom, value=-lr/bc1)
		}
		if err := opt.Step(params, grads, lr); err != nil {
			t.Fatal(err)
		}
		for i, n := range names {
			if got := float64(params[n][0]); !near(got, ref[i], 1e-6) {
				t.Errorf("step %d %s = %.9g, want %.9g", step+1, n, got, ref[i])
			}
		}
	}
	// Independently computed values after two steps.
	want := []float64{0.8007959063646517, -1.8184151424192265, 0.4366103565460368}
	for i, n := range names {
		if got := float64(params[n][0]); !near(got, want[i], 1e-6) {
			t.Errorf("%s = %.9g, want %.9g", n, got, want[i])
		}
	}
	if opt.Steps() != 2 {
		t.Errorf("Steps = %d", opt.Steps())
	}
}

func TestDefaultDecay(t *testing.T) {
	cases := map[string]bool{
		"blocks.3.attn.Wq.weight":             true,
		"blocks.0.moe.experts.1.net.0.weight": true,
		"blocks.0.res_gate.weight":            true,
		"tok_emb.weight":                      true,
		"blocks.0.norm1.weight":               false,
		"blocks.0.norm2.weight":               false,
		"ln_f.weight":                         false,
		"blocks.1.ln1.weight":                 false,
		"final_LayerNorm.weight":              false,
		"lnx.weight":                          true,
		"blocks.0.attn.out_proj.bias":         false,
		"blocks.0.attn.tau_att":               false,
		"blocks.0.mem.centers":                false,
		"weight":                              false,
	}
	for name, want := range cases {
		if got := DefaultDecay(name); got != want {
			t.Errorf("DefaultDecay(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestWeightDecaySelection(t *testing.T) {
	// With zero gradients Adam's update is zero, so only decay moves a
	// parameter.
	opt := NewAdamW(AdamWConfig{WeightDecay: 0.5, Decay: func(n string) bool { return n == "a" }})
	params := map[string][]float32{"a": {2, 4}, "b": {2, 4}, "c": {2, 4}}
	grads := map[string][]float32{"a": {0, 0}, "b": {0, 0}}
	if err := opt.Step(params, grads, 0.1); err != nil {
		t.Fatal(err)
	}
	if params["a"][0] != 2*0.95 || params["a"][1] != 4*0.95 {
		t.Errorf("decayed a = %v", params["a"])
	}
	if params["b"][0] != 2 || params["c"][0] != 2 {
		t.Errorf("b = %v, c = %v; want untouched", params["b"], params["c"])
	}
	if !opt.Decays("a") || opt.Decays("b") {
		t.Error("Decays disagrees with the predicate")
	}
}

func TestStepErrors(t *testing.T) {
	opt := NewAdamW(AdamWConfig{})
	p := map[string][]float32{"a": {1, 2}}
	cases := []struct {
		grads map[string][]float32
		lr    float64
		want  string
	}{
		{map[string][]float32{"b": {1}}, 0.1, "no parameter"},
		{map[string][]float32{"a": {1}}, 0.1, "gradient 1"},
		{map[string][]float32{"a": {1, 1}}, math.NaN(), "learning rate"},
		{map[string][]float32{"a": {1, 1}}, -1, "learning rate"},
	}
	for _, c := range cases {
		if err := opt.Step(p, c.grads, c.lr); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("err = %v, want %q", err, c.want)
		}
	}
	if p["a"][0] != 1 || opt.Steps() != 0 {
		t.Error("a failed step changed something")
	}
	bad := NewAdamW(AdamWConfig{Beta1: 1.5})
	if err := bad.Step(p, map[string][]float32{"a": {1, 1}}, 0.1); err == nil || bad.Err() == nil || p["a"][0] != 1 {
		t.Error("beta1 1.5 accepted")
	}
	if err := (AdamWConfig{WeightDecay: -1}).Validate(); err == nil {
		t.Error("negative weight decay accepted")
	}
	if err := DefaultAdamW().Validate(); err != nil {
		t.Error(err)
	}
}

func randomModel(rng *rand.Rand) map[string][]float32 {
	sizes := map[string]int{"tok_emb.weight": 3 * chunk, "blocks.0.attn.Wq.weight": 2*chunk + 17, "blocks.0.norm1.weight": 33, "blocks.0.attn.tau_att": 1}
	m := map[string][]float32{}
	for n, s := range sizes {
		x := make([]float32, s)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		m[n] = x
	}
	return m
}

func clone(m map[string][]float32) map[string][]float32 {
	out := map[string][]float32{}
	for k, v := range m {
		out[k] = append([]float32(nil), v...)
	}
	return out
}

func TestStateRoundTripResumesExactly(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	params := randomModel(rng)
	gradsAt := make([]map[string][]float32, 4)
	for i := range gradsAt {
		gradsAt[i] = randomModel(rng)
	}
	delete(gradsAt[1], "blocks.0.attn.tau_att") // a parameter skipped once

	cfg := AdamWConfig{WeightDecay: 0.1, Workers: 2}
	run := NewAdamW(cfg)
	for i := 0; i < 2; i++ {
		if err := run.Step(params, gradsAt[i], 1e-3); err != nil {
			t.Fatal(err)
		}
	}
	ts, steps := run.Export()
	// Through a real checkpoint file.
	dir := t.TempDir() + "/ckpt"
	if err := checkpoint.Save(dir, &checkpoint.Checkpoint{Optim: ts}); err != nil {
		t.Fatal(err)
	}
	c, err := checkpoint.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	resumed := NewAdamW(AdamWConfig{WeightDecay: 0.1, Workers: 1})
	if err := resumed.Import(c.Optim, steps); err != nil {
		t.Fatal(err)
	}
	p1, p2 := clone(params), clone(params)
	for i := 2; i < 4; i++ {
		if err := run.Step(p1, gradsAt[i], 1e-3); err != nil {
			t.Fatal(err)
		}
		if err := resumed.Step(p2, gradsAt[i], 1e-3); err != nil {
			t.Fatal(err)
		}
	}
	for n := range p1 {
		for i := range p1[n] {
			if math.Float32bits(p1[n][i]) != math.Float32bits(p2[n][i]) {
				t.Fatalf("%s[%d]: continued %v, resumed %v", n, i, p1[n][i], p2[n][i])
			}
		}
	}
	if resumed.Steps() != 4 {
		t.Errorf("resumed Steps = %d, want 4", resumed.Steps())
	}
	a, _ := run.Export()
	b, _ := resumed.Export()
	if len(a) != len(b) {
		t.Fatal("exported states differ in size")
	}
	for i := range a {
		if a[i].Name != b[i].Name || len(a[i].Data) != len(b[i].Data) {
			t.Fatalf("exported states differ at %d", i)
		}
	}
	if x, ok := checkpoint.Lookup(a, PrefixStep+"blocks.0.attn.tau_att"); !ok || x.Data[0] != 3 {
		t.Errorf("tau_att step count = %v, want 3", x.Data)
	}
}

func TestImportErrors(t *testing.T) {
	opt := NewAdamW(AdamWConfig{})
	good := []checkpoint.Named{
		{Name: "adam.m.a", Shape: []int{2}, Data: []float32{1, 2}},
		{Name: "adam.v.a", Shape: []int{2}, Data: []float32{1, 2}},
		{Name: "adam.step.a", Shape: []int{}, Data: []float32{3}},
	}
	if err := opt.Import(good, 3); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		ts   []checkpoint.Named
		want string
	}{
		{"foreign", append(good[:2:2], checkpoint.Named{Name: "sgd.buf.a", Data: []float32{1}}), "not AdamW state"},
		{"incomplete", good[:2], "incomplete"},
		{"mismatch", []checkpoint.Named{good[0], {Name: "adam.v.a", Shape: []int{1}, Data: []float32{1}}, good[2]}, "m has 2 values"},
		{"bad step", []checkpoint.Named{good[0], good[1], {Name: "adam.step.a", Data: []float32{1.5}}}, "not a step count"},
	}
	for _, c := range cases {
		if err := opt.Import(c.ts, 1); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.name, err, c.want)
		}
	}
	if opt.Steps() != 3 {
		t.Error("a failed import changed the state")
	}
	// State for a parameter of another size is caught at the next step.
	err := opt.Step(map[string][]float32{"a": {1, 2, 3}}, map[string][]float32{"a": {1, 2, 3}}, 0.1)
	if err == nil || !strings.Contains(err.Error(), "another model") {
		t.Errorf("size mismatch after import: %v", err)
	}
}

// TestParallelMatchesSerial checks that the update does not depend on the
// number of workers.
func TestParallelMatchesSerial(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	params := randomModel(rng)
	grads := randomModel(rng)
	p1, p2 := clone(params), clone(params)
	o1 := NewAdamW(AdamWConfig{WeightDecay: 0.1, Workers: 1})
	o2 := NewAdamW(AdamWConfig{WeightDecay: 0.1, Workers: 2})
	o1.Step(p1, grads, 1e-2)
	o2.Step(p2, grads, 1e-2)
	for n := range p1 {
		for i := range p1[n] {
			if p1[n][i] != p2[n][i] {
				t.Fatalf("%s[%d] differs", n, i)
			}
		}
	}
}

func TestClipGlobalNorm(t *testing.T) {
	grads := map[string][]float32{"a": {3, 0}, "b": {4}}
	if n := ClipGlobalNorm(grads, 10); n != 5 || grads["a"][0] != 3 {
		t.Errorf("under the limit: norm %v, grads %v", n, grads)
	}
	if n := ClipGlobalNorm(grads, 1); n != 5 {
		t.Errorf("norm %v, want 5", n)
	}
	coef := float32(1 / (5 + 1e-6))
	if grads["a"][0] != 3*coef || grads["b"][0] != 4*coef {
		t.Errorf("clipped grads %v", grads)
	}
	if n := GlobalNorm(grads); !near(n, 1, 1e-6) {
		t.Errorf("norm after clipping %v, want 1", n)
	}
	if n := ClipGlobalNorm(grads, 0); !near(n, 1, 1e-6) {
		t.Errorf("measure only: %v", n)
	}
	bad := map[string][]float32{"a": {float32(math.NaN()), 1}}
	if n := ClipGlobalNorm(bad, 1); !math.IsNaN(n) || bad["a"][1] != 1 {
		t.Errorf("NaN gradient: norm %v, grads %v", n, bad)
	}
	// Large tensors go through the parallel path and agree with a plain sum.
	rng := rand.New(rand.NewPCG(5, 6))
	big := randomModel(rng)
	var s float64
	for _, g := range big {
		for _, x := range g {
			s += float64(x) * float64(x)
		}
	}
	if n := GlobalNorm(big); !near(n, math.Sqrt(s), 1e-12) {
		t.Errorf("GlobalNorm %v, want %v", n, math.Sqrt(s))
	}
}

func TestSchedule(t *testing.T) {
	s := Schedule{Peak: 1e-3, FloorFrac: 0.1, FlatFrac: 0.4, Total: 1000}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		step int
		want float64
	}{
		{-5, 1e-3},
		{0, 1e-3},
		{399, 1e-3},
		{400, 1e-3},                   // end of flat: cosine starts at the peak
		{700, 1e-4 + (1e-3-1e-4)*0.5}, // middle of the cosine
		{550, 1e-4 + 0.9e-3*0.5*(1+math.Sqrt(0.5))}, // a quarter in
		{1000, 1e-4}, // end
		{5000, 1e-4}, // past the end: the floor
	}
	for _, c := range cases {
		if got := s.LR(c.step); !near(got, c.want, 1e-12) {
			t.Errorf("LR(%d) = %g, want %g", c.step, got, c.want)
		}
	}
	// Monotone non-increasing after the flat part.
	for i := 400; i < 1100; i++ {
		if s.LR(i+1) > s.LR(i) {
			t.Fatalf("LR rises at %d", i)
		}
	}

	w := Schedule{Peak: 2, FloorFrac: 0.05, FlatFrac: 0, WarmupSteps: 4, Total: 10}
	for step, want := range []float64{0.5, 1, 1.5, 2, 2} {
		if got := w.LR(step); !near(got, want, 1e-12) {
			t.Errorf("warmup LR(%d) = %g, want %g", step, got, want)
		}
	}
	if got := w.LR(10); !near(got, 0.1, 1e-12) {
		t.Errorf("warmup schedule end %g", got)
	}

	for _, bad := range []Schedule{
		{Peak: 0, Total: 10}, {Peak: 1, FloorFrac: 2, Total: 10}, {Peak: 1, FlatFrac: -1, Total: 10},
		{Peak: 1, WarmupSteps: -1, Total: 10}, {Peak: 1}, {Peak: math.NaN(), Total: 10},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v validated", bad)
		}
	}
}

func BenchmarkAdamWStep(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 8))
	params := map[string][]float32{"w.weight": make([]float32, 4<<20)}
	grads := map[string][]float32{"w.weight": make([]float32, 4<<20)}
	for i := range grads["w.weight"] {
		grads["w.weight"][i] = float32(rng.NormFloat64())
	}
	opt := NewAdamW(AdamWConfig{WeightDecay: 0.1})
	b.SetBytes(4 << 20 * 16)
	for b.Loop() {
		opt.Step(params, grads, 1e-3)
	}
}
