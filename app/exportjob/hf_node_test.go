package exportjob

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/rpac-dev/rpac/training/data"
)

// requireOrSkip fails the test under CI=true, where every dependency is
// installed, and skips it elsewhere.
func requireOrSkip(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and "+format, args...)
	}
	t.Skipf(format, args...)
}

// nodeClients is clients/node of the repository with
// @huggingface/transformers installed (npm ci --prefix clients/node).
func nodeClients(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		requireOrSkip(t, "node is not on PATH: %v", err)
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", "clients", "node"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@huggingface", "transformers", "package.json")); err != nil {
		requireOrSkip(t, "@huggingface/transformers is not installed (npm ci --prefix clients/node): %v", err)
	}
	return dir
}

// validText is WikiText-2's valid split, from $RPAC_DATA or the shared
// copy beside the repository.
func validText(t *testing.T) string {
	t.Helper()
	for _, dir := range []string{os.Getenv(data.EnvDataDir), filepath.Join("..", "..", "..", "shared", "data", "wikitext-2-raw-v1")} {
		if p := filepath.Join(dir, "wiki.valid.raw"); dir != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	requireOrSkip(t, "wiki.valid.raw not found: set $%s to the WikiText-2 raw directory", data.EnvDataDir)
	return ""
}

// TestHFTokenizerTransformersJS: transformers.js loads the tokenizer files
// an export writes, offline, encodes the whole WikiText-2 valid split to
// exactly rpac's ids and decodes them back to the text
// (clients/node/hf_tokenizer.mjs exits non-zero on a difference).
func TestHFTokenizerTransformersJS(t *testing.T) {
	node := nodeClients(t)
	textPath := validText(t)
	dir := filepath.Join(t.TempDir(), "export")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := writeHFTokenizer(dir, data.GPT2TokenizerName); err != nil {
		t.Fatal(err)
	}
	checkTokenizerJS(t, node, dir, textPath)
}

// checkTokenizerJS runs clients/node/hf_tokenizer.mjs on the tokenizer
// files in dir and the text at textPath.
func checkTokenizerJS(t *testing.T, node, dir, textPath string) {
	t.Helper()
	text, err := os.ReadFile(textPath)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := json.Marshal(data.NewTokenizer().Encode(string(text)))
	if err != nil {
		t.Fatal(err)
	}
	idsPath := filepath.Join(t.TempDir(), "ids.json")
	if err := os.WriteFile(idsPath, ids, 0o644); err != nil {
		t.Fatal(err)
	}
	runNode(t, node, "hf_tokenizer.mjs", dir, textPath, idsPath)
}

// runNode runs a script of clients/node and fails on a non-zero exit.
func runNode(t *testing.T, node, script string, args ...string) {
	t.Helper()
	cmd := exec.Command("node", append([]string{filepath.Join(node, script)}, args...)...)
	cmd.Dir = node
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("transformers.js (%s): %v\n%s", script, err, out)
	}
	t.Logf("%s (%.1fs):\n%s", script, time.Since(t0).Seconds(), out)
}
