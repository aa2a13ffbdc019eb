package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/rpac-dev/rpac/training"
)

// benchGemmAlgosCommand is `rpac bench gemm-algos`: cuBLASLt's candidate
// algorithms timed on given GEMM shapes (cuda.TimeGemmAlgos).
func benchGemmAlgosCommand() *cli.Command {
	return &cli.Command{
		Name:  "gemm-algos",
		Usage: "time the first N algorithms cuBLASLt's heuristic lists for GEMM shapes, against the first (which rpac's plans take)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "shapes", Required: true, Usage: "comma-separated MxNxK[:TT] (TT: NN, NT, TN or TT), as the backend runs them: e.g. 24576x510x510:NT,1024x50257x510:NT"},
			&cli.IntFlag{Name: "algos", Value: 8, Usage: "algorithms per shape"},
			&cli.IntFlag{Name: "reps", Value: 10, Usage: "timed runs per algorithm (the median is reported)"},
			&cli.StringFlag{Name: "device", Value: "cuda", Usage: "cuda | cuda-sim"},
			&cli.StringFlag{Name: "precision", Value: "bf16", Usage: "operands: bf16 | fp32"},
		},
		Action: benchGemmAlgos,
	}
}

func benchGemmAlgos(c *cli.Context) error {
	if c.Int("algos") < 1 || c.Int("reps") < 1 {
		return fmt.Errorf("--algos and --reps must be positive")
	}
	dev, prec, err := deviceFlags(c)
	if err != nil {
		return err
	}
	if dev != training.DeviceCUDA && dev != training.DeviceCUDASim {
		return fmt.Errorf("--device %s: gemm-algos times cuBLASLt: cuda or cuda-sim", c.String("device"))
	}
	ab := cuda.BF16
	switch prec {
	case ir.FP32:
		ab = cuda.F32
	case ir.FP16:
		return fmt.Errorf("--precision fp16: gemm-algos times bf16 or fp32 operands")
	}
	specs := strings.Split(c.String("shapes"), ",")
	var shapes []cuda.GemmShape
	for i, spec := range specs {
		specs[i] = strings.TrimSpace(spec)
		s, err := cuda.ParseGemmShape(specs[i], ab)
		if err != nil {
			return err
		}
		shapes = append(shapes, s)
	}
	t, err := training.ResolveDevice(dev, prec)
	if err != nil {
		return err
	}
	co, err := cudaOptions(false, nil)
	if err != nil {
		return err
	}
	be, err := training.OpenBackend(t, co)
	if err != nil {
		return err
	}
	gpu, ok := be.(*cuda.Backend)
	if !ok {
		return fmt.Errorf("--device %s did not open the CUDA backend", c.String("device"))
	}
	w := c.App.Writer
	fmt.Fprintf(w, "gemm-algos on %s: C = A·B, random operands in [-1, 1), median of %d runs each\n", gpu.Name(), c.Int("reps"))
	for i, s := range shapes {
		ts, err := gpu.TimeGemmAlgos(s, ab, c.Int("algos"), c.Int("reps"))
		if err != nil {
			return fmt.Errorf("%s: %w", specs[i], err)
		}
		printAlgoTimes(w, specs[i], s, ts)
	}
	return nil
}

func printAlgoTimes(w io.Writer, name string, s cuda.GemmShape, ts []cuda.AlgoTime) {
	flops := 2 * float64(s.M) * float64(s.N) * float64(s.K)
	fmt.Fprintf(w, "  %s (%d algorithms)\n", name, len(ts))
	fmt.Fprintf(w, "    %4s %10s %9s %12s %6s %10s\n", "rank", "ms", "TFLOP/s", "workspace", "waves", "max diff")
	best := 0
	for i, t := range ts {
		fmt.Fprintf(w, "    %4d %10.4f %9.1f %12d %6.2f %10.2e\n", t.Rank, 1e3*t.Seconds, flops/t.Seconds/1e12, t.Workspace, t.Waves, t.MaxDiff)
		if t.Seconds < ts[best].Seconds {
			best = i
		}
	}
	fmt.Fprintf(w, "    best: rank %d, %.2f× the heuristic's first\n", ts[best].Rank, ts[0].Seconds/ts[best].Seconds)
}
