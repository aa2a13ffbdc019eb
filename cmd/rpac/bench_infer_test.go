package main

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
	"golang.org/x/perf/benchfmt"
)

// The export without the folded bias is the benchmark's reference only:
// nothing in this command sets export.Options.DropBias (the benchmark,
// app/inferbench, does), and what rpac export writes has every
// layer's folded bias and no bias_dropped record.
func TestDropBiasIsBenchmarkOnly(t *testing.T) {
	if users := identUsers(t, ".", "DropBias"); len(users) > 0 {
		t.Errorf("DropBias used in the command: %v", users)
	}
	if users := identUsers(t, "../../app/inferbench", "DropBias"); len(users) == 0 {
		t.Fatal("app/inferbench does not use export.Options.DropBias (the test is stale)")
	}
	run := writeRun(t)
	for _, att := range []string{"op", "plain"} {
		out := filepath.Join(t.TempDir(), "e")
		got, code := rpac(t, "export", "--run", run, "--lengths", "16", "--attention", att, "--out", out)
		if code != 0 {
			t.Fatalf("export: exit %d:\n%s", code, got)
		}
		man, err := runtime.ReadManifest(out)
		if err != nil {
			t.Fatal(err)
		}
		var fold export.Fold
		if err := json.Unmarshal(man.Fold, &fold); err != nil || fold.BiasDropped || fold.Mode != passes.FoldRPAMode || len(fold.Layers) != 2 {
			t.Errorf("%s: manifest fold %s (%v)", att, man.Fold, err)
		}
		m, err := onnx.Read(filepath.Join(out, export.FileName(16)))
		if err != nil {
			t.Fatal(err)
		}
		biases := 0
		for _, n := range m.Graph.Node {
			for _, in := range n.Input {
				if strings.Contains(in, ".attn.rpa_bias.T16") {
					biases++
				}
			}
		}
		if biases != 2 {
			t.Errorf("%s: %d nodes read a folded bias, want one per layer (2)", att, biases)
		}
		if strings.Contains(onnx.Inspect(m).Metadata["fold"], "bias_dropped") {
			t.Errorf("%s: metadata fold says bias_dropped", att)
		}
	}
}

// rpac bench infer times the folded model with and without its bias and
// prints the prior's cost.
func TestBenchInferPriorCost(t *testing.T) {
	env := []string{"ORT_LIB=" + ortLib(t)}
	keep := t.TempDir()
	benchOut := filepath.Join(t.TempDir(), "bench.txt")
	got, code := rpacEnv(t, env, "bench", "infer", "--preset", "tiny", "--attention", "op", "--runs", "4", "--block", "2",
		"--threads", "1", "--gemm-time", "0", "--control", "--keep", keep, "--bench-out", benchOut)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, got)
	}
	checkBenchOut(t, benchOut, 4, 4)
	for _, want := range []string{"fuzzy    rpa    op", "fuzzy    nobias op", "fuzzy    rpa#2  op", "baseline -      op",
		"prior cost tiny T=128 op: ", "p50", "fast½", "paired", "Mann-Whitney", "control tiny T=128 op", "load average"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	// Each exported case is one log line, once.
	exported := map[string]int{}
	for _, l := range strings.Split(got, "\n") {
		if strings.HasPrefix(l, "exported tiny ") {
			exported[l]++
		}
	}
	if len(exported) != 4 {
		t.Errorf("%d export lines, want 4 (rpa, nobias, rpa#2, baseline):\n%s", len(exported), got)
	}
	for l, n := range exported {
		if n != 1 || strings.Contains(l, "<nil>") {
			t.Errorf("%q written %d times", l, n)
		}
	}
	for _, f := range []struct {
		dir  string
		want bool
	}{{"tiny_fuzzy_rpa_op_L128", false}, {"tiny_fuzzy_nobias_op_L128", true}} {
		man, err := runtime.ReadManifest(filepath.Join(keep, f.dir))
		if err != nil {
			t.Fatal(err)
		}
		var fold export.Fold
		if err := json.Unmarshal(man.Fold, &fold); err != nil || fold.BiasDropped != f.want {
			t.Errorf("%s: fold %s, want bias_dropped %v", f.dir, man.Fold, f.want)
		}
	}
	if _, code := rpacEnv(t, env, "bench", "infer", "--fold", "bias"); code == 0 {
		t.Error("--fold bias: want an error")
	}
}

// identUsers lists the positions where the non-test Go files of dir use
// the identifier name.
func identUsers(t *testing.T, dir, name string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var users []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(af, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && id.Name == name {
				users = append(users, fset.Position(id.Pos()).String())
			}
			return true
		})
	}
	return users
}

// checkBenchOut reads a --bench-out file as benchstat does: runs results
// for each of cases benchmarks, in seconds per op.
func checkBenchOut(t *testing.T, path string, cases, runs int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := benchfmt.NewReader(f, path)
	n := map[string]int{}
	for r.Scan() {
		res, ok := r.Result().(*benchfmt.Result)
		if !ok {
			t.Fatalf("not a result: %v", r.Result())
		}
		if v, ok := res.Value("sec/op"); !ok || !(v > 0) {
			t.Errorf("%s: sec/op %v", res.Name, v)
		}
		if res.GetConfig("onnxruntime") == "" {
			t.Errorf("%s: no onnxruntime configuration", res.Name)
		}
		n[res.Name.String()]++
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if len(n) != cases {
		t.Errorf("%d benchmarks, want %d: %v", len(n), cases, n)
	}
	for name, k := range n {
		if k != runs || !strings.HasPrefix(name, "Infer/preset=tiny/") {
			t.Errorf("%s: %d results, want %d", name, k, runs)
		}
	}
}
