package main

import (
	"fmt"

	"github.com/rpac-dev/rpac/kernels/cuda/cudasim"
	"github.com/urfave/cli/v2"
)

func cudaSimCommand() *cli.Command {
	return &cli.Command{
		Name:  "cuda-sim",
		Usage: "rpac's CUDA simulator (the CUDA backend on the CPU: --device cuda-sim)",
		Subcommands: []*cli.Command{{
			Name:  "build",
			Usage: "build the simulator library with g++ (once per version; --device cuda-sim also builds it on first use)",
			Flags: []cli.Flag{&cli.BoolFlag{Name: "force", Usage: "rebuild even when it is built"}},
			Action: func(c *cli.Context) error {
				dir, err := cudasim.Dir()
				if err != nil {
					return err
				}
				if c.Bool("force") || !cudasim.Built(dir) {
					if err := cudasim.BuildInto(dir); err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "built the CUDA simulator in %s (%s)\n", dir, cudasim.Compiler())
					return nil
				}
				fmt.Fprintf(c.App.Writer, "the CUDA simulator is built in %s\n", dir)
				return nil
			},
		}},
	}
}
