package control

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/rpac-dev/rpac/training/optim"
)

func near(a, b, tol float64) bool {
	return math.Abs(a-b) <= tol*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

// TestPolicyGradientFiniteDifference checks the tape's gradient of
// log π(a|s) against central differences for every policy parameter.
func TestPolicyGradientFiniteDifference(t *testing.T) {
	rng := NewRNG(7, 1)
	p := NewPolicy(4, 16, 3, rng)
	for i := range p.LogStd {
		p.LogStd[i] = 0.3*rng.Norm() - 0.2
	}
	s := []float64{0.12, 0.4, 1.2, 6.3}
	a := []float64{0.5, -1.1, 0.2}
	_, grads := p.LogProbGrad(s, a)
	const h = 1e-6
	for k, par := range p.Params() {
		for i := range par {
			old := par[i]
			par[i] = old + h
			up := p.LogProb(s, a)
			par[i] = old - h
			down := p.LogProb(s, a)
			par[i] = old
			fd := (up - down) / (2 * h)
			if !near(grads[k][i], fd, 1e-6) {
				t.Fatalf("param %d[%d]: tape %.10g, finite difference %.10g", k, i, grads[k][i], fd)
			}
		}
	}
}

// TestTapeOps checks every tape op through one composite function.
func TestTapeOps(t *testing.T) {
	x0 := []float64{0.3, -0.7, 1.1}
	y0 := []float64{1.4, 0.9, -0.5}
	f := func(x, y []float64, grad bool) (float64, []float64, []float64) {
		var tp Tape
		xv, yv := tp.Vec(x), tp.Vec(y)
		z := tp.Add(tp.Mul(tp.Tanh(xv), tp.Exp(yv)), tp.Div(tp.Sub(xv, yv), tp.Affine1(tp.Exp(xv), 2, 1)))
		out := tp.Sum(z)
		if grad {
			tp.Backward(out)
		}
		return out.Val[0], xv.Grad, yv.Grad
	}
	_, gx, gy := f(x0, y0, true)
	for _, c := range []struct {
		v []float64
		g []float64
	}{{x0, gx}, {y0, gy}} {
		for i := range c.v {
			old := c.v[i]
			c.v[i] = old + 1e-6
			up, _, _ := f(x0, y0, false)
			c.v[i] = old - 1e-6
			down, _, _ := f(x0, y0, false)
			c.v[i] = old
			if fd := (up - down) / 2e-6; !near(c.g[i], fd, 1e-6) {
				t.Fatalf("element %d: tape %g, finite difference %g", i, c.g[i], fd)
			}
		}
	}
}

// TestLogProbIsGaussian: log π matches the closed-form diagonal Gaussian.
func TestLogProbIsGaussian(t *testing.T) {
	p := NewPolicy(4, 8, 3, NewRNG(1, 2))
	p.LogStd = []float64{0.1, -0.4, 0.7}
	s := []float64{0, 0.5, 1, 5}
	a := []float64{0.2, 0.1, -0.3}
	m, std := p.Mean(s)
	want := 0.0
	for i := range a {
		z := (a[i] - m[i]) / (std[i] + 1e-8)
		want += -0.5 * (z*z + 2*p.LogStd[i] + math.Log(2*math.Pi))
	}
	if got := p.LogProb(s, a); !near(got, want, 1e-12) {
		t.Fatalf("log π = %g, want %g", got, want)
	}
}

// TestGuardianLearns: with a reward that prefers Δτ near +1, REINFORCE
// moves the policy mean toward it.
func TestGuardianLearns(t *testing.T) {
	cfg := DefaultGuardianConfig()
	cfg.LR = 1e-2
	g, err := NewGuardian(cfg, 3)
	if err != nil {
		t.Fatal(err)
	}
	g.Beta = 1
	obs := Observation{GateDelta: 0.01, SatFrac: 0.2, MuEntropy: 1.2, ValCE: 6}
	m0, _ := g.Policy.Mean(obs.Vector())
	for i := 0; i < 400; i++ {
		taus := []float64{1}
		act := g.Act(obs, taus)
		// Learn turns a CE into a reward; feed a CE that is lowest when a₀ ≈ 1.
		g.PrevCE = F(math.NaN())
		d := act.Raw[0] - 1
		g.Learn(6 + d*d)
	}
	m1, _ := g.Policy.Mean(obs.Vector())
	if !(math.Abs(m1[0]-1) < math.Abs(m0[0]-1)-0.3) {
		t.Fatalf("policy mean of Δτ went %g → %g, want it much closer to 1", m0[0], m1[0])
	}
}

func TestProject(t *testing.T) {
	cases := []struct {
		name                      string
		tau, lo, hi, margin, pull float64
		want                      float64
	}{
		{"interior unchanged", 0.9, 0.3, 1.6, 0.05, 0.1, 0.9},
		{"above max clamps", 2.0, 0.3, 1.6, 0.05, 0.1, 1.6},
		{"below min clamps", 0.1, 0.3, 1.6, 0.05, 0.1, 0.3},
		{"upper margin pulls back", 1.59, 0.3, 1.6, 0.05, 0.1, 1.59 - 0.1*(1.59-1.55)},
		{"lower margin pushes up", 0.31, 0.3, 1.6, 0.05, 0.1, 0.31 + 0.1*(0.35-0.31)},
		{"listing rule (margin 0)", 1.7, 0.3, 1.6, 0, 0.1, 1.6},
		{"listing rule inside", 1.2, 0.3, 1.6, 0, 0.1, 1.2},
		{"NaN goes to the middle", math.NaN(), 0.3, 1.6, 0.05, 0.1, 0.95},
	}
	for _, c := range cases {
		if got := Project(c.tau, c.lo, c.hi, c.margin, c.pull); !near(got, c.want, 1e-12) {
			t.Errorf("%s: Project(%g) = %g, want %g", c.name, c.tau, got, c.want)
		}
	}
}

func TestBetaRamp(t *testing.T) {
	c := GuardianConfig{BetaStart: 10, BetaRamp: 20}
	for _, tc := range []struct {
		step int
		want float64
	}{{0, 0}, {9, 0}, {10, 0}, {20, 0.5}, {30, 1}, {100, 1}} {
		if got := c.BetaAt(tc.step); got != tc.want {
			t.Errorf("β(%d) = %g, want %g", tc.step, got, tc.want)
		}
	}
	if (GuardianConfig{BetaStart: 5}).BetaAt(5) != 1 {
		t.Error("a zero ramp should switch β on at the start step")
	}
}

func TestReward(t *testing.T) {
	r := Reward{Lambda1: 5, Lambda2: 0.5, Kappa: 50}
	if got, want := r.Of(6, math.NaN()), -6+0.25; !near(got, want, 1e-12) {
		t.Errorf("first reward %g, want %g", got, want)
	}
	if got, want := r.Of(5.9, 6), -5.9+5*0.1+0.5*sigmoid(50*0.1/5.9); !near(got, want, 1e-12) {
		t.Errorf("gain reward %g, want %g", got, want)
	}
	if got, want := r.Of(6.1, 6), -6.1+0.5*sigmoid(50*-0.1/6.1); !near(got, want, 1e-12) {
		t.Errorf("loss reward %g, want %g", got, want)
	}
	// The same absolute gain is worth more at a lower CE.
	if !(r.Of(3.9, 4)+3.9 > r.Of(5.9, 6)+5.9) {
		t.Error("gain shaping should favour gains at low CE")
	}
}

func TestGuardianActBoundsAndResume(t *testing.T) {
	cfg := DefaultGuardianConfig()
	cfg.TauStep = 1 // large moves to hit the bounds
	g, err := NewGuardian(cfg, 9)
	if err != nil {
		t.Fatal(err)
	}
	g.Beta = 1
	taus := []float64{0.68, 1.0}
	obs := Observation{0.1, 0.3, 1.1, 6}
	var blob []byte
	var after []Action
	for i := 0; i < 50; i++ {
		if i == 25 {
			blob, _ = json.Marshal(g)
		}
		g.Learn(6 - 0.01*float64(i))
		a := g.Act(obs, taus)
		if i >= 25 {
			after = append(after, a)
		}
		for _, tau := range taus {
			if tau < cfg.TauMin || tau > cfg.TauMax {
				t.Fatalf("τ = %g outside [%g, %g]", tau, cfg.TauMin, cfg.TauMax)
			}
		}
		if g.LambdaDelta < 0 || g.LambdaDelta > 1 || g.LambdaSat < 0 || g.LambdaSat > 0.6 {
			t.Fatalf("λ out of bounds: %g %g", g.LambdaDelta, g.LambdaSat)
		}
	}
	var h Guardian
	if err := json.Unmarshal(blob, &h); err != nil {
		t.Fatal(err)
	}
	if err := h.Policy.Validate(); err != nil {
		t.Fatal(err)
	}
	for i := 25; i < 50; i++ {
		h.Learn(6 - 0.01*float64(i))
		a := h.Act(obs, []float64{1, 1})
		for j := range a.Raw {
			if a.Raw[j] != after[i-25].Raw[j] {
				t.Fatalf("restored Guardian diverged at action %d", i)
			}
		}
	}
}

func TestScripted(t *testing.T) {
	s, err := NewScripted(0.6, 1.6, 10, 110)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		t    int
		want float64
	}{
		{0, 0.6}, {5, 1.1}, {10, 1.6},
		{60, 0.6 + 1.0*(0.1+0.9*0.5)}, // u = 0.5
		{110, 0.6 + 0.1},              // u = 1: the floor
		{200, 0.7},
	} {
		if got := s.Base(tc.t); !near(got, tc.want, 1e-12) {
			t.Errorf("τ(%d) = %g, want %g", tc.t, got, tc.want)
		}
	}
	s.Observe(6.0) // first evaluation: no improvement measured yet → no nudge
	if s.Nudging {
		t.Error("nudged without a previous CE")
	}
	s.Observe(5.999) // improvement 0.001 < gate 0.005, CE below zone +Inf
	if !s.Nudging || !near(s.Tau(110), 0.75, 1e-12) {
		t.Errorf("want a nudge of 0.05 at a stall, got nudging=%v τ=%g", s.Nudging, s.Tau(110))
	}
	if s.Tau(10) != 1.6 {
		t.Errorf("the nudge must be capped at τmax, got %g", s.Tau(10))
	}
	s.Observe(5.9) // a real gain
	if s.Nudging {
		t.Error("nudged despite a gain above the gate")
	}
	s.Zone = 5
	s.Observe(5.9) // stalled but above the zone
	if s.Nudging {
		t.Error("nudged outside the CE zone")
	}
}

func TestChaosLogisticMap(t *testing.T) {
	c, err := NewChaos(3.9, 0.25, 0.01)
	if err != nil {
		t.Fatal(err)
	}
	x := 0.721
	for i := 1; i <= 200; i++ {
		x = 3.9 * x * (1 - x)
		a := 0.25 * math.Exp(-0.01*float64(i))
		want := (1 - a) + a*x
		got := c.Step()
		if !near(got, want, 1e-12) {
			t.Fatalf("step %d: factor %g, want %g", i, got, want)
		}
		if got < 1-a-1e-12 || got > 1+1e-12 || c.X < 0 || c.X > 1 {
			t.Fatalf("step %d: factor %g or x %g out of bounds", i, got, c.X)
		}
	}
	if c.Amp() > 0.25*math.Exp(-2)+1e-12 || c.Temp(0.3) != 1+0.3*c.Amp() {
		t.Error("amplitude did not decay as exp(−decay·t)")
	}
	for _, bad := range [][3]float64{{4.5, 0.2, 0}, {3.9, 1.5, 0}, {3.9, 0.2, -1}} {
		if _, err := NewChaos(bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("NewChaos%v accepted", bad)
		}
	}
}

func TestSchedules(t *testing.T) {
	if WarmIn(0, 100) != 0 || WarmIn(50, 100) != 0.5 || WarmIn(200, 100) != 1 || WarmIn(3, 0) != 1 {
		t.Error("warm-in is min(1, step/warm)")
	}
	for _, tc := range []struct{ base, phase, want float64 }{
		{0.09, 0, 0.09}, {0.09, 0.3, 0.085}, {0.09, 0.6, 0.08}, {0.09, 1, 0.08},
		{0.05, 0.5, 0.05}, {0.2, 0.15, 0.08 + 0.12*0.75},
	} {
		if got := DropoutGlide(tc.base, tc.phase); !near(got, tc.want, 1e-12) {
			t.Errorf("glide(%g, %g) = %g, want %g", tc.base, tc.phase, got, tc.want)
		}
	}
	if QuantizeDropout(0.0863, 0.005) != 0.085 {
		t.Error("quantize")
	}
	// The LR floor schedule: flat prelude, cosine, nonzero floor.
	s := optim.Schedule{Peak: 1e-3, FloorFrac: 0.1, FlatFrac: 0.3, Total: 100}
	if s.LR(0) != 1e-3 || s.LR(29) != 1e-3 || !near(s.LR(65), 1e-4+0.9e-3*0.5, 1e-12) || s.LR(100) != 1e-4 || s.LR(500) != 1e-4 {
		t.Errorf("LR floor schedule: %g %g %g %g", s.LR(0), s.LR(65), s.LR(100), s.LR(500))
	}
}

// TestReplicatorStep: one update is q' ∝ q·exp(η·u) (floor 0).
func TestReplicatorStep(t *testing.T) {
	cfg := GameConfig{Eta: 1.5, Temp: 1, MinProb: 0, LambdaS: 2, S0: 0.5, LambdaH: 0.3}
	g, err := NewContextGame([]int{64, 128, 256}, cfg, math.Log(4), 1)
	if err != nil {
		t.Fatal(err)
	}
	g.LogW = []float64{0.2, -0.1, 0.4}
	q := g.Probs()
	obs := [][3]float64{{6.0, 0.2, 1.0}, {5.8, 0.7, 1.2}, {5.7, 0.1, 0.5}}
	for i, o := range obs {
		g.Observe(i, o[0]+0.1, o[1], o[2])
		g.Observe(i, o[0]-0.1, o[1], o[2])
	}
	u := g.Update()
	var z float64
	want := make([]float64, 3)
	for i, o := range obs {
		ui := -o[0] - 2*math.Max(o[1]-0.5, 0) + 0.3*o[2]/math.Log(4)
		if !near(u[i], ui, 1e-12) {
			t.Fatalf("u(%d) = %g, want %g", i, u[i], ui)
		}
		want[i] = q[i] * math.Exp(1.5*ui)
		z += want[i]
	}
	for i, p := range g.Probs() {
		if !near(p, want[i]/z, 1e-12) {
			t.Fatalf("q'(%d) = %g, want %g", i, p, want[i]/z)
		}
	}
	// Unobserved contexts keep their last utility: another update with only
	// context 0 observed changes q by context 0's utility alone.
	g.Observe(0, 5.0, 0.2, 1.0)
	before := g.Probs()
	u2 := g.Update()
	if u2[1] != u[1] || u2[2] != u[2] {
		t.Fatal("unobserved contexts lost their utilities")
	}
	if !(g.Probs()[0] > before[0]) {
		t.Fatal("a better utility at context 0 should raise q(0)")
	}
}

func TestContextGameConvergesAndSamples(t *testing.T) {
	g, err := NewContextGame([]int{64, 128}, DefaultGameConfig(), math.Log(4), 5)
	if err != nil {
		t.Fatal(err)
	}
	for epoch := 0; epoch < 30; epoch++ {
		for s := 0; s < 20; s++ {
			i := g.Sample()
			g.Observe(i, []float64{6.2, 6.0}[i], 0.1, 1)
		}
		g.Update()
	}
	q := g.Probs()
	if !(q[1] > 0.9 && q[0] >= 0.05-1e-12) {
		t.Fatalf("q = %v: want the better context near 1 - floor and the floor kept", q)
	}
	n := 0
	for i := 0; i < 20000; i++ {
		if g.Sample() == 1 {
			n++
		}
	}
	if f := float64(n) / 20000; math.Abs(f-q[1]) > 0.01 {
		t.Fatalf("sampled context 1 with frequency %g, q = %g", f, q[1])
	}
	for _, bad := range [][]int{{}, {64, 64}, {1}} {
		if _, err := NewContextGame(bad, DefaultGameConfig(), 1, 1); err == nil {
			t.Errorf("contexts %v accepted", bad)
		}
	}
	// JSON round trip keeps the sampler's sequence.
	b, _ := json.Marshal(g)
	var h ContextGame
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		if g.Sample() != h.Sample() {
			t.Fatal("restored game samples differently")
		}
	}
}

func TestEMA(t *testing.T) {
	e, err := NewEMA(0.9)
	if err != nil {
		t.Fatal(err)
	}
	shadow := [][]float32{{0}}
	w := [][]float32{{1}}
	want := 0.0
	for n := 0; n < 30; n++ {
		d := math.Min(0.9, (1+float64(n))/(10+float64(n)))
		want = d*want + (1-d)*1
		e.Update(shadow, w)
		if math.Abs(float64(shadow[0][0])-want) > 1e-6 {
			t.Fatalf("update %d: %g, want %g", n, shadow[0][0], want)
		}
	}
	if _, err := NewEMA(1); err == nil {
		t.Error("decay 1 accepted")
	}
}

func TestSWASelectRule(t *testing.T) {
	s, err := NewSWASelect(0, 6.5, 0.02, 0.001, 2)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		epoch int
		ce    float64
		join  bool
		why   string
	}{
		{0, 7.0, false, "no entry snapshot yet"},
		{1, 6.4, false, "before the start epoch"},
		{2, 6.6, false, "above the zone's upper edge (and no gain)"},
		{3, 6.3, true, "in zone, gain (6.6−6.3)/6.6"},
		{4, 6.2999, false, "gain below the minimum"},
		{5, 6.2, true, "in zone, gain"},
		{6, 6.35, false, "a loss"},
		{7, 6.33, false, "gained but outside the band of 2% above the best 6.2 (6.324)"},
		{8, 6.30, true, "gained, inside the band"},
	}
	for _, st := range steps {
		d := s.Consider(st.epoch, st.ce)
		if d.Join != st.join {
			t.Fatalf("epoch %d (CE %g): join = %v, want %v (%s); decision %+v", st.epoch, st.ce, d.Join, st.join, st.why, d)
		}
	}
	if got := s.Members; len(got) != 3 || got[0] != 3 || got[1] != 5 || got[2] != 8 {
		t.Fatalf("members %v, want [3 5 8]", got)
	}
	avg := [][]float32{{0, 0}}
	for n, w := range [][]float32{{1, 2}, {3, 4}, {5, 9}} {
		Accumulate(avg, [][]float32{w}, n+1)
	}
	if avg[0][0] != 3 || avg[0][1] != 5 {
		t.Fatalf("average %v, want [3 5]", avg[0])
	}
	if _, err := NewSWASelect(2, 1, 0, 0, 0); err == nil {
		t.Error("empty zone accepted")
	}
}

func TestDiagnostics(t *testing.T) {
	mu := []float32{0.95, 0.05, 0.5, 0.5, 0.1, 0.9, 0.02, 0.98}
	if got := SatFraction(mu, 2, 0.9); got != 0.5 {
		t.Errorf("saturation %g, want 0.5 (rows 0 and 3; 0.9 itself is not above)", got)
	}
	prev := [][]float64{{0.5, 0.5}, {1, 0}}
	cur := [][]float64{{0.6, 0.4}, {0.5, 0.5}}
	if got := GateDelta(prev, cur); !near(got, (0.1+0.5)/2, 1e-12) {
		t.Errorf("gate delta %g", got)
	}
	if GateDelta(nil, cur) != 0 {
		t.Error("no previous usage should give 0")
	}
}

func TestFJSON(t *testing.T) {
	for _, x := range []float64{1.5, math.NaN(), math.Inf(1), math.Inf(-1)} {
		b, err := json.Marshal(F(x))
		if err != nil {
			t.Fatal(err)
		}
		var y F
		if err := json.Unmarshal(b, &y); err != nil {
			t.Fatal(err)
		}
		if !(float64(y) == x || (math.IsNaN(x) && math.IsNaN(float64(y)))) {
			t.Errorf("%g → %s → %g", x, b, float64(y))
		}
	}
}
