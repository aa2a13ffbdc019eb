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

	"github.com/rpac-dev/rpac/internal/logging"
	"github.com/urfave/cli/v2"
)

func main() {
	app := &cli.App{
		Name:   "rpac",
		Usage:  "train, export and serve transformers with a length-aware attention prior (RPA)",
		Flags:  logFlags(),
		Before: setupLogs,
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
		fail(cleanErr(err))
		os.Exit(exitCode(err))
	}
}

// fail reports a failed command on stderr: "rpac: <reason>", or an
// "error" event with --log-format json.
func fail(msg string) {
	if active.format == logging.JSON {
		logging.Log(context.Background(), active.log, slog.LevelError, failedEvent{Err: msg})
		return
	}
	logging.End(active.log) // a progress line drawn in place keeps its line
	fmt.Fprintln(os.Stderr, "rpac:", msg)
}

func cleanErr(err error) string {
	s := err.Error()
	// urfave/cli reports a non-numeric value as: invalid value "x" for flag -steps: parse error
	if strings.Contains(s, "parse error") || strings.Contains(s, "invalid syntax") {
		s += " (the flag wants a number)"
	}
	if strings.Contains(s, "flag provided but not defined: -log-") {
		s += " (--log-format and --log-level are global flags: give them before the command, e.g. rpac --log-format json train ...)"
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
