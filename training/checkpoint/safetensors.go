package checkpoint

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"

	"github.com/rpac-dev/rpac/internal/fileio"
	"github.com/rpac-dev/rpac/internal/sysmem"
)

// Named is one tensor of a checkpoint: a name (a PyTorch module path such as
// "blocks.3.attn.Wq.weight"), a row-major shape and its float32 data.
// len(Data) must equal the product of Shape; an empty Shape is a scalar
// holding one value.
type Named struct {
	Name  string
	Shape []int
	Data  []float32
}

// Numel is the element count of the shape (1 for a scalar).
func (n Named) Numel() int { return numel(n.Shape) }

func numel(shape []int) int {
	p := 1
	for _, d := range shape {
		p *= d
	}
	return p
}

// maxHeaderLen bounds the JSON header of a safetensors file (the reference
// implementation uses the same limit).
const maxHeaderLen = 100 << 20

// metadataKey is the reserved header entry holding string metadata.
const metadataKey = "__metadata__"

// dtypeSize is the element size of every dtype the reader converts to
// float32. Anything else is rejected as an unknown dtype.
var dtypeSize = map[string]int{
	"F64": 8, "F32": 4, "F16": 2, "BF16": 2,
	"I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
}

type headerEntry struct {
	Dtype       string  `json:"dtype"`
	Shape       []int   `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// validate checks the tensors for writing: non-empty unique names, no
// reserved name, non-negative dimensions matching the data length.
func validate(tensors []Named) error {
	seen := make(map[string]bool, len(tensors))
	for i, t := range tensors {
		if t.Name == "" {
			return fmt.Errorf("tensor %d has an empty name", i)
		}
		if t.Name == metadataKey {
			return fmt.Errorf("tensor name %q is reserved by the safetensors format", t.Name)
		}
		if seen[t.Name] {
			return fmt.Errorf("tensor %q appears twice", t.Name)
		}
		seen[t.Name] = true
		n := 1
		for _, d := range t.Shape {
			if d < 0 {
				return fmt.Errorf("tensor %q has a negative dimension in shape %v", t.Name, t.Shape)
			}
			if d != 0 && n > math.MaxInt/d {
				return fmt.Errorf("tensor %q: shape %v is too large", t.Name, t.Shape)
			}
			n *= d
		}
		if n != len(t.Data) {
			return fmt.Errorf("tensor %q: shape %v holds %d values but Data has %d", t.Name, t.Shape, n, len(t.Data))
		}
	}
	return nil
}

// WriteSafetensors writes the tensors as float32 ("F32") in the safetensors
// format: an 8-byte little-endian header length, the JSON header padded with
// spaces to a multiple of 8 bytes, then the packed little-endian data. Tensors
// are laid out sorted by name, so equal inputs give identical bytes. meta may
// be nil.
func WriteSafetensors(w io.Writer, tensors []Named, meta map[string]string) error {
	if err := validate(tensors); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	order := make([]int, len(tensors))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return tensors[order[a]].Name < tensors[order[b]].Name })

	// The header is built by hand so that entries appear in data order.
	var hdr bytes.Buffer
	hdr.WriteByte('{')
	first := true
	if len(meta) > 0 {
		m, err := json.Marshal(meta)
		if err != nil {
			return fmt.Errorf("safetensors: metadata: %w", err)
		}
		hdr.WriteString(`"` + metadataKey + `":`)
		hdr.Write(m)
		first = false
	}
	var off int64
	for _, i := range order {
		t := tensors[i]
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		end := off + 4*int64(len(t.Data))
		e, err := json.Marshal(headerEntry{Dtype: "F32", Shape: shape, DataOffsets: []int64{off, end}})
		if err != nil {
			return fmt.Errorf("safetensors: %w", err)
		}
		name, _ := json.Marshal(t.Name)
		if !first {
			hdr.WriteByte(',')
		}
		first = false
		hdr.Write(name)
		hdr.WriteByte(':')
		hdr.Write(e)
		off = end
	}
	hdr.WriteByte('}')
	for hdr.Len()%8 != 0 {
		hdr.WriteByte(' ')
	}

	bw := bufio.NewWriterSize(w, 1<<20)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(hdr.Len()))
	bw.Write(lenBuf[:])
	bw.Write(hdr.Bytes())
	var buf [4096]byte
	for _, i := range order {
		data := tensors[i].Data
		for len(data) > 0 {
			n := min(len(data), len(buf)/4)
			for j, x := range data[:n] {
				binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(x))
			}
			if _, err := bw.Write(buf[:4*n]); err != nil {
				return fmt.Errorf("safetensors: %w", err)
			}
			data = data[n:]
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}

// ReadSafetensors parses a safetensors file held in memory. Every dtype in
// dtypeSize is converted to float32 (F64, F16 and BF16 for interop with
// PyTorch state dicts; integer and bool buffers by value). The tensors come
// back in file order. Malformed input gives an error, never a panic: a header
// length out of range, a header that is not a JSON object of well-formed
// entries, an unknown dtype, a shape that does not match its byte range,
// offsets out of bounds, overlapping or leaving gaps.
func ReadSafetensors(data []byte) ([]Named, map[string]string, error) {
	return readSafetensors(bytes.NewReader(data), int64(len(data)), readOptions{})
}

// TensorInfo is one tensor as a safetensors header declares it.
type TensorInfo struct {
	Name  string
	Dtype string
	Shape []int
}

// readOptions control readSafetensors.
type readOptions struct {
	// check, when set, sees the declared tensors before any data is read.
	check func([]TensorInfo) error
	// limit bounds the memory the decoded tensors may take (0: none).
	limit int64
	// finite refuses a NaN or ±Inf value of a floating tensor.
	finite bool
}

// readSafetensors reads a safetensors file of size bytes from r, in one
// pass: the header first, checked (offsets against size, then o.check),
// and only then the data it declares, decoded tensor by tensor, never held
// whole.
func readSafetensors(r io.Reader, size int64, o readOptions) ([]Named, map[string]string, error) {
	if size < 8 {
		return nil, nil, fmt.Errorf("safetensors: file is %d bytes, shorter than the 8-byte header length", size)
	}
	var lenBuf [8]byte
	if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
		return nil, nil, fmt.Errorf("safetensors: reading the header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n < 2 || n > maxHeaderLen {
		return nil, nil, fmt.Errorf("safetensors: header length %d is out of range (2..%d); not a safetensors file?", n, maxHeaderLen)
	}
	if n > uint64(size-8) {
		return nil, nil, fmt.Errorf("safetensors: header length %d exceeds the %d bytes after it; the file is truncated", n, size-8)
	}
	header := make([]byte, n)
	if _, err := io.ReadFull(r, header); err != nil {
		return nil, nil, fmt.Errorf("safetensors: reading the header: %w", err)
	}
	entries, meta, err := parseHeader(header, size-8-int64(n))
	if err != nil {
		return nil, nil, err
	}
	if o.check != nil {
		infos := make([]TensorInfo, len(entries))
		for i, e := range entries {
			infos[i] = TensorInfo{Name: e.name, Dtype: e.Dtype, Shape: e.Shape}
		}
		if err := o.check(infos); err != nil {
			return nil, nil, fmt.Errorf("safetensors: %w", err)
		}
	}
	if o.limit > 0 {
		var need int64
		for _, e := range entries {
			need += 4 * ((e.DataOffsets[1] - e.DataOffsets[0]) / int64(dtypeSize[e.Dtype]))
		}
		if need > o.limit {
			return nil, nil, fmt.Errorf("safetensors: the tensors would take %d MiB as float32, more than the %d MiB this process can spare", need>>20, o.limit>>20)
		}
	}
	out := make([]Named, len(entries))
	buf := make([]byte, 1<<20)
	for i, e := range entries {
		t := Named{Name: e.name, Shape: append([]int{}, e.Shape...)}
		size := int64(dtypeSize[e.Dtype])
		t.Data = make([]float32, (e.DataOffsets[1]-e.DataOffsets[0])/size)
		for done := 0; done < len(t.Data); {
			k := min(len(t.Data)-done, len(buf)/int(size))
			raw := buf[:k*int(size)]
			if _, err := io.ReadFull(r, raw); err != nil {
				return nil, nil, fmt.Errorf("safetensors: reading tensor %q: %w", e.name, err)
			}
			decodeInto(t.Data[done:done+k], e.Dtype, raw)
			done += k
		}
		if o.finite {
			for j, v := range t.Data {
				if v != v || math.IsInf(float64(v), 0) {
					return nil, nil, fmt.Errorf("safetensors: tensor %q holds a non-finite value (%v at element %d); no checkpoint is written so: the file was altered or damaged", e.name, v, j)
				}
			}
		}
		out[i] = t
	}
	return out, meta, nil
}

// entry is one tensor of a parsed header.
type entry struct {
	name string
	headerEntry
}

// parseHeader parses and checks a header against the bodyLen data bytes
// after it; the entries come back in data order.
func parseHeader(header []byte, bodyLen int64) ([]entry, map[string]string, error) {
	if header[0] != '{' {
		return nil, nil, fmt.Errorf("safetensors: header does not start with '{'")
	}
	var entries []entry
	var meta map[string]string
	dec := json.NewDecoder(bytes.NewReader(header))
	if _, err := dec.Token(); err != nil {
		return nil, nil, fmt.Errorf("safetensors: bad header JSON: %w", err)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, fmt.Errorf("safetensors: bad header JSON: %w", err)
		}
		key, ok := tok.(string)
		if !ok {
			return nil, nil, fmt.Errorf("safetensors: bad header JSON: key %v is not a string", tok)
		}
		if key == "" {
			return nil, nil, fmt.Errorf("safetensors: header has a tensor with an empty name")
		}
		if seen[key] {
			return nil, nil, fmt.Errorf("safetensors: header lists %q twice", key)
		}
		seen[key] = true
		if key == metadataKey {
			if err := dec.Decode(&meta); err != nil {
				return nil, nil, fmt.Errorf("safetensors: bad %s (want an object of strings): %w", metadataKey, err)
			}
			continue
		}
		var e headerEntry
		if err := dec.Decode(&e); err != nil {
			return nil, nil, fmt.Errorf("safetensors: bad header entry for %q: %w", key, err)
		}
		entries = append(entries, entry{key, e})
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, fmt.Errorf("safetensors: bad header JSON: %w", err)
	}
	if rest := bytes.TrimRight(header[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return nil, nil, fmt.Errorf("safetensors: %d stray bytes after the header object", len(rest))
	}

	for _, e := range entries {
		size, ok := dtypeSize[e.Dtype]
		if !ok {
			return nil, nil, fmt.Errorf("safetensors: tensor %q has unknown dtype %q (supported: F32, F64, F16, BF16, I64, I32, I16, I8, U8, BOOL)", e.name, e.Dtype)
		}
		if e.Shape == nil {
			return nil, nil, fmt.Errorf("safetensors: tensor %q has no shape", e.name)
		}
		if len(e.DataOffsets) != 2 {
			return nil, nil, fmt.Errorf("safetensors: tensor %q: data_offsets must be [begin, end], got %v", e.name, e.DataOffsets)
		}
		begin, end := e.DataOffsets[0], e.DataOffsets[1]
		if begin < 0 || end < begin || end > bodyLen {
			return nil, nil, fmt.Errorf("safetensors: tensor %q: data_offsets [%d, %d] out of bounds of the %d data bytes", e.name, begin, end, bodyLen)
		}
		elems := int64(1)
		for _, d := range e.Shape {
			if d < 0 {
				return nil, nil, fmt.Errorf("safetensors: tensor %q has a negative dimension in shape %v", e.name, e.Shape)
			}
			if d != 0 && elems > bodyLen/int64(d) {
				elems = bodyLen + 1 // larger than any valid byte range
				break
			}
			elems *= int64(d)
		}
		if elems*int64(size) != end-begin {
			return nil, nil, fmt.Errorf("safetensors: tensor %q: shape %v of %s needs %d bytes but data_offsets [%d, %d] span %d", e.name, e.Shape, e.Dtype, elems*int64(size), begin, end, end-begin)
		}
	}

	sort.SliceStable(entries, func(a, b int) bool {
		ea, eb := entries[a].DataOffsets, entries[b].DataOffsets
		if ea[0] != eb[0] {
			return ea[0] < eb[0]
		}
		return ea[1] < eb[1]
	})
	var pos int64
	for i, e := range entries {
		begin, end := e.DataOffsets[0], e.DataOffsets[1]
		if begin < pos {
			return nil, nil, fmt.Errorf("safetensors: tensor %q: data_offsets [%d, %d] overlap tensor %q ending at %d", e.name, begin, end, entries[i-1].name, pos)
		}
		if begin > pos {
			return nil, nil, fmt.Errorf("safetensors: gap of %d unused bytes before tensor %q at offset %d", begin-pos, e.name, pos)
		}
		pos = end
	}
	if pos != bodyLen {
		return nil, nil, fmt.Errorf("safetensors: %d data bytes after the last tensor (expected %d bytes of data, file has %d)", bodyLen-pos, pos, bodyLen)
	}

	return entries, meta, nil
}

// decodeInto converts little-endian raw data of a known dtype to float32,
// len(out) values.
func decodeInto(out []float32, dtype string, raw []byte) {
	le := binary.LittleEndian
	switch dtype {
	case "F32":
		for i := range out {
			out[i] = math.Float32frombits(le.Uint32(raw[4*i:]))
		}
	case "F64":
		for i := range out {
			out[i] = float32(math.Float64frombits(le.Uint64(raw[8*i:])))
		}
	case "F16":
		for i := range out {
			out[i] = f16ToF32(le.Uint16(raw[2*i:]))
		}
	case "BF16":
		for i := range out {
			out[i] = math.Float32frombits(uint32(le.Uint16(raw[2*i:])) << 16)
		}
	case "I64":
		for i := range out {
			out[i] = float32(int64(le.Uint64(raw[8*i:])))
		}
	case "I32":
		for i := range out {
			out[i] = float32(int32(le.Uint32(raw[4*i:])))
		}
	case "I16":
		for i := range out {
			out[i] = float32(int16(le.Uint16(raw[2*i:])))
		}
	case "I8":
		for i := range out {
			out[i] = float32(int8(raw[i]))
		}
	case "U8", "BOOL":
		for i := range out {
			out[i] = float32(raw[i])
		}
	}
}

// f16ToF32 converts an IEEE 754 half-precision value exactly.
func f16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0xff<<23 | mant<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case mant == 0: // signed zero
		return math.Float32frombits(sign)
	}
	// Subnormal: value = mant * 2^-24.
	v := float32(mant) * (1.0 / (1 << 24))
	if sign != 0 {
		v = -v
	}
	return v
}

// LoadWeightsFile reads a bare .safetensors file (for example a PyTorch state
// dict saved with safetensors.torch.save_file) and returns its tensors as
// float32 in file order, plus the header metadata. Errors name the file.
// The file is streamed: its header is checked against its size before any
// data is read, and tensors that would not fit in half the memory this
// process can still take are refused unread.
func LoadWeightsFile(path string) ([]Named, map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("checkpoint: %s is not a regular file", path)
	}
	ts, meta, err := readSafetensors(bufio.NewReaderSize(f, 1<<20), st.Size(), readOptions{limit: memoryLimit()})
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint: %s: %w", path, err)
	}
	return ts, meta, nil
}

// memoryLimit is half the memory this process can still take (0 when
// unknown: no limit).
func memoryLimit() int64 {
	avail, err := sysmem.Available()
	if err != nil || avail <= 0 {
		return 0
	}
	return avail / 2
}

// SaveWeightsFile writes tensors as a bare .safetensors file, atomically: the
// data goes to a temporary file in the same directory, is synced, and is then
// renamed over path.
func SaveWeightsFile(path string, tensors []Named, meta map[string]string) error {
	if err := validate(tensors); err != nil {
		return fmt.Errorf("checkpoint: %s: %w", path, err)
	}
	dir, base := splitPath(path)
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	err = fileio.Replace(f, path, func(f *os.File) error { return WriteSafetensors(f, tensors, meta) })
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("checkpoint: writing %s: %w", path, err)
	}
	return nil
}

// Lookup returns the tensor with the given name, or false.
func Lookup(tensors []Named, name string) (Named, bool) {
	for _, t := range tensors {
		if t.Name == name {
			return t, true
		}
	}
	return Named{}, false
}
