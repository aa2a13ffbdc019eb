package onnx

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/internal/fileio"
)

// maxInline is the size above which Write moves initializer data into an
// external file: a protobuf message cannot exceed 2 GiB, and the margin
// leaves room for the graph itself.
const maxInline = 2<<30 - 64<<20

// externalMin is the smallest initializer moved to the external file; the
// small constants (shapes, scalars, masks) stay inside the model.
const externalMin = 1024

// externalAlign aligns each tensor in the external file (page size, so
// onnxruntime can mmap it).
const externalAlign = 4096

// Write writes m to path atomically (a temporary file in the same folder,
// synced and renamed). A model whose initializers make it larger than a
// protobuf message may be (2 GiB) is written with its large initializers in
// a second file, path + ".data", referenced by external_data entries
// (location relative to the model's folder); m itself is not modified.
func Write(path string, m *onnxpb.ModelProto) error {
	return write(path, m, maxInline)
}

// WriteExternal is Write with every initializer of 1 KiB or more stored in
// DataFile(path), whatever the model's size.
func WriteExternal(path string, m *onnxpb.ModelProto) error {
	return write(path, m, -1)
}

// DataFile is the external-data file Write uses for a model at path.
func DataFile(path string) string { return path + ".data" }

func write(path string, m *onnxpb.ModelProto, limit int64) error {
	if m == nil || m.Graph == nil {
		return errors.New("onnx: write: model has no graph")
	}
	if int64(proto.Size(m)) > limit {
		var err error
		if m, err = externalize(path, m); err != nil {
			return err
		}
	} else if err := os.Remove(DataFile(path)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("onnx: write %s: removing a stale %s: %w", path, DataFile(path), err)
	}
	buf, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("onnx: encode %s: %w", path, err)
	}
	return atomicWrite(path, func(f *os.File) error {
		_, err := f.Write(buf)
		return err
	})
}

// externalize writes the large initializers' raw data to DataFile(path) and
// returns a copy of m whose initializers point at it.
func externalize(path string, m *onnxpb.ModelProto) (*onnxpb.ModelProto, error) {
	g := m.Graph
	inits := make([]*onnxpb.TensorProto, len(g.Initializer))
	type chunk struct {
		off  int64
		data []byte
	}
	var chunks []chunk
	var off int64
	location := filepath.Base(DataFile(path))
	for i, t := range g.Initializer {
		if len(t.RawData) < externalMin || t.GetDataLocation() == onnxpb.TensorProto_EXTERNAL {
			inits[i] = t
			continue
		}
		off = (off + externalAlign - 1) / externalAlign * externalAlign
		chunks = append(chunks, chunk{off, t.RawData})
		inits[i] = &onnxpb.TensorProto{
			Name:         t.Name,
			DataType:     t.DataType,
			Dims:         t.Dims,
			DocString:    t.DocString,
			DataLocation: onnxpb.TensorProto_EXTERNAL,
			ExternalData: []*onnxpb.StringStringEntryProto{
				{Key: "location", Value: location},
				{Key: "offset", Value: strconv.FormatInt(off, 10)},
				{Key: "length", Value: strconv.Itoa(len(t.RawData))},
			},
		}
		off += int64(len(t.RawData))
	}
	err := atomicWrite(DataFile(path), func(f *os.File) error {
		for _, c := range chunks {
			if _, err := f.WriteAt(c.data, c.off); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	ng := &onnxpb.GraphProto{
		Node:          g.Node,
		Name:          g.Name,
		Initializer:   inits,
		DocString:     g.DocString,
		Input:         g.Input,
		Output:        g.Output,
		ValueInfo:     g.ValueInfo,
		MetadataProps: g.MetadataProps,
	}
	return &onnxpb.ModelProto{
		IrVersion:       m.IrVersion,
		OpsetImport:     m.OpsetImport,
		ProducerName:    m.ProducerName,
		ProducerVersion: m.ProducerVersion,
		Domain:          m.Domain,
		ModelVersion:    m.ModelVersion,
		DocString:       m.DocString,
		Graph:           ng,
		MetadataProps:   m.MetadataProps,
	}, nil
}

// atomicWrite creates path through a synced temporary file and a rename.
func atomicWrite(path string, fill func(*os.File) error) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("onnx: write %s: %w", path, err)
	}
	err = fileio.Replace(f, path, func(f *os.File) error {
		if err := fill(f); err != nil {
			return err
		}
		return f.Chmod(0o644)
	})
	if err != nil {
		return fmt.Errorf("onnx: write %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// Read parses the ONNX model at path. Initializers stored as external data
// keep their external_data references (LoadExternal reads them).
func Read(path string) (*onnxpb.ModelProto, error) {
	buf, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("onnx: %w", err)
	}
	m := &onnxpb.ModelProto{}
	if err := proto.Unmarshal(buf, m); err != nil {
		return nil, fmt.Errorf("onnx: %s is not an ONNX model: %w", path, err)
	}
	if m.Graph == nil {
		return nil, fmt.Errorf("onnx: %s is not an ONNX model (no graph)", path)
	}
	return m, nil
}

// LoadExternal replaces the external_data references of m's initializers by
// their raw data, read from files relative to dir (the model's folder).
func LoadExternal(m *onnxpb.ModelProto, dir string) error {
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, t := range m.GetGraph().GetInitializer() {
		if t.GetDataLocation() != onnxpb.TensorProto_EXTERNAL {
			continue
		}
		var loc string
		var off, length int64 = 0, -1
		for _, e := range t.ExternalData {
			var err error
			switch e.Key {
			case "location":
				loc = e.Value
			case "offset":
				off, err = strconv.ParseInt(e.Value, 10, 64)
			case "length":
				length, err = strconv.ParseInt(e.Value, 10, 64)
			}
			if err != nil {
				return fmt.Errorf("onnx: initializer %s: bad external_data %s=%q", t.Name, e.Key, e.Value)
			}
		}
		if loc == "" || filepath.IsAbs(loc) || !filepath.IsLocal(loc) {
			return fmt.Errorf("onnx: initializer %s: external location %q must be a relative path inside the model folder", t.Name, loc)
		}
		f := files[loc]
		if f == nil {
			var err error
			if f, err = os.Open(filepath.Join(dir, loc)); err != nil {
				return fmt.Errorf("onnx: initializer %s: %w", t.Name, err)
			}
			files[loc] = f
		}
		if length < 0 {
			st, err := f.Stat()
			if err != nil {
				return fmt.Errorf("onnx: initializer %s: %w", t.Name, err)
			}
			length = st.Size() - off
		}
		if length < 0 || off < 0 {
			return fmt.Errorf("onnx: initializer %s: bad external range offset %d length %d", t.Name, off, length)
		}
		buf := make([]byte, length)
		if _, err := f.ReadAt(buf, off); err != nil {
			return fmt.Errorf("onnx: initializer %s: reading %s: %w", t.Name, loc, err)
		}
		t.RawData = buf
		t.ExternalData = nil
		t.DataLocation = onnxpb.TensorProto_DEFAULT
	}
	return nil
}
