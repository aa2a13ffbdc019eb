package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the longest function (or function literal) cmd/ may
// hold, from its first line to its closing brace: the commands hold flags
// and printing, and the logic lives in the packages a service would
// import.
const maxFuncLines = 60

// TestFunctionLength fails for every function in cmd/ longer than
// maxFuncLines.
func TestFunctionLength(t *testing.T) {
	long := longFuncs(t, "..", maxFuncLines)
	for _, f := range long {
		t.Errorf("%s: longer than %d lines; move logic into its package or split it", f, maxFuncLines)
	}
}

// TestFunctionLengthDetects: the check finds a long function and a long
// literal, and passes short ones.
func TestFunctionLengthDetects(t *testing.T) {
	dir := t.TempDir()
	body := strings.Repeat("\tx++\n", maxFuncLines)
	src := "package p\n\nfunc short() { var x int; x++ }\n\nfunc long() {\n\tvar x int\n" + body + "}\n\nvar lit = func() {\n\tvar x int\n" + body + "}\n"
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	long := longFuncs(t, dir, maxFuncLines)
	if len(long) != 2 || !strings.Contains(long[0], "long") || !strings.Contains(long[1], "func literal") {
		t.Errorf("found %v, want long and the literal", long)
	}
}

// longFuncs lists the functions and function literals of the non-test Go
// files under root longer than limit lines.
func longFuncs(t *testing.T, root string, limit int) []string {
	t.Helper()
	fset := token.NewFileSet()
	var long []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			name := "func literal"
			switch x := n.(type) {
			case *ast.FuncDecl:
				name = x.Name.Name
			case *ast.FuncLit:
			default:
				return true
			}
			from, to := fset.Position(n.Pos()), fset.Position(n.End())
			if lines := to.Line - from.Line + 1; lines > limit {
				long = append(long, from.String()+" "+name)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return long
}
