package metrics

import (
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/rpac-dev/rpac/internal/logging"
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

// Progress reports the advance of long work as ProgressEvents on a logger.
// A text logger on a terminal redraws one line in place (at most every
// RedrawEvery); any other logger (a text log file or pipe, JSON) gets an
// event at most every LogEvery. Finish always reports the final state, and
// each state is reported once: the last unit is left to Finish.
//
//	step 1200/5000 [#####...............] 24.0%  3.10 step/s  76.2k tok/s  ETA 20m25s  loss=4.123 lr=0.0003
//
// Set the exported fields before the first Update. A Progress is safe for
// concurrent use.
type Progress struct {
	// Event names the events (default "progress").
	Event string
	// Redraw selects the terminal cadence; NewProgress sets it when the
	// logger redraws in place.
	Redraw bool
	// TokensPerStep, when positive, adds a tokens/s rate.
	TokensPerStep int
	// LogEvery is the interval of events on a log (default 10 s).
	LogEvery time.Duration
	// RedrawEvery is the interval of terminal redraws (default 100 ms).
	RedrawEvery time.Duration

	mu       sync.Mutex
	log      *slog.Logger
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
	finished bool
}

// NewProgress reports on log for work of total units (e.g. "step").
func NewProgress(log *slog.Logger, total int, unit string) *Progress {
	if unit == "" {
		unit = "it"
	}
	p := &Progress{
		Event:       "progress",
		Redraw:      logging.Redraws(log),
		LogEvery:    10 * time.Second,
		RedrawEvery: 100 * time.Millisecond,
		log:         log,
		total:       total,
		unit:        unit,
		now:         time.Now,
	}
	p.created = p.now()
	return p
}

// Update records that done units are complete and reports it if it is
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
	if p.Redraw {
		every = p.RedrawEvery
	}
	if p.printed && now.Sub(p.lastOut) < every {
		return
	}
	if p.total > 0 && done >= p.total && !p.Redraw {
		return // Finish reports the last unit
	}
	p.emit(now, false)
}

// Finish reports the final state (with the total time). Later calls and
// Updates do nothing.
func (p *Progress) Finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished {
		return
	}
	p.emit(p.now(), true)
	p.finished = true
}

// emit logs the current state.
func (p *Progress) emit(now time.Time, final bool) {
	logging.Info(p.log, p.event(now, final))
	p.printed = true
	p.lastOut = now
}

// event is the current state.
func (p *Progress) event(now time.Time, final bool) ProgressEvent {
	e := ProgressEvent{Event: p.Event, Unit: p.unit, Done: p.done, Total: p.total, Fields: append(Fields(nil), p.fields...),
		Rate: math.NaN(), TokensPerS: math.NaN(), ETA: math.NaN(), Elapsed: math.NaN(), Final: final}
	elapsed := now.Sub(p.t0).Seconds()
	if p.started && elapsed > 0 && p.done > p.done0 {
		e.Rate = float64(p.done-p.done0) / elapsed
		if p.TokensPerStep > 0 {
			e.TokensPerS = e.Rate * float64(p.TokensPerStep)
		}
	}
	switch {
	case final:
		e.Elapsed = now.Sub(p.created).Seconds()
	case p.total > 0 && !math.IsNaN(e.Rate) && p.done < p.total:
		e.ETA = float64(p.total-p.done) / e.Rate
	}
	return e
}

// ProgressEvent is the state of work in progress. Rates, ETA and elapsed
// time are NaN (and left out) when they do not apply: no rate before the
// second update, no ETA on the final event, the elapsed time only there.
type ProgressEvent struct {
	Event      string // the event's name
	Unit       string // what is counted, e.g. "step"
	Done       int
	Total      int // 0: unknown
	Rate       float64
	TokensPerS float64
	ETA        float64 // seconds
	Elapsed    float64 // seconds since the Progress was created (final only)
	Final      bool
	Fields     Fields
}

// Name implements logging.Event.
func (e ProgressEvent) Name() string { return e.Event }

// Live implements logging.Live: only the final event ends the line.
func (e ProgressEvent) Live() bool { return !e.Final }

// Attrs are "<unit>" (units done), "<unit>s" (the total), "<unit>_per_s",
// "tok_per_s", "eta_s", "elapsed_s" and the extra fields, those that apply.
func (e ProgressEvent) Attrs() []slog.Attr {
	a := []slog.Attr{slog.Int(e.Unit, e.Done)}
	if e.Total > 0 {
		a = append(a, slog.Int(e.Unit+"s", e.Total))
	}
	for _, f := range []struct {
		key string
		v   float64
	}{{e.Unit + "_per_s", e.Rate}, {"tok_per_s", e.TokensPerS}, {"eta_s", e.ETA}, {"elapsed_s", e.Elapsed}} {
		if !math.IsNaN(f.v) {
			a = append(a, slog.Float64(f.key, f.v))
		}
	}
	for _, f := range e.Fields {
		a = append(a, slog.Float64(f.Key, f.Value))
	}
	return a
}

// Text is the progress line.
func (e ProgressEvent) Text() string {
	var b strings.Builder
	if e.Total > 0 {
		frac := math.Min(1, math.Max(0, float64(e.Done)/float64(e.Total)))
		const barWidth = 20
		fill := int(frac * barWidth)
		fmt.Fprintf(&b, "%s %d/%d [%s%s] %5.1f%%", e.Unit, e.Done, e.Total,
			strings.Repeat("#", fill), strings.Repeat(".", barWidth-fill), 100*frac)
	} else {
		fmt.Fprintf(&b, "%s %d", e.Unit, e.Done)
	}
	if !math.IsNaN(e.Rate) {
		fmt.Fprintf(&b, "  %.3g %s/s", e.Rate, e.Unit)
	}
	if !math.IsNaN(e.TokensPerS) {
		fmt.Fprintf(&b, "  %s tok/s", si(e.TokensPerS))
	}
	if !math.IsNaN(e.Elapsed) {
		fmt.Fprintf(&b, "  in %s", duration(e.Elapsed))
	}
	if !math.IsNaN(e.ETA) {
		fmt.Fprintf(&b, "  ETA %s", duration(e.ETA))
	}
	for i, f := range e.Fields {
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
