package checkpoint

import (
	"bytes"
	"encoding/binary"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func sampleTensors() []Named {
	return []Named{
		{Name: "blocks.0.attn.Wq.weight", Shape: []int{2, 3}, Data: []float32{1, -2, 3.5, 0, float32(math.Inf(1)), -1e-30}},
		{Name: "blocks.0.attn.tau_att", Shape: []int{}, Data: []float32{0.68}},
		{Name: "blocks.0.norm1.bias", Shape: []int{3}, Data: []float32{0.25, 0.5, 0.75}},
		{Name: "empty", Shape: []int{0, 4}, Data: []float32{}},
		{Name: "a.first", Shape: []int{1}, Data: []float32{float32(math.NaN())}},
	}
}

// sameTensors compares tensors as sets (by name), data by bit pattern.
func sameTensors(t *testing.T, got, want []Named) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d tensors, want %d", len(got), len(want))
	}
	byName := map[string]Named{}
	for _, g := range got {
		byName[g.Name] = g
	}
	for _, w := range want {
		g, ok := byName[w.Name]
		if !ok {
			t.Fatalf("tensor %q missing", w.Name)
		}
		ws := w.Shape
		if ws == nil {
			ws = []int{}
		}
		if !reflect.DeepEqual(g.Shape, ws) {
			t.Fatalf("%s: shape %v, want %v", w.Name, g.Shape, ws)
		}
		if len(g.Data) != len(w.Data) {
			t.Fatalf("%s: %d values, want %d", w.Name, len(g.Data), len(w.Data))
		}
		for i := range w.Data {
			if math.Float32bits(g.Data[i]) != math.Float32bits(w.Data[i]) {
				t.Fatalf("%s[%d] = %v, want %v", w.Name, i, g.Data[i], w.Data[i])
			}
		}
	}
}

func encode(t testing.TB, ts []Named, meta map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteSafetensors(&buf, ts, meta); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestSafetensorsRoundTrip(t *testing.T) {
	ts := sampleTensors()
	meta := map[string]string{"format": "pt", "note": "x"}
	b := encode(t, ts, meta)
	n := binary.LittleEndian.Uint64(b)
	if n%8 != 0 {
		t.Errorf("header length %d is not a multiple of 8", n)
	}
	got, gotMeta, err := ReadSafetensors(b)
	if err != nil {
		t.Fatal(err)
	}
	sameTensors(t, got, ts)
	if !reflect.DeepEqual(gotMeta, meta) {
		t.Errorf("metadata %v, want %v", gotMeta, meta)
	}
	// Data is laid out sorted by name; the reader returns file order.
	for i := 1; i < len(got); i++ {
		if got[i-1].Name > got[i].Name {
			t.Errorf("tensors not sorted: %q before %q", got[i-1].Name, got[i].Name)
		}
	}
	// Writing is deterministic regardless of input order.
	rev := append([]Named(nil), ts...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	if !bytes.Equal(b, encode(t, rev, meta)) {
		t.Error("output depends on input order")
	}

	path := filepath.Join(t.TempDir(), "w.safetensors")
	if err := SaveWeightsFile(path, ts, nil); err != nil {
		t.Fatal(err)
	}
	got, _, err = LoadWeightsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sameTensors(t, got, ts)
	if x, ok := Lookup(got, "blocks.0.attn.tau_att"); !ok || x.Data[0] != 0.68 {
		t.Errorf("Lookup = %v, %v", x, ok)
	}
}

func TestWriteRejectsBadTensors(t *testing.T) {
	cases := []struct {
		name string
		ts   []Named
		want string
	}{
		{"empty name", []Named{{Shape: []int{1}, Data: []float32{1}}}, "empty name"},
		{"duplicate", []Named{{Name: "a", Data: []float32{1}}, {Name: "a", Data: []float32{1}}}, "twice"},
		{"reserved", []Named{{Name: "__metadata__", Data: []float32{1}}}, "reserved"},
		{"length", []Named{{Name: "a", Shape: []int{2, 2}, Data: []float32{1}}}, "holds 4 values"},
		{"negative", []Named{{Name: "a", Shape: []int{-1}, Data: nil}}, "negative"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := WriteSafetensors(&bytes.Buffer{}, c.ts, nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to mention %q", err, c.want)
			}
		})
	}
}

// rawFile assembles a safetensors file from a header and data bytes.
func rawFile(header string, data []byte) []byte {
	for len(header)%8 != 0 {
		header += " "
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

func TestReadForeignDtypes(t *testing.T) {
	le := binary.LittleEndian
	var data []byte
	data = le.AppendUint64(data, math.Float64bits(-2.5))
	data = le.AppendUint64(data, math.Float64bits(1e-3))
	// F16: 1.0, -2.0, 65504 (max), smallest subnormal, +Inf
	for _, h := range []uint16{0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00} {
		data = le.AppendUint16(data, h)
	}
	// BF16: 1.0, -3.0
	for _, h := range []uint16{0x3f80, 0xc040} {
		data = le.AppendUint16(data, h)
	}
	var neg int64 = -7
	data = le.AppendUint64(data, uint64(neg))
	data = append(data, 1, 0) // BOOL
	header := `{"d":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},` +
		`"h":{"dtype":"F16","shape":[5],"data_offsets":[16,26]},` +
		`"b":{"dtype":"BF16","shape":[2],"data_offsets":[26,30]},` +
		`"i":{"dtype":"I64","shape":[],"data_offsets":[30,38]},` +
		`"m":{"dtype":"BOOL","shape":[2],"data_offsets":[38,40]},` +
		`"__metadata__":{"format":"pt"}}`
	got, meta, err := ReadSafetensors(rawFile(header, data))
	if err != nil {
		t.Fatal(err)
	}
	if meta["format"] != "pt" {
		t.Errorf("meta = %v", meta)
	}
	want := []Named{
		{Name: "d", Shape: []int{2}, Data: []float32{-2.5, float32(1e-3)}},
		{Name: "h", Shape: []int{5}, Data: []float32{1, -2, 65504, float32(math.Ldexp(1, -24)), float32(math.Inf(1))}},
		{Name: "b", Shape: []int{2}, Data: []float32{1, -3}},
		{Name: "i", Shape: []int{}, Data: []float32{-7}},
		{Name: "m", Shape: []int{2}, Data: []float32{1, 0}},
	}
	sameTensors(t, got, want)
	for i, w := range want {
		if got[i].Name != w.Name {
			t.Errorf("tensor %d is %q, want %q (file order)", i, got[i].Name, w.Name)
		}
	}
}

func TestF16Conversion(t *testing.T) {
	cases := []struct {
		h    uint16
		want float32
	}{
		{0x0000, 0}, {0x3c00, 1}, {0x3555, 0.333251953125}, {0xfbff, -65504},
		{0x0400, float32(math.Ldexp(1, -14))}, {0x03ff, float32(math.Ldexp(1023, -24))},
		{0xfc00, float32(math.Inf(-1))},
	}
	for _, c := range cases {
		if got := f16ToF32(c.h); got != c.want {
			t.Errorf("f16ToF32(%#04x) = %v, want %v", c.h, got, c.want)
		}
	}
	if got := f16ToF32(0x8000); math.Float32bits(got) != 0x80000000 {
		t.Errorf("negative zero lost: %v", got)
	}
	if got := f16ToF32(0x7e00); !math.IsNaN(float64(got)) {
		t.Errorf("NaN lost: %v", got)
	}
}

func TestReadSafetensorsErrors(t *testing.T) {
	f32 := func(n int) []byte { return make([]byte, 4*n) }
	hugeLen := binary.LittleEndian.AppendUint64(nil, 1<<62)
	cases := []struct {
		name string
		file []byte
		want string
	}{
		{"empty", nil, "shorter than"},
		{"garbage header length", append(hugeLen, "{}      "...), "out of range"},
		{"header longer than file", append(binary.LittleEndian.AppendUint64(nil, 64), "{}"...), "truncated"},
		{"not an object", rawFile(`[1,2]`, nil), "does not start"},
		{"bad json", rawFile(`{"a":`, nil), "bad header"},
		{"stray bytes", rawFile(`{} x`, nil), "stray"},
		{"duplicate", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)), "twice"},
		{"unknown dtype", rawFile(`{"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}}`, []byte{0}), "unknown dtype"},
		{"missing shape", rawFile(`{"a":{"dtype":"F32","data_offsets":[0,4]}}`, f32(1)), "no shape"},
		{"bad offsets arity", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}`, f32(1)), "data_offsets"},
		{"negative dim", rawFile(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, f32(1)), "negative"},
		{"shape mismatch", rawFile(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, f32(2)), "needs 12 bytes"},
		{"huge shape", rawFile(`{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}}`, f32(2)), "needs"},
		{"out of bounds", rawFile(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, f32(2)), "out of bounds"},
		{"reversed offsets", rawFile(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}}`, f32(2)), "out of bounds"},
		{"overlap", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, f32(3)), "overlap"},
		{"gap", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)), "gap"},
		{"trailing data", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32(2)), "after the last tensor"},
		{"bad metadata", rawFile(`{"__metadata__":{"a":1}}`, nil), "__metadata__"},
		{"entry not object", rawFile(`{"a":3}`, nil), "bad header entry"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := ReadSafetensors(c.file)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to mention %q", err, c.want)
			}
		})
	}
}

func FuzzReadSafetensors(f *testing.F) {
	valid := encode(f, sampleTensors(), map[string]string{"format": "pt"})
	f.Add(valid)
	f.Add(valid[:len(valid)-3])
	f.Add(valid[:20])
	f.Add(rawFile(`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]}}`, make([]byte, 6)))
	f.Add(rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, make([]byte, 12)))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'})
	f.Fuzz(func(t *testing.T, data []byte) {
		ts, meta, err := ReadSafetensors(data)
		if err != nil {
			return
		}
		// Whatever parses must survive a write/read round trip.
		var buf bytes.Buffer
		if err := WriteSafetensors(&buf, ts, meta); err != nil {
			t.Fatalf("re-encoding parsed tensors: %v", err)
		}
		again, _, err := ReadSafetensors(buf.Bytes())
		if err != nil {
			t.Fatalf("re-reading: %v", err)
		}
		sameTensors(t, again, ts)
	})
}
