package runtime

import (
	"github.com/rpac-dev/rpac/internal/fuzzlimit"
	"os"
	"path/filepath"
	"testing"
)

// FuzzReadIO: the ONNX reader and its tensor checks return (an error or a
// result) on any bytes, never panic or loop, in an export folder whose
// manifest lists an external data file, quickly.
func FuzzReadIO(f *testing.F) {
	msg := func(field int, b []byte) []byte { return append([]byte{byte(field<<3 | 2), byte(len(b))}, b...) }
	ext := func(k, v string) []byte { return msg(13, append(msg(1, []byte(k)), msg(2, []byte(v))...)) }
	for _, s := range []string{"", "\x3a\x00", "\x3a\xf5\xff\xff\xff\xff\xff\xff\xff\xff\x01", "\x3a\x04\x5a\x02\x0a\x00",
		"\x3a\x0c\x5a\x0a\x0a\x09input_ids", "\x08\x07\x3a\x02\x62\x00"} {
		f.Add([]byte(s))
	}
	// A float16 NaN, float_data split and unpacked, a Constant node, a
	// subgraph, external data (listed, outside, past the end).
	f.Add(msg(7, msg(5, append([]byte{1<<3 | 0, 2, 2<<3 | 0, 10}, msg(9, []byte{0, 0x3c, 0, 0x7e})...))))
	f.Add(msg(7, msg(5, append(append([]byte{2<<3 | 0, 1}, msg(4, []byte{0, 0, 0xc0, 0x7f})...), 4<<3|5, 0, 0, 0x80, 0x7f))))
	f.Add(msg(7, msg(1, msg(5, msg(5, append([]byte{2<<3 | 0, 1}, msg(9, []byte{0, 0, 0xc0, 0x7f})...))))))
	f.Add(msg(7, msg(1, msg(5, msg(6, msg(5, append([]byte{2<<3 | 0, 1}, msg(9, []byte{0, 0, 0x80, 0x7f})...)))))))
	for _, loc := range []string{"w.data", "../w.data", "w.data/../w.data"} {
		t := append([]byte{1<<3 | 0, 2, 2<<3 | 0, 1, 14<<3 | 0, 1}, ext("location", loc)...)
		f.Add(msg(7, msg(5, append(append(t, ext("offset", "4")...), ext("length", "8")...))))
	}
	dir := f.TempDir()
	data := []byte{0, 0, 0, 0, 0, 0, 0x80, 0x3f, 0, 0, 0xc0, 0x7f}
	if err := os.WriteFile(filepath.Join(dir, "w.data"), data, 0o644); err != nil {
		f.Fatal(err)
	}
	sc := &scanConfig{dir: dir, rel: "m.onnx", files: map[string]int64{"m.onnx": 0, "w.data": int64(len(data))}}
	f.Fuzz(func(t *testing.T, b []byte) {
		defer fuzzlimit.Start().Check(t) // a slow input fails like a crash
		path := filepath.Join(dir, "m.onnx")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		readIO(path, true)
		readIOScan(path, sc)
	})
}
