package logging

import (
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"strings"
	"sync"
	"time"
)

// Name is the type of the blank field that names an event, in its `log`
// tag; the other fields' `log` tags are the event's fields:
//
//	// CompiledEvent: the graphs of a length are written ("export.compiled").
//	type CompiledEvent struct {
//		_       logging.Name  `log:"export.compiled"`
//		T       int           `log:"T"`
//		File    string        `log:"file"`
//		Nodes   int           `log:"nodes,omitempty"`
//		Elapsed time.Duration `log:"seconds,seconds"`
//	}
//
// A field's tag is its key and options: omitempty leaves the field out
// when it is the zero value or empty, omitnan when it is NaN, with=F when
// the field F is zero or empty (a field present only with another);
// seconds writes a time.Duration as float seconds; string writes an
// error's or a fmt.Stringer's text. Tagged fields are exported. A field
// without a tag is not written, but for an embedded struct, whose tagged
// fields are the event's own (another event's fields declared once). An
// event with a field that a tag cannot say (a computed one) has an Attrs
// method, which may start from Fields.
type Name struct{}

// Named is an event whose name is not fixed: its Name method gives it.
type Named interface{ Name() string }

// Attributed is an event that writes its fields itself.
type Attributed interface{ Attrs() []slog.Attr }

// NameOf is ev's name: its Name method's, or its Name field's tag, or
// (neither) its type's name.
func NameOf(ev Event) string {
	if n, ok := ev.(Named); ok {
		return n.Name()
	}
	if d := describe(reflect.TypeOf(ev)); d.name != "" {
		return d.name
	}
	return reflect.TypeOf(ev).String()
}

// AttrsOf is ev's fields: its Attrs method's, or Fields.
func AttrsOf(ev Event) []slog.Attr {
	if a, ok := ev.(Attributed); ok {
		return a.Attrs()
	}
	return Fields(ev)
}

// Fields is the fields of an event struct that its `log` tags describe,
// in the struct's order, those that apply.
func Fields(ev any) []slog.Attr {
	v := reflect.ValueOf(ev)
	d := describe(v.Type())
	out := make([]slog.Attr, 0, len(d.fields))
	for _, f := range d.fields {
		if f.with != nil && empty(v.FieldByIndex(f.with)) {
			continue
		}
		if a, ok := f.attr(v.FieldByIndex(f.index)); ok {
			out = append(out, a)
		}
	}
	return out
}

// description is what an event type's tags say.
type description struct {
	name   string
	fields []field
}

// field is one tagged field.
type field struct {
	index                               []int // in the event struct (reflect.Value.FieldByIndex)
	key                                 string
	with                                []int // the field whose zero value leaves this one out (nil: none)
	omitEmpty, omitNaN, seconds, asText bool
}

var (
	nameType     = reflect.TypeFor[Name]()
	durationType = reflect.TypeFor[time.Duration]()
	descriptions sync.Map // reflect.Type → *description
)

// describe reads (once per type) the tags of an event struct; a type that
// is not a struct has none.
func describe(t reflect.Type) *description {
	if d, ok := descriptions.Load(t); ok {
		return d.(*description)
	}
	d := &description{}
	for i := range numFields(t) {
		sf := t.Field(i)
		tag, ok := sf.Tag.Lookup("log")
		switch {
		case !ok && sf.Anonymous && sf.Type.Kind() == reflect.Struct: // an embedded event's fields, inline
			for _, f := range describe(sf.Type).fields {
				f.index = append([]int{i}, f.index...)
				if f.with != nil {
					f.with = append([]int{i}, f.with...)
				}
				d.fields = append(d.fields, f)
			}
			continue
		case !ok:
			continue
		case sf.Type == nameType:
			d.name = tag
			continue
		}
		key, opts, _ := strings.Cut(tag, ",")
		f := field{index: []int{i}, key: key}
		for o := range strings.SplitSeq(opts, ",") {
			if name, ok := strings.CutPrefix(o, "with="); ok {
				w, found := t.FieldByName(name)
				if !found {
					panic(fmt.Sprintf("logging: %v.%s: `log:%q` names no field of %v", t, sf.Name, tag, t))
				}
				f.with = w.Index
				continue
			}
			switch o {
			case "omitempty":
				f.omitEmpty = true
			case "omitnan":
				f.omitNaN = true
			case "seconds":
				f.seconds = true
			case "string":
				f.asText = true
			case "":
			default:
				panic(fmt.Sprintf("logging: %v.%s: unknown option %q in `log:%q`", t, sf.Name, o, tag))
			}
		}
		if f.seconds && sf.Type != durationType {
			panic(fmt.Sprintf("logging: %v.%s: seconds of a %v", t, sf.Name, sf.Type))
		}
		d.fields = append(d.fields, f)
	}
	actual, _ := descriptions.LoadOrStore(t, d)
	return actual.(*description)
}

func numFields(t reflect.Type) int {
	if t.Kind() != reflect.Struct {
		return 0
	}
	return t.NumField()
}

// empty reports whether v is the zero value, or an empty slice or map.
func empty(v reflect.Value) bool {
	return v.IsZero() || (v.Kind() == reflect.Slice || v.Kind() == reflect.Map) && v.Len() == 0
}

// attr is the field's attribute for the value v, false when it is left
// out.
func (f field) attr(v reflect.Value) (slog.Attr, bool) {
	switch {
	case f.omitEmpty && empty(v):
		return slog.Attr{}, false
	case f.omitNaN && v.CanFloat() && math.IsNaN(v.Float()):
		return slog.Attr{}, false
	case f.seconds:
		return slog.Float64(f.key, time.Duration(v.Int()).Seconds()), true
	case f.asText:
		switch x := v.Interface().(type) {
		case error:
			return slog.String(f.key, x.Error()), true
		case fmt.Stringer:
			return slog.String(f.key, x.String()), true
		}
		return slog.String(f.key, fmt.Sprint(v.Interface())), true
	}
	switch v.Kind() {
	case reflect.Bool:
		return slog.Bool(f.key, v.Bool()), true
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return slog.Int64(f.key, v.Int()), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return slog.Uint64(f.key, v.Uint()), true
	case reflect.Float32, reflect.Float64:
		return slog.Float64(f.key, v.Float()), true
	case reflect.String:
		return slog.String(f.key, v.String()), true
	}
	return slog.Any(f.key, v.Interface()), true
}
