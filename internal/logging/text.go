package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// textHandler writes one line per record: an Event's Text, or a plain
// record's message and fields (key=value, fields without a value left
// out). Warnings and errors start with "warning: " and "error: ", debug
// records with "debug: ".
type textHandler struct {
	level  slog.Leveler
	fields []string // from WithAttrs, rendered
	prefix string   // from WithGroup: "group."
	out    *textOut
}

// textOut is the writer shared by a handler and those derived from it.
type textOut struct {
	mu       sync.Mutex
	w        io.Writer
	terminal bool
	width    int
	live     string // the Live line drawn in place; "" when none
}

func newTextHandler(w io.Writer, level slog.Leveler, terminal bool) *textHandler {
	width := 120
	if c, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && c > 20 {
		width = c
	}
	return &textHandler{level: level, out: &textOut{w: w, terminal: terminal, width: width}}
}

func (h *textHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level.Level() }

func (h *textHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.fields = slices.Clone(h.fields)
	for _, a := range as {
		c.fields = appendField(c.fields, h.prefix, a)
	}
	return &c
}

func (h *textHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.prefix = h.prefix + name + "."
	return &c
}

func (h *textHandler) Handle(_ context.Context, r slog.Record) error {
	var ev Event
	var fields []string
	r.Attrs(func(a slog.Attr) bool {
		if e, ok := a.Value.Any().(event); ok && a.Key == "" && a.Value.Kind() == slog.KindLogValuer {
			ev = e.Event
			return true
		}
		fields = appendField(fields, h.prefix, a)
		return true
	})
	var b strings.Builder
	switch {
	case r.Level >= slog.LevelError:
		b.WriteString("error: ")
	case r.Level >= slog.LevelWarn:
		b.WriteString("warning: ")
	case r.Level < slog.LevelInfo:
		b.WriteString("debug: ")
	}
	if ev != nil {
		b.WriteString(ev.Text())
	} else {
		b.WriteString(r.Message)
	}
	for _, f := range append(slices.Clone(h.fields), fields...) {
		b.WriteByte(' ')
		b.WriteString(f)
	}
	status, live := false, false
	if l, ok := ev.(Live); ok {
		status, live = true, l.Live()
	}
	return h.out.write(b.String(), status, live)
}

// write writes line. On a terminal a live status line is drawn in place;
// any other line is written above it, and a status line that is not live
// replaces it for good.
func (o *textOut) write(line string, status, live bool) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.terminal {
		_, err := io.WriteString(o.w, line+"\n")
		return err
	}
	if status && live {
		o.live = line
		_, err := io.WriteString(o.w, "\r"+o.cut(line)+"\x1b[K")
		return err
	}
	s := ""
	if o.live != "" {
		s = "\r\x1b[K"
	}
	s += line + "\n"
	if status {
		o.live = ""
	} else if o.live != "" {
		s += o.cut(o.live) + "\x1b[K"
	}
	_, err := io.WriteString(o.w, s)
	return err
}

// end leaves the live line on the screen as a finished line.
func (o *textOut) end() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.terminal && o.live != "" {
		io.WriteString(o.w, "\n")
		o.live = ""
	}
}

// cut shortens s to the terminal's width (less one column, so that the
// cursor never wraps).
func (o *textOut) cut(s string) string {
	limit := o.width - 1
	if utf8.RuneCountInString(s) <= limit {
		return s
	}
	n := 0
	for i := range s {
		if n == limit {
			return s[:i]
		}
		n++
	}
	return s
}

// appendField renders a as key=value (groups flattened to group.key),
// leaving out attributes without a value.
func appendField(fields []string, prefix string, a slog.Attr) []string {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, g := range v.Group() {
			fields = appendField(fields, p, g)
		}
		return fields
	}
	if a.Key == "" || (v.Kind() == slog.KindAny && v.Any() == nil) {
		return fields
	}
	return append(fields, prefix+a.Key+"="+textValue(v))
}

// textValue renders a value for a person: floats to 5 significant
// digits, strings quoted only when they hold spaces or quotes.
func textValue(v slog.Value) string {
	var s string
	switch v.Kind() {
	case slog.KindFloat64:
		return strconv.FormatFloat(v.Float64(), 'g', 5, 64)
	case slog.KindDuration:
		return v.Duration().String()
	case slog.KindTime:
		return v.Time().Format(time.RFC3339)
	case slog.KindString:
		s = v.String()
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			s = err.Error()
		} else {
			s = fmt.Sprint(v.Any())
		}
	default:
		return v.String()
	}
	if s == "" || strings.ContainsAny(s, " \t\n\"=") {
		return strconv.Quote(s)
	}
	return s
}
