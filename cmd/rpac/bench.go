package main

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"time"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/kernels/cpu/blas"
	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/rpac-dev/rpac/kernels/cuda/perf"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/training"
	"github.com/urfave/cli/v2"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure this machine: gemm | gemm-algos | train | infer | generate | serve | torch-export",
		Subcommands: []*cli.Command{
			benchGemmAlgosCommand(),
			benchTorchExportCommand(),
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
					&cli.StringFlag{Name: "predict", Usage: "h100|h200|gh200 (or a data-parallel cluster of them: h100x8, h100x64): trace one step of --device cuda (on the dry-run device when no GPU is usable) and predict its time on that machine (docs/PERFMODEL.md)"},
					&cli.BoolFlag{Name: "measure", Usage: "with --predict on a GPU (or cuda-sim): also time each kernel and GEMM of the traced step, the device synchronized around each, and print the measured times beside the predicted ones"},
					&cli.IntFlag{Name: "kernels", Value: 10, Usage: "with --predict: how many of the costliest kernels to list (0: all)"},
					&cli.IntFlag{Name: "gemm-shapes", Usage: "with --predict: also list the N costliest GEMM shapes (0: none)"},
					&cli.BoolFlag{Name: "compare-dispatch", Usage: "bench (or --predict) the step with --expert-dispatch dense, then routed, in this run, and print the two side by side"},
				}, append(memoryFlagDefs(), sizeFlags()...)...),
				Action: benchTrain,
			},
			benchInferCommand(),
			benchGenerateCommand(),
			benchServeCommand(),
		},
	}
}

func benchTrain(c *cli.Context) error {
	o, err := benchTrainOptions(c)
	if err != nil {
		return err
	}
	runs := []passes.Dispatch{o.Experts}
	if c.Bool("compare-dispatch") {
		runs = []passes.Dispatch{passes.DispatchDense, passes.DispatchRouted}
	}
	var lines []benchLine
	if !c.IsSet("predict") {
		lines, err = benchTrainDispatches(c, o, runs)
	}
	for _, d := range runs {
		if !c.IsSet("predict") || err != nil {
			break
		}
		o.Experts = d
		var l benchLine
		l, err = benchPredict(c, o)
		lines = append(lines, l)
	}
	if err != nil {
		return err
	}
	if len(lines) > 1 {
		printBenchLines(c.App.Writer, lines)
	}
	return nil
}

// benchLine is one benched or predicted step, for the side-by-side table.
type benchLine struct {
	experts           passes.Dispatch
	step, tokens      float64 // seconds per step, tokens per step
	cpu               float64 // the process's CPU seconds per step (0: not measured)
	flops, denseFlops int64
	mfu               float64 // predicted MFU on flops (0: measured on the CPU)
}

// printBenchLines prints the steps side by side.
func printBenchLines(w io.Writer, lines []benchLine) {
	fmt.Fprintf(w, "experts side by side (CPU: median wall time of steps taken in turn, and the process's CPU time per step):\n")
	fmt.Fprintf(w, "  %-8s %12s %12s %10s %18s %18s %8s\n", "experts", "step ms", "cpu ms", "tok/s", "GEMM GFLOP (model)", "GEMM GFLOP (dense)", "MFU")
	for _, l := range lines {
		mfu, cpu := "-", "-"
		if l.mfu > 0 {
			mfu = fmt.Sprintf("%.1f%%", 100*l.mfu)
		}
		if l.cpu > 0 {
			cpu = fmt.Sprintf("%.1f", 1e3*l.cpu)
		}
		fmt.Fprintf(w, "  %-8s %12.1f %12s %10.0f %18.1f %18.1f %8s\n", l.experts, 1e3*l.step, cpu, l.tokens/l.step,
			float64(l.flops)/1e9, float64(l.denseFlops)/1e9, mfu)
	}
}

// benchTrainDispatches times the training step of o with each dispatch
// of the experts: alone (Bench.Time, profiled with --cpuprofile), or, to
// compare them under the same load, their steps in turn
// (training.TimeInterleaved, median step times).
func benchTrainDispatches(c *cli.Context, o training.Options, dispatches []passes.Dispatch) ([]benchLine, error) {
	var benches []*training.Bench
	defer func() {
		for _, b := range benches {
			b.Close()
		}
	}()
	for _, d := range dispatches {
		o.Experts = d
		b, err := training.NewBench(o)
		if err != nil {
			return nil, err
		}
		benches = append(benches, b)
	}
	var times []training.StepTime
	var err error
	if len(benches) == 1 {
		var profile func() (func(), error)
		if f := c.String("cpuprofile"); f != "" {
			profile = func() (func(), error) { return startCPUProfile(f) }
		}
		var dt float64
		dt, err = benches[0].Time(c.Int("steps"), profile)
		times = []training.StepTime{{Wall: dt}}
	} else {
		times, err = training.TimeInterleaved(benches, c.Int("steps"))
	}
	if err != nil {
		return nil, err
	}
	var lines []benchLine
	for i, b := range benches {
		l := b.Length()
		lines = append(lines, benchLine{experts: b.Experts(), step: times[i].Wall, cpu: times[i].CPU, tokens: float64(l.Batch * l.T),
			flops: b.Flops(), denseFlops: b.DenseFlops()})
		if err := printBenchTrain(c.App.Writer, b, c.Int("steps"), times[i].Wall); err != nil {
			return nil, err
		}
	}
	return lines, nil
}

// benchTrainOptions is the training step the flags describe.
func benchTrainOptions(c *cli.Context) (training.Options, error) {
	kind, err := model.ParseKind(c.String("model"))
	if err != nil {
		return training.Options{}, err
	}
	o := training.Options{Preset: c.String("preset"), Model: kind, Context: c.Int("context"),
		TokensPerStep: c.Int("tokens-per-step"), Dropout: -1, Seed: 1, ConfigFile: c.String("config"), Sizes: sizesFromFlags(c)}
	if err := applyRunFlags(c, &o); err != nil {
		return training.Options{}, err
	}
	if c.Int("steps") < 1 {
		return training.Options{}, fmt.Errorf("--steps must be positive")
	}
	return o, nil
}

// startCPUProfile starts a Go CPU profile into path and returns its stop.
func startCPUProfile(path string) (func(), error) {
	pf, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(pf); err != nil {
		pf.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); pf.Close() }, nil
}

func printBenchTrain(w io.Writer, b *training.Bench, steps int, dt float64) error {
	l := b.Length()
	if note := training.SimulatorNote(b.Backend()); note != "" {
		fmt.Fprintln(w, note)
	}
	fmt.Fprintf(w, "bench train: preset=%s model=%s params=%d T=%d B=%d micro-batch=%d tokens/step=%d on %s (forward, backward, clip, AdamW)\n",
		b.Plan.Preset, b.Plan.Config.Model, b.Params(), l.T, l.Batch, l.Micro, l.Batch*l.T, b.Backend().Name())
	fmt.Fprintf(w, "  step time        %.3f s  (%d steps)\n", dt, steps)
	fmt.Fprintf(w, "  tokens/s         %.0f\n", float64(l.Batch*l.T)/dt)
	fmt.Fprintf(w, "  experts          %s\n", b.Experts())
	fmt.Fprintf(w, "  GEMM work/step   %.1f GFLOP (the model's: routed experts over their tokens; dense form %.1f GFLOP)\n",
		float64(b.Flops())/1e9, float64(b.DenseFlops())/1e9)
	achieved := float64(b.Flops()) / dt / 1e9
	fmt.Fprintf(w, "  achieved         %.1f GFLOP/s\n", achieved)
	if gpu, ok := b.Backend().(*cuda.Backend); ok {
		if peak := cuda.DensePeakTFLOPS(gpu.Device().Name, gpu.GEMM()); peak > 0 {
			fmt.Fprintf(w, "  MFU              %.1f%% of the %s dense %s peak (%.1f TFLOP/s, datasheet), on the dense form's %.1f GFLOP/step (every expert on every token)\n",
				100*float64(b.DenseFlops())/dt/(peak*1e12), gpu.Device().Name, gpu.GEMM(), peak, float64(b.DenseFlops())/1e9)
			fmt.Fprintf(w, "  MFU routed       %.1f%% (the FLOPs of routed experts, %.1f GFLOP/step: each token through its top-k only)\n",
				100*float64(b.RoutedFlops())/dt/(peak*1e12), float64(b.RoutedFlops())/1e9)
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

// benchPredict traces one training step on the CUDA backend (a GPU, the
// simulator, or the dry-run device when --device cuda finds no GPU) and
// predicts its time on the --predict machine. Its last line names the
// prediction.
func benchPredict(c *cli.Context, o training.Options) (benchLine, error) {
	cl, isCluster, err := perf.LookupCluster(c.String("predict"))
	if err != nil {
		return benchLine{}, err
	}
	hw := cl.GPU
	if !isCluster {
		if hw, err = perf.LookupMachine(c.String("predict")); err != nil {
			return benchLine{}, err
		}
	}
	w := c.App.Writer
	o, dryRun, err := training.PredictOptions(o, hw)
	if err != nil {
		return benchLine{}, err
	}
	if dryRun {
		fmt.Fprintf(w, "no GPU: tracing the step on the dry-run device (every launch checked, nothing computed); memory budget %s (90%% of the %s's %.0f GiB)\n",
			training.FormatBytes(o.MemBudget), hw.Name, hw.MemGiB)
	}
	b, err := training.NewBench(o)
	if err != nil {
		return benchLine{}, err
	}
	defer b.Close()
	p, err := b.Predict(hw, c.Bool("measure"))
	if err != nil {
		return benchLine{}, err
	}
	printPrediction(w, b, hw, p, c.Int("kernels"), c.Int("gemm-shapes"))
	if isCluster {
		printScaling(w, b, cl.Scale(p, b.GradBytes(), cuda.DefaultBucketBytes))
	}
	l := b.Length()
	return benchLine{experts: b.Experts(), step: p.Step, tokens: float64(l.Batch * l.T), flops: b.Flops(), denseFlops: b.DenseFlops(),
		mfu: p.MFU(float64(b.Flops()))}, nil
}

// printScaling prints the data-parallel prediction: every GPU runs the
// traced step on its shard, the gradients all-reduced in buckets.
func printScaling(w io.Writer, b *training.Bench, s perf.Scaling) {
	cl, l := s.Cluster, b.Length()
	fmt.Fprintf(w, "  all-reduce       %s of fp32 gradients in %d buckets of at most %s: %.2f ms (ring, bus bandwidth %.0f GB/s: %s), %.2f ms not hidden by the backward\n",
		perf.FormatBusBytes(s.GradBytes), s.Buckets, perf.FormatBusBytes(cuda.DefaultBucketBytes), 1e3*s.Comm, cl.BusGBs(), clusterLinks(cl), 1e3*s.Exposed)
	fmt.Fprintf(w, "  by default       the all-reduce after the backward: %.1f ms/step, scaling efficiency %.1f%%\n", 1e3*s.StepAfter, 100*s.EfficiencyAfter)
	fmt.Fprintf(w, "predicted %s %s (data-parallel, %d GPUs on %d node(s), %d tokens/step per GPU, %d in all; buckets overlapped with the backward: rpac train --overlap-allreduce): %.1f ms/step, scaling efficiency %.1f%%\n",
		cl.Name, b.Plan.Preset, cl.GPUs, cl.Nodes(), l.Batch*l.T, cl.GPUs*l.Batch*l.T, 1e3*s.Step, 100*s.Efficiency)
}

// clusterLinks names the links the all-reduce crosses.
func clusterLinks(cl perf.Cluster) string {
	if cl.Nodes() == 1 {
		return fmt.Sprintf("NVLink %.0f GB/s per direction", cl.NVLinkGBs)
	}
	return fmt.Sprintf("NVLink %.0f GB/s within a node, %d InfiniBand NICs of %.0f GB/s per node between nodes", cl.NVLinkGBs, min(cl.GPUs, cl.GPUsPerNode), cl.NICGBs)
}

func printPrediction(w io.Writer, b *training.Bench, hw perf.Hardware, p *perf.Prediction, top, shapes int) {
	l := b.Length()
	tokens := float64(l.Batch * l.T)
	fmt.Fprintf(w, "bench train --predict %s: preset=%s model=%s params=%d T=%d B=%d micro-batch=%d tokens/step=%d on %s\n",
		hw.Name, b.Plan.Preset, b.Plan.Config.Model, b.Params(), l.T, l.Batch, l.Micro, l.Batch*l.T, b.Backend().Name())
	fmt.Fprintf(w, "  machine          %s: bf16 %.1f TFLOP/s, fp32 %.1f TFLOP/s, HBM %.2f TB/s, %d SMs, %s %.0f GB/s, %d host cores\n",
		hw.Name, hw.BF16TFLOPS, hw.FP32TFLOPS, hw.HBMTBs, hw.SMs, hw.Bus, hw.BusGBs, hw.HostCores)
	fmt.Fprintf(w, "  trace            %d launches, %d GEMMs (%.2f TFLOP), host->device %s, device->host %s\n",
		p.Launches, p.GEMMs, p.GEMMFlops/1e12, perf.FormatBusBytes(p.H2D), perf.FormatBusBytes(p.D2H))
	fmt.Fprintf(w, "  GPU time         %.2f ms (kernels back to back)\n", 1e3*p.GPU)
	fmt.Fprintf(w, "  host issue       %.2f ms (launches and GEMM calls)\n", 1e3*p.HostIssue)
	fmt.Fprintf(w, "  copies           %.2f ms\n", 1e3*p.Copies)
	fmt.Fprintf(w, "  host optimizer   %.2f ms (%d parameters clipped and updated on the host)\n", 1e3*p.HostOptim, p.HostParams)
	if p.Measured > 0 {
		fmt.Fprintf(w, "  measured         %.2f ms (each kernel and GEMM timed between two synchronizations, less %.1f µs per call, a synchronized empty launch's time; predicted %.2f)\n",
			1e3*p.Measured, 1e6*p.MeasureFloor, 1e3*p.GPU)
	}
	printKernelTable(w, "kernels", p.Kernels, p, top)
	if shapes > 0 {
		printKernelTable(w, "GEMM shapes", p.GEMMShapes, p, shapes)
	}
	fmt.Fprintf(w, "  experts          %s: MFU on the model's %.2f TFLOP (routed experts over their tokens); on the dense form's %.2f TFLOP %.1f%%\n",
		b.Experts(), float64(b.Flops())/1e12, float64(b.DenseFlops())/1e12, 100*p.MFU(float64(b.DenseFlops())))
	fmt.Fprintf(w, "predicted %s %s: %.1f ms/step, %.0fk tok/s, MFU %.1f%%, host-device %s/step\n", hw.Name, b.Plan.Preset,
		1e3*p.Step, tokens/p.Step/1e3, 100*p.MFU(float64(b.Flops())), perf.FormatBusBytes(p.H2D+p.D2H))
}

// printKernelTable lists the top costliest of ks (all for top ≤ 0), a
// group of p, with their measured times when the trace was measured.
func printKernelTable(w io.Writer, what string, ks []perf.KernelTime, p *perf.Prediction, top int) {
	if top <= 0 || top > len(ks) {
		top = len(ks)
	}
	measured := ""
	if p.Measured > 0 {
		measured = fmt.Sprintf(" %11s %7s", "measured ms", "ratio")
	}
	fmt.Fprintf(w, "  %d costliest %s (predicted GPU time per step):\n", top, what)
	fmt.Fprintf(w, "    %-34s %6s %10s %6s %12s %12s%s  %s\n", "kernel", "calls", "ms", "share", "GFLOP", "MB", measured, "bound")
	for _, k := range ks[:top] {
		m := ""
		if p.Measured > 0 {
			m = fmt.Sprintf(" %11.3f %7.2f", 1e3*k.Measured, k.Measured/k.Seconds)
		}
		fmt.Fprintf(w, "    %-34s %6d %10.3f %5.1f%% %12.1f %12.1f%s  %s\n", k.Name, k.Calls, 1e3*k.Seconds, 100*k.Seconds/p.GPU,
			k.Flops/1e9, k.Bytes/1e6, m, k.Bound)
	}
}
