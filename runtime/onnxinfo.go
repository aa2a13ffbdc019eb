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
// else, so large initializers are never held in memory.
//
// With scan, every tensor the file stores is also checked (see scanConfig;
// external data is refused, there being no export folder).
func readIO(path string, scan bool) (in, out []ioInfo, err error) {
	var sc *scanConfig
	if scan {
		sc = &scanConfig{}
	}
	return readIOScan(path, sc)
}

// readIOScan is readIO that checks the file's tensors as sc says (nil:
// not at all).
func readIOScan(path string, sc *scanConfig) (in, out []ioInfo, err error) {
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
		if (field != 7 && field != 25) || wt != 2 {
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
		if field == 25 { // a FunctionProto: its Constant nodes hold tensors
			if sc != nil {
				if err := sc.scanFunction(f, g.off, g.end); err != nil {
					return nil, nil, err
				}
			}
			continue
		}
		if found {
			return nil, nil, errors.New("more than one graph")
		}
		found = true
		if sc != nil {
			if err := sc.scanGraph(f, g.off, g.end, 0); err != nil {
				return nil, nil, err
			}
		}
		for !g.done() {
			field, wt, err := g.tag()
			if err != nil {
				return nil, nil, err
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
