package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/rpac-dev/rpac/training/plot"
	"github.com/urfave/cli/v2"
)

func plotCommand() *cli.Command {
	return &cli.Command{
		Name: "plot",
		Usage: "draw a run's diagnostics as PNGs (val CE and its rate of change, τ_att, H(μ), q(c), expert usage, Guardian, LR, B(T) heatmaps, recall), " +
			"or with --recall the recall of several runs in one PNG",
		ArgsUsage: "RUN [RUN...]",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "out", Usage: "directory for the PNGs (default: RUN/plots)"},
			&cli.StringFlag{Name: "recall", Usage: "write one PNG (this path) comparing the runs' recall: against the step, and by distance at each run's last evaluation"},
			&cli.StringFlag{Name: "labels", Usage: "with --recall: comma-separated names of the runs (default: their directory names)"},
		},
		Action: func(c *cli.Context) error {
			if c.String("recall") != "" {
				return plotRecall(c)
			}
			if c.Args().Len() != 1 {
				return fmt.Errorf("want one run directory (rpac plot RUN), got %d arguments; several runs go with --recall OUT.png", c.Args().Len())
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

// plotRecall draws the runs' recall into the --recall PNG.
func plotRecall(c *cli.Context) error {
	dirs := c.Args().Slice()
	if len(dirs) == 0 {
		return fmt.Errorf("--recall: want at least one run directory")
	}
	labels := splitList(c.String("labels"))
	if len(labels) != 0 && len(labels) != len(dirs) {
		return fmt.Errorf("--labels: %d names for %d runs", len(labels), len(dirs))
	}
	var runs []plot.RecallRun
	for i, d := range dirs {
		label := filepath.Base(strings.TrimRight(d, "/"))
		if len(labels) > 0 {
			label = labels[i]
		}
		r, err := plot.ReadRecallRun(d, label)
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	if err := plot.Recall(c.String("recall"), runs); err != nil {
		return err
	}
	fmt.Fprintln(c.App.Writer, c.String("recall"))
	return nil
}
