package ir

import "testing"

func TestParsePrecision(t *testing.T) {
	for s, want := range map[string]Precision{"": PrecisionDefault, "fp32": FP32, "float32": FP32, "f32": FP32,
		"bf16": BF16, "bfloat16": BF16, "fp16": FP16, "float16": FP16} {
		got, err := ParsePrecision(s)
		if err != nil || got != want {
			t.Errorf("ParsePrecision(%q) = %v, %v; want %v", s, got, err, want)
		}
		if s == want.String() {
			continue
		}
		if back, _ := ParsePrecision(got.String()); got != PrecisionDefault && back != got {
			t.Errorf("%v does not round-trip through String", got)
		}
	}
	for _, s := range []string{"int8", "fp64", "float64"} { // fp64 is a host program's type, never a flag's
		if _, err := ParsePrecision(s); err == nil {
			t.Errorf("%s parsed as a precision", s)
		}
	}
	if FP64.String() != "fp64" {
		t.Errorf("FP64 is spelled %q", FP64)
	}
	if !BF16.Reduced() || !FP16.Reduced() || FP32.Reduced() || FP64.Reduced() || PrecisionDefault.Reduced() {
		t.Error("Reduced")
	}
	if PrecisionDefault.Or(FP32) != FP32 || BF16.Or(FP32) != BF16 {
		t.Error("Or")
	}
}
