package cuda

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/ir"
)

// mustEWCode is op's elementwise op code (tests).
func mustEWCode(op ir.OpName) int32 {
	_, code, ok := ewCode(op)
	if !ok {
		panic("no elementwise op " + op)
	}
	return code
}

// TestEveryElementwiseOpHasCUDACase: every op of ir.Elementwise has a CUDA
// formula and, in the prelude every kernel source is compiled with, a code
// of its own and a case in its kind's function, whose default gives NaN
// instead of the input; the registration table holds every other op and
// only ops of the table.
func TestEveryElementwiseOpHasCUDACase(t *testing.T) {
	pre, err := prelude()
	if err != nil {
		t.Fatal(err)
	}
	fn := map[ir.EwKind]string{ir.EwUnary: "ew_unary(", ir.EwGrad: "ew_grad(", ir.EwBinary: "ew_binary("}
	seen := map[string]ir.OpName{}
	for _, s := range ir.Elementwise {
		if strings.TrimSpace(s.CUDA) == "" {
			t.Errorf("%s has no CUDA formula", s.Name)
		}
		kind, code, ok := ewCode(s.Name)
		if !ok || kind != s.Kind || !HasKernel(s.Name) {
			t.Errorf("%s: no op code (kind %v, code %d, ok %v)", s.Name, kind, code, ok)
			continue
		}
		def := ewDefine(s)
		if other, dup := seen[def]; dup {
			t.Errorf("%s and %s share the code name %s", s.Name, other, def)
		}
		seen[def] = s.Name
		if !strings.Contains(pre, fmt.Sprintf("#define %s %d\n", def, code)) {
			t.Errorf("the prelude does not define %s as %d", def, code)
		}
		body := functionBody(pre, fn[s.Kind])
		if !strings.Contains(body, "case "+def+": ") {
			t.Errorf("%s of the prelude has no case %s (%s)", fn[s.Kind], def, s.Name)
		}
		if _, ok := builders[s.Name]; ok {
			t.Errorf("elementwise op %s is in the registration table too", s.Name)
		}
	}
	for _, f := range fn {
		body := functionBody(pre, f)
		if !strings.HasSuffix(body, "    }\n    return __int_as_float(0x7fc00000);\n}\n") {
			t.Errorf("%s...) does not give NaN after its cases:\n%s", f, body)
		}
	}
	for op := range builders {
		if ir.Ops[op] == nil {
			t.Errorf("the registration table has %s, which ir.Ops lacks", op)
		}
	}
	for op := range ir.Ops {
		if ir.ElementwiseOf(op) == nil && builders[op] == nil {
			t.Errorf("op %s is neither elementwise nor in the registration table", op)
		}
	}
}

// functionBody is the text of the prelude's function whose signature
// starts with name, up to its closing brace.
func functionBody(src, name string) string {
	i := strings.Index(src, " float "+name)
	if i < 0 {
		return ""
	}
	j := strings.Index(src[i:], "\n}\n")
	if j < 0 {
		return src[i:]
	}
	return src[i : i+j+3]
}
