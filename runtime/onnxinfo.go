package runtime

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// ioInfo is a graph input or output as declared in an ONNX file.
type ioInfo struct {
	Name string
	Elem int32   // ONNX TensorProto.DataType
	Dims []int64 // -1: symbolic or unknown
}

// ONNX element types used here (TensorProto.DataType).
const (
	onnxFloat = 1
	onnxInt64 = 7
)

// readIO reads the declared graph inputs and outputs of an ONNX file. It
// walks the protobuf wire format directly (ModelProto.graph = 7,
// GraphProto.input = 11, GraphProto.output = 12) and seeks over everything
// else, so large initializers are never read.
//
// With scan, every float32 initializer is also streamed and a NaN or +Inf
// value refused.
func readIO(path string, scan bool) (in, out []ioInfo, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	top := &wire{r: f, end: st.Size()}
	found := false
	for !top.done() {
		field, wt, err := top.tag()
		if err != nil {
			return nil, nil, err
		}
		if field != 7 || wt != 2 {
			if err := top.skip(wt); err != nil {
				return nil, nil, err
			}
			continue
		}
		n, err := top.varint()
		if err != nil {
			return nil, nil, err
		}
		if n > uint64(top.end-top.off) { // checked before any offset arithmetic: a length near 2^64 must not wrap
			return nil, nil, errTruncated
		}
		g := &wire{r: f, off: top.off, end: top.off + int64(n)}
		top.off = g.end
		found = true
		for !g.done() {
			field, wt, err := g.tag()
			if err != nil {
				return nil, nil, err
			}
			if field == 5 && wt == 2 && scan { // an initializer: its values must be finite
				if err := checkInitializer(f, g); err != nil {
					return nil, nil, err
				}
				continue
			}
			if (field != 11 && field != 12) || wt != 2 {
				if err := g.skip(wt); err != nil {
					return nil, nil, err
				}
				continue
			}
			b, err := g.bytes()
			if err != nil {
				return nil, nil, err
			}
			vi, err := parseValueInfo(b)
			if err != nil {
				return nil, nil, err
			}
			if field == 11 {
				in = append(in, vi)
			} else {
				out = append(out, vi)
			}
		}
	}
	if !found {
		return nil, nil, errors.New("no graph")
	}
	return in, out, nil
}

var errTruncated = errors.New("truncated protobuf")

// checkInitializer reads the TensorProto at g's offset (a length-delimited
// field) and, for float32 data, refuses a NaN or +Inf value, naming the
// tensor (−Inf is allowed: masks use it). The values are streamed, never
// held whole.
func checkInitializer(r io.ReaderAt, g *wire) error {
	n, err := g.varint()
	if err != nil {
		return err
	}
	if n > uint64(g.end-g.off) {
		return errTruncated
	}
	t := &wire{r: r, off: g.off, end: g.off + int64(n)}
	g.off = t.end
	var name string
	var dtype uint64
	var dataOff, dataLen int64
	for !t.done() {
		field, wt, err := t.tag()
		if err != nil {
			return err
		}
		switch {
		case field == 2 && wt == 0:
			if dtype, err = t.varint(); err != nil {
				return err
			}
		case field == 8 && wt == 2:
			b, err := t.bytes()
			if err != nil {
				return err
			}
			name = string(b)
		case (field == 9 || field == 4) && wt == 2: // raw_data, or packed float_data
			l, err := t.varint()
			if err != nil {
				return err
			}
			if l > uint64(t.end-t.off) {
				return errTruncated
			}
			dataOff, dataLen = t.off, int64(l)
			t.off += int64(l)
		default:
			if err := t.skip(wt); err != nil {
				return err
			}
		}
	}
	if dtype != onnxFloat || dataLen == 0 {
		return nil
	}
	return scanFinite(r, dataOff, dataLen, name)
}

// scanFinite refuses a NaN or +Inf among the little-endian float32 values
// at [off, off+n).
func scanFinite(r io.ReaderAt, off, n int64, name string) error {
	buf := make([]byte, 1<<20)
	for done := int64(0); done+4 <= n; {
		k := min(int64(len(buf)), (n-done)/4*4)
		if _, err := r.ReadAt(buf[:k], off+done); err != nil && err != io.EOF {
			return err
		}
		for i := int64(0); i+4 <= k; i += 4 {
			u := uint32(buf[i]) | uint32(buf[i+1])<<8 | uint32(buf[i+2])<<16 | uint32(buf[i+3])<<24
			if u&0x7f800000 == 0x7f800000 && u != 0xff800000 { // NaN or +Inf (−Inf masks are fine)
				return fmt.Errorf("%w: initializer %q holds a NaN or +Inf value (element %d): the weights diverged", errNonFinite, name, (done+i)/4)
			}
		}
		done += k
	}
	return nil
}

var errNonFinite = errors.New("non-finite weights")

func parseValueInfo(b []byte) (ioInfo, error) {
	var vi ioInfo
	err := eachField(b, func(field int, wt int, v uint64, sub []byte) error {
		switch {
		case field == 1 && wt == 2:
			vi.Name = string(sub)
		case field == 2 && wt == 2: // TypeProto
			return eachField(sub, func(field int, wt int, v uint64, sub []byte) error {
				if field != 1 || wt != 2 { // tensor_type
					return nil
				}
				return eachField(sub, func(field int, wt int, v uint64, sub []byte) error {
					switch {
					case field == 1 && wt == 0:
						vi.Elem = int32(v)
					case field == 2 && wt == 2: // TensorShapeProto
						return eachField(sub, func(field int, wt int, v uint64, sub []byte) error {
							if field != 1 || wt != 2 {
								return nil
							}
							d := int64(-1)
							err := eachField(sub, func(field int, wt int, v uint64, _ []byte) error {
								if field == 1 && wt == 0 {
									d = int64(v)
								}
								return nil
							})
							vi.Dims = append(vi.Dims, d)
							return err
						})
					}
					return nil
				})
			})
		}
		return nil
	})
	return vi, err
}

// eachField calls fn for each field of an in-memory message: v holds varint
// values, sub the bytes of length-delimited ones.
func eachField(b []byte, fn func(field, wt int, v uint64, sub []byte) error) error {
	w := &wire{r: bytes.NewReader(b), end: int64(len(b))}
	for !w.done() {
		field, wt, err := w.tag()
		if err != nil {
			return err
		}
		switch wt {
		case 0:
			v, err := w.varint()
			if err != nil {
				return err
			}
			if err := fn(field, wt, v, nil); err != nil {
				return err
			}
		case 2:
			sub, err := w.bytes()
			if err != nil {
				return err
			}
			if err := fn(field, wt, 0, sub); err != nil {
				return err
			}
		default:
			if err := w.skip(wt); err != nil {
				return err
			}
		}
	}
	return nil
}

// wire reads protobuf fields from r between off and end.
type wire struct {
	r        io.ReaderAt
	off, end int64
}

func (w *wire) done() bool { return w.off >= w.end }

func (w *wire) varint() (uint64, error) {
	var buf [10]byte
	n := int64(len(buf))
	if w.end-w.off < n {
		n = w.end - w.off
	}
	if n <= 0 {
		return 0, errTruncated
	}
	if _, err := w.r.ReadAt(buf[:n], w.off); err != nil && err != io.EOF {
		return 0, err
	}
	var v uint64
	for i := int64(0); i < n; i++ {
		v |= uint64(buf[i]&0x7f) << (7 * i)
		if buf[i] < 0x80 {
			w.off += i + 1
			return v, nil
		}
	}
	return 0, errors.New("bad varint")
}

func (w *wire) tag() (int, int, error) {
	t, err := w.varint()
	if err != nil {
		return 0, 0, err
	}
	if t>>3 == 0 {
		return 0, 0, errors.New("field number 0")
	}
	return int(t >> 3), int(t & 7), nil
}

func (w *wire) skip(wt int) error {
	var n int64
	switch wt {
	case 0:
		_, err := w.varint()
		return err
	case 1:
		n = 8
	case 2:
		l, err := w.varint()
		if err != nil {
			return err
		}
		if l > uint64(w.end-w.off) {
			return errTruncated
		}
		n = int64(l)
	case 5:
		n = 4
	default:
		return fmt.Errorf("unsupported wire type %d", wt)
	}
	if w.off+n > w.end {
		return errTruncated
	}
	w.off += n
	return nil
}

func (w *wire) bytes() ([]byte, error) {
	l, err := w.varint()
	if err != nil {
		return nil, err
	}
	if l > uint64(w.end-w.off) {
		return nil, errTruncated
	}
	b := make([]byte, l)
	if n, err := w.r.ReadAt(b, w.off); n < len(b) {
		if err == nil || err == io.EOF {
			err = errTruncated
		}
		return nil, err
	}
	w.off += int64(l)
	return b, nil
}
