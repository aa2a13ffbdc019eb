package layering

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/rpac-dev/rpac/"

// rule: the packages under From (and their transitive imports within the
// module) import nothing under a Deny prefix except the Allow prefixes.
type rule struct {
	from  string
	deny  []string
	allow []string
	why   string
}

// libraries are the layers below the application layer (app/): none of
// them imports it.
var libraries = []string{"ir", "kernels", "passes", "compiler", "training", "runtime", "internal"}

var rules = append([]rule{
	{from: "runtime", deny: []string{""}, allow: []string{"runtime", "internal/"},
		why: "runtime is what a service embeds: no training, compiler, kernel or IR code"},
	{from: "runtime/manifest", deny: []string{""}, allow: []string{"runtime/manifest"},
		why: "the manifest is the contract between exporter and runtime and imports nothing of rpac"},
	{from: "training", deny: []string{"compiler/"}, allow: []string{"compiler/model"},
		why: "training builds models but never the exporter: the manifest and provenance come from runtime/manifest"},
	{from: "ir", deny: []string{""}, allow: []string{"ir"}, why: "the IR is the bottom layer"},
	{from: "compiler", deny: []string{"training", "cmd/"}, why: "the compiler does not know training or the CLI"},
	{from: "kernels", deny: []string{"compiler/", "runtime", "passes", "training"},
		why: "kernels sit below the passes, the compiler and training"},
	{from: "kernels/cuda/driver", deny: []string{""}, allow: []string{"kernels/cuda/driver"},
		why: "the CUDA bindings know nothing of rpac: no IR, kernels or graphs"},
	{from: "kernels/cuda/perf", deny: []string{""}, allow: []string{"kernels/cuda/perf", "kernels/cuda/driver"},
		why: "the performance model reads traced events and GEMM shapes, not the backend"},
	{from: "internal", deny: []string{""}, allow: []string{"internal"},
		why: "internal/ holds leaf helpers: it imports nothing of rpac but internal/"},
	{from: "", deny: []string{"cmd/"}, why: "nothing imports the command line (the application layer, app/, imports everything else)"},
}, belowApps()...)

// belowApps is a rule per library: it does not import the application
// layer, which drives the libraries.
func belowApps() []rule {
	var rs []rule
	for _, l := range libraries {
		rs = append(rs, rule{from: l, deny: []string{"app"}, why: "the application layer (app/) sits above the libraries"})
	}
	return rs
}

// graph maps a package (module-relative directory) to the module packages
// its non-test files import.
type graph map[string][]string

func TestLayers(t *testing.T) {
	g := moduleGraph(t, "../..")
	if len(g["runtime"]) == 0 || len(g["training"]) == 0 || len(g["app/loadgen"]) == 0 {
		t.Fatalf("the import graph misses runtime, training or app/loadgen (%d packages): the test reads the wrong tree", len(g))
	}
	for _, v := range violations(g, rules) {
		t.Error(v)
	}
}

// TestLayersDetect: an edge from runtime to compiler/ (through a third
// package) and one from training to the exporter are both reported (and
// the third package, a helper of internal/ that reaches up, too).
func TestLayersDetect(t *testing.T) {
	g := graph{
		"runtime":         {"internal/x"},
		"internal/x":      {"compiler/export"},
		"compiler/export": nil,
		"training":        {"compiler/model", "compiler/export"},
		"compiler/model":  nil,
	}
	v := violations(g, rules)
	joined := strings.Join(v, "\n")
	if len(v) != 3 || !strings.Contains(joined, "runtime imports compiler/export (via internal/x)") || !strings.Contains(joined, "training imports compiler/export") ||
		!strings.Contains(joined, "internal/x imports compiler/export: internal/") {
		t.Errorf("violations:\n%s", joined)
	}
}

// TestLayersDetectApps: a helper of internal/ that reaches up, a library
// that imports the application layer and an application that imports the
// command line are reported; an application that imports the libraries and
// internal/ is not.
func TestLayersDetectApps(t *testing.T) {
	g := graph{
		"internal/y":      {"runtime"},
		"internal/z":      nil,
		"runtime":         nil,
		"training":        {"app/x"},
		"app/x":           {"ir"},
		"ir":              nil,
		"app/z":           {"cmd/rpac"},
		"cmd/rpac":        {"app/ok"},
		"app/ok":          {"compiler/export", "training", "runtime", "internal/z"},
		"compiler/export": {"runtime"},
	}
	v := violations(g, rules)
	joined := strings.Join(v, "\n")
	want := []string{"internal/y imports runtime: internal/", "training imports app/x: the application layer", "app/z imports cmd/rpac: nothing imports"}
	if len(v) != len(want) {
		t.Errorf("violations:\n%s", joined)
	}
	for _, w := range want {
		if !strings.Contains(joined, w) {
			t.Errorf("no %q in the violations:\n%s", w, joined)
		}
	}
}

// violations lists every package that a rule covers and whose transitive
// imports break it.
func violations(g graph, rs []rule) []string {
	var out []string
	pkgs := make([]string, 0, len(g))
	for p := range g {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	for _, r := range rs {
		for _, p := range pkgs {
			if !under(p, r.from) {
				continue
			}
			for dep, via := range closure(g, p) {
				if denied(dep, r) {
					out = append(out, p+" imports "+dep+via+": "+r.why)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// under reports whether package p is prefix or below it ("" covers all;
// a prefix ending in "/" covers only the packages below it).
func under(p, prefix string) bool {
	switch {
	case prefix == "":
		return true
	case strings.HasSuffix(prefix, "/"):
		return strings.HasPrefix(p, prefix)
	}
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}

func denied(dep string, r rule) bool {
	for _, a := range r.allow {
		if under(dep, a) {
			return false
		}
	}
	for _, d := range r.deny {
		if under(dep, d) {
			return true
		}
	}
	return false
}

// closure returns the transitive module imports of p, each with the
// package it was reached through (" (via q)", or "" for a direct import).
func closure(g graph, p string) map[string]string {
	seen := map[string]string{}
	var visit func(q, via string)
	visit = func(q, via string) {
		for _, d := range g[q] {
			if _, ok := seen[d]; ok {
				continue
			}
			v := via
			if v == "" && q != p {
				v = " (via " + q + ")"
			}
			seen[d] = v
			visit(d, v)
		}
	}
	visit(p, "")
	return seen
}

// moduleGraph parses the imports of every non-test Go file under root.
func moduleGraph(t *testing.T, root string) graph {
	t.Helper()
	g := graph{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(rel)
		if _, ok := g[pkg]; !ok {
			g[pkg] = nil
		}
		for _, im := range f.Imports {
			ip, _ := strconv.Unquote(im.Path.Value)
			if dep, ok := strings.CutPrefix(ip, module); ok {
				g[pkg] = append(g[pkg], dep)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}
