package cuda

import (
	"fmt"
	"strings"

	"github.com/rpac-dev/rpac/ir"
)

// The elementwise formulas of the kernels (ew_unary, ew_grad, ew_binary
// and their op codes U_*, G_*, B_*) are generated from ir.Elementwise into
// the prelude, where it says ewMarker: graph.cu's unary, gradient and
// binary kernels and the generated chains call them.

// ewMarker is the prelude line the generated section replaces.
const ewMarker = "// @elementwise formulas: generated from ir.Elementwise (ewgen.go)@"

// uCopy is ew_unary's copy (U_COPY: a StopGradient step of a chain).
const uCopy int32 = 0

// ewPrefix is the prefix of each kind's op codes in the prelude.
var ewPrefix = map[ir.EwKind]string{ir.EwUnary: "U_", ir.EwGrad: "G_", ir.EwBinary: "B_"}

// ewCodes lists each kind's ops in the order of their codes: their order
// in ir.Elementwise, the unary ones after U_COPY.
func ewCodes() map[ir.EwKind][]*ir.EwSpec {
	out := map[ir.EwKind][]*ir.EwSpec{ir.EwUnary: {nil}}
	for _, s := range ir.Elementwise {
		out[s.Kind] = append(out[s.Kind], s)
	}
	return out
}

// ewCode is op's code among the elementwise ops of its kind.
func ewCode(op ir.OpName) (ir.EwKind, int32, bool) {
	s := ir.ElementwiseOf(op)
	if s == nil {
		return 0, 0, false
	}
	for code, t := range ewCodes()[s.Kind] {
		if t == s {
			return s.Kind, int32(code), true
		}
	}
	return 0, 0, false
}

// ewParams are a node's kernel parameters a, b, c of s (defaults filled).
func ewParams(s *ir.EwSpec, a ir.Attrs) [3]float32 { return [3]float32(s.Params32(a)) }

// ewDefine is the prelude's name of s's op code.
func ewDefine(s *ir.EwSpec) string { return ewPrefix[s.Kind] + strings.ToUpper(string(s.Name)) }

// ewSource is the prelude's generated section: the op codes, and each
// kind's function with one case per op. A code without a case gives NaN.
func ewSource() string {
	var b strings.Builder
	b.WriteString("// Generated from ir.Elementwise (kernels/cuda/ewgen.go): the op codes the Go side\n")
	b.WriteString("// passes (ewCode) and one case per op; a code without one gives NaN.\n")
	b.WriteString("#define U_COPY 0\n")
	codes := ewCodes()
	kinds := []ir.EwKind{ir.EwUnary, ir.EwGrad, ir.EwBinary}
	for _, k := range kinds {
		for code, s := range codes[k] {
			if s != nil {
				fmt.Fprintf(&b, "#define %s %d\n", ewDefine(s), code)
			}
		}
	}
	sigs := map[ir.EwKind]string{
		ir.EwUnary:  "ew_unary(int op, float x, float a, float b, float c)",
		ir.EwGrad:   "ew_grad(int op, float x, float y, float a, float b)",
		ir.EwBinary: "ew_binary(int op, float x, float y)",
	}
	for _, k := range kinds {
		fmt.Fprintf(&b, "__device__ __forceinline__ float %s {\n    switch (op) {\n", sigs[k])
		if k == ir.EwUnary {
			b.WriteString("    case U_COPY: return x;\n")
		}
		for _, s := range codes[k] {
			if s == nil {
				continue
			}
			body := "return " + s.CUDA + ";"
			if strings.HasPrefix(strings.TrimSpace(s.CUDA), "{") {
				body = s.CUDA
			}
			fmt.Fprintf(&b, "    case %s: %s\n", ewDefine(s), body)
		}
		b.WriteString("    }\n    return __int_as_float(0x7fc00000);\n}\n")
	}
	return b.String()
}

// buildElementwise launches an elementwise op's kernel: unary_f32,
// grad_unary_f32, or binary_dense_f32 (a broadcast operand: a generated
// chain of one step).
func (p *program) buildElementwise(n *ir.Node, s *ir.EwSpec, in, out []*dval) (func() error, error) {
	_, code, ok := ewCode(s.Name)
	if !ok {
		return nil, errUnsupported
	}
	k := ewParams(s, n.Attrs)
	o := out[0]
	switch s.Kind {
	case ir.EwBinary:
		if !in[0].v.Shape.Equal(in[1].v.Shape) {
			return p.buildFused(oneStepChain(n), in, out) // a generated kernel: constant offsets
		}
		return p.buildBinary(code, in, out)
	case ir.EwGrad:
		x, dy := in[1], in[0]
		return func() error {
			return p.each("grad_unary_f32", o.n, o.buf.Ptr, dy.buf.Ptr, x.buf.Ptr, code, k[0], k[1], int64(o.n))
		}, nil
	}
	x := in[0]
	return func() error {
		return p.each("unary_f32", o.n, o.buf.Ptr, x.buf.Ptr, code, k[0], k[1], k[2], int64(o.n))
	}, nil
}
