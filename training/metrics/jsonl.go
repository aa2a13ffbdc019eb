// Package metrics records training runs: metrics.jsonl, one Record per
// line as a JSON object, and a progress line for people watching the run.
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
	"os"
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

// Discard is a Writer that writes nothing: the records of a data-parallel
// job's ranks other than rank 0.
func Discard() *Writer { return &Writer{path: "(discarded)"} }

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
func (w *Writer) Write(rec *Record) error { return w.write(rec, false) }

// WriteEval appends one record (an evaluation) and syncs it to disk at once,
// together with any buffered records.
func (w *Writer) WriteEval(rec *Record) error { return w.write(rec, true) }

// write encodes rec as one line, stamped with the time when it has none.
// durable flushes and syncs the file before returning.
func (w *Writer) write(rec *Record, durable bool) error {
	if w.f == nil { // Discard
		return nil
	}
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
	if w.f == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return w.err
	}
	return w.flushLocked()
}

// Close flushes, syncs and closes the file. It is safe to call twice.
func (w *Writer) Close() error {
	if w.f == nil {
		return nil
	}
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

// encodeRecord renders one line, newline included; a record without a
// time gets now's.
func encodeRecord(rec *Record, now time.Time) ([]byte, error) {
	r := *rec
	if r.Time == 0 {
		r.Time = Stamp(float64(now.UnixMilli()) / 1000)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// ReadJSONL reads a metrics.jsonl file. Blank lines are skipped; a last line
// without its newline that does not parse is taken as cut short by a killed
// process and ignored. Any other line that is not a JSON object is an error
// naming the line, as is a field of the wrong type.
func ReadJSONL(path string) ([]Record, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	var out []Record
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
		rec, err := decodeRecord(line)
		if err != nil {
			if !complete {
				break
			}
			return nil, fmt.Errorf("metrics: %s:%d: bad record: %v", path, lineNo, err)
		}
		out = append(out, rec)
	}
	return out, nil
}

// decodeRecord reads one line, which must be a JSON object.
func decodeRecord(line []byte) (Record, error) {
	var rec Record
	if t := bytes.TrimSpace(line); len(t) == 0 || t[0] != '{' {
		return rec, errors.New("not an object")
	}
	return rec, json.Unmarshal(line, &rec)
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
