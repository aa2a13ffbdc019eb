package serve

import (
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/rpac-dev/rpac/runtime"
)

// nodeClients is the folder of the npm clients, from this package.
var nodeClients = filepath.Join("..", "..", "clients", "node")

// requireNodeModule skips a test when node or the npm package pkg (under
// clients/node, installed by npm ci) is missing, except under CI=true,
// where that is a failure.
func requireNodeModule(t *testing.T, pkg string) {
	t.Helper()
	missing := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and "+format, args...)
		}
		t.Skipf(format, args...)
	}
	if _, err := exec.LookPath("node"); err != nil {
		missing("node is not on PATH: %v", err)
	}
	if _, err := os.Stat(filepath.Join(nodeClients, "node_modules", pkg, "package.json")); err != nil {
		missing("the npm package %s is not installed (npm ci --prefix clients/node): %v", pkg, err)
	}
}

// TestOpenAINodeSDK runs the official openai npm SDK (clients/node) against
// the server over a real export: completions (whole, streamed, logprobs,
// stop), chat (whole and streamed), the model list, and the SDK's typed
// errors naming the field; the script asserts each and exits non-zero on
// a mismatch.
func TestOpenAINodeSDK(t *testing.T) {
	requireORT(t)
	requireNodeModule(t, "openai")
	dir := tinyExport(t, []int{32}, 1)
	m, err := runtime.Open(dir, runtime.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := New(m, Config{Tokenizer: letters{}, ServedModelNames: []string{"tiny"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "openai-sdk-check.mjs", ts.URL+"/v1", "tiny")
	cmd.Dir = nodeClients
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("the openai SDK check failed: %v", err)
	}
}
