package export

import (
	"fmt"
	"slices"

	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/passes"
)

// ParseQuantize reads a quantization: "none" (onnx.QuantizeNone) or int8.
func ParseQuantize(s string) (string, error) {
	switch s {
	case "none":
		return onnx.QuantizeNone, nil
	case onnx.QuantizeInt8:
		return s, nil
	}
	return "", fmt.Errorf("--quantize %q: want none or int8", s)
}

// CheckFold checks a fold mode of Options.Fold.
func CheckFold(f string) error {
	if !slices.Contains([]string{passes.FoldRPAMode, passes.FoldNoneMode, passes.FoldRankMode, passes.FoldRankApproxMode}, f) {
		return fmt.Errorf("--fold %q: want rpa, rank, rank-approx or none", f)
	}
	return nil
}

// CheckAttention checks an attention lowering of Options.Attention.
func CheckAttention(a string) error {
	if a != passes.AttentionOp && a != passes.AttentionPlain && a != passes.AttentionOpPadded {
		return fmt.Errorf("--attention %q: want op, op8 or plain", a)
	}
	return nil
}
