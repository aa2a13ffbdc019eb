package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"time"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/kernels/cpu/blas"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/training/optim"
	"github.com/urfave/cli/v2"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure this machine: gemm | train",
		Subcommands: []*cli.Command{
			{
				Name:  "gemm",
				Usage: "GFLOP/s of the CPU GEMM (n×n×n)",
				Flags: []cli.Flag{
					&cli.IntFlag{Name: "n", Value: 2048},
					&cli.StringFlag{Name: "precision", Value: "f32", Usage: "f32|f64"},
					&cli.DurationFlag{Name: "time", Value: 3 * time.Second},
				},
				Action: func(c *cli.Context) error {
					if c.Int("n") < 1 {
						return fmt.Errorf("--n must be positive")
					}
					gf, err := blas.Measure(c.Int("n"), c.String("precision"), c.Duration("time"))
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "gemm %s n=%d impl=%s: %.1f GFLOP/s\n", c.String("precision"), c.Int("n"), blas.Impl(), gf)
					return nil
				},
			},
			{
				Name:  "train",
				Usage: "tokens/s and achieved GEMM GFLOP/s of training steps, against the GEMM peak measured in the same run",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "preset", Value: "tiny"},
					&cli.StringFlag{Name: "model", Value: "fuzzy"},
					&cli.IntFlag{Name: "context"},
					&cli.IntFlag{Name: "tokens-per-step"},
					&cli.IntFlag{Name: "steps", Value: 5, Usage: "timed steps (after one warm-up step)"},
					&cli.StringFlag{Name: "device", Value: "cpu"},
					&cli.StringFlag{Name: "cpuprofile", Usage: "write a Go CPU profile of the timed steps to this file"},
				},
				Action: benchTrain,
			},
			benchInferCommand(),
		},
	}
}

func benchTrain(c *cli.Context) error {
	if c.String("device") != "cpu" {
		return fmt.Errorf("device %q is not available in this build (use --device cpu)", c.String("device"))
	}
	p, err := model.LookupPreset(c.String("preset"))
	if err != nil {
		return err
	}
	cfg := p.Config
	cfg.Model = c.String("model")
	T := c.Int("context")
	if T == 0 {
		T = p.Contexts[0]
	}
	tps := c.Int("tokens-per-step")
	if tps == 0 {
		tps = p.TokensPerStep
	}
	B := max(1, tps/T)
	steps := c.Int("steps")
	if steps < 1 {
		return fmt.Errorf("--steps must be positive")
	}
	g, specs, err := model.Build(&cfg, model.Opts{T: T, B: B, Mode: model.Train})
	if err != nil {
		return err
	}
	if err := passes.Run(g, passes.TrainPipeline, &passes.Context{Loss: "loss"}); err != nil {
		return err
	}
	st := kernels.NewStore(kernels.F32)
	if err := model.InitStore(specs, st, 1); err != nil {
		return err
	}
	plan := passes.Plan(g)
	prog, err := cpu.New(kernels.F32).Compile(g, plan, st)
	if err != nil {
		return err
	}
	defer prog.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	ids := make([]int32, B*T)
	tg := make([]int32, B*T)
	for i := range ids {
		ids[i], tg[i] = int32(rng.IntN(cfg.Vocab)), int32(rng.IntN(cfg.Vocab))
	}
	feeds := map[string]*kernels.Tensor{"input_ids": kernels.IntTensor(ir.Shape{B, T}, ids), "targets": kernels.IntTensor(ir.Shape{B * T}, tg)}
	if err := prog.Run(feeds, 0); err != nil { // warm-up
		return err
	}
	if f := c.String("cpuprofile"); f != "" {
		pf, err := os.Create(f)
		if err != nil {
			return err
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	opt := optim.NewAdamW(optim.DefaultAdamW())
	params := map[string][]float32{}
	for _, s := range specs {
		if s.Param {
			params[s.Name] = st.Get(s.Name).F32
		}
	}
	t0 := time.Now()
	for i := 0; i < steps; i++ {
		if err := prog.Run(feeds, uint64(i+1)); err != nil {
			return err
		}
		grads := map[string][]float32{}
		for name := range params {
			if gt := prog.Output(passes.GradName(name)); gt != nil {
				grads[name] = gt.F32
			}
		}
		optim.ClipGlobalNorm(grads, 1)
		if err := opt.Step(params, grads, 1e-4); err != nil {
			return err
		}
	}
	dt := time.Since(t0).Seconds() / float64(steps)
	flops := passes.Flops(g)
	achieved := float64(flops) / dt / 1e9
	peak, err := blas.Measure(2048, "f32", 3*time.Second)
	if err != nil {
		return err
	}
	w := c.App.Writer
	fmt.Fprintf(w, "bench train: preset=%s model=%s params=%d T=%d B=%d tokens/step=%d (forward, backward, clip, AdamW)\n",
		p.Name, cfg.Model, model.CountParams(specs), T, B, B*T)
	fmt.Fprintf(w, "  step time        %.3f s  (%d steps)\n", dt, steps)
	fmt.Fprintf(w, "  tokens/s         %.0f\n", float64(B*T)/dt)
	fmt.Fprintf(w, "  GEMM work/step   %.1f GFLOP\n", float64(flops)/1e9)
	fmt.Fprintf(w, "  achieved         %.1f GFLOP/s\n", achieved)
	fmt.Fprintf(w, "  gemm peak        %.1f GFLOP/s (sgemm n=2048, %s, same run)\n", peak, blas.Impl())
	fmt.Fprintf(w, "  ratio            %.0f%%\n", 100*achieved/peak)
	fmt.Fprintf(w, "  plan             %.1f MiB of slots (%.1f MiB without reuse) + %.1f MiB kernel scratch\n",
		float64(plan.Peak)*4/(1<<20), float64(plan.Naive)*4/(1<<20), float64(plan.ScratchElems)*4/(1<<20))
	return nil
}
