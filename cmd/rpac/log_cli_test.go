package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rpac-dev/rpac/training/metrics"
)

// rpacStreams runs the CLI and returns its stdout and stderr apart.
func rpacStreams(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), "RPAC_DATA=", "XDG_CACHE_HOME="+t.TempDir()), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(e.String(), "panic") || strings.Contains(e.String(), "goroutine ") {
		t.Fatalf("rpac %v panicked:\n%s", args, e.String())
	}
	return o.String(), e.String(), code
}

func lines(s string) []string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// checkTextLines: every line of the two streams is written once (no
// event twice, on one stream or across both), and none holds a nil field
// or slog's own key=value form.
func checkTextLines(t *testing.T, stdout, stderr string) {
	t.Helper()
	seen := map[string]string{}
	for _, s := range []struct{ name, text string }{{"stdout", stdout}, {"stderr", stderr}} {
		for _, l := range lines(s.text) {
			if where, dup := seen[l]; dup {
				t.Errorf("%s repeats a line of %s: %q", s.name, where, l)
			}
			seen[l] = s.name
			for _, bad := range []string{"<nil>", "=<nil>", "level=", "msg=", "time=", "NaN", "{"} {
				if strings.Contains(l, bad) {
					t.Errorf("%s line holds %q: %q", s.name, bad, l)
				}
			}
		}
	}
}

// count is the number of lines of s that match re.
func count(s, re string) int {
	n := 0
	r := regexp.MustCompile(re)
	for _, l := range lines(s) {
		if r.MatchString(l) {
			n++
		}
	}
	return n
}

// jsonEvents parses every line of s as one JSON object with a time, a
// level and a message, none with a null field.
func jsonEvents(t *testing.T, name, s string) []map[string]any {
	t.Helper()
	var evs []map[string]any
	for _, l := range lines(s) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%s: a line that is not a JSON object: %q: %v", name, l, err)
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := m[k]; !ok {
				t.Errorf("%s: %q lacks %q", name, l, k)
			}
		}
		for k, v := range m {
			if v == nil || v == "<nil>" {
				t.Errorf("%s: %q has a nil %q", name, l, k)
			}
		}
		evs = append(evs, m)
	}
	return evs
}

// named returns the events called msg.
func named(evs []map[string]any, msg string) []map[string]any {
	var out []map[string]any
	for _, e := range evs {
		if e["msg"] == msg {
			out = append(out, e)
		}
	}
	return out
}

// hasKeys fails unless ev has every key of want and none of absent.
func hasKeys(t *testing.T, ev map[string]any, want, absent []string) {
	t.Helper()
	for _, k := range want {
		if _, ok := ev[k]; !ok {
			t.Errorf("%v event lacks %q: %v", ev["msg"], k, ev)
		}
	}
	for _, k := range absent {
		if _, ok := ev[k]; ok {
			t.Errorf("%v event has %q, which does not apply: %v", ev["msg"], k, ev)
		}
	}
}

// shortTrain is a 4-step synthetic run evaluated at steps 2 and 4.
func shortTrain(out string) []string {
	return []string{"train", "--dataset", "synthetic", "--d-model", "16", "--layers", "1", "--heads", "2", "--context", "32",
		"--tokens-per-step", "64", "--steps", "4", "--eval-every", "2", "--eval-batches", "1", "--out", out}
}

// TestTrainLogText: each event of a short run is one line, once: the plan,
// the model, one line per evaluation, progress lines that never repeat a
// step, the summary on stdout only; no nil or placeholder fields; and
// metrics.jsonl keeps its records, the start record with the run's seed.
func TestTrainLogText(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run")
	stdout, stderr, code := rpacStreams(t, nil, shortTrain(run)...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, stdout, stderr)
	}
	checkTextLines(t, stdout, stderr)
	for re, n := range map[string]int{
		`^memory: .* planned of a .* budget .*; micro-batch 2 of 2 sequences at T=32$`:                                  1,
		`^model: model=fuzzy d_model=16 layers=1 heads=2 .*, \d+ parameters; training 4 steps × 64 tokens on synthetic`: 1,
		`^eval step 2/4 on synthetic-eval: CE \d+\.\d{4} \(ppl \d+\.\d\) over 64 tokens$`:                               1,
		`^eval step 4/4 on synthetic-eval: CE \d+\.\d{4} \(ppl \d+\.\d\) over 64 tokens$`:                               1,
		`^step 4/4 \[#+\] 100\.0% .* in \d+s  loss=\d`:                                                                  1,
		`trained`: 0,
	} {
		if got := count(stderr, re); got != n {
			t.Errorf("stderr: %d lines match %q, want %d:\n%s", got, re, n, stderr)
		}
	}
	steps := map[string]bool{}
	for _, l := range lines(stderr) {
		if m := regexp.MustCompile(`^step (\d+)/4 `).FindStringSubmatch(l); m != nil {
			if steps[m[1]] {
				t.Errorf("step %s reported twice:\n%s", m[1], stderr)
			}
			steps[m[1]] = true
		}
	}
	if !steps["1"] || !steps["4"] {
		t.Errorf("no first or last progress line:\n%s", stderr)
	}
	// The synthetic eval chunks here hold no answers: no recall is shown;
	// nor EMA or SWA figures, which are off.
	if regexp.MustCompile(`recall \d|EMA|SWA`).MatchString(stderr + stdout) {
		t.Errorf("fields that do not apply are shown:\n%s%s", stderr, stdout)
	}
	if out := lines(stdout); len(out) != 1 || !regexp.MustCompile(`^trained 4 steps \(\d+ parameters\): train CE \d+\.\d+ -> \d+\.\d+, final eval CE \d+\.\d+ \(ppl \d+\.\d\), \d+ tokens/s; run in `).MatchString(out[0]) {
		t.Errorf("stdout:\n%s", stdout)
	}

	recs, err := metrics.ReadJSONL(filepath.Join(run, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var stepRecs, evalRecs, start int
	for _, r := range recs {
		switch r.Kind() {
		case metrics.KindStart:
			start++
			if r.Start.Seed != 1 { // --seed's default
				t.Errorf("metrics.jsonl: the start record's seed is %v, want 1", r.Start.Seed)
			}
		case metrics.KindEval:
			evalRecs++
		case metrics.KindStep:
			if r.Loss.Present() {
				stepRecs++
			}
		}
	}
	if start != 1 || stepRecs != 4 || evalRecs != 2 {
		t.Errorf("metrics.jsonl: %d start, %d step and %d eval records, want 1, 4, 2", start, stepRecs, evalRecs)
	}
}

// TestTrainLogJSON: with --log-format json every line of both streams is
// one JSON object; the events carry their fields and only those that
// apply.
func TestTrainLogJSON(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run")
	stdout, stderr, code := rpacStreams(t, nil, append([]string{"--log-format", "json"}, shortTrain(run)...)...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, stdout, stderr)
	}
	errEvs, outEvs := jsonEvents(t, "stderr", stderr), jsonEvents(t, "stdout", stdout)
	for msg, n := range map[string]int{"train.memory": 1, "train.start": 1, "train.eval": 2} {
		if got := len(named(errEvs, msg)); got != n {
			t.Errorf("%d %s events on stderr, want %d:\n%s", got, msg, n, stderr)
		}
	}
	hasKeys(t, named(errEvs, "train.memory")[0], []string{"planned_bytes", "budget_bytes", "static_bytes", "eval_bytes", "lengths"}, nil)
	hasKeys(t, named(errEvs, "train.start")[0], []string{"model", "config", "params", "steps", "tokens_per_step", "dataset", "backend"},
		[]string{"controller", "ema", "swa", "chaos", "dropout_glide", "contexts", "resume_from"})
	for i, ev := range named(errEvs, "train.eval") {
		hasKeys(t, ev, []string{"step", "steps", "split", "val_ce", "val_ppl", "val_tokens"}, []string{"val_ce_ema", "val_ce_swa", "recall_acc"})
		if ev["step"] != float64(2*(i+1)) || ev["steps"] != 4.0 || ev["level"] != "INFO" {
			t.Errorf("eval event %d: %v", i, ev)
		}
	}
	prog := named(errEvs, "train.progress")
	var steps []float64
	for _, ev := range prog {
		steps = append(steps, ev["step"].(float64))
		hasKeys(t, ev, []string{"step", "steps", "loss", "lr"}, nil)
	}
	if len(prog) < 2 || !slices.IsSorted(steps) || len(slices.Compact(slices.Clone(steps))) != len(steps) || steps[len(steps)-1] != 4 {
		t.Fatalf("progress steps %v: want each at most once, from the first to 4", steps)
	}
	hasKeys(t, prog[0], nil, []string{"step_per_s", "eta_s", "elapsed_s"}) // no rate before the second update
	hasKeys(t, prog[len(prog)-1], []string{"elapsed_s", "step_per_s", "tok_per_s"}, []string{"eta_s"})
	if len(outEvs) != 1 || outEvs[0]["msg"] != "train.done" {
		t.Fatalf("stdout: %s", stdout)
	}
	hasKeys(t, outEvs[0], []string{"steps", "params", "train_ce_first", "train_ce", "val_ce", "val_ppl", "tok_per_s", "out"},
		[]string{"val_ce_ema", "val_ce_swa", "recall_acc"})
	if outEvs[0]["steps"] != 4.0 || outEvs[0]["out"] != run {
		t.Errorf("train.done: %v", outEvs[0])
	}
}

// TestExportEvalLog: export and eval write one line (text) or one JSON
// object (json) per event: the export, each length, each layer's fold,
// each verified length; eval's score.
func TestExportEvalLog(t *testing.T) {
	env := []string{"ORT_LIB=" + ortLib(t)}
	run := writeRun(t)
	args := func(out string) []string {
		return []string{"export", "--run", run, "--lengths", "16,32", "--out", out, "--verify", "--verify-batches", "1", "--verify-batch", "2", "--calib-batches", "2"}
	}

	out := filepath.Join(t.TempDir(), "text")
	stdout, stderr, code := rpacStreams(t, env, args(out)...)
	if code != 0 {
		t.Fatalf("export: exit %d:\n%s%s", code, stdout, stderr)
	}
	checkTextLines(t, stdout, stderr)
	if stderr != "" {
		t.Errorf("export logged on stderr at the info level:\n%s", stderr)
	}
	for re, n := range map[string]int{`^exported fuzzy model \(last weights, step 3\) to .* fold rpa, attention op, batch 1$`: 1,
		`^  L=16  model_L16\.onnx .* nodes  \d+\.\ds$`: 1, `^  L=32  model_L32\.onnx .*, running statistics calibrated on 2×4 chunks \(synthetic`: 1,
		`^    layer  [01]  bias \[`: 4, `^verify on `: 1, `^  L=(16|32)  \d+ tokens \(1×2\)  max\|Δlogit\| `: 2, `calibrated`: 1} {
		if got := count(stdout, re); got != n {
			t.Errorf("export: %d lines match %q, want %d:\n%s", got, re, n, stdout)
		}
	}
	stdout, stderr, code = rpacStreams(t, env, "eval", "--model", out, "--max-chunks", "2")
	if code != 0 {
		t.Fatalf("eval: exit %d:\n%s%s", code, stdout, stderr)
	}
	checkTextLines(t, stdout, stderr)
	if l := lines(stdout); len(l) != 1 || !strings.HasPrefix(l[0], "synthetic eval, L=32, 2 chunks (64 tokens): CE ") || stderr != "" {
		t.Errorf("eval: stdout\n%s\nstderr\n%s", stdout, stderr)
	}

	out = filepath.Join(t.TempDir(), "json")
	stdout, stderr, code = rpacStreams(t, env, append([]string{"--log-format", "json", "--log-level", "debug"}, args(out)...)...)
	if code != 0 {
		t.Fatalf("export: exit %d:\n%s%s", code, stdout, stderr)
	}
	evs := jsonEvents(t, "export stdout", stdout)
	for msg, n := range map[string]int{"export.done": 1, "export.length": 2, "export.fold": 4, "export.verify": 1, "export.verified": 2, "export.verify_limits": 1} {
		if got := len(named(evs, msg)); got != n {
			t.Errorf("%d %s events, want %d:\n%s", got, msg, n, stdout)
		}
	}
	if len(evs) != 11 {
		t.Errorf("%d events on stdout, want 11:\n%s", len(evs), stdout)
	}
	hasKeys(t, named(evs, "export.done")[0], []string{"model", "weights", "step", "dir", "manifest", "lengths", "fold", "attention", "batch", "dtype"},
		[]string{"quantize", "kv_cache"})
	for _, ev := range named(evs, "export.length") {
		if ev["T"] == 32.0 {
			hasKeys(t, ev, []string{"file", "bytes", "nodes", "seconds", "calibrated", "calib_batches", "calib_batch", "calib_source"}, []string{"kv_files"})
		} else {
			hasKeys(t, ev, []string{"file", "bytes", "nodes", "seconds"}, []string{"calibrated", "calib_batches", "calib_source", "kv_files"})
		}
	}
	for _, ev := range named(evs, "export.fold") {
		hasKeys(t, ev, []string{"T", "layer", "bias_min", "bias_max", "bias_mean", "clip_frac", "clip"}, []string{"rank", "rank_err"})
	}
	for _, ev := range named(evs, "export.verified") {
		hasKeys(t, ev, []string{"T", "tokens", "max_abs_logit_diff", "ce_onnxruntime", "ce_go_eval", "export_cost", "ce_batch_stats"}, []string{"kv_steps"})
	}
	// --log-level debug: the export's own events on stderr, each once.
	dbg := jsonEvents(t, "export stderr", stderr)
	if len(named(dbg, "export.calibrated")) != 1 || len(named(dbg, "export.compiled")) != 2 || named(dbg, "export.calibrated")[0]["level"] != "DEBUG" {
		t.Errorf("debug events:\n%s", stderr)
	}

	stdout, stderr, code = rpacStreams(t, env, "--log-format", "json", "eval", "--model", out, "--max-chunks", "2")
	if code != 0 {
		t.Fatalf("eval: exit %d:\n%s%s", code, stdout, stderr)
	}
	evs = jsonEvents(t, "eval stdout", stdout)
	if len(evs) != 1 || evs[0]["msg"] != "eval.done" || evs[0]["T"] != 32.0 || evs[0]["chunks"] != 2.0 || evs[0]["tokens"] != 64.0 || stderr != "" {
		t.Fatalf("eval: stdout\n%s\nstderr\n%s", stdout, stderr)
	}
	hasKeys(t, evs[0], []string{"data", "ce", "ppl", "model_tok_per_s", "tok_per_s", "onnxruntime", "provider"}, nil)
}

// TestLogFlags: bad values are refused with a clear message, a failed
// command is a JSON "error" event in json mode, and the flags given after
// the command get a hint.
func TestLogFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--log-format", "xml", "train", "--out", "x"}, `--log-format "xml": want text or json`},
		{[]string{"--log-level", "loud", "train", "--out", "x"}, `--log-level "loud": want debug, info, warn or error`},
		{[]string{"train", "--log-format", "json", "--out", "x"}, "global flags: give them before the command"},
	} {
		stdout, stderr, code := rpacStreams(t, nil, tc.args...)
		if code == 0 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr lacks %q:\n%s%s", tc.args, code, tc.want, stdout, stderr)
		}
	}
	stdout, stderr, code := rpacStreams(t, nil, "--log-format", "json", "train", "--dataset", "synthetic", "--steps", "-1", "--out", "x")
	evs := jsonEvents(t, "stderr", stderr)
	if code == 0 || stdout != "" || len(evs) != 1 || evs[0]["msg"] != "error" || evs[0]["level"] != "ERROR" ||
		!strings.Contains(fmt.Sprint(evs[0]["err"]), "--steps must not be negative") {
		t.Errorf("exit %d: stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestServeLogJSON: rpac serve in json mode announces its address as a
// serve.start object on stdout, logs its shutdown on stderr and its stop
// on stdout.
func TestServeLogJSON(t *testing.T) {
	env := []string{"ORT_LIB=" + ortLib(t)}
	run := writeRun(t)
	out := filepath.Join(t.TempDir(), "export")
	if got, code := rpacEnv(t, env, "export", "--run", run, "--lengths", "16", "--out", out); code != 0 {
		t.Fatalf("export: %s", got)
	}
	cmd := exec.Command(bin, "--log-format", "json", "serve", "--model", out, "--addr", "127.0.0.1:0", "--name", "tiny")
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() {
		t.Fatal("rpac serve printed nothing")
	}
	var start map[string]any
	if err := json.Unmarshal(sc.Bytes(), &start); err != nil || start["msg"] != "serve.start" {
		t.Fatalf("first line %q: %v", sc.Text(), err)
	}
	hasKeys(t, start, []string{"model", "dir", "lengths", "batch", "url", "max_batch", "max_wait_s", "queue", "tokenizer", "text_prompts"},
		[]string{"kv_cache_lengths"})
	url, _ := start["url"].(string)
	resp, err := http.Post(url+"/v1/score", "application/json", strings.NewReader(`{"ids": [0, 17, 113, 5]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(stdout)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("rpac serve after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("rpac serve did not stop on SIGTERM")
	}
	if evs := jsonEvents(t, "stdout", string(rest)); len(evs) != 1 || evs[0]["msg"] != "serve.stop" {
		t.Errorf("stdout after the start: %q", rest)
	}
	if evs := jsonEvents(t, "stderr", stderr.String()); len(evs) != 1 || evs[0]["msg"] != "serve.shutdown" {
		t.Errorf("stderr: %q", stderr.String())
	}
}
