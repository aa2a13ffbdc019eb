package model

// Params lists cfg's trainable parameter names.
func Params(cfg *Config) ([]string, error) {
	mg, err := Build(cfg, Opts{T: 1, B: 1, Mode: Eval, Logits: true, NoLoss: true})
	if err != nil {
		return nil, err
	}
	return mg.Params(), nil
}

// RunningBuffers maps the running-statistics buffers of cfg at length T to
// the stat outputs they are estimated from (none for the baseline).
func RunningBuffers(cfg *Config, T int) (map[string]string, error) {
	mg, err := Build(cfg, Opts{T: T, B: 1, Mode: Eval, Logits: true, NoLoss: true})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, r := range mg.RunningStats() {
		out[r.Buffer] = r.Stat
	}
	return out, nil
}
