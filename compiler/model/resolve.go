package model

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"reflect"
	"sort"
	"strings"
)

// Overrides replace single size fields of a configuration (the command-line
// flags). A nil field leaves the value beneath it alone.
type Overrides struct {
	DModel    *int // d_model
	Layers    *int // layers
	Heads     *int // heads
	R         *int // R, fuzzy regimes
	Experts   *int // experts
	TopK      *int // top_k
	FFMult    *int // ff_mult
	MaxLen    *int // max_len
	RoPE      *bool
	SmearKeys *bool
}

// Apply returns c with every set override written over it.
func (o Overrides) Apply(c Config) Config {
	for _, f := range []struct {
		v   *int
		dst *int
	}{
		{o.DModel, &c.DModel}, {o.Layers, &c.Layers}, {o.Heads, &c.Heads}, {o.R, &c.R},
		{o.Experts, &c.Experts}, {o.TopK, &c.TopK}, {o.FFMult, &c.FFMult}, {o.MaxLen, &c.MaxLen},
	} {
		if f.v != nil {
			*f.dst = *f.v
		}
	}
	if o.RoPE != nil {
		c.RoPE = *o.RoPE
	}
	if o.SmearKeys != nil {
		c.SmearKeys = *o.SmearKeys
	}
	return c
}

// Resolve builds a model configuration from three layers, later ones winning:
// base (a preset's config), then the JSON file at path file (skipped when
// file is ""), then the overrides; the result must pass Validate.
func Resolve(base Config, file string, ov Overrides) (Config, error) {
	c := base
	if file != "" {
		var err error
		if c, err = ApplyConfigFile(c, file); err != nil {
			return Config{}, err
		}
	}
	c = ov.Apply(c)
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// ApplyConfigFile reads a JSON object from path and writes the fields it
// names over base; fields it leaves out keep base's values. The field names
// are Config's JSON names (those Config.JSON writes), matched exactly. An
// unknown name, a null, a value of the wrong type or malformed JSON is an
// error that names the file (and line:column where the JSON is at fault).
// The result is not validated; Resolve does that.
func ApplyConfigFile(base Config, path string) (Config, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Config{}, fmt.Errorf("model config file %s does not exist", path)
	}
	if err != nil {
		return Config{}, fmt.Errorf("model config file: %w", err)
	}
	defer f.Close()
	// A config is a few hundred bytes; a larger file is not one (and is
	// not read whole: it could be a device or a huge file).
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigFileBytes+1))
	if err != nil {
		return Config{}, fmt.Errorf("model config file: %w", err)
	}
	if len(data) > MaxConfigFileBytes {
		return Config{}, fmt.Errorf("model config file %s is more than %d bytes; it is not a model config", path, MaxConfigFileBytes)
	}
	return applyConfigJSON(base, path, data)
}

// MaxConfigFileBytes bounds a --config file.
const MaxConfigFileBytes = 1 << 20

func applyConfigJSON(base Config, path string, data []byte) (Config, error) {
	// at names the byte encoding/json had just read after off bytes.
	at := func(off int64) string {
		line, col := lineCol(data, off-1)
		return fmt.Sprintf("%s:%d:%d", path, line, col)
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return Config{}, fmt.Errorf("model config file %s is empty (want a JSON object such as {\"d_model\": 96})", path)
	}
	if trimmed[0] != '{' {
		return Config{}, fmt.Errorf("%s: want a JSON object of model config fields, such as {\"d_model\": 96}", at(int64(bytes.IndexByte(data, trimmed[0]))+1))
	}
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&fields); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return Config{}, fmt.Errorf("%s: malformed JSON: %s", at(se.Offset), se.Error())
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return Config{}, fmt.Errorf("%s: malformed JSON: the file ends inside the object", at(int64(len(data))))
		}
		return Config{}, fmt.Errorf("model config file %s: %w", path, err)
	}
	if end := dec.InputOffset(); len(bytes.TrimSpace(data[end:])) > 0 {
		extra := end + int64(len(data[end:])-len(bytes.TrimLeft(data[end:], " \t\r\n")))
		return Config{}, fmt.Errorf("%s: malformed JSON: more data after the object", at(extra+1))
	}

	valid := configFieldNames()
	known := map[string]bool{}
	for _, n := range valid {
		known[n] = true
	}
	var unknown, nulls []string
	for name, raw := range fields {
		switch {
		case !known[name]:
			u := fmt.Sprintf("%q", name)
			for _, n := range valid {
				if strings.EqualFold(strings.ReplaceAll(n, "_", ""), strings.NewReplacer("_", "", "-", "").Replace(name)) {
					u += fmt.Sprintf(" (did you mean %q?)", n)
					break
				}
			}
			unknown = append(unknown, u)
		case string(bytes.TrimSpace(raw)) == "null":
			nulls = append(nulls, name)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		noun := "field"
		if len(unknown) > 1 {
			noun = "fields"
		}
		return Config{}, fmt.Errorf("model config file %s: unknown %s %s; the valid fields are %s",
			path, noun, strings.Join(unknown, ", "), strings.Join(valid, ", "))
	}
	if len(nulls) > 0 {
		sort.Strings(nulls)
		return Config{}, fmt.Errorf("model config file %s: %s set to null (give a value, or leave the field out to keep the preset's)", path, strings.Join(nulls, ", "))
	}

	c := base
	if err := json.Unmarshal(data, &c); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Config{}, fmt.Errorf("%s: %s: want %s, got %s", at(te.Offset), te.Field, jsonKind(te.Type), te.Value)
		}
		return Config{}, fmt.Errorf("model config file %s: %w", path, err)
	}
	return c, nil
}

// configFieldNames lists Config's JSON field names in declaration order.
func configFieldNames() []string {
	t := reflect.TypeFor[Config]()
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); tag != "" && tag != "-" {
			names = append(names, tag)
		}
	}
	return names
}

func jsonKind(t reflect.Type) string {
	if reflect.PointerTo(t).Implements(reflect.TypeFor[encoding.TextUnmarshaler]()) {
		return "a string"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	}
	return t.String()
}

// lineCol returns the 1-based line and column of data[off].
func lineCol(data []byte, off int64) (line, col int) {
	off = max(0, min(off, int64(len(data))))
	line, col = 1, 1
	for _, b := range data[:off] {
		if b == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return line, col
}

// Summary is a one-line description of the model's shape for logs, in the
// JSON field names.
func (c Config) Summary() string {
	var s string
	if c.Model != Fuzzy {
		s = fmt.Sprintf("model=%s d_model=%d layers=%d heads=%d ff_mult=%d top_k=%d (ffn width %d) max_len=%d",
			c.Model, c.DModel, c.Layers, c.Heads, c.FFMult, c.TopK, c.FFMult*c.DModel*max(1, c.TopK), c.MaxLen)
	} else {
		s = fmt.Sprintf("model=fuzzy d_model=%d layers=%d heads=%d R=%d experts=%d top_k=%d ff_mult=%d max_len=%d",
			c.DModel, c.Layers, c.Heads, c.R, c.Experts, c.TopK, c.FFMult, c.MaxLen)
	}
	if c.RoPE {
		base := c.RoPEBase
		if base == 0 {
			base = 10000
		}
		s += fmt.Sprintf(" rope=true rope_base=%g", base)
	}
	if c.PosInit == "none" {
		s += " pos_init=none"
	}
	if c.SmearKeys {
		s += " smear_keys=true"
	}
	return s
}
