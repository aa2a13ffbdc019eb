package onnx

import "github.com/rpac-dev/rpac/ir"

func init() {
	lowerings["Concat"] = lowerConcat
}

// Concat(x...; axis) -> Concat(x...; axis).
func lowerConcat(b *builder, n *ir.Node, in []string, out string) (string, error) {
	_, ax, err := ir.ConcatShape(n.Inputs, n.Attrs.Int("axis", 0))
	if err != nil {
		return "", err
	}
	return b.emitTo(out, "Concat", in, attrInt("axis", int64(ax))), nil
}
