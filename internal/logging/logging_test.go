package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
)

// testEvent has one optional field.
type testEvent struct {
	Step int
	CE   float64 // NaN: not measured
}

func (e testEvent) Name() string { return "test.eval" }

func (e testEvent) Attrs() []slog.Attr {
	a := []slog.Attr{slog.Int("step", e.Step)}
	if !math.IsNaN(e.CE) {
		a = append(a, slog.Float64("val_ce", e.CE))
	}
	return a
}

func (e testEvent) Text() string { return "eval at step " + strconv.Itoa(e.Step) }

// liveEvent is work in progress.
type liveEvent struct{ done, total int }

func (e liveEvent) Name() string       { return "test.progress" }
func (e liveEvent) Attrs() []slog.Attr { return []slog.Attr{slog.Int("done", e.done)} }
func (e liveEvent) Text() string       { return "done " + strconv.Itoa(e.done) }
func (e liveEvent) Live() bool         { return e.done < e.total }

func TestParse(t *testing.T) {
	for in, want := range map[string]Format{"text": Text, "json": JSON, " JSON ": JSON} {
		if got, err := ParseFormat(in); err != nil || got != want {
			t.Errorf("ParseFormat(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "xml", "logfmt"} {
		if _, err := ParseFormat(bad); err == nil || !strings.Contains(err.Error(), "want text or json") {
			t.Errorf("ParseFormat(%q): %v", bad, err)
		}
	}
	for in, want := range map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "WARNING": slog.LevelWarn, "error": slog.LevelError} {
		if got, err := ParseLevel(in); err != nil || got != want {
			t.Errorf("ParseLevel(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseLevel("loud"); err == nil || !strings.Contains(err.Error(), "--log-level") {
		t.Errorf("ParseLevel(loud): %v", err)
	}
}

// TestText: an event is its Text, a plain record its message and the
// fields that have a value, with the level as a prefix beyond info.
func TestText(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf, Text, slog.LevelInfo)
	Info(l, testEvent{Step: 3, CE: math.NaN()})
	Debug(l, testEvent{Step: 4}) // below the level
	l.Warn("checkpoint: loading the previous one", "dir", "runs/a b", "missing", nil, "err", errors.New("gone"), "ce", 7.123456789)
	l.With("stage", "x").Error("failed", slog.Group("req", "path", "/v1"))
	want := "eval at step 3\n" +
		`warning: checkpoint: loading the previous one dir="runs/a b" err=gone ce=7.1235` + "\n" +
		"error: failed stage=x req.path=/v1\n"
	if got := buf.String(); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

// TestJSON: one object per record, the event's fields inlined, absent
// fields and nil values left out, non-finite floats as strings.
func TestJSON(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf, JSON, slog.LevelInfo)
	Info(l, testEvent{Step: 3, CE: 7.5})
	Info(l, testEvent{Step: 4, CE: math.NaN()})
	l.Warn("skipped", "loss", math.Inf(1), "none", nil)
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines:\n%s", len(lines), buf.String())
	}
	var recs []map[string]any
	for _, line := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		recs = append(recs, m)
	}
	if r := recs[0]; r["msg"] != "test.eval" || r["level"] != "INFO" || r["step"] != 3.0 || r["val_ce"] != 7.5 || r["time"] == nil || len(r) != 5 {
		t.Errorf("event: %v", r)
	}
	if _, ok := recs[1]["val_ce"]; ok || len(recs[1]) != 4 {
		t.Errorf("a field that does not apply was written: %v", recs[1])
	}
	if r := recs[2]; r["loss"] != "Inf" || r["level"] != "WARN" || len(r) != 4 {
		t.Errorf("plain record: %v", r)
	}
	if strings.Contains(buf.String(), "null") || strings.Contains(buf.String(), "!ERROR") {
		t.Errorf("null or an encoding error in\n%s", buf.String())
	}
}

// TestTerminal: live events are drawn in place and stay below the other
// lines; a final one ends the line; End finishes a line left drawn.
func TestTerminal(t *testing.T) {
	var buf bytes.Buffer
	l := NewText(&buf, nil, true)
	if !Redraws(l) || Redraws(New(&buf, Text, nil)) || Redraws(New(&buf, JSON, nil)) {
		t.Fatal("Redraws")
	}
	Info(l, liveEvent{1, 3})
	Info(l, liveEvent{2, 3})
	Info(l, testEvent{Step: 5})
	Info(l, liveEvent{3, 3})
	Info(l, testEvent{Step: 6})
	Info(l, liveEvent{1, 2})
	End(l)
	End(l)
	want := "\rdone 1\x1b[K" + "\rdone 2\x1b[K" +
		"\r\x1b[Keval at step 5\ndone 2\x1b[K" + // above the live line, which is drawn again
		"\r\x1b[Kdone 3\n" + // the final state ends it
		"eval at step 6\n" +
		"\rdone 1\x1b[K\n" // End
	if got := buf.String(); got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

func TestIsTerminal(t *testing.T) {
	if IsTerminal(&bytes.Buffer{}) {
		t.Error("bytes.Buffer is a terminal")
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	if IsTerminal(f) {
		t.Error("the null device is a terminal")
	}
	tmp, _ := os.CreateTemp(t.TempDir(), "x")
	defer tmp.Close()
	if IsTerminal(tmp) {
		t.Error("a regular file is a terminal")
	}
}
