package main

import (
	"encoding/json"
	"fmt"
	"sort"

	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/urfave/cli/v2"
)

func gpuCommand() *cli.Command {
	return &cli.Command{
		Name:  "gpu",
		Usage: "what this machine offers the CUDA backend: devices, driver, NVRTC, cuBLASLt, and whether every kernel compiles",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"}},
		Action: func(c *cli.Context) error {
			rep := cuda.Probe()
			w := c.App.Writer
			if c.Bool("json") {
				b, _ := json.MarshalIndent(rep, "", "  ")
				fmt.Fprintln(w, string(b))
				return nil
			}
			if rep.Driver != "" {
				fmt.Fprintf(w, "driver    %s\n", rep.Driver)
			}
			for _, d := range rep.Devices {
				fmt.Fprintf(w, "device %d  %s, %s, %d SMs, %.1f GiB, driver CUDA %s\n", d.Ordinal, d.Name, d.SM, d.SMs, float64(d.TotalMemory)/(1<<30), d.DriverVersionString())
			}
			if rep.DriverVersion != "" {
				fmt.Fprintf(w, "CUDA      driver supports CUDA %s\n", rep.DriverVersion)
			}
			fmt.Fprintf(w, "NVRTC     %s\n", rep.NVRTC)
			if rep.NVRTCNewer {
				fmt.Fprintf(w, "          NVRTC is newer than the driver: its PTX would not load; the kernels are loaded as cubins\n")
			}
			if rep.Simulated {
				fmt.Fprintf(w, "          (the CUDA simulator, not a GPU)\n")
			}
			fmt.Fprintf(w, "cuBLASLt  %s\n", rep.CublasLt)
			names := make([]string, 0, len(rep.Kernels))
			for n := range rep.Kernels {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, n := range names {
				fmt.Fprintf(w, "kernel    %-18s %s\n", n, rep.Kernels[n])
			}
			return nil
		},
	}
}
