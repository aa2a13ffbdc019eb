package main

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/rpac-dev/rpac/app/launch"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/training"
	"github.com/rpac-dev/rpac/training/data"
	"github.com/rpac-dev/rpac/training/dist"
	"github.com/urfave/cli/v2"
)

// controlFlags are the switches of the paper's training machinery.
func controlFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "all", Usage: "switch every component on: guardian, context game, EMA, SWA-select, chaos, dropout glide (single flags still apply)"},
		&cli.StringFlag{Name: "controller", Value: "none", Usage: "τ_att controller between steps: none | guardian | scripted (Algorithm 1)"},
		&cli.BoolFlag{Name: "align", Value: true, Usage: "RPA alignment (Sinkhorn); --align=false uses the legacy fuzzy-similarity bias"},
		&cli.StringFlag{Name: "contexts", Usage: "context game lengths, e.g. 64,128 (two or more switch the game on; batch = tokens/step ÷ length)"},
		&cli.IntFlag{Name: "game-every", Usage: "steps per context-game update (default: --eval-every)"},
		&cli.Float64Flag{Name: "game-eta", Value: 2, Usage: "context game: replicator step size η"},
		&cli.Float64Flag{Name: "game-temp", Value: 1, Usage: "context game: softmax temperature"},
		&cli.Float64Flag{Name: "game-floor", Value: 0.05, Usage: "context game: probability floor per length"},
		&cli.Float64Flag{Name: "game-lambda-s", Value: 1, Usage: "context game: saturation penalty λs"},
		&cli.Float64Flag{Name: "game-s0", Value: 0.5, Usage: "context game: saturation threshold s0"},
		&cli.Float64Flag{Name: "game-lambda-h", Value: 0.1, Usage: "context game: entropy bonus λh"},
		&cli.BoolFlag{Name: "ema", Usage: "keep an EMA of the weights (evaluated beside the raw weights; exported with --weights ema)"},
		&cli.Float64Flag{Name: "ema-decay", Usage: "EMA decay (default 1 − 10/steps within [0.9, 0.9999])"},
		&cli.BoolFlag{Name: "swa", Usage: "SWA-select: average the epochs that are in the helpful zone and gained over their entry snapshot"},
		&cli.StringFlag{Name: "swa-zone", Value: "0,inf", Usage: "SWA-select: helpful zone of val CE, LO,HI"},
		&cli.Float64Flag{Name: "swa-band", Value: 0.03, Usage: "SWA-select: also require val CE ≤ (1+band)·best so far (0: off)"},
		&cli.Float64Flag{Name: "swa-gain", Value: 0.001, Usage: "SWA-select: minimum relative val-CE gain over the epoch's entry snapshot"},
		&cli.IntFlag{Name: "swa-start", Value: -1, Usage: "SWA-select: first epoch (evaluation interval) that may join (-1: half of the run)"},
		&cli.BoolFlag{Name: "chaos", Usage: "chaos controller: logistic-map factor (r 3.9) on LR and bias scale, decaying"},
		&cli.Float64Flag{Name: "chaos-amp", Value: 0.25, Usage: "chaos amplitude"},
		&cli.Float64Flag{Name: "chaos-decay", Usage: "chaos amplitude decay per step (default 4/steps)"},
		&cli.BoolFlag{Name: "dropout-glide", Usage: "glide dropout from its base rate to 0.08 over the first 60% of steps (base ≥ 0.08 only)"},
		&cli.Float64Flag{Name: "lr-flat", Value: 0.3, Usage: "fraction of steps at the peak LR before the cosine"},
		&cli.Float64Flag{Name: "lr-floor", Value: 0.1, Usage: "LR floor as a fraction of the peak"},
		&cli.Float64Flag{Name: "guardian-lr", Value: 1e-3, Usage: "Guardian policy learning rate (Adam)"},
		&cli.Float64Flag{Name: "guardian-lambda1", Value: 5, Usage: "Guardian reward weight λ1 of (ΔCE)+"},
		&cli.Float64Flag{Name: "guardian-lambda2", Value: 0.5, Usage: "Guardian reward weight λ2 of σ(κ·ΔCE/CE)"},
		&cli.Float64Flag{Name: "guardian-kappa", Value: 50, Usage: "Guardian reward slope κ"},
	}
}

// parseInts reads "64,128".
func parseInts(flag, s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			return nil, fmt.Errorf("--%s %q: want lengths of at least 2 separated by commas, e.g. 64,128", flag, s)
		}
		out = append(out, n)
	}
	return out, nil
}

// controlsFromFlags turns the flags into training.Controls.
func controlsFromFlags(c *cli.Context) (training.Controls, error) {
	all := c.Bool("all")
	ctl := training.Controls{Controller: c.String("controller")}
	if all && !c.IsSet("controller") {
		ctl.Controller = "guardian"
	}
	var err error
	if ctl.Contexts, err = parseInts("contexts", c.String("contexts")); err != nil {
		return ctl, err
	}
	ctl.GameDefault = all && !c.IsSet("contexts")
	ctl.GameEvery = c.Int("game-every")
	ctl.Game.Eta, ctl.Game.Temp, ctl.Game.MinProb = c.Float64("game-eta"), c.Float64("game-temp"), c.Float64("game-floor")
	ctl.Game.LambdaS, ctl.Game.S0, ctl.Game.LambdaH = c.Float64("game-lambda-s"), c.Float64("game-s0"), c.Float64("game-lambda-h")
	ctl.EMA = c.Bool("ema") || (all && !c.IsSet("ema"))
	ctl.EMADecay = c.Float64("ema-decay")
	ctl.SWA = c.Bool("swa") || (all && !c.IsSet("swa"))
	zone := strings.Split(c.String("swa-zone"), ",")
	if len(zone) != 2 {
		return ctl, fmt.Errorf("--swa-zone %q: want LO,HI, e.g. 0,inf or 5.5,6.5", c.String("swa-zone"))
	}
	lo, err1 := strconv.ParseFloat(strings.TrimSpace(zone[0]), 64)
	hi, err2 := strconv.ParseFloat(strings.TrimSpace(zone[1]), 64)
	if err1 != nil || err2 != nil || math.IsNaN(lo) || math.IsNaN(hi) || lo > hi {
		return ctl, fmt.Errorf("--swa-zone %q: want LO,HI with LO ≤ HI, e.g. 0,inf", c.String("swa-zone"))
	}
	ctl.SWAZoneLo, ctl.SWAZoneHi = lo, hi
	band, gain := c.Float64("swa-band"), c.Float64("swa-gain")
	ctl.SWABand, ctl.SWAMinGain = &band, &gain
	if s := c.Int("swa-start"); s >= 0 {
		ctl.SWAStart = &s
	}
	ctl.Chaos = c.Bool("chaos") || (all && !c.IsSet("chaos"))
	ctl.ChaosAmp, ctl.ChaosDecay = c.Float64("chaos-amp"), c.Float64("chaos-decay")
	ctl.DropoutGlide = c.Bool("dropout-glide") || (all && !c.IsSet("dropout-glide"))
	flat, floor := c.Float64("lr-flat"), c.Float64("lr-floor")
	ctl.LRFlat, ctl.LRFloor = &flat, &floor
	ctl.Guardian.LR = c.Float64("guardian-lr")
	ctl.Guardian.Reward.Lambda1, ctl.Guardian.Reward.Lambda2 = c.Float64("guardian-lambda1"), c.Float64("guardian-lambda2")
	ctl.Guardian.Reward.Kappa = c.Float64("guardian-kappa")
	return ctl, nil
}

func trainCommand() *cli.Command {
	flags := append(append(append(trainFlags(), memoryFlagDefs()...), sizeFlags()...), syntheticFlags()...)
	return &cli.Command{
		Name:   "train",
		Usage:  "train a model (fuzzy RPA transformer or baseline) with the paper's training machinery",
		Flags:  append(flags, controlFlags()...),
		Action: trainAction,
	}
}

func trainFlags() []cli.Flag {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "preset", Value: "tiny", Usage: "model size: " + strings.Join(model.PresetNames(), "|")},
		&cli.StringFlag{Name: "model", Value: "fuzzy", Usage: "fuzzy|baseline"},
		&cli.StringFlag{Name: "dataset", Value: "wikitext2", Usage: "wikitext2|synthetic|mqar"},
		&cli.StringFlag{Name: "data-dir", Usage: "WikiText-2 raw directory (else $RPAC_DATA, the user cache, then a download)"},
		&cli.StringFlag{Name: "train-split", Value: "train", Usage: "split to train on (train|valid|test)"},
		&cli.StringFlag{Name: "eval-split", Value: "valid", Usage: "split to evaluate on"},
	}
	flags = append(flags, intOverrides([]intOverride{
		{"context", "context length T of evaluation (and of training without --contexts; default: the preset's)"},
		{"tokens-per-step", "tokens per optimizer step; batch = tokens/T (default: the preset's)"},
		{"steps", "optimizer steps (default: from --epochs or the preset; 0 writes the initialised checkpoint and stops)"},
	})...)
	return append(flags,
		&cli.Float64Flag{Name: "epochs", Usage: "passes over the training split (alternative to --steps)"},
		&cli.IntFlag{Name: "eval-every", Value: 0, Usage: "evaluate and checkpoint every N steps; one controller epoch (0: only at the end, steps/10 with controllers)"},
		&cli.IntFlag{Name: "eval-batches", Value: 0, Usage: "limit each evaluation to N batches (0: the whole split)"},
		&cli.IntFlag{Name: "final-eval-batches", Value: 0, Usage: "limit the last evaluation to N batches (0: as --eval-batches)"},
		&cli.StringFlag{Name: "eval-stats", Value: "running", Usage: "RPA statistics in evaluation: running (causal) | batch (the paper's listing)"},
		&cli.Uint64Flag{Name: "seed", Value: 1},
		&cli.StringFlag{Name: "out", Usage: "run directory (checkpoint, metrics.jsonl)", Required: true},
		&cli.BoolFlag{Name: "resume", Usage: "continue the run in --out (give the same flags)"},
		&cli.IntFlag{Name: "stop-after", Usage: "end this invocation after N steps with a checkpoint (continue with --resume); 0: run to the end"},
		&cli.Float64Flag{Name: "lr", Usage: "peak learning rate (default: the preset's)"},
		&cli.Float64Flag{Name: "dropout", Value: -1, Usage: "dropout (default: the preset's)"},
		&cli.IntFlag{Name: "warm-in", Value: -1, Usage: "bias warm-in steps (default: the preset's)"},
		&cli.Float64Flag{Name: "grad-clip", Value: 1.0, Usage: "global gradient-norm clip"},
		lossFlag(),
		&cli.StringFlag{Name: "dump-ir", Usage: "print the training graph after the named pass (" + strings.Join(passes.Names(passes.TrainPipeline), ", ") + ", or all)"},
		&cli.IntFlag{Name: "nproc-per-node", Value: 1, Usage: "data-parallel: start N local ranks of this command, one per GPU, as torchrun does (ranks launched by torchrun or srun read RANK/WORLD_SIZE or SLURM_PROCID/SLURM_NTASKS themselves; docs/TRAINING.md)"},
		&cli.DurationFlag{Name: "collective-timeout", Value: training.DefaultCollectiveTimeout, Usage: "data-parallel: the rendezvous and every collective fail after this long (a rank died or hangs)"},
		&cli.BoolFlag{Name: "overlap-allreduce", Usage: "data-parallel: all-reduce the gradients bucket by bucket during the backward, on a second stream (unmeasured on GPUs; docs/PARALLEL.md)"},
	)
}

func trainAction(c *cli.Context) error {
	if n := c.Int("nproc-per-node"); n > 1 && os.Getenv("WORLD_SIZE") == "" {
		return launchRanks(c, n)
	}
	o, err := trainOptions(c)
	if err != nil {
		return err
	}
	res, err := training.Train(c.Context, o)
	if err != nil {
		return err
	}
	if o.InitOnly {
		report(c, initialisedEvent{Params: res.Params, Out: res.Out})
		return nil
	}
	if res.Ran == 0 {
		report(c, alreadyFinishedEvent{Out: res.Out, Steps: res.Steps, ValCE: res.FinalValCE})
		return nil
	}
	report(c, trainedEvent{Steps: res.Steps, Params: res.Params, FirstCE: res.InitialLoss, LastCE: res.FinalLoss,
		ValCE: res.FinalValCE, EMACE: res.FinalEMACE, SWACE: res.FinalSWACE, SWAMembers: len(res.SWAMembers),
		Recall: res.FinalRecall, RecallN: res.FinalRecallN, TokensPerS: res.TokensPerS, Out: res.Out})
	return nil
}

// launchRanks runs this command again as n local ranks (launch.Job).
func launchRanks(c *cli.Context, n int) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	j := launch.Job{Exe: exe, Args: launch.WithoutFlag(os.Args[1:], "nproc-per-node"), Ranks: n, Stdout: c.App.Writer, Stderr: c.App.ErrWriter}
	return j.Run(c.Context)
}

// parallelFlags places the run in its data-parallel job: the launch
// variables (torchrun's or SLURM's), --collective-timeout and
// --overlap-allreduce.
func parallelFlags(c *cli.Context) (training.Parallel, error) {
	env, err := dist.FromEnv(os.Getenv)
	if err != nil {
		return training.Parallel{}, err
	}
	if c.Duration("collective-timeout") <= 0 {
		return training.Parallel{}, fmt.Errorf("--collective-timeout must be positive")
	}
	return training.Parallel{Env: env, Timeout: c.Duration("collective-timeout"), Overlap: c.Bool("overlap-allreduce")}, nil
}

// checkTrainCounts checks the flags that must not be negative.
func checkTrainCounts(c *cli.Context) error {
	if c.Args().Len() > 0 {
		return fmt.Errorf("unexpected arguments: %v", c.Args().Slice())
	}
	for _, n := range []string{"context", "tokens-per-step", "steps", "eval-every", "eval-batches", "final-eval-batches", "game-every"} {
		if c.Int(n) < 0 {
			return fmt.Errorf("--%s must not be negative (got %d)", n, c.Int(n))
		}
	}
	if c.Float64("epochs") < 0 || math.IsNaN(c.Float64("epochs")) {
		return fmt.Errorf("--epochs must not be negative")
	}
	return checkTrainFlags(c)
}

// trainOptions is the training run the flags describe.
func trainOptions(c *cli.Context) (training.Options, error) {
	if err := checkTrainCounts(c); err != nil {
		return training.Options{}, err
	}
	ctl, err := controlsFromFlags(c)
	if err != nil {
		return training.Options{}, err
	}
	syn, err := syntheticFromFlags(c)
	if err != nil {
		return training.Options{}, err
	}
	mq, err := mqarFromFlags(c)
	if err != nil {
		return training.Options{}, err
	}
	loss, err := training.ParseLossTargets(c.String("loss"))
	if err != nil {
		return training.Options{}, err
	}
	kind, err := modelFlag(c)
	if err != nil {
		return training.Options{}, err
	}
	o := training.Options{
		Preset: c.String("preset"), Model: kind, Dataset: c.String("dataset"),
		ConfigFile: c.String("config"), Sizes: sizesFromFlags(c), Synthetic: syn, MQAR: mq,
		InitOnly: c.IsSet("steps") && c.Int("steps") == 0,
		DataDir:  c.String("data-dir"), TrainSplit: c.String("train-split"), EvalSplit: c.String("eval-split"),
		Context: c.Int("context"), TokensPerStep: c.Int("tokens-per-step"), Steps: c.Int("steps"),
		Epochs: c.Float64("epochs"), EvalEvery: c.Int("eval-every"), EvalBatches: c.Int("eval-batches"),
		FinalEvalBatches: c.Int("final-eval-batches"),
		EvalStats:        c.String("eval-stats"), Seed: c.Uint64("seed"), Out: c.String("out"), Resume: c.Bool("resume"), StopAfter: c.Int("stop-after"),
		LR: c.Float64("lr"), Dropout: c.Float64("dropout"), WarmIn: c.Int("warm-in"),
		GradClip: c.Float64("grad-clip"), DumpIR: c.String("dump-ir"), NoAlign: !c.Bool("align"), Control: ctl, Loss: loss,
		Log: logger(c), Progress: c.App.ErrWriter,
	}
	if o.Parallel, err = parallelFlags(c); err != nil {
		return o, err
	}
	return o, applyRunFlags(c, &o)
}

// intOverride is an integer flag whose zero value keeps the default its usage names.
type intOverride struct{ name, usage string }

// intOverrides declares integer override flags, in order.
func intOverrides(fs []intOverride) []cli.Flag {
	flags := make([]cli.Flag, len(fs))
	for i, f := range fs {
		flags[i] = &cli.IntFlag{Name: f.name, Usage: f.usage}
	}
	return flags
}

// syntheticFlags shape the synthetic corpus.
func syntheticFlags() []cli.Flag {
	return append(intOverrides([]intOverride{
		{"syn-len", "synthetic corpus: tokens per sequence (default 256)"},
		{"syn-pairs", "synthetic corpus: key-value statements (and queries) per sequence (default 4)"},
		{"syn-gap", "synthetic corpus: least distance from a statement to its query (default half the sequence)"},
		{"mqar-len", "MQAR corpus: tokens per sequence (default 128)"},
		{"mqar-pairs", "MQAR corpus: key-value pairs (and queries) per sequence (default 8)"},
		{"mqar-vocab", "MQAR corpus: vocabulary size, half keys and half values (default 256)"},
		{"mqar-min-dist", "MQAR corpus: least distance from a pair's key to its query's key (default 1)"},
		{"mqar-max-dist", "MQAR corpus: most distance from a pair's key to its query's key (default the sequence length)"},
	}),
		&cli.StringFlag{Name: "mqar-draw", Usage: "MQAR corpus: which pairs the queries ask for: each (every pair once, in random order; default) | random (drawn with replacement, so the values already asked for tell nothing)"},
	)
}

// mqarFromFlags reads the MQAR corpus's shape; the corpus checks it.
func mqarFromFlags(c *cli.Context) (data.MQARConfig, error) {
	cfg := data.MQARConfig{SeqLen: c.Int("mqar-len"), Pairs: c.Int("mqar-pairs"), Vocab: c.Int("mqar-vocab"),
		MinDist: c.Int("mqar-min-dist"), MaxDist: c.Int("mqar-max-dist"), Draw: data.MQARDraw(c.String("mqar-draw"))}
	if cfg.SeqLen < 0 || cfg.Pairs < 0 || cfg.Vocab < 0 || cfg.MinDist < 0 || cfg.MaxDist < 0 {
		return cfg, fmt.Errorf("--mqar-len, --mqar-pairs, --mqar-vocab, --mqar-min-dist and --mqar-max-dist must not be negative")
	}
	if cfg != (data.MQARConfig{}) {
		if err := cfg.Validate(); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// syntheticFromFlags reads the synthetic corpus's shape; the corpus checks it.
func syntheticFromFlags(c *cli.Context) (data.SyntheticConfig, error) {
	cfg := data.SyntheticConfig{SeqLen: c.Int("syn-len"), Pairs: c.Int("syn-pairs"), MinGap: c.Int("syn-gap")}
	if cfg.SeqLen < 0 || cfg.Pairs < 0 || cfg.MinGap < 0 {
		return cfg, fmt.Errorf("--syn-len, --syn-pairs and --syn-gap must not be negative")
	}
	if cfg != (data.SyntheticConfig{}) {
		if err := cfg.Validate(); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// sizeFlags override the preset's model size.
func sizeFlags() []cli.Flag {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "config", Usage: "JSON file with fields of the model config (d_model, layers, heads, R, experts, top_k, ff_mult, max_len, ...) applied over the preset"},
	}
	flags = append(flags, intOverrides([]intOverride{
		{"d-model", "model width d (overrides the preset and --config)"},
		{"layers", "transformer blocks"},
		{"heads", "attention heads (must divide --d-model)"},
		{"regimes", "fuzzy regimes R"},
		{"experts", "FuzzyMoE experts"},
		{"top-k", "experts kept per token"},
		{"ff-mult", "expert hidden width as a multiple of d"},
		{"max-len", "rows of the learned position embedding"},
	})...)
	return append(flags,
		&cli.BoolFlag{Name: "rope", Usage: "rotate queries and keys by position (rotary embedding, on top of the learned positions; not in the paper)"},
		&cli.BoolFlag{Name: "smear-keys", Usage: "mix each attention key with the one before it (learned per head; not in the paper)"},
	)
}

// sizesFromFlags collects the size flags that were given.
func sizesFromFlags(c *cli.Context) model.Overrides {
	get := func(name string) *int {
		if !c.IsSet(name) {
			return nil
		}
		v := c.Int(name)
		return &v
	}
	o := model.Overrides{DModel: get("d-model"), Layers: get("layers"), Heads: get("heads"), R: get("regimes"),
		Experts: get("experts"), TopK: get("top-k"), FFMult: get("ff-mult"), MaxLen: get("max-len")}
	flag := func(name string) *bool {
		if !c.IsSet(name) {
			return nil
		}
		v := c.Bool(name)
		return &v
	}
	o.RoPE, o.SmearKeys = flag("rope"), flag("smear-keys")
	return o
}

// memoryFlagDefs are the flags of the memory plan (train, bench train).
func memoryFlagDefs() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "device", Value: "cpu", Usage: "cpu | cuda (the first GPU) | cuda-sim (the CUDA backend on rpac's CUDA simulator, on the CPU) | auto (cuda when a GPU is usable)"},
		&cli.StringFlag{Name: "precision", Usage: "GEMM inputs on CUDA: bf16 (default there) | fp32 (exact parity with the CPU backend); the CPU computes in fp32"},
		&cli.StringFlag{Name: "micro-batch", Value: "auto", Usage: "sequences per forward/backward pass; gradients of a step's micro-batches are accumulated (N dividing the batch, or auto: the largest that fits --mem-budget)"},
		&cli.StringFlag{Name: "mem-budget", Usage: "memory the run may plan for, e.g. 12GiB (default: 80% of the memory available to the process, cgroup limits included)"},
		&cli.StringFlag{Name: "expert-dispatch", Value: "auto", Usage: "the fuzzy blocks' experts in training steps: dense (every expert on every token, the listing) | routed (each token to its top-k experts only; same results) | auto (the backend's choice: routed on the CPU, dense on CUDA)"},
		&cli.BoolFlag{Name: "host-optimizer", Usage: "on CUDA, clip, step AdamW and average the EMA on the host (weights up and gradients down every step) instead of on the device"},
		&cli.BoolFlag{Name: "cuda-candidate", Usage: "on CUDA, turn on every path no GPU has measured yet (" + cudaUnmeasured() + "; off by default until a lease measures them)"},
		&cli.StringSliceFlag{Name: "cuda-path", Usage: "on CUDA, NAME=on|off sets one of the backend's paths (after --cuda-candidate; repeatable); NAME: " + cuda.PathList()},
	}
}

// cudaUnmeasured names the CUDA paths off by default until a GPU measures them.
func cudaUnmeasured() string {
	var names []string
	for _, p := range cuda.Unmeasured() {
		names = append(names, p.String())
	}
	return strings.Join(names, ", ")
}

// memoryFlags reads --micro-batch (0: auto) and --mem-budget (0: default).
func memoryFlags(c *cli.Context) (micro int, budget int64, err error) {
	if micro, err = parseMicroBatch(c.String("micro-batch")); err != nil {
		return 0, 0, err
	}
	budget, err = parseMemBudget(c.String("mem-budget"))
	return micro, budget, err
}

// applyRunFlags reads the flags of memoryFlagDefs (where the run trains,
// in what precision and memory) into o.
// warmInFlag is --warm-in: steps ≥ 0, or -1 (unset: the preset's).
func warmInFlag(c *cli.Context) (int, error) {
	w := c.Int("warm-in")
	if c.IsSet("warm-in") && w < 0 {
		return 0, fmt.Errorf("--warm-in %d: want 0 or more steps", w)
	}
	return w, nil
}

func applyRunFlags(c *cli.Context, o *training.Options) error {
	micro, budget, err := memoryFlags(c)
	if err != nil {
		return err
	}
	device, precision, err := deviceFlags(c)
	if err != nil {
		return err
	}
	co, err := cudaOptions(c.Bool("cuda-candidate"), c.StringSlice("cuda-path"))
	if err != nil {
		return err
	}
	if o.Experts, err = passes.ParseDispatch(c.String("expert-dispatch")); err != nil {
		return err
	}
	o.MicroBatch, o.MemBudget, o.Device, o.Precision, o.HostOptimizer, o.CUDA = micro, budget, device, precision, c.Bool("host-optimizer"), co
	return nil
}

// cudaOptions are the CUDA backend's paths: its defaults (the candidates
// with --cuda-candidate), then each --cuda-path NAME=on|off, then the
// RPAC_CUDA_* variables experiments set (cuda.OptionsFromEnv).
func cudaOptions(candidate bool, paths []string) (*cuda.Options, error) {
	base := cuda.DefaultOptions()
	if candidate {
		base = cuda.CandidateOptions()
	}
	for _, s := range paths {
		p, on, err := cuda.ParsePathSetting(s)
		if err != nil {
			return nil, err
		}
		base.Set(p, on)
	}
	o, err := cuda.OptionsFromEnv(base)
	return &o, err
}

// deviceFlags reads --device and --precision.
func deviceFlags(c *cli.Context) (training.Device, ir.Precision, error) {
	d, err := training.ParseDevice(c.String("device"))
	if err != nil {
		return 0, 0, err
	}
	p, err := ir.ParsePrecision(c.String("precision"))
	if err != nil {
		return 0, 0, fmt.Errorf("--precision: %w", err)
	}
	return d, p, nil
}

// parseMicroBatch reads --micro-batch: auto (0) or a positive count.
func parseMicroBatch(s string) (int, error) {
	if s == "" || s == "auto" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("--micro-batch %q: want a positive number of sequences or auto", s)
	}
	return n, nil
}

// parseMemBudget reads --mem-budget ("" = the default).
func parseMemBudget(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := training.ParseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("--mem-budget: %w", err)
	}
	return n, nil
}

// checkTrainFlags refuses values that would otherwise be ignored or
// misread silently.
func checkTrainFlags(c *cli.Context) error {
	if g := c.Float64("grad-clip"); !(g > 0) || math.IsInf(g, 0) {
		return fmt.Errorf("--grad-clip %v: want a positive, finite global-norm bound", g)
	}
	if d := c.Float64("dropout"); c.IsSet("dropout") && !(d >= 0 && d < 1) {
		return fmt.Errorf("--dropout %v: want a rate in [0,1)", d)
	}
	if _, err := warmInFlag(c); err != nil {
		return err
	}
	if lr := c.Float64("lr"); c.IsSet("lr") && !(lr > 0 && !math.IsInf(lr, 0)) {
		return fmt.Errorf("--lr %v: want a positive, finite learning rate", lr)
	}
	if d := c.String("dump-ir"); d != "" && d != "all" && !slices.Contains(passes.Names(passes.TrainPipeline), d) {
		return fmt.Errorf("--dump-ir %q: not a pass of the training pipeline (%s, or all)", d, strings.Join(passes.Names(passes.TrainPipeline), ", "))
	}
	return nil
}

// lossFlag is --loss (train, ablate).
func lossFlag() cli.Flag {
	return &cli.StringFlag{Name: "loss", Value: string(training.LossAll), Usage: "tokens the training loss averages over: all | answers (only the answer positions of the synthetic or mqar corpus; evaluations still score every token)"}
}

// modelFlag is --model, model.KindUnset (the preset's) when it is not given.
func modelFlag(c *cli.Context) (model.Kind, error) {
	if !c.IsSet("model") {
		return model.KindUnset, nil
	}
	return model.ParseKind(c.String("model"))
}
