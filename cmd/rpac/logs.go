package main

import (
	"log/slog"
	"os"

	"github.com/rpac-dev/rpac/internal/logging"
	"github.com/urfave/cli/v2"
)

// logFlags are the global flags of rpac's events.
func logFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug|info|warn|error: the least level of the events on stderr"},
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text (one line per event, for people) | json (one JSON object per event, log/slog's JSONHandler): stderr carries the progress events, stdout the results"},
	}
}

// streams are a command's two event streams, in the format of
// --log-format: log (stderr) reports the work as it goes (progress,
// evaluations, plans, warnings, server events), out (stdout) the command's
// results (train's summary, export's files and checks, eval's score,
// serve's address). Reports meant to be read as tables or documents (bench,
// inspect, generate, plot, ablate's table) stay text on stdout.
type streams struct {
	format logging.Format
	log    *slog.Logger
	out    *slog.Logger
}

// active is set up by setupLogs before any command runs (text until
// then); main reports a failed command on it.
var active = &streams{format: logging.Text,
	log: logging.New(os.Stderr, logging.Text, slog.LevelInfo), out: logging.New(os.Stdout, logging.Text, slog.LevelInfo)}

// setupLogs reads --log-format and --log-level and makes the loggers (the
// stderr logger also becomes slog's default, so packages that log on it
// follow the flags).
func setupLogs(c *cli.Context) error {
	f, err := logging.ParseFormat(c.String("log-format"))
	if err != nil {
		return err
	}
	level, err := logging.ParseLevel(c.String("log-level"))
	if err != nil {
		return err
	}
	active = &streams{format: f,
		log: logging.New(c.App.ErrWriter, f, level),
		out: logging.New(c.App.Writer, f, slog.LevelInfo)} // results are never filtered
	slog.SetDefault(active.log)
	return nil
}

// logger is the stderr event stream.
func logger(*cli.Context) *slog.Logger { return active.log }

// results is the stdout event stream.
func results(*cli.Context) *slog.Logger { return active.out }

// report writes result events on stdout.
func report(c *cli.Context, evs ...logging.Event) {
	for _, ev := range evs {
		logging.Info(results(c), ev)
	}
}
