package ir

import "fmt"

// Precision is a floating-point number format: the arithmetic of a run's
// GEMMs (rpac train --precision; the CUDA backend's GEMM inputs, FP32 or
// BF16), the type of an exported graph's weights and activations (rpac
// export --dtype), or the float type a compiled program computes in on the
// host (kernels.Backend.Precision: FP32, or FP64 for gradient checks). It
// is parsed in one place, ParsePrecision; each consumer states which
// formats it takes.
type Precision uint8

const (
	// PrecisionDefault is no choice: each consumer's default (bf16 GEMMs on
	// CUDA, fp32 on the CPU and in an export).
	PrecisionDefault Precision = iota
	FP32                       // IEEE single precision
	BF16                       // bfloat16
	FP16                       // IEEE half precision
	FP64                       // IEEE double precision (host programs only: gradient checks)
)

// ParsePrecision reads a precision flag: fp32, bf16 or fp16 (float32,
// bfloat16, float16 and f32 are accepted too); empty is PrecisionDefault.
func ParsePrecision(s string) (Precision, error) {
	switch s {
	case "":
		return PrecisionDefault, nil
	case "fp32", "float32", "f32":
		return FP32, nil
	case "bf16", "bfloat16":
		return BF16, nil
	case "fp16", "float16":
		return FP16, nil
	}
	return PrecisionDefault, fmt.Errorf("precision %q: want fp32, bf16 or fp16", s)
}

// String is the flag spelling ("default" for PrecisionDefault).
func (p Precision) String() string {
	switch p {
	case FP32:
		return "fp32"
	case BF16:
		return "bf16"
	case FP16:
		return "fp16"
	case FP64:
		return "fp64"
	case PrecisionDefault:
		return "default"
	}
	return fmt.Sprintf("precision(%d)", uint8(p))
}

// Reduced reports whether p is a 16-bit format.
func (p Precision) Reduced() bool { return p == BF16 || p == FP16 }

// Or is p, or d when p is PrecisionDefault.
func (p Precision) Or(d Precision) Precision {
	if p == PrecisionDefault {
		return d
	}
	return p
}
