// Command rpac trains the paper's Fuzzy-Gated transformer with its RPA
// attention prior, benchmarks the CPU backend, and (with the export tools)
// turns checkpoints into ONNX graphs.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"
)

func main() {
	app := &cli.App{
		Name:  "rpac",
		Usage: "train, export and serve transformers with a length-aware attention prior (RPA)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug|info|warn|error"},
		},
		Commands: []*cli.Command{
			trainCommand(),
			benchCommand(),
			plotCommand(),
			ablateCommand(),
			exportCommand(),
			evalCommand(),
			generateCommand(),
			serveCommand(),
			inspectCommand(),
			gpuCommand(),
			cudaSimCommand(),
		},
		ExitErrHandler: func(c *cli.Context, err error) {},
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.RunContext(ctx, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "rpac:", cleanErr(err))
		os.Exit(exitCode(err))
	}
}

func cleanErr(err error) string {
	s := err.Error()
	// urfave/cli reports a non-numeric value as: invalid value "x" for flag -steps: parse error
	if strings.Contains(s, "parse error") || strings.Contains(s, "invalid syntax") {
		s += " (the flag wants a number)"
	}
	return s
}

func exitCode(err error) int {
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return 1
}

func logger(c *cli.Context) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.String("log-level")))
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}
