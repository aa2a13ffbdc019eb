package main

import (
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/rpac-dev/rpac/kernels/cpu/blas"
	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/rpac-dev/rpac/training"
	"github.com/urfave/cli/v2"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure this machine: gemm | train | infer | generate | serve",
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
				Flags: append([]cli.Flag{
					&cli.StringFlag{Name: "preset", Value: "tiny"},
					&cli.StringFlag{Name: "model", Value: "fuzzy"},
					&cli.IntFlag{Name: "context"},
					&cli.IntFlag{Name: "tokens-per-step"},
					&cli.IntFlag{Name: "steps", Value: 5, Usage: "timed steps (after one warm-up step)"},
					&cli.StringFlag{Name: "cpuprofile", Usage: "write a Go CPU profile of the timed steps to this file"},
				}, memoryFlagDefs()...),
				Action: benchTrain,
			},
			benchInferCommand(),
			benchGenerateCommand(),
			benchServeCommand(),
		},
	}
}

func benchTrain(c *cli.Context) error {
	device, precision, err := deviceFlags(c)
	if err != nil {
		return err
	}
	if err := training.CheckDevice(device, precision); err != nil {
		return err
	}
	steps := c.Int("steps")
	if steps < 1 {
		return fmt.Errorf("--steps must be positive")
	}
	micro, budget, err := memoryFlags(c)
	if err != nil {
		return err
	}
	b, err := training.NewBench(training.Options{Preset: c.String("preset"), Model: c.String("model"), Context: c.Int("context"),
		TokensPerStep: c.Int("tokens-per-step"), MicroBatch: micro, MemBudget: budget, Dropout: -1, Seed: 1,
		Device: device, Precision: precision})
	if err != nil {
		return err
	}
	defer b.Close()
	if err := b.Step(0); err != nil { // warm-up
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
	t0 := time.Now()
	for i := 0; i < steps; i++ {
		if err := b.Step(uint64(i + 1)); err != nil {
			return err
		}
	}
	dt := time.Since(t0).Seconds() / float64(steps)
	w, l := c.App.Writer, b.Length()
	if note := training.SimulatorNote(b.Backend()); note != "" {
		fmt.Fprintln(w, note)
	}
	fmt.Fprintf(w, "bench train: preset=%s model=%s params=%d T=%d B=%d micro-batch=%d tokens/step=%d on %s (forward, backward, clip, AdamW)\n",
		b.Plan.Preset, b.Plan.Config.Model, b.Params(), l.T, l.Batch, l.Micro, l.Batch*l.T, b.Backend().Name())
	fmt.Fprintf(w, "  step time        %.3f s  (%d steps)\n", dt, steps)
	fmt.Fprintf(w, "  tokens/s         %.0f\n", float64(l.Batch*l.T)/dt)
	fmt.Fprintf(w, "  GEMM work/step   %.1f GFLOP\n", float64(b.Flops())/1e9)
	achieved := float64(b.Flops()) / dt / 1e9
	fmt.Fprintf(w, "  achieved         %.1f GFLOP/s\n", achieved)
	if gpu, ok := b.Backend().(*cuda.Backend); ok {
		if peak := cuda.DensePeakTFLOPS(gpu.Device().Name, gpu.GEMM()); peak > 0 {
			fmt.Fprintf(w, "  MFU              %.1f%% of the %s dense %s peak (%.1f TFLOP/s, datasheet)\n",
				100*achieved/(peak*1e3), gpu.Device().Name, gpu.GEMM(), peak)
		}
	} else {
		peak, err := blas.Measure(2048, "f32", 3*time.Second)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  gemm peak        %.1f GFLOP/s (sgemm n=2048, %s, same run)\n", peak, blas.Impl())
		fmt.Fprintf(w, "  ratio            %.0f%%\n", 100*achieved/peak)
	}
	fmt.Fprintf(w, "  plan             %.1f MiB step program; %s planned in all of a %s budget\n",
		float64(b.PlanBytes())/(1<<20), training.FormatBytes(b.Plan.Memory.Total), training.FormatBytes(b.Plan.Memory.Budget))
	return nil
}
