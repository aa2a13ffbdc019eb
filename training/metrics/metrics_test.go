package metrics

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rpac-dev/rpac/internal/logging"
	"github.com/rpac-dev/rpac/training/data"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time            { return c.t }
func (c *fakeClock) add(d time.Duration)       { c.t = c.t.Add(d) }
func newClock() *fakeClock                     { return &fakeClock{time.Unix(1_700_000_000, 0)} }
func fileString(t *testing.T, p string) string { b, _ := os.ReadFile(p); return string(b) }

func TestWriterBuffersTrainAndSyncsEval(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	w, err := OpenInterval(path, time.Hour) // only explicit flushes in this test
	if err != nil {
		t.Fatal(err)
	}
	clock := newClock()
	w.mu.Lock()
	w.now = clock.now
	w.lastFlush = clock.now()
	w.mu.Unlock()

	if err := w.Write(&Record{Step: 1, Loss: N(5.5), LR: N(1e-3), Context: 64}); err != nil {
		t.Fatal(err)
	}
	if got := fileString(t, path); got != "" {
		t.Fatalf("train record written at once: %q", got)
	}
	epoch := 0
	if err := w.WriteEval(&Record{Step: 1, Time: 1.5, ValCE: N(5.25), GateDelta: N(math.NaN()), Epoch: &epoch, TauAtt: []float64{1}}); err != nil {
		t.Fatal(err)
	}
	want := `{"step":1,"time":1700000000.000,"loss":5.5,"context":64,"lr":0.001}` + "\n" +
		`{"step":1,"time":1.500,"epoch":0,"val_ce":5.25,"gate_delta":"NaN","tau_att":[1]}` + "\n"
	if got := fileString(t, path); got != want {
		t.Fatalf("file:\n%s\nwant:\n%s", got, want)
	}
	// A train record older than the flush interval triggers a flush.
	w.mu.Lock()
	w.flushEvery = time.Second
	w.mu.Unlock()
	clock.add(2 * time.Second)
	w.Write(&Record{Step: 2, Loss: N(float64(float32(5)))})
	if got := fileString(t, path); !strings.Contains(got, `"step":2`) {
		t.Fatalf("no flush after the interval: %q", got)
	}
	w.Write(&Record{Step: 3, GradNorm: N(math.Inf(-1))})
	if err := w.Write(&Record{Step: 4, TauAtt: []float64{math.NaN()}}); err == nil {
		t.Error("unencodable field accepted")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(&Record{}); err == nil {
		t.Error("write after Close accepted")
	}
	recs, err := ReadJSONL(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 4 || recs[3].Step != 3 || recs[3].GradNorm.Value() != math.Inf(-1) || !math.IsNaN(recs[1].GateDelta.Value()) ||
		!recs[1].GateDelta.Present() || recs[0].ValCE.Present() || recs[1].Epoch == nil || *recs[1].Epoch != 0 {
		t.Fatalf("records %+v", recs)
	}
}

// TestRecordKinds: every kind of record the trainer writes reads back as
// itself, the start record with its own fields (its chaos is a flag, a
// step's the factor).
func TestRecordKinds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	w, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	recs := []*Record{
		{Event: EventStart, Start: &Start{Model: "fuzzy", Chaos: true, Seed: 7, Config: json.RawMessage(`{"d_model":8}`)}},
		{Step: 1, TrainCE: N(3), Chaos: N(0.5), Context: 8},
		{Step: 2, Skipped: true, Loss: N(math.NaN()), SkippedTotal: 1},
		{Step: 2, ValCE: N(2.5), RecallBreakdown: &data.RecallBreakdown{ByDist: []data.RecallBucket{{Lo: 1, Hi: 4, Correct: 1, Total: 2}}}},
	}
	for _, r := range recs {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	got, err := ReadJSONL(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("%d records", len(got))
	}
	for i, want := range []Kind{KindStart, KindStep, KindSkipped, KindEval} {
		if k := got[i].Kind(); k != want {
			t.Errorf("record %d: kind %v, want %v", i, k, want)
		}
	}
	if s := got[0].Start; s == nil || !s.Chaos || s.Seed != 7 || s.Model != "fuzzy" || string(s.Config) != `{"d_model":8}` || got[0].Step != 0 {
		t.Errorf("start record %+v (%+v)", got[0], s)
	}
	if got[1].Chaos.Value() != 0.5 || got[1].Start != nil {
		t.Errorf("step record %+v", got[1])
	}
	if b := got[3].RecallBreakdown; b == nil || len(b.ByDist) != 1 || b.ByDist[0].Total != 2 {
		t.Errorf("eval record %+v", got[3])
	}
}

// TestReadEarlierRecords: lines as earlier versions wrote them (keys
// sorted, a NaN as null, a kind key) read into the same fields.
func TestReadEarlierRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	lines := `{"event":"start","time":1,"chaos":false,"config":{"model":"fuzzy"},"contexts":[64,128],"ema":true,"lengths":[{"T":64,"batch":4,"micro_batch":4}],"model":"fuzzy","seed":3}` + "\n" +
		`{"step":1,"time":1700000000.500,"batch":4,"bias_scale":0,"context":64,"grad_norm":1.5,"loss":4,"lr":0.001,"mu_entropy":null,"sat_frac":null,"tok_per_s":10,"tokens":256,"train_ce":4}` + "\n" +
		`{"step":2,"time":2,"context":64,"grad_norm":null,"loss":"Inf","skipped":true,"skipped_total":1}` + "\n" +
		`{"kind":"eval","step":2,"time":3,"epoch":0,"expert_usage":[[0.5,0.5]],"guardian_advantage":null,"swa_join":false,"train_ce_by_context":{"64":4},"val_ce":"NaN","val_ppl":"NaN"}` + "\n"
	os.WriteFile(path, []byte(lines), 0o644)
	recs, err := ReadJSONL(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 4 {
		t.Fatalf("%d records", len(recs))
	}
	if s := recs[0].Start; s == nil || !s.EMA || s.Seed != 3 || len(s.Contexts) != 2 || recs[0].Kind() != KindStart {
		t.Errorf("start %+v", recs[0])
	}
	st := recs[1]
	if st.Kind() != KindStep || st.TrainCE.Value() != 4 || !st.BiasScale.Present() || st.BiasScale.Value() != 0 || !math.IsNaN(st.MuEntropy.Value()) || st.Tokens != 256 {
		t.Errorf("step %+v", st)
	}
	if sk := recs[2]; sk.Kind() != KindSkipped || !math.IsInf(sk.Loss.Value(), 1) || !math.IsNaN(sk.GradNorm.Value()) {
		t.Errorf("skipped %+v", sk)
	}
	ev := recs[3]
	if ev.Kind() != KindEval || !math.IsNaN(ev.ValCE.Value()) || ev.Epoch == nil || ev.SWAJoin == nil || *ev.SWAJoin || ev.TrainCEByContext["64"] != 4 || ev.ExpertUsage[0][1] != 0.5 {
		t.Errorf("eval %+v", ev)
	}
}

func TestWriterBackgroundFlush(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	w, err := OpenInterval(path, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Write(&Record{Loss: N(1)})
	// Wait for the flusher (bounded, not a timing assertion).
	for i := 0; i < 500 && fileString(t, path) == ""; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if fileString(t, path) == "" {
		t.Fatal("buffered record never flushed")
	}
}

func TestAppendAfterKill(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	os.WriteFile(path, []byte(`{"step":1,"train_ce":2}`+"\n"+`{"step":2,"tr`), 0o644)

	recs, err := ReadJSONL(path)
	if err != nil || len(recs) != 1 {
		t.Fatalf("truncated last line: %v, %v", recs, err)
	}
	w, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteEval(&Record{Step: 2, ValCE: N(3)})
	w.Close()
	recs, err = ReadJSONL(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[1].Kind() != KindEval {
		t.Fatalf("after reopening: %v\n%s", recs, fileString(t, path))
	}
}

func TestReadJSONL(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, content string
		n             int
		err           string
	}{
		{"empty", "", 0, ""},
		{"whole", "{\"a\":1}\n{\"a\":2}\n", 2, ""},
		{"blank lines", "\n{\"a\":1}\n\n", 1, ""},
		{"no final newline but valid", "{\"a\":1}\n{\"a\":2}", 2, ""},
		{"truncated last", "{\"a\":1}\n{\"a\":", 1, ""},
		{"bad middle", "{\"a\":1}\n{oops\n{\"a\":2}\n", 0, ":2:"},
		{"not an object", "[1]\n", 0, "bad record"},
		{"wrong type", "{\"step\":\"x\"}\n", 0, ":1:"},
		{"null", "null\n", 0, "not an object"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_"))
			os.WriteFile(p, []byte(c.content), 0o644)
			recs, err := ReadJSONL(p)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || len(recs) != c.n {
				t.Fatalf("got %d records, %v; want %d", len(recs), err, c.n)
			}
		})
	}
	if _, err := ReadJSONL(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file read")
	}
}

func TestProgressPlain(t *testing.T) {
	var buf bytes.Buffer
	p := NewProgress(logging.New(&buf, logging.Text, nil), 100, "step")
	if p.Redraw {
		t.Fatal("a bytes.Buffer is not a terminal")
	}
	clock := newClock()
	p.now = clock.now
	p.created = clock.now()
	p.TokensPerStep = 1000
	p.LogEvery = 10 * time.Second

	p.Update(0, Fields{{"loss", 9.5}})
	for i := 1; i <= 60; i++ {
		clock.add(500 * time.Millisecond)
		p.Update(i, Fields{F("loss", 9.5-float64(i)/10), F("lr", 3e-4)})
	}
	p.Finish()
	p.Update(61, nil) // ignored after Finish
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	// Line at 0, then every 10 s (20 steps): 20, 40, 60, then the final one.
	if len(lines) != 5 {
		t.Fatalf("%d lines:\n%s", len(lines), buf.String())
	}
	if strings.Contains(buf.String(), "\r") {
		t.Error("carriage return in plain mode")
	}
	l := lines[2]
	for _, want := range []string{"step 40/100", "[########............]", "40.0%", "2 step/s", "2k tok/s", "ETA 30s", "loss=5.5", "lr=0.0003"} {
		if !strings.Contains(l, want) {
			t.Errorf("line %q lacks %q", l, want)
		}
	}
	if !strings.HasPrefix(lines[0], "step 0/100 [") || !strings.Contains(lines[0], "loss=9.5") || strings.Contains(lines[0], "/s") {
		t.Errorf("first line %q (no rate before the second update)", lines[0])
	}
	final := lines[4]
	if !strings.Contains(final, "step 60/100") || !strings.Contains(final, "in 30s") || strings.Contains(final, "ETA") {
		t.Errorf("final line %q", final)
	}
}

// TestProgressLastStepOnce: the last unit is reported once, by Finish,
// even when its Update comes after the interval.
func TestProgressLastStepOnce(t *testing.T) {
	var buf bytes.Buffer
	p := NewProgress(logging.New(&buf, logging.Text, nil), 3, "step")
	clock := newClock()
	p.now = clock.now
	p.created = clock.now()
	for i := 1; i <= 3; i++ {
		clock.add(time.Minute)
		p.Update(i, nil)
	}
	p.Finish()
	p.Finish()
	out := buf.String()
	for i := 1; i <= 3; i++ {
		if n := strings.Count(out, fmt.Sprintf("step %d/3 ", i)); n != 1 {
			t.Errorf("step %d reported %d times:\n%s", i, n, out)
		}
	}
	if !strings.Contains(out, "step 3/3 [####################] 100.0%") || !strings.Contains(out, " in 3m00s") {
		t.Errorf("final line:\n%s", out)
	}
}

// TestProgressJSON: on a JSON logger each report is one object with the
// fields that apply: no rate before the second update, an ETA until the
// end, the elapsed time only on the final one.
func TestProgressJSON(t *testing.T) {
	var buf bytes.Buffer
	p := NewProgress(logging.New(&buf, logging.JSON, nil), 4, "step")
	p.Event, p.TokensPerStep, p.LogEvery = "train.progress", 100, time.Second
	clock := newClock()
	p.now = clock.now
	p.created = clock.now()
	for i := 1; i <= 4; i++ {
		p.Update(i, Fields{F("loss", 5)})
		clock.add(2 * time.Second)
	}
	p.Finish()
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not JSON: %q: %v", line, err)
		}
		recs = append(recs, m)
	}
	if len(recs) != 4 { // steps 1, 2, 3 and the final one
		t.Fatalf("%d records:\n%s", len(recs), buf.String())
	}
	for i, m := range recs {
		if m["msg"] != "train.progress" || m["level"] != "INFO" || m["steps"] != 4.0 || m["loss"] != 5.0 || m["step"] != float64(min(i+1, 4)) {
			t.Errorf("record %d: %v", i, m)
		}
		_, rate := m["step_per_s"]
		_, tok := m["tok_per_s"]
		_, eta := m["eta_s"]
		_, el := m["elapsed_s"]
		final := i == 3
		if rate != (i > 0) || tok != (i > 0) || eta != (i > 0 && !final) || el != final {
			t.Errorf("record %d has rate %v, tok/s %v, ETA %v, elapsed %v: %v", i, rate, tok, eta, el, m)
		}
	}
	if recs[1]["step_per_s"] != 0.5 || recs[3]["elapsed_s"] != 8.0 {
		t.Errorf("rate %v, elapsed %v", recs[1]["step_per_s"], recs[3]["elapsed_s"])
	}
}

func TestProgressTerminal(t *testing.T) {
	var buf bytes.Buffer
	t.Setenv("COLUMNS", "60")
	p := NewProgress(logging.NewText(&buf, nil, true), 10, "step")
	if !p.Redraw {
		t.Fatal("a terminal logger does not redraw")
	}
	clock := newClock()
	p.now = clock.now
	p.created = clock.now()
	for i := 1; i <= 10; i++ {
		p.Update(i, Fields{{"loss", 1}})
		clock.add(50 * time.Millisecond) // 20 updates/s; at most 10 redraws/s
	}
	out := buf.String()
	if strings.Contains(out, "\n") {
		t.Fatalf("newline before Finish: %q", out)
	}
	if n := strings.Count(out, "\r"); n != 5 {
		t.Errorf("%d redraws for 10 updates 50 ms apart, want 5: %q", n, out)
	}
	for _, seg := range strings.Split(out, "\r")[1:] {
		if len(strings.TrimSuffix(seg, "\x1b[K")) > 59 {
			t.Errorf("line %q is wider than the terminal", seg)
		}
	}
	p.Finish()
	out = buf.String()
	if !strings.HasSuffix(out, "\n") || strings.Count(out, "\n") != 1 || !strings.Contains(out, "step 10/10") {
		t.Errorf("final draw %q", out)
	}
	p.Finish()
	if buf.String() != out {
		t.Error("second Finish wrote again")
	}
}

func TestFormatting(t *testing.T) {
	for sec, want := range map[float64]string{0: "0s", 59.4: "59s", 61: "1m01s", 3723: "1h02m03s", math.Inf(1): "?"} {
		if got := duration(sec); got != want {
			t.Errorf("duration(%v) = %q, want %q", sec, got, want)
		}
	}
	for x, want := range map[float64]string{12: "12", 76200: "76.2k", 1.5e6: "1.5M", 2e9: "2G"} {
		if got := si(x); got != want {
			t.Errorf("si(%v) = %q, want %q", x, got, want)
		}
	}
}
