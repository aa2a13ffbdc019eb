package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFloatDataLayouts: float_data holding a NaN is refused however the
// encoder laid it out: packed in one record, split over several packed
// records (the NaN in the first), or unpacked (one fixed32 per value).
func TestFloatDataLayouts(t *testing.T) {
	msg := func(field int, b []byte) []byte { return append([]byte{byte(field<<3 | 2), byte(len(b))}, b...) }
	f32 := func(bits uint32) []byte {
		return []byte{byte(bits), byte(bits >> 8), byte(bits >> 16), byte(bits >> 24)}
	}
	one, nan := f32(0x3f800000), f32(0x7fc00000)
	head := append([]byte{1<<3 | 0, 3, 2<<3 | 0, 1}, msg(8, []byte("w"))...) // dims [3], FLOAT, name
	layouts := map[string][]byte{
		"packed":   msg(4, append(append(append([]byte{}, one...), nan...), one...)),
		"split":    append(msg(4, nan), msg(4, append(append([]byte{}, one...), one...))...),
		"unpacked": append(append(append([]byte{4<<3 | 5}, one...), append([]byte{4<<3 | 5}, nan...)...), append([]byte{4<<3 | 5}, one...)...),
	}
	dir := t.TempDir()
	for name, data := range layouts {
		path := filepath.Join(dir, name+".onnx")
		os.WriteFile(path, msg(7, msg(5, append(append([]byte{}, head...), data...))), 0o644)
		_, _, err := readIO(path, true)
		if !errors.Is(err, errNonFinite) || !strings.Contains(err.Error(), `"w"`) {
			t.Errorf("%s float_data: %v", name, err)
		}
	}
}
