package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExportKVCacheGenerate: `rpac export --kv-cache` writes the prefill and
// decode graphs, `rpac inspect` checks them, and `rpac generate` on that
// export (through the cache) samples the tokens it samples on the export
// without them (running the full graph for every token).
func TestExportKVCacheGenerate(t *testing.T) {
	env := []string{"ORT_LIB=" + ortLib(t)}
	run := writeRun(t)
	plain := filepath.Join(t.TempDir(), "plain")
	cached := filepath.Join(t.TempDir(), "cached")
	for _, tc := range []struct {
		out  string
		args []string
	}{{plain, nil}, {cached, []string{"--kv-cache", "--verify", "--verify-batches", "1", "--verify-batch", "2"}}} {
		args := append([]string{"export", "--run", run, "--lengths", "16,32", "--out", tc.out, "--calib-batches", "2"}, tc.args...)
		got, code := rpacEnv(t, env, args...)
		if code != 0 {
			t.Fatalf("export %v: exit %d:\n%s", tc.args, code, got)
		}
		if kv := strings.Contains(got, "KV cache: model_L16.prefill.onnx, model_L16.decode.onnx"); kv != (tc.out == cached) {
			t.Fatalf("export %v: KV-cache line present %v:\n%s", tc.args, kv, got)
		}
		if tc.out == cached && !strings.Contains(got, "KV cache: 30 decode steps, max|Δlogit|") {
			t.Fatalf("export %v: no KV-cache verification line:\n%s", tc.args, got)
		}
	}
	for _, f := range []string{"model_L16.prefill.onnx", "model_L16.decode.onnx", "model_L32.prefill.onnx", "model_L32.decode.onnx"} {
		if _, err := os.Stat(filepath.Join(cached, f)); err != nil {
			t.Fatal(err)
		}
	}
	if got, code := rpacEnv(t, env, "inspect", cached); code != 0 || !strings.Contains(got, "hashes     ok") ||
		!strings.Contains(got, "kv cache   fixed-slots, 2 layers × 2 heads × head size 16, prefill and decode graphs at [16 32]") ||
		!strings.Contains(got, "model_L32.decode.onnx") {
		t.Fatalf("inspect: exit %d:\n%s", code, got)
	}
	var outs []string
	for _, dir := range []string{plain, cached} {
		got, code := rpacEnv(t, env, "generate", "--model", dir, "--ids", "0,17,113", "--max-new-tokens", "12", "--temperature", "0")
		if code != 0 || len(strings.Fields(got)) != 12 {
			t.Fatalf("generate %s: exit %d:\n%s", dir, code, got)
		}
		outs = append(outs, got)
	}
	got, code := rpacEnv(t, env, "generate", "--model", cached, "--ids", "0,17,113", "--max-new-tokens", "12", "--temperature", "0", "--recompute")
	if code != 0 {
		t.Fatalf("generate --recompute: exit %d:\n%s", code, got)
	}
	if outs[0] != outs[1] || outs[1] != got {
		t.Fatalf("greedy tokens differ: full graph %q, KV cache %q, --recompute %q", outs[0], outs[1], got)
	}
	if got, code := rpacEnv(t, env, "export", "--run", run, "--lengths", "16", "--out", t.TempDir(), "--kv-cache", "--quantize", "int8"); code == 0 || !strings.Contains(got, "quantiz") {
		t.Fatalf("--kv-cache with --quantize int8: exit %d:\n%s", code, got)
	}
}

// TestBenchGenerate: `rpac bench generate` times both paths and reports
// that they sampled the same tokens; bad flags are errors.
func TestBenchGenerate(t *testing.T) {
	env := []string{"ORT_LIB=" + ortLib(t)}
	got, code := rpacEnv(t, env, "bench", "generate", "--preset", "tiny", "--length", "16", "--prompt", "4", "--new-tokens", "6", "--rounds", "2", "--threads", "1")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, got)
	}
	for _, want := range []string{"round 1  recompute", "round 2  KV cache", "tokens/s", "same tokens: true"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if got, code := rpacEnv(t, env, "bench", "generate", "--preset", "tiny", "--length", "16", "--prompt", "10", "--new-tokens", "7"); code == 0 || !strings.Contains(got, "exceed --length 16") {
		t.Fatalf("prompt + new tokens > length: exit %d:\n%s", code, got)
	}
}
