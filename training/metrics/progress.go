package metrics

import (
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Field is one extra value shown on the progress line.
type Field struct {
	Key   string
	Value float64
}

// F is shorthand for Field{Key: key, Value: value}; outside this package
// go vet rejects unkeyed Field literals, so build lists as
// metrics.Fields{metrics.F("loss", 4.1), metrics.F("lr", 3e-4)}.
func F(key string, value float64) Field { return Field{Key: key, Value: value} }

// Fields are shown in the order given.
type Fields []Field

// Progress reports the advance of long work. On a terminal it redraws one
// line in place (at most every RedrawEvery); elsewhere (a log file, a pipe)
// it prints a plain line at most every LogEvery. Finish always shows the
// final line.
//
//	step 1200/5000 [#####...............] 24.0%  3.10 step/s  76.2k tok/s  ETA 20m25s  loss=4.123 lr=0.0003
//
// Set the exported fields before the first Update. A Progress is safe for
// concurrent use.
type Progress struct {
	// Terminal selects in-place redrawing; NewProgress sets it with
	// IsTerminal.
	Terminal bool
	// TokensPerStep, when positive, adds a tokens/s rate.
	TokensPerStep int
	// LogEvery is the interval of plain lines (default 10 s).
	LogEvery time.Duration
	// RedrawEvery is the interval of terminal redraws (default 100 ms).
	RedrawEvery time.Duration
	// Width is the terminal width lines are cut to (default $COLUMNS, else 120).
	Width int

	mu       sync.Mutex
	w        io.Writer
	total    int
	unit     string
	now      func() time.Time
	created  time.Time
	started  bool
	t0       time.Time
	done0    int
	done     int
	fields   []Field
	lastOut  time.Time
	printed  bool
	dirty    bool // terminal line drawn and not yet ended by a newline
	finished bool
}

// NewProgress reports on w for work of total units (e.g. "step").
func NewProgress(w io.Writer, total int, unit string) *Progress {
	if unit == "" {
		unit = "it"
	}
	p := &Progress{
		Terminal:    IsTerminal(w),
		LogEvery:    10 * time.Second,
		RedrawEvery: 100 * time.Millisecond,
		w:           w,
		total:       total,
		unit:        unit,
		now:         time.Now,
	}
	if c, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && c > 20 {
		p.Width = c
	}
	p.created = p.now()
	return p
}

// IsTerminal reports whether w is an interactive terminal: an *os.File that
// is a character device other than the null device, with TERM not "dumb".
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || f == nil {
		return false
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	if null, err := os.Stat(os.DevNull); err == nil && os.SameFile(fi, null) {
		return false
	}
	return os.Getenv("TERM") != "dumb"
}

// Update records that done units are complete and shows the line if it is
// time to. Rates count from the first Update, so set-up time and the units
// done before a resume do not distort them.
func (p *Progress) Update(done int, fields Fields) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished {
		return
	}
	now := p.now()
	if !p.started {
		p.started = true
		p.t0, p.done0 = now, done
	}
	p.done = done
	p.fields = append(p.fields[:0], fields...)
	every := p.LogEvery
	if p.Terminal {
		every = p.RedrawEvery
	}
	if p.printed && now.Sub(p.lastOut) < every {
		return
	}
	p.emit(now, false)
}

// Clear erases the terminal line so other output can be printed; the next
// Update draws it again. It does nothing in plain mode.
func (p *Progress) Clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.Terminal && p.dirty {
		io.WriteString(p.w, "\r\x1b[K")
		p.dirty = false
		p.printed = false
	}
}

// Finish shows the final line (with the total time) and ends it with a
// newline. Later calls and Updates do nothing.
func (p *Progress) Finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished {
		return
	}
	p.emit(p.now(), true)
	p.finished = true
}

// emit writes the current line.
func (p *Progress) emit(now time.Time, final bool) {
	line := p.render(now, final)
	if p.Terminal {
		if w := p.width(); len(line) > w-1 {
			line = line[:w-1]
		}
		s := "\r" + line + "\x1b[K"
		if final {
			s += "\n"
		}
		io.WriteString(p.w, s)
		p.dirty = !final
	} else {
		io.WriteString(p.w, line+"\n")
	}
	p.printed = true
	p.lastOut = now
}

func (p *Progress) width() int {
	if p.Width > 20 {
		return p.Width
	}
	return 120
}

func (p *Progress) render(now time.Time, final bool) string {
	var b strings.Builder
	if p.total > 0 {
		frac := math.Min(1, math.Max(0, float64(p.done)/float64(p.total)))
		const barWidth = 20
		fill := int(frac * barWidth)
		fmt.Fprintf(&b, "%s %d/%d [%s%s] %5.1f%%", p.unit, p.done, p.total,
			strings.Repeat("#", fill), strings.Repeat(".", barWidth-fill), 100*frac)
	} else {
		fmt.Fprintf(&b, "%s %d", p.unit, p.done)
	}
	elapsed := now.Sub(p.t0).Seconds()
	rate := math.NaN()
	if p.started && elapsed > 0 && p.done > p.done0 {
		rate = float64(p.done-p.done0) / elapsed
	}
	if !math.IsNaN(rate) {
		fmt.Fprintf(&b, "  %.3g %s/s", rate, p.unit)
		if p.TokensPerStep > 0 {
			fmt.Fprintf(&b, "  %s tok/s", si(rate*float64(p.TokensPerStep)))
		}
	}
	switch {
	case final:
		fmt.Fprintf(&b, "  in %s", duration(now.Sub(p.created).Seconds()))
	case p.total > 0 && !math.IsNaN(rate) && p.done < p.total:
		fmt.Fprintf(&b, "  ETA %s", duration(float64(p.total-p.done)/rate))
	}
	for i, f := range p.fields {
		if i == 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, " %s=%.4g", f.Key, f.Value)
	}
	return b.String()
}

// si formats a rate with a k/M/G suffix.
func si(x float64) string {
	switch {
	case x >= 1e9:
		return fmt.Sprintf("%.3gG", x/1e9)
	case x >= 1e6:
		return fmt.Sprintf("%.3gM", x/1e6)
	case x >= 1e3:
		return fmt.Sprintf("%.3gk", x/1e3)
	}
	return fmt.Sprintf("%.3g", x)
}

// duration formats seconds as 1h02m03s, 4m05s or 6s.
func duration(sec float64) string {
	if math.IsNaN(sec) || math.IsInf(sec, 0) || sec > 1e8 {
		return "?"
	}
	s := int64(math.Round(sec))
	h, m := s/3600, s/60%60
	s %= 60
	switch {
	case h > 0:
		return fmt.Sprintf("%dh%02dm%02ds", h, m, s)
	case m > 0:
		return fmt.Sprintf("%dm%02ds", m, s)
	}
	return fmt.Sprintf("%ds", s)
}
