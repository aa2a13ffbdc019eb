package main

import (
	"fmt"
	"path/filepath"

	"github.com/rpac-dev/rpac/training/plot"
	"github.com/urfave/cli/v2"
)

func plotCommand() *cli.Command {
	return &cli.Command{
		Name:      "plot",
		Usage:     "draw a run's diagnostics as PNGs (val CE and its rate of change, τ_att, H(μ), q(c), expert usage, Guardian, LR, B(T) heatmaps)",
		ArgsUsage: "RUN",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "out", Usage: "directory for the PNGs (default: RUN/plots)"},
		},
		Action: func(c *cli.Context) error {
			if c.Args().Len() != 1 {
				return fmt.Errorf("want one run directory (rpac plot RUN), got %d arguments", c.Args().Len())
			}
			run := c.Args().First()
			out := c.String("out")
			if out == "" {
				out = filepath.Join(run, "plots")
			}
			files, err := plot.Run(run, out)
			if err != nil {
				return err
			}
			for _, f := range files {
				fmt.Fprintln(c.App.Writer, f)
			}
			return nil
		},
	}
}
