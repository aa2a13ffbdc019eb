package onnx

import (
	"strings"
	"testing"
)

// TestQuantizeSpelling: --quantize takes none and int8 and refuses others
// with the valid values; the text form keeps the spelling.
func TestQuantizeSpelling(t *testing.T) {
	for s, want := range map[string]Quantize{"none": QuantizeNone, "int8": QuantizeInt8} {
		q, err := ParseQuantize(s)
		if err != nil || q != want || q.String() != s {
			t.Errorf("ParseQuantize(%q) = %v, %v", s, q, err)
		}
		if b, err := q.MarshalText(); err != nil || string(b) != s {
			t.Errorf("%v marshals as %q, %v", q, b, err)
		}
	}
	if _, err := ParseQuantize("int4"); err == nil || !strings.Contains(err.Error(), `--quantize "int4": want none or int8`) {
		t.Errorf("ParseQuantize(int4): %v", err)
	}
	var q Quantize
	if err := q.UnmarshalText([]byte("int8")); err != nil || q != QuantizeInt8 {
		t.Errorf("UnmarshalText(int8) = %v, %v", q, err)
	}
}
