package checkpoint

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Schema is what a checkpoint's safetensors file may hold: every tensor's
// name and shape, all float32 (F32, the only dtype a checkpoint is written
// in). Load checks a file's size against the largest file the schema
// allows and its header against the schema before any tensor data is
// read: a tensor of another dtype or shape, or one the schema does not
// name, is refused by name. Tensors the schema names may be absent (the
// caller decides what a partial file means).
type Schema map[string][]int

// errSchema marks a file refused by its schema (definite: the file is not
// read further).
var errSchema = errors.New("does not match the model")

// maxFileBytes is the size of the largest file the schema allows: every
// tensor present, with a generous header.
func (s Schema) maxFileBytes() int64 {
	n := int64(8 + 4096) // header length, metadata and braces
	for name, shape := range s {
		n += int64(len(name)) + 96 + 24*int64(len(shape))
		n += 4 * int64(numel(shape))
	}
	return n
}

// check refuses declared tensors the schema does not allow, naming them.
func (s Schema) check(ts []TensorInfo) error {
	var unknown []string
	for _, t := range ts {
		want, ok := s[t.Name]
		if !ok {
			unknown = append(unknown, t.Name)
			continue
		}
		if t.Dtype != "F32" {
			return fmt.Errorf("%w: tensor %q is %s, the model's %q is F32", errSchema, t.Name, t.Dtype, t.Name)
		}
		if !slices.Equal(t.Shape, want) {
			return fmt.Errorf("%w: tensor %q has shape %v, the model's has %v", errSchema, t.Name, t.Shape, want)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		if len(unknown) > 5 {
			unknown = append(unknown[:5], fmt.Sprintf("and %d more", len(unknown)-5))
		}
		return fmt.Errorf("%w: it holds tensors the model does not have: %s", errSchema, strings.Join(unknown, ", "))
	}
	return nil
}
