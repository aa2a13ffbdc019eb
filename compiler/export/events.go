package export

import (
	"fmt"
	"log/slog"
)

// The export's debug events, logged on Options.Log as each length is done
// (rpac export reports the results when all are).

// CalibratedEvent: the running statistics of a length were computed on
// data ("export.calibrated").
type CalibratedEvent struct {
	T, Batches, Batch int
	Source            string
}

func (e CalibratedEvent) Name() string { return "export.calibrated" }

func (e CalibratedEvent) Attrs() []slog.Attr {
	return []slog.Attr{slog.Int("T", e.T), slog.Int("batches", e.Batches), slog.Int("batch", e.Batch), slog.String("source", e.Source)}
}

func (e CalibratedEvent) Text() string {
	return fmt.Sprintf("L=%d: running statistics calibrated on %d×%d chunks (%s)", e.T, e.Batches, e.Batch, e.Source)
}

// CompiledEvent: the graphs of a length are written ("export.compiled").
type CompiledEvent struct {
	T       int
	File    string
	Bytes   int64
	Nodes   int
	Seconds float64
}

func (e CompiledEvent) Name() string { return "export.compiled" }

func (e CompiledEvent) Attrs() []slog.Attr {
	return []slog.Attr{slog.Int("T", e.T), slog.String("file", e.File), slog.Int64("bytes", e.Bytes), slog.Int("nodes", e.Nodes),
		slog.Float64("seconds", e.Seconds)}
}

func (e CompiledEvent) Text() string {
	return fmt.Sprintf("L=%d: wrote %s (%d nodes) in %.1fs", e.T, e.File, e.Nodes, e.Seconds)
}
