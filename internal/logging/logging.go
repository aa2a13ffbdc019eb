// Package logging is how rpac reports what it does: typed events written
// through log/slog, as one human-readable line each (Text) or as one JSON
// object each (JSON, slog's JSONHandler).
//
// An Event is a struct that knows its name, its fields (only those that
// apply: a field that does not apply is left out, never written as nil or
// as a zero placeholder) and the line a person reads. The name and the
// fields are said once, in the struct's `log` tags (Name, Fields); the
// line is its Text method. Packages that do the work (training, export,
// serve) define their events and log them with Info/Warn/Debug on the
// *slog.Logger they are given; a plain slog record (slog.Warn("...", "k",
// v)) is rendered too, as its message and fields.
//
//	logging.Info(log, training.EvalEvent{Step: 100, Steps: 200, Split: "valid", CE: 7.396, Tokens: 249856, ...})
//
// Text:  eval step 100/200 on valid: CE 7.3960 (ppl 1630.2) over 249856 tokens
// JSON:  {"time":"…","level":"INFO","msg":"train.eval","step":100,"steps":200,"split":"valid","val_ce":7.396,…}
//
// On a terminal the text handler draws Live events (progress) in place on
// one line and keeps that line below the other lines.
package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
)

// Format is how records are written.
type Format string

const (
	// Text writes one human-readable line per record.
	Text Format = "text"
	// JSON writes one JSON object per record (slog.JSONHandler).
	JSON Format = "json"
)

// ParseFormat reads a --log-format value.
func ParseFormat(s string) (Format, error) {
	switch f := Format(strings.ToLower(strings.TrimSpace(s))); f {
	case Text, JSON:
		return f, nil
	}
	return "", fmt.Errorf("--log-format %q: want text or json", s)
}

// ParseLevel reads a --log-level value: debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
}

// An Event is one typed thing that happened: a struct that says its name
// and its fields in `log` tags (see Name; a Name method and an Attrs
// method say them instead) and the line a person reads. The name is the
// record's message, e.g. "train.eval", by which JSON consumers select
// events; the fields are only those that apply.
type Event interface {
	// Text is the line a person reads (no trailing newline).
	Text() string
}

// Live is implemented by events that report on work in progress: on a
// terminal, a text logger redraws the latest Live event in place (Live
// true) until one with Live false ends it as an ordinary line.
type Live interface {
	Live() bool
}

// New returns a logger that writes records of at least level to w in
// format f. Text loggers on a terminal redraw Live events in place.
func New(w io.Writer, f Format, level slog.Leveler) *slog.Logger {
	if level == nil {
		level = slog.LevelInfo
	}
	if f == JSON {
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: jsonValue}))
	}
	return NewText(w, level, IsTerminal(w))
}

// NewText returns a text logger on w; terminal selects drawing Live events
// in place (New decides it with IsTerminal).
func NewText(w io.Writer, level slog.Leveler, terminal bool) *slog.Logger {
	if level == nil {
		level = slog.LevelInfo
	}
	return slog.New(newTextHandler(w, level, terminal))
}

// Discard is a logger that writes nothing.
func Discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// jsonValue leaves out fields without a value and writes non-finite
// floats as the strings "NaN", "Inf" and "-Inf" (as metrics.jsonl does),
// which JSON has no numbers for.
func jsonValue(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindAny:
		if a.Value.Any() == nil {
			return slog.Attr{}
		}
	case slog.KindFloat64:
		if f := a.Value.Float64(); math.IsNaN(f) || math.IsInf(f, 0) {
			return slog.String(a.Key, nonFinite(f))
		}
	}
	return a
}

func nonFinite(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case f > 0:
		return "Inf"
	}
	return "-Inf"
}

// event carries an Event in a record: an attribute with an empty key whose
// value resolves to the group of the event's fields, which slog's handlers
// inline. The text handler finds the Event itself and writes its Text.
type event struct{ Event }

func (e event) LogValue() slog.Value { return slog.GroupValue(AttrsOf(e.Event)...) }

// Log writes ev on l at level (nothing when l is nil).
func Log(ctx context.Context, l *slog.Logger, level slog.Level, ev Event) {
	if l == nil || !l.Enabled(ctx, level) {
		return
	}
	l.LogAttrs(ctx, level, NameOf(ev), slog.Any("", event{ev}))
}

// Info writes ev on l at the info level.
func Info(l *slog.Logger, ev Event) { Log(context.Background(), l, slog.LevelInfo, ev) }

// Warn writes ev on l at the warning level.
func Warn(l *slog.Logger, ev Event) { Log(context.Background(), l, slog.LevelWarn, ev) }

// Debug writes ev on l at the debug level.
func Debug(l *slog.Logger, ev Event) { Log(context.Background(), l, slog.LevelDebug, ev) }

// Redraws reports whether l redraws Live events in place (a text logger
// on a terminal): work in progress may then report more often.
func Redraws(l *slog.Logger) bool {
	if l == nil {
		return false
	}
	h, ok := l.Handler().(*textHandler)
	return ok && h.out.terminal
}

// End finishes a Live line that l drew in place, so that what is written
// next to the terminal starts on a line of its own.
func End(l *slog.Logger) {
	if l == nil {
		return
	}
	if h, ok := l.Handler().(*textHandler); ok {
		h.out.end()
	}
}
