package main

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServeCommand: rpac serve, on an export with KV-cache graphs, answers
// a completion and a score on a port it picked, and exits 0 on SIGTERM.
func TestServeCommand(t *testing.T) {
	env := []string{"ORT_LIB=" + ortLib(t)}
	run := writeRun(t)
	out := filepath.Join(t.TempDir(), "export")
	if got, code := rpacEnv(t, env, "export", "--run", run, "--lengths", "16", "--batch", "2", "--kv-cache", "--out", out); code != 0 {
		t.Fatalf("export: %s", got)
	}
	cmd := exec.Command(bin, "serve", "--model", out, "--addr", "127.0.0.1:0", "--max-batch", "2", "--name", "tiny")
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatal("rpac serve printed nothing")
	}
	first := lines.Text()
	url := regexp.MustCompile(`http://127\.0\.0\.1:\d+`).FindString(first)
	if url == "" {
		t.Fatalf("no address in %q", first)
	}
	if !strings.Contains(first, "decode on the KV cache") || !strings.Contains(first, "prompts must be token ids") {
		t.Fatalf("rpac serve on a --kv-cache export without a tokenizer printed %q", first)
	}
	go io.Copy(io.Discard, stdout)
	for _, c := range []struct{ path, body, want string }{
		{"/v1/completions", `{"prompt": [0, 17, 113], "max_tokens": 4, "temperature": 0}`, `"model":"tiny"`},
		{"/v1/score", `{"ids": [0, 17, 113, 5]}`, `"perplexity":`},
	} {
		resp, err := http.Post(url+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), c.want) {
			t.Fatalf("%s: %d %s", c.path, resp.StatusCode, b)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("rpac serve after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("rpac serve did not stop on SIGTERM")
	}
}

func TestExportTritonCommand(t *testing.T) {
	run := writeRun(t)
	repo := filepath.Join(t.TempDir(), "repo")
	got, code := rpac(t, "export", "--run", run, "--lengths", "16", "--format", "triton", "--name", "tiny", "--batch", "4", "--out", repo)
	if code != 0 || !strings.Contains(got, "tritonserver --model-repository=/models") {
		t.Fatalf("export --format triton: exit %d:\n%s", code, got)
	}
	for _, f := range []string{"tiny_L16/config.pbtxt", "tiny_L16/1/model.onnx"} {
		if _, err := os.Stat(filepath.Join(repo, f)); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(filepath.Join(repo, "tiny_L16", "config.pbtxt"))
	if !strings.Contains(string(b), "max_batch_size: 4") {
		t.Fatalf("config.pbtxt:\n%s", b)
	}
	for _, args := range [][]string{{"--format", "tflite"}, {"--format", "triton", "--verify"}} {
		got, code := rpac(t, append([]string{"export", "--run", run, "--lengths", "16", "--out", t.TempDir()}, args...)...)
		if code == 0 || !strings.Contains(got, "--") {
			t.Errorf("%v: exit %d:\n%s", args, code, got)
		}
	}
}

// TestServeFlagChecks: the connection and answer limits are checked before
// anything is loaded.
func TestServeFlagChecks(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-conns", "0"}, "--max-conns must be positive"},
		{[]string{"--read-timeout", "0s"}, "--read-timeout must be positive"},
		{[]string{"--stream-idle-timeout", "-1s"}, "--stream-idle-timeout must be positive"},
		{[]string{"--max-response", "100", "--response-memory", "10"}, "--response-memory (10) must hold at least one answer of --max-response (100)"},
	} {
		got, code := rpac(t, append([]string{"serve", "--model", t.TempDir()}, c.args...)...)
		if code == 0 || !strings.Contains(got, c.want) {
			t.Errorf("%v: exit %d, %q; want an error with %q", c.args, code, got, c.want)
		}
	}
}

// TestBenchServeMix: rpac bench serve --mix against an export folder
// prints a row per kind of request, the RSS and the goroutine check, with
// no 5xx and every request answered in time; its flags are checked before
// anything is loaded.
func TestBenchServeMix(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--weights", "1,1,1"}, "want 4 weights"},
		{[]string{"--weights", "0,0,0,0"}, "all zero"},
		{[]string{"--malformed", "0.7", "--slow", "0.5"}, "add up to at most 1"},
		{[]string{"--requests", "-1"}, "--requests must not be negative"},
	} {
		got, code := rpac(t, append([]string{"bench", "serve", "--mix", "--model", t.TempDir()}, c.args...)...)
		if code == 0 || !strings.Contains(got, c.want) {
			t.Errorf("%v: exit %d, %q; want an error with %q", c.args, code, got, c.want)
		}
	}
	env := []string{"ORT_LIB=" + ortLib(t)}
	out := filepath.Join(t.TempDir(), "export")
	if got, code := rpacEnv(t, env, "export", "--run", writeRun(t), "--lengths", "16", "--batch", "2", "--kv-cache", "--out", out); code != 0 {
		t.Fatalf("export: %s", got)
	}
	got, code := rpacEnv(t, env, "bench", "serve", "--model", out, "--mix", "--clients", "4", "--requests", "0", "--duration", "1s",
		"--read-timeout", "300ms", "--settle", "200ms", "--warmup", "0", "--max-batch", "2", "--prompt-len", "3", "--gen-tokens", "4",
		"--score-len", "6", "--infer-len", "4", "--top-k", "3", "--malformed", "0.2", "--slow", "0.1")
	if code != 0 {
		t.Fatalf("bench serve --mix: exit %d:\n%s", code, got)
	}
	for _, want := range []string{"completion ", "stream ", "score ", "kserve ", "malformed ", "slow ", "peak ", "goroutines: ",
		"none left over", "every request answered or refused in time; 5xx: 0"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in:\n%s", want, got)
		}
	}
}
