package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/rpac-dev/rpac/training/data"
)

// ortLib returns the onnxruntime library for the CLI subprocesses; a test
// that needs it skips when it is missing, except under CI=true, where it
// fails.
func ortLib(t *testing.T) string {
	t.Helper()
	lib, err := runtime.LibraryPath("")
	if err == nil {
		err = runtime.Available()
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and onnxruntime is unavailable: %v", err)
		}
		t.Skipf("onnxruntime unavailable: %v", err)
	}
	return lib
}

// rpacEnv runs the CLI with extra environment variables.
func rpacEnv(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), "RPAC_DATA=", "XDG_CACHE_HOME="+t.TempDir()), env...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "panic") || strings.Contains(string(out), "goroutine ") {
		t.Fatalf("rpac %v panicked:\n%s", args, out)
	}
	return string(out), code
}

// writeRun writes a run directory holding a random-init checkpoint of a
// small fuzzy model on the synthetic corpus, in the trainer's format, with
// trained running statistics at context 16 only.
func writeRun(t *testing.T) string {
	t.Helper()
	return writeRunOf(t, "synthetic", data.SyntheticVocab)
}

// writeRunOf is writeRun of a run on dataset with a vocabulary of vocab ids.
func writeRunOf(t *testing.T, dataset string, vocab int) string {
	t.Helper()
	p, _ := model.LookupPreset("tiny")
	cfg := p.Config
	cfg.Vocab, cfg.DModel, cfg.Heads, cfg.Layers, cfg.MaxLen, cfg.Experts, cfg.TopK = vocab, 32, 2, 2, 64, 2, 1
	const T = 16
	st := kernels.NewStore(ir.FP32)
	mg, err := model.Build(&cfg, model.Opts{T: T, B: 1, Mode: model.Train})
	if err != nil {
		t.Fatal(err)
	}
	specs := mg.Specs
	mg, err = model.Build(&cfg, model.Opts{T: T, B: 1, Mode: model.Eval})
	if err != nil {
		t.Fatal(err)
	}
	especs := mg.Specs
	if err := model.InitStore(append(specs, especs...), st, 1); err != nil {
		t.Fatal(err)
	}
	running := map[string]bool{}
	for _, s := range especs {
		if s.Running != "" {
			running[s.Name] = true
		}
	}
	state, _ := json.Marshal(map[string]any{"format": 1, "step": 3, "config": cfg, "preset": "tiny", "context": T, "batch": 2,
		"dataset": dataset, "protocol": dataset, "running_initialised": running, "options": map[string]any{"Seed": 1}})
	dir := filepath.Join(t.TempDir(), "run")
	if err := checkpoint.Save(filepath.Join(dir, "checkpoint"), &checkpoint.Checkpoint{Weights: checkpoint.FromStore(st), State: state}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestExportServe: export a run at two lengths (one calibrated on the
// synthetic corpus), verify it, then evaluate, sample and inspect it.
func TestExportServe(t *testing.T) {
	env := []string{"ORT_LIB=" + ortLib(t)}
	run := writeRun(t)
	out := filepath.Join(t.TempDir(), "export")
	got, code := rpacEnv(t, env, "export", "--run", run, "--lengths", "16,32", "--out", out, "--verify", "--verify-batches", "1", "--verify-batch", "2", "--calib-batches", "2")
	if code != 0 {
		t.Fatalf("export: exit %d:\n%s", code, got)
	}
	for _, want := range []string{"L=16", "L=32", "calibrated", "max|Δlogit|", "CE batch-stats"} {
		if !strings.Contains(got, want) {
			t.Errorf("export output lacks %q:\n%s", want, got)
		}
	}
	for _, f := range []string{"model_L16.onnx", "model_L32.onnx", "manifest.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatal(err)
		}
	}
	got, code = rpacEnv(t, env, "eval", "--model", out, "--dataset", "synthetic", "--split", "eval", "--max-chunks", "4")
	if code != 0 || !strings.Contains(got, "perplexity") || !strings.Contains(got, "L=32") {
		t.Fatalf("eval: exit %d:\n%s", code, got)
	}
	got, code = rpacEnv(t, env, "generate", "--model", out, "--ids", "0,17,113", "--max-new-tokens", "5", "--temperature", "0")
	if code != 0 || len(strings.Fields(got)) != 5 {
		t.Fatalf("generate: exit %d:\n%s", code, got)
	}
	got2, _ := rpacEnv(t, env, "generate", "--model", out, "--ids", "0,17,113", "--max-new-tokens", "5", "--temperature", "0")
	if got2 != got {
		t.Fatalf("greedy generation is not deterministic: %q vs %q", got, got2)
	}
	for _, tc := range []struct{ path, want string }{
		{out, "hashes     ok"},
		{filepath.Join(out, "model_L32.onnx"), "lengths    16,32 (this file: 32)"},
		{run, "running statistics stored for [16]"},
		{filepath.Join(run, "checkpoint", "model.safetensors"), "parameters"},
	} {
		got, code := rpacEnv(t, env, "inspect", tc.path)
		if code != 0 || !strings.Contains(got, tc.want) {
			t.Errorf("inspect %s: exit %d, want %q:\n%s", tc.path, code, tc.want, got)
		}
	}
}

// TestExportVerifyLimits: --verify fails, naming the limit, when a length's
// max |Δlogit| or CE cost is above it, and says which limits held when it
// passes; a limit that is not a positive number is refused.
func TestExportVerifyLimits(t *testing.T) {
	env := []string{"ORT_LIB=" + ortLib(t)}
	run := writeRun(t)
	args := func(extra ...string) []string {
		return append([]string{"export", "--run", run, "--lengths", "16", "--out", filepath.Join(t.TempDir(), "e"),
			"--verify", "--verify-batches", "1", "--verify-batch", "2", "--calib-batches", "2"}, extra...)
	}
	got, code := rpacEnv(t, env, args("--quantize", "int8")...)
	if code != 0 || !strings.Contains(got, "within the limits: mean KL 0.001, CE cost 0.01 nats, max |Δlogit| 2") {
		t.Fatalf("int8 within its default limits: exit %d:\n%s", code, got)
	}
	for _, tc := range []struct{ flag, val, want string }{
		{"--verify-max-diff", "1e-12", "max |Δlogit|"},
		{"--verify-max-kl", "1e-15", "mean KL"},
		{"--verify-max-ce-cost", "-1", "must be a positive number"},
		{"--verify-max-diff", "NaN", "must be a positive number"},
	} {
		got, code := rpacEnv(t, env, args("--quantize", "int8", tc.flag, tc.val)...)
		if code == 0 || !strings.Contains(got, tc.want) {
			t.Errorf("%s %s: exit %d, want %q:\n%s", tc.flag, tc.val, code, tc.want, got)
		}
		if strings.HasPrefix(tc.val, "1e-1") && !strings.Contains(got, "exceeds the limit "+tc.val) {
			t.Errorf("the failure does not name the limit:\n%s", got)
		}
	}
}

// TestExportHF: --format hf of a run on GPT-2 tokens writes the Hugging
// Face layout at its trained length and says so; two lengths are refused.
func TestExportHF(t *testing.T) {
	run := writeRunOf(t, "wikitext2", 50257)
	out := filepath.Join(t.TempDir(), "hf")
	got, code := rpac(t, "export", "--run", run, "--format", "hf", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, got)
	}
	if !strings.Contains(got, "wrote the Hugging Face layout to "+out) || !strings.Contains(got, "L 16") {
		t.Errorf("output:\n%s", got)
	}
	for _, f := range []string{"onnx/model.onnx", "config.json", "generation_config.json", "genai_config.json", "tokenizer.json", "tokenizer_config.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
	got, code = rpac(t, "export", "--run", run, "--format", "hf", "--lengths", "16,32", "--out", filepath.Join(t.TempDir(), "two"))
	if code == 0 || !strings.Contains(got, "--format hf exports one frame length") {
		t.Errorf("two lengths: exit %d:\n%s", code, got)
	}
}

// TestExportBadInput: clear errors, non-zero exits, no panics.
func TestExportBadInput(t *testing.T) {
	run := writeRun(t)
	empty := t.TempDir()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"zero length", []string{"--run", run, "--lengths", "0"}, "not a positive integer"},
		{"negative length", []string{"--run", run, "--lengths", "16,-4"}, "not a positive integer"},
		{"text length", []string{"--run", run, "--lengths", "long"}, "not a positive integer"},
		{"length beyond max_len", []string{"--run", run, "--lengths", "16,65"}, "exceeds the model's maximum length 64"},
		{"run without checkpoint", []string{"--run", empty}, "holds no checkpoint"},
		{"missing run", []string{"--run", filepath.Join(empty, "nope")}, "nope"},
		{"no source", nil, "--run DIR or --checkpoint"},
		{"ema missing", []string{"--run", run, "--weights", "ema"}, "no EMA weights"},
		{"swa missing", []string{"--run", run, "--weights", "swa"}, "swa.<param>"},
		{"bad weights", []string{"--run", run, "--weights", "best"}, `--weights "best": want last, ema or swa`},
		{"bad fold", []string{"--run", run, "--fold", "some"}, `--fold "some": want rpa, rank, rank-approx or none`},
		{"bad attention", []string{"--run", run, "--attention", "flash"}, `--attention "flash": want op, op8, plain or none`},
		{"attention none", []string{"--run", run, "--attention", "none"}, "--attention none: an export writes op, op8 or plain"},
		{"bad quantize", []string{"--run", run, "--quantize", "int4"}, `--quantize "int4": want none or int8`},
		{"bad dump pass", []string{"--run", run, "--dump-ir", "cse"}, "not a pass"},
		{"no calibration", []string{"--run", run, "--lengths", "32", "--calib-batches", "0"}, "--calib-batches"},
		{"zero calibration batch", []string{"--run", run, "--calib-batch", "0"}, "--calib-batch must be positive"},
		{"calibrate never", []string{"--run", run, "--lengths", "16,32", "--calibrate", "never"}, "--calibrate is never"},
		{"bad calibrate", []string{"--run", run, "--calibrate", "sometimes"}, "--calibrate"},
		{"bad format", []string{"--run", run, "--format", "tf"}, `--format "tf": want onnx, triton or hf`},
		{"hf verify", []string{"--run", run, "--format", "hf", "--verify"}, "--verify checks a runtime export"},
		{"hf without GPT-2 tokens", []string{"--run", run, "--format", "hf", "--lengths", "16"}, "--format hf writes GPT-2's tokenizer files"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "export")
			got, code := rpac(t, append(append([]string{"export"}, tc.args...), "--out", out)...)
			if code == 0 {
				t.Fatalf("exit 0:\n%s", got)
			}
			if strings.Contains(got, "panic") || strings.Contains(got, "goroutine ") {
				t.Fatalf("panicked:\n%s", got)
			}
			if !strings.Contains(got, tc.want) {
				t.Fatalf("message does not mention %q:\n%s", tc.want, got)
			}
			if _, err := os.Stat(filepath.Join(out, "manifest.json")); err == nil {
				t.Fatal("a failed export left a manifest")
			}
		})
	}
	// A corrupt checkpoint file.
	bad := writeRun(t)
	f := filepath.Join(bad, "checkpoint", "model.safetensors")
	b, _ := os.ReadFile(f)
	b[len(b)/2] ^= 0xff
	os.WriteFile(f, b, 0o644)
	if got, code := rpac(t, "export", "--run", bad, "--out", t.TempDir()); code == 0 || !strings.Contains(got, "corrupt") {
		t.Fatalf("corrupt checkpoint: exit %d:\n%s", code, got)
	}
}

// TestServeBadInput: a corrupt manifest or model, a missing onnxruntime
// library and token ids outside the vocabulary give clear errors.
func TestServeBadInput(t *testing.T) {
	lib := ortLib(t)
	env := []string{"ORT_LIB=" + lib}
	run := writeRun(t)
	good := filepath.Join(t.TempDir(), "export")
	if got, code := rpacEnv(t, env, "export", "--run", run, "--out", good); code != 0 {
		t.Fatalf("export: %s", got)
	}
	copyDir := func() string {
		dst := filepath.Join(t.TempDir(), "export")
		os.MkdirAll(dst, 0o755)
		ents, _ := os.ReadDir(good)
		for _, e := range ents {
			b, _ := os.ReadFile(filepath.Join(good, e.Name()))
			os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644)
		}
		return dst
	}
	corruptManifest := copyDir()
	os.WriteFile(filepath.Join(corruptManifest, "manifest.json"), []byte(`{"format": 1, "lengths": [16`), 0o644)

	unknownTokenizer := copyDir()
	mtb, _ := os.ReadFile(filepath.Join(unknownTokenizer, "manifest.json"))
	os.WriteFile(filepath.Join(unknownTokenizer, "manifest.json"), []byte(strings.Replace(string(mtb), `"tokenizer": "synthetic"`, `"tokenizer": "mystery-bpe"`, 1)), 0o644)

	changedModel := copyDir()
	mf := filepath.Join(changedModel, "model_L16.onnx")
	b, _ := os.ReadFile(mf)
	b[len(b)-10] ^= 0xff
	os.WriteFile(mf, b, 0o644)

	garbageModel := copyDir() // not ONNX at all, with a manifest that matches it
	gf := filepath.Join(garbageModel, "model_L16.onnx")
	os.WriteFile(gf, []byte("this is not an onnx model"), 0o644)
	var man runtime.Manifest
	mb, _ := os.ReadFile(filepath.Join(garbageModel, "manifest.json"))
	json.Unmarshal(mb, &man)
	fe, err := runtime.NewFile(garbageModel, "model_L16.onnx", 16)
	if err != nil {
		t.Fatal(err)
	}
	man.Files = []runtime.File{fe}
	if err := runtime.WriteManifest(garbageModel, &man); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"corrupt manifest", env, []string{"eval", "--model", corruptManifest, "--dataset", "synthetic"}, "not a valid manifest"},
		{"changed model", env, []string{"generate", "--model", changedModel, "--ids", "1"}, "sha256"},
		{"garbage model", env, []string{"generate", "--model", garbageModel, "--ids", "1"}, "not a readable ONNX model"},
		{"inspect garbage", env, []string{"inspect", gf}, "not an ONNX model"},
		{"no export", env, []string{"eval", "--model", t.TempDir(), "--dataset", "synthetic"}, "rpac export"},
		{"unknown tokenizer", env, []string{"eval", "--model", unknownTokenizer}, "mystery-bpe"},
		{"missing library", []string{"ORT_LIB=/nonexistent/libonnxruntime.so"}, []string{"generate", "--model", good, "--ids", "1"}, "fetch-onnxruntime.sh"},
		{"missing library eval", []string{"ORT_LIB=/nonexistent/libonnxruntime.so"}, []string{"eval", "--model", good, "--dataset", "synthetic"}, "fetch-onnxruntime.sh"},
		{"id beyond vocabulary", env, []string{"generate", "--model", good, "--ids", "1,512"}, "outside the model's vocabulary"},
		{"negative id", env, []string{"generate", "--model", good, "--ids", "-1"}, "outside the model's vocabulary"},
		{"length beyond export", env, []string{"eval", "--model", good, "--dataset", "synthetic", "--length", "17"}, "exceeds the longest exported length"},
		{"negative length", env, []string{"eval", "--model", good, "--dataset", "synthetic", "--length", "-1"}, "--length"},
		{"wikitext ids for a synthetic model", env, []string{"eval", "--model", good, "--dataset", "wikitext2", "--data-dir", filepath.Join(t.TempDir(), "none")}, "none"},
		{"bad provider", env, []string{"generate", "--model", good, "--ids", "1", "--provider", "tpu"}, "provider"},
		{"inspect nothing", env, []string{"inspect", filepath.Join(t.TempDir(), "missing.onnx")}, "missing.onnx"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, code := rpacEnv(t, tc.env, tc.args...)
			if code == 0 {
				t.Fatalf("exit 0:\n%s", got)
			}
			if !strings.Contains(got, tc.want) {
				t.Fatalf("message does not mention %q:\n%s", tc.want, got)
			}
		})
	}
}

// TestExportDumpIR: --dump-ir prints the graph after the named pass.
func TestExportDumpIR(t *testing.T) {
	run := writeRun(t)
	got, code := rpac(t, "export", "--run", run, "--out", filepath.Join(t.TempDir(), "e"), "--dump-ir", "fuse attention")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, got)
	}
	if strings.Count(got, "// after pass") != 1 || !strings.Contains(got, "// after pass fuse attention") || !strings.Contains(got, "= FusedAttention(") {
		t.Fatalf("no dump after fuse attention:\n%.600s", got)
	}
}
