package runtime

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Checking every tensor stored in an ONNX file before onnxruntime sees it:
// initializers, sparse initializers, the tensors of node attributes
// (Constant nodes), in subgraphs and functions too, whether the values sit
// in raw_data, in the typed repeated fields (float_data, int32_data for
// float16/bfloat16, double_data) or in an external data file, and the
// float attributes of nodes. Each floating tensor must be finite, but for
// the −Inf of the masks an export writes: a one-element tensor (the fill of
// a Where) and the strict upper triangle of a causal mask (the last two
// dimensions [T,S], the others 1: −Inf exactly at j > i + S − T). A float
// attribute must be finite, but for −Inf in a Constant's value_float(s).
// Each tensor's stored size must match its shape, and its dtype must be one
// an export writes. Errors name the tensor or attribute.

// scanConfig says how to check an ONNX file's tensors; nil checks nothing.
type scanConfig struct {
	// dir is the export folder and rel the model's slash-separated path in
	// it; external data must be one of files (verified manifest entries,
	// by path, with their sizes). Without dir, external data is refused.
	dir, rel string
	files    map[string]int64
}

// newScan returns the scan of the manifest file f in dir.
func newScan(dir string, man *Manifest, f File) *scanConfig {
	sc := &scanConfig{dir: dir, rel: f.Path, files: map[string]int64{}}
	for _, g := range man.Files {
		sc.files[g.Path] = g.Bytes
	}
	return sc
}

// ONNX TensorProto.DataType values.
const (
	dtFloat    = 1
	dtUint8    = 2
	dtInt8     = 3
	dtUint16   = 4
	dtInt16    = 5
	dtInt32    = 6
	dtInt64    = 7
	dtBool     = 9
	dtFloat16  = 10
	dtDouble   = 11
	dtUint32   = 12
	dtUint64   = 13
	dtBFloat16 = 16
)

// elemSize is the stored size of each dtype a model may hold; others (strings,
// complex, 4-bit and 8-bit float types) are refused.
var elemSize = map[uint64]int64{
	dtFloat: 4, dtUint8: 1, dtInt8: 1, dtUint16: 2, dtInt16: 2, dtInt32: 4, dtInt64: 8, dtBool: 1,
	dtFloat16: 2, dtDouble: 8, dtUint32: 4, dtUint64: 8, dtBFloat16: 2,
}

func dtypeName(dt uint64) string {
	switch dt {
	case dtFloat:
		return "float"
	case dtFloat16:
		return "float16"
	case dtBFloat16:
		return "bfloat16"
	case dtDouble:
		return "double"
	}
	return "type " + strconv.FormatUint(dt, 10)
}

// maxNesting bounds subgraphs within subgraphs.
const maxNesting = 8

// seq reads protobuf fields sequentially from [off, end) of r through a
// buffer (a tensor of millions of unpacked values costs no syscall each).
type seq struct {
	br       *bufio.Reader
	off, end int64
}

func newSeq(r io.ReaderAt, off, end int64) *seq {
	size := int(min(max(end-off, 16), 64<<10)) // small messages (nodes) get small buffers
	return &seq{br: bufio.NewReaderSize(io.NewSectionReader(r, off, end-off), size), off: off, end: end}
}

func (s *seq) done() bool { return s.off >= s.end }

func (s *seq) varint() (uint64, error) {
	var v uint64
	for i := 0; i < 10; i++ {
		if s.off >= s.end {
			return 0, errTruncated
		}
		b, err := s.br.ReadByte()
		if err != nil {
			return 0, errTruncated
		}
		s.off++
		v |= uint64(b&0x7f) << (7 * i)
		if b < 0x80 {
			return v, nil
		}
	}
	return 0, errors.New("bad varint")
}

func (s *seq) tag() (int, int, error) {
	t, err := s.varint()
	if err != nil {
		return 0, 0, err
	}
	if t>>3 == 0 || t>>3 > math.MaxInt32 {
		return 0, 0, errors.New("bad field number")
	}
	return int(t >> 3), int(t & 7), nil
}

// length reads a length prefix and checks it against the bytes left.
func (s *seq) length() (int64, error) {
	l, err := s.varint()
	if err != nil {
		return 0, err
	}
	if l > uint64(s.end-s.off) {
		return 0, errTruncated
	}
	return int64(l), nil
}

func (s *seq) discard(n int64) error {
	if n > s.end-s.off {
		return errTruncated
	}
	for n > 0 {
		k := int(min(n, 1<<30))
		d, err := s.br.Discard(k)
		s.off += int64(d)
		n -= int64(d)
		if err != nil {
			return errTruncated
		}
	}
	return nil
}

func (s *seq) read(n int64) ([]byte, error) {
	if n > s.end-s.off {
		return nil, errTruncated
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(s.br, b); err != nil {
		return nil, errTruncated
	}
	s.off += n
	return b, nil
}

func (s *seq) skip(wt int) error {
	switch wt {
	case 0:
		_, err := s.varint()
		return err
	case 1:
		return s.discard(8)
	case 2:
		n, err := s.length()
		if err != nil {
			return err
		}
		return s.discard(n)
	case 5:
		return s.discard(4)
	}
	return fmt.Errorf("unsupported wire type %d", wt)
}

// eachMessage calls fn(field, start, end) for every length-delimited field
// of the message at [off, end) that want accepts, and skips every other
// field.
func eachMessage(r io.ReaderAt, off, end int64, want func(field int) bool, fn func(field int, start, end int64) error) error {
	s := newSeq(r, off, end)
	for !s.done() {
		field, wt, err := s.tag()
		if err != nil {
			return err
		}
		if wt != 2 || !want(field) {
			if err := s.skip(wt); err != nil {
				return err
			}
			continue
		}
		n, err := s.length()
		if err != nil {
			return err
		}
		if err := fn(field, s.off, s.off+n); err != nil {
			return err
		}
		if err := s.discard(n); err != nil {
			return err
		}
	}
	return nil
}

// fields accepts the listed field numbers.
func fields(want ...int) func(int) bool {
	return func(f int) bool { return slices.Contains(want, f) }
}

// scanGraph checks every tensor of the GraphProto at [off, end).
func (sc *scanConfig) scanGraph(r io.ReaderAt, off, end int64, depth int) error {
	if depth > maxNesting {
		return errors.New("subgraphs nested too deep")
	}
	return eachMessage(r, off, end, fields(1, 5, 15), func(field int, start, end int64) error {
		switch field {
		case 1: // node
			return sc.scanNode(r, start, end, depth)
		case 5: // initializer
			return sc.scanTensor(r, start, end, "initializer")
		default: // 15: sparse_initializer
			return sc.scanSparse(r, start, end, "sparse initializer")
		}
	})
}

// scanFunction checks the nodes (field 7) of a FunctionProto
// (ModelProto.functions).
func (sc *scanConfig) scanFunction(r io.ReaderAt, off, end int64) error {
	return eachMessage(r, off, end, fields(7), func(_ int, start, end int64) error {
		return sc.scanNode(r, start, end, 1)
	})
}

// scanNode checks the tensors and graphs of a NodeProto's attributes
// (field 5).
func (sc *scanConfig) scanNode(r io.ReaderAt, off, end int64, depth int) error {
	return eachMessage(r, off, end, fields(5), func(_ int, start, end int64) error {
		return sc.scanAttribute(r, start, end, depth)
	})
}

// scanAttribute checks an AttributeProto's tensors (t, tensors), sparse
// tensors and graphs (g, graphs).
func (sc *scanConfig) scanAttribute(r io.ReaderAt, off, end int64, depth int) error {
	if err := scanFloatAttribute(r, off, end); err != nil {
		return err
	}
	return eachMessage(r, off, end, fields(5, 11, 6, 10, 22, 23), func(field int, start, end int64) error {
		switch field {
		case 5, 11:
			return sc.scanTensor(r, start, end, "node attribute tensor")
		case 6, 10:
			return sc.scanGraph(r, start, end, depth+1)
		default: // 22, 23
			return sc.scanSparse(r, start, end, "node attribute sparse tensor")
		}
	})
}

// scanFloatAttribute checks the float values (f, floats) of the
// AttributeProto at [off, end): finite, but for −Inf in a Constant's
// value_float(s).
func scanFloatAttribute(r io.ReaderAt, off, end int64) error {
	var name string
	first := finite // the first non-finite kind found, and where
	var at int64
	v := rawCheck(dtFloat, nil)
	s := newSeq(r, off, end)
	for elem := int64(0); !s.done(); {
		field, wt, err := s.tag()
		if err != nil {
			return err
		}
		n := int64(4)
		switch {
		case field == 1 && wt == 2:
			if n, err = s.length(); err != nil {
				return err
			}
			b, err := s.read(min(n, 256))
			if err != nil {
				return err
			}
			name = string(b)
			if err := s.discard(n - int64(len(b))); err != nil {
				return err
			}
			continue
		case (field == 2 || field == 7) && wt == 5:
		case field == 7 && wt == 2:
			if n, err = s.length(); err != nil {
				return err
			}
		default:
			if err := s.skip(wt); err != nil {
				return err
			}
			continue
		}
		for ; n >= 4; n -= 4 {
			b, err := s.read(4)
			if err != nil {
				return err
			}
			if c := v.class(b); c > first {
				first, at = c, elem
			}
			elem++
		}
		if err := s.discard(n); err != nil {
			return err
		}
	}
	if first == finite || first == negInfinite && (name == "value_float" || name == "value_floats") {
		return nil
	}
	return fmt.Errorf("%w: node attribute %q holds a non-finite value (element %d): the model was altered", errNonFinite, name, at)
}

// scanSparse checks a SparseTensorProto's values (field 1).
func (sc *scanConfig) scanSparse(r io.ReaderAt, off, end int64, what string) error {
	return eachMessage(r, off, end, fields(1), func(_ int, start, end int64) error {
		return sc.scanTensor(r, start, end, what)
	})
}

// tensorMeta is what the first pass over a TensorProto collects.
type tensorMeta struct {
	name     string
	dtype    uint64
	dims     []int64
	external bool
	ext      map[string]string
	rawLen   int64 // -1 without raw_data
}

// maxDims bounds a tensor's rank.
const maxDims = 64

// scanTensor checks the TensorProto at [off, end): dtype, shape against the
// stored size, and the finiteness of floating values wherever they are
// stored.
func (sc *scanConfig) scanTensor(r io.ReaderAt, off, end int64, what string) error {
	m := tensorMeta{rawLen: -1}
	s := newSeq(r, off, end)
	for !s.done() {
		field, wt, err := s.tag()
		if err != nil {
			return err
		}
		switch {
		case field == 1 && wt == 0: // dims
			d, err := s.varint()
			if err != nil {
				return err
			}
			m.dims = append(m.dims, int64(d))
		case field == 1 && wt == 2: // packed dims
			n, err := s.length()
			if err != nil {
				return err
			}
			stop := s.off + n
			for s.off < stop && len(m.dims) <= maxDims {
				d, err := s.varint()
				if err != nil {
					return err
				}
				m.dims = append(m.dims, int64(d))
			}
			if s.off > stop {
				return errTruncated
			}
		case field == 2 && wt == 0:
			if m.dtype, err = s.varint(); err != nil {
				return err
			}
		case field == 8 && wt == 2:
			n, err := s.length()
			if err != nil {
				return err
			}
			b, err := s.read(min(n, 4096))
			if err != nil {
				return err
			}
			if err := s.discard(n - int64(len(b))); err != nil {
				return err
			}
			m.name = string(b)
		case field == 9 && wt == 2:
			n, err := s.length()
			if err != nil {
				return err
			}
			m.rawLen = n
			if err := s.discard(n); err != nil {
				return err
			}
		case field == 13 && wt == 2: // external_data entry
			n, err := s.length()
			if err != nil {
				return err
			}
			if n > 8192 || len(m.ext) > 16 {
				return badTensor("%s %q: oversized external_data", what, m.name)
			}
			b, err := s.read(n)
			if err != nil {
				return err
			}
			var k, v string
			if err := eachField(b, func(field, wt int, _ uint64, sub []byte) error {
				switch {
				case field == 1 && wt == 2:
					k = string(sub)
				case field == 2 && wt == 2:
					v = string(sub)
				}
				return nil
			}); err != nil {
				return err
			}
			if m.ext == nil {
				m.ext = map[string]string{}
			}
			m.ext[k] = v
		case field == 14 && wt == 0:
			loc, err := s.varint()
			if err != nil {
				return err
			}
			m.external = loc == 1
		default:
			if err := s.skip(wt); err != nil {
				return err
			}
		}
		if len(m.dims) > maxDims {
			return badTensor("%s %q has more than %d dimensions", what, m.name, maxDims)
		}
	}
	size, ok := elemSize[m.dtype]
	if !ok {
		return badTensor("%s %q has data type %d, which an exported model does not hold", what, m.name, m.dtype)
	}
	numel := int64(1)
	for _, d := range m.dims {
		if d < 0 || (d > 0 && numel > (math.MaxInt64/size)/d) {
			return badTensor("%s %q has shape %v, out of range", what, m.name, m.dims)
		}
		numel *= d
	}
	want := numel * size
	if m.rawLen >= 0 && m.rawLen != want {
		return badTensor("%s %q: shape %v of %s needs %d bytes but raw_data holds %d", what, m.name, m.dims, dtypeName(m.dtype), want, m.rawLen)
	}
	if m.external {
		return sc.scanExternal(&m, want, what)
	}
	if m.dtype != dtFloat && m.dtype != dtFloat16 && m.dtype != dtBFloat16 && m.dtype != dtDouble {
		return nil
	}
	// Second pass: the values, in whichever field holds them.
	s = newSeq(r, off, end)
	for !s.done() {
		field, wt, err := s.tag()
		if err != nil {
			return err
		}
		var vals valueCheck
		switch {
		case field == 9 && wt == 2:
			vals = rawCheck(m.dtype, maskNegInf(m.dims))
		case field == 4 && m.dtype == dtFloat && (wt == 2 || wt == 5):
			vals = rawCheck(dtFloat, maskNegInf(m.dims))
		case field == 10 && m.dtype == dtDouble && (wt == 2 || wt == 1):
			vals = rawCheck(dtDouble, maskNegInf(m.dims))
		case field == 5 && (m.dtype == dtFloat16 || m.dtype == dtBFloat16) && (wt == 0 || wt == 2):
			if err := scanHalfVarints(s, wt, rawCheck(m.dtype, maskNegInf(m.dims)), m.name, what); err != nil {
				return err
			}
			continue
		default:
			if err := s.skip(wt); err != nil {
				return err
			}
			continue
		}
		var n int64
		switch wt {
		case 2:
			if n, err = s.length(); err != nil {
				return err
			}
		case 5:
			n = 4
		case 1:
			n = 8
		}
		if err := vals.stream(s, n, m.name, what); err != nil {
			return err
		}
	}
	return nil
}

// valueCheck finds a non-finite value among little-endian values of one
// size; negInf says where −Inf is allowed (by element index).
type valueCheck struct {
	size   int64
	dtype  uint64
	class  func(b []byte) finiteness
	negInf func(elem int64) bool
}

// finiteness is what a floating value is, as the scan sees it.
type finiteness int

const (
	finite finiteness = iota
	negInfinite
	nanOrPosInf
)

// classify sorts a value by its exponent bits (all set: not finite) and
// whether it is exactly −Inf.
func classify(u, expMask, negInfBits uint64) finiteness {
	switch {
	case u&expMask != expMask:
		return finite
	case u == negInfBits:
		return negInfinite
	}
	return nanOrPosInf
}

func rawCheck(dtype uint64, negInf func(int64) bool) valueCheck {
	switch dtype {
	case dtFloat16:
		return valueCheck{2, dtype, func(b []byte) finiteness {
			return classify(uint64(b[0])|uint64(b[1])<<8, 0x7c00, 0xfc00)
		}, negInf}
	case dtBFloat16:
		return valueCheck{2, dtype, func(b []byte) finiteness {
			return classify(uint64(b[0])|uint64(b[1])<<8, 0x7f80, 0xff80)
		}, negInf}
	case dtDouble:
		return valueCheck{8, dtype, func(b []byte) finiteness {
			u := uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 | uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
			return classify(u, 0x7ff0000000000000, 0xfff0000000000000)
		}, negInf}
	case dtFloat:
		return valueCheck{4, dtype, func(b []byte) finiteness {
			return classify(uint64(b[0])|uint64(b[1])<<8|uint64(b[2])<<16|uint64(b[3])<<24, 0x7f800000, 0xff800000)
		}, negInf}
	}
	return valueCheck{1, dtype, func([]byte) finiteness { return finite }, negInf}
}

// check returns the error for the value b at element elem, if any.
func (v valueCheck) check(b []byte, name, what string, elem int64) error {
	switch v.class(b) {
	case nanOrPosInf:
		return fmt.Errorf("%w: %s %q (%s) holds a NaN or +Inf value (element %d): the weights diverged or were altered", errNonFinite, what, name, dtypeName(v.dtype), elem)
	case negInfinite:
		if v.negInf == nil || !v.negInf(elem) {
			return fmt.Errorf("%w: %s %q (%s) holds −Inf at element %d, where no mask an export writes has it: the weights diverged or were altered", errNonFinite, what, name, dtypeName(v.dtype), elem)
		}
	}
	return nil
}

// maskNegInf says where a tensor of shape dims may hold −Inf: anywhere in
// a one-element tensor, at j > i + S − T of a causal mask [..., T, S]
// whose other dimensions are 1, nowhere else.
func maskNegInf(dims []int64) func(int64) bool {
	numel := int64(1)
	for _, d := range dims {
		numel *= d
	}
	if numel == 1 {
		return func(int64) bool { return true }
	}
	r := len(dims)
	if r < 2 || numel != dims[r-2]*dims[r-1] {
		return nil
	}
	T, S := dims[r-2], dims[r-1]
	return func(e int64) bool { return e%S > e/S+S-T }
}

// stream checks n bytes read from s.
func (v valueCheck) stream(s *seq, n int64, name, what string) error {
	if n > s.end-s.off {
		return errTruncated
	}
	buf := make([]byte, min(n, 1<<20)/v.size*v.size+v.size)
	var done int64
	for done+v.size <= n {
		k := min(int64(len(buf)), (n-done)/v.size*v.size)
		if _, err := io.ReadFull(s.br, buf[:k]); err != nil {
			return errTruncated
		}
		s.off += k
		for i := int64(0); i < k; i += v.size {
			if err := v.check(buf[i:i+v.size], name, what, (done+i)/v.size); err != nil {
				return err
			}
		}
		done += k
	}
	return s.discard(n - done) // a trailing partial value
}

// scanHalfVarints checks float16/bfloat16 values held in int32_data.
func scanHalfVarints(s *seq, wt int, v valueCheck, name, what string) error {
	check := func(x uint64, i int64) error {
		return v.check([]byte{byte(x), byte(x >> 8)}, name, what, i)
	}
	if wt == 0 {
		x, err := s.varint()
		if err != nil {
			return err
		}
		return check(x, 0)
	}
	n, err := s.length()
	if err != nil {
		return err
	}
	for i, stop := int64(0), s.off+n; s.off < stop; i++ {
		x, err := s.varint()
		if err != nil {
			return err
		}
		if s.off > stop {
			return errTruncated
		}
		if err := check(x, i); err != nil {
			return err
		}
	}
	return nil
}

// scanExternal checks a tensor stored in an external data file: the file
// must be a verified file of the export, the range inside it and of the
// tensor's size, and floating values finite.
func (sc *scanConfig) scanExternal(m *tensorMeta, want int64, what string) error {
	loc := m.ext["location"]
	if sc.dir == "" {
		return badTensor("%s %q is stored in external data %q, which is only read from an export folder", what, m.name, loc)
	}
	if loc == "" || strings.Contains(loc, `\`) || path.Clean(loc) != loc || path.IsAbs(loc) || strings.HasPrefix(loc, "../") || loc == ".." {
		return badTensor("%s %q: external data location %q must be a plain relative path inside the export folder", what, m.name, loc)
	}
	full := path.Join(path.Dir(sc.rel), loc)
	size, ok := sc.files[full]
	if !ok {
		return badTensor("%s %q: external data file %q is not listed in the manifest; export it again", what, m.name, full)
	}
	parse := func(key string, def int64) (int64, error) {
		v, ok := m.ext[key]
		if !ok {
			return def, nil
		}
		x, err := strconv.ParseInt(v, 10, 64)
		if err != nil || x < 0 {
			return 0, badTensor("%s %q: bad external data %s %q", what, m.name, key, v)
		}
		return x, nil
	}
	off, err := parse("offset", 0)
	if err != nil {
		return err
	}
	if off > size {
		return badTensor("%s %q: external data offset %d is past the end of %s (%d bytes)", what, m.name, off, full, size)
	}
	n, err := parse("length", size-off)
	if err != nil {
		return err
	}
	if n > size-off {
		return badTensor("%s %q: external data [%d, +%d) runs past the end of %s (%d bytes)", what, m.name, off, n, full, size)
	}
	if n != want {
		return badTensor("%s %q: shape %v of %s needs %d bytes but its external data holds %d", what, m.name, m.dims, dtypeName(m.dtype), want, n)
	}
	if m.dtype != dtFloat && m.dtype != dtFloat16 && m.dtype != dtBFloat16 && m.dtype != dtDouble {
		return nil
	}
	root, err := os.OpenRoot(sc.dir)
	if err != nil {
		return err
	}
	defer root.Close()
	f, err := root.Open(full)
	if err != nil {
		return err
	}
	defer f.Close()
	s := newSeq(f, off, off+n)
	return rawCheck(m.dtype, maskNegInf(m.dims)).stream(s, n, m.name, what)
}

// errBadTensor marks a tensor refused for its dtype, shape or storage.
var errBadTensor = errors.New("bad tensor")

func badTensor(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errBadTensor, fmt.Sprintf(format, a...))
}
