// Package metrics records training runs: metrics.jsonl, one JSON object per
// line, and a progress line for people watching the run.
//
// Each record is written whole with a single write call, so a process killed
// at any moment leaves at most a truncated last line, which ReadJSONL skips
// and the next Open removes.
package metrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"
)

// DefaultFlushEvery is how long buffered records may sit in memory.
const DefaultFlushEvery = 2 * time.Second

// maxBuffered forces a flush when this many bytes are pending.
const maxBuffered = 1 << 20

// Writer appends records to a metrics.jsonl file. Records from Write are
// buffered and flushed at least every flush interval (by a background
// goroutine) and on Close; WriteEval flushes everything pending and fsyncs
// the file.
// A Writer is safe for concurrent use.
type Writer struct {
	mu         sync.Mutex
	f          *os.File
	path       string
	buf        []byte
	lastFlush  time.Time
	flushEvery time.Duration
	err        error
	closed     bool
	stop       chan struct{}
	done       chan struct{}
	now        func() time.Time
}

// Open opens path for appending, creating it if needed, with
// DefaultFlushEvery. A truncated last line left by a killed process is
// removed first.
func Open(path string) (*Writer, error) { return OpenInterval(path, DefaultFlushEvery) }

// OpenInterval is Open with flushEvery bounding how long buffered records
// stay in memory (0 means DefaultFlushEvery).
func OpenInterval(path string, flushEvery time.Duration) (*Writer, error) {
	if flushEvery <= 0 {
		flushEvery = DefaultFlushEvery
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if err := dropPartialLine(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("metrics: %s: %w", path, err)
	}
	w := &Writer{
		f:          f,
		path:       path,
		flushEvery: flushEvery,
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
		now:        time.Now,
	}
	w.lastFlush = w.now()
	go w.flusher(flushEvery)
	return w, nil
}

// dropPartialLine truncates f after its last newline.
func dropPartialLine(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	end := size
	buf := make([]byte, 4096)
	for end > 0 {
		n := int64(len(buf))
		if n > end {
			n = end
		}
		if _, err := f.ReadAt(buf[:n], end-n); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			end = end - n + int64(i) + 1
			break
		}
		end -= n
	}
	if end == size {
		return nil
	}
	slog.Warn("metrics: removing a truncated last record", "file", f.Name(), "bytes", size-end)
	return f.Truncate(end)
}

func (w *Writer) flusher(every time.Duration) {
	defer close(w.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.mu.Lock()
			if len(w.buf) > 0 && w.now().Sub(w.lastFlush) >= w.flushEvery/2 {
				w.flushLocked()
			}
			w.mu.Unlock()
		}
	}
}

// Write appends one record (a training step); it is buffered.
func (w *Writer) Write(rec map[string]any) error { return w.write(rec, false) }

// WriteEval appends one record (an evaluation) and syncs it to disk at once,
// together with any buffered records.
func (w *Writer) WriteEval(rec map[string]any) error { return w.write(rec, true) }

// write encodes rec as one line: the keys "kind", "step" and "time" first
// (in that order, when present), then the others sorted. "time" (unix
// seconds) is added when rec lacks it. Non-finite floats are written as the
// strings "NaN", "Inf" and "-Inf" (JSON has no such numbers). durable
// flushes and syncs the file before returning.
func (w *Writer) write(rec map[string]any, durable bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return fmt.Errorf("metrics: %s: write after Close", w.path)
	}
	if w.err != nil {
		return w.err
	}
	line, err := encodeRecord(rec, w.now())
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	w.buf = append(w.buf, line...)
	if durable {
		if err := w.flushLocked(); err != nil {
			return err
		}
		return w.syncLocked()
	}
	if len(w.buf) >= maxBuffered || w.now().Sub(w.lastFlush) >= w.flushEvery {
		return w.flushLocked()
	}
	return nil
}

// Flush writes buffered records to the file (without fsync).
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return w.err
	}
	return w.flushLocked()
}

// Close flushes, syncs and closes the file. It is safe to call twice.
func (w *Writer) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return w.err
	}
	w.closed = true
	w.mu.Unlock()
	close(w.stop)
	<-w.done

	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.flushLocked()
	if err == nil {
		err = w.syncLocked()
	}
	if cerr := w.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("metrics: %w", cerr)
	}
	if w.err == nil {
		w.err = err
	}
	return err
}

// flushLocked writes all whole lines pending with one write call.
func (w *Writer) flushLocked() error {
	if w.err != nil {
		return w.err
	}
	w.lastFlush = w.now()
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.f.Write(w.buf)
	w.buf = w.buf[:0]
	if err != nil {
		w.err = fmt.Errorf("metrics: writing %s: %w", w.path, err)
	}
	return w.err
}

func (w *Writer) syncLocked() error {
	if w.err != nil {
		return w.err
	}
	if err := w.f.Sync(); err != nil {
		w.err = fmt.Errorf("metrics: syncing %s: %w", w.path, err)
	}
	return w.err
}

// leadKeys come first in a record, in this order.
var leadKeys = []string{"kind", "step", "time"}

// encodeRecord renders one line, newline included.
func encodeRecord(rec map[string]any, now time.Time) ([]byte, error) {
	keys := make([]string, 0, len(rec)+1)
	for _, k := range leadKeys {
		if _, ok := rec[k]; ok || k == "time" {
			keys = append(keys, k)
		}
	}
	var rest []string
	for k := range rec {
		if !slices.Contains(leadKeys, k) {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	keys = append(keys, rest...)

	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kj, _ := json.Marshal(k)
		b.Write(kj)
		b.WriteByte(':')
		v, ok := rec[k]
		if !ok { // the automatic time stamp
			b.WriteString(strconv.FormatFloat(float64(now.UnixMilli())/1000, 'f', 3, 64))
			continue
		}
		vj, err := encodeValue(v)
		if err != nil {
			return nil, fmt.Errorf("field %q: %w", k, err)
		}
		b.Write(vj)
	}
	b.WriteString("}\n")
	return b.Bytes(), nil
}

func encodeValue(v any) ([]byte, error) {
	var f float64
	switch x := v.(type) {
	case float64:
		f = x
	case float32:
		f = float64(x)
	default:
		return json.Marshal(v)
	}
	switch {
	case math.IsNaN(f):
		return []byte(`"NaN"`), nil
	case math.IsInf(f, 1):
		return []byte(`"Inf"`), nil
	case math.IsInf(f, -1):
		return []byte(`"-Inf"`), nil
	}
	return strconv.AppendFloat(nil, f, 'g', -1, 64), nil
}

// ReadJSONL reads a metrics.jsonl file. Blank lines are skipped; a last line
// without its newline that does not parse is taken as cut short by a killed
// process and ignored. Any other line that is not a JSON object is an error
// naming the line. Numbers decode as float64.
func ReadJSONL(path string) ([]map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	var out []map[string]any
	for lineNo := 1; len(data) > 0; lineNo++ {
		line := data
		complete := false
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data, complete = data[:i], data[i+1:], true
		} else {
			data = nil
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil || rec == nil {
			if !complete {
				break
			}
			if err == nil {
				err = errors.New("not an object")
			}
			return nil, fmt.Errorf("metrics: %s:%d: bad record: %v", path, lineNo, err)
		}
		out = append(out, rec)
	}
	return out, nil
}

// TruncateAfter drops the records of path whose "step" is beyond step (a
// resumed run writes them again from its checkpoint), keeping the others and
// their order. A missing file is not an error. The file is replaced
// atomically.
func TruncateAfter(path string, step int) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var kept []byte
	dropped := false
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var rec struct {
			Step *float64 `json:"step"`
		}
		if json.Unmarshal(line, &rec) == nil && rec.Step != nil && *rec.Step > float64(step) {
			dropped = true
			continue
		}
		if !bytes.HasSuffix(line, []byte("\n")) {
			continue // a partial last line
		}
		kept = append(kept, line...)
	}
	if !dropped {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, kept, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
