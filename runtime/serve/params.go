package serve

import (
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
)

// decodeParams reads a JSON object body into the struct *v (as
// decodeJSON does) and refuses any field v does not declare: a parameter
// this server does not implement gets a 400 that names it instead of
// being ignored. A field sent as null counts as absent.
func (s *Server) decodeParams(w http.ResponseWriter, r *http.Request, v any) error {
	var fields map[string]json.RawMessage
	if err := s.decodeJSON(w, r, &fields); err != nil {
		return err
	}
	if fields == nil {
		return badRequest("the request body is null; send a JSON object")
	}
	known := knownFields(reflect.TypeOf(v).Elem())
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names) // the first unknown one, in a stable order
	for _, name := range names {
		if !known[name] && string(fields[name]) != "null" {
			return unsupportedParam(name)
		}
	}
	b, _ := json.Marshal(fields)
	if err := json.Unmarshal(b, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			// the path of a promoted field begins with its embedded struct's name
			field := strings.TrimPrefix(te.Field, reflect.TypeFor[samplingParams]().Name()+".")
			return badParam(field, "%s: want a JSON %s, not %s", field, jsonKind(te.Type), te.Value)
		}
		return badRequest("the request body is not valid JSON for this route: %v", err)
	}
	return nil
}

// jsonKind names the JSON value a Go type takes.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "boolean"
	case reflect.String:
		return "string"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Map, reflect.Struct:
		return "object"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "number"
}

var knownFieldsCache sync.Map // reflect.Type → map[string]bool

// knownFields is the set of JSON field names of a struct type.
func knownFields(t reflect.Type) map[string]bool {
	if m, ok := knownFieldsCache.Load(t); ok {
		return m.(map[string]bool)
	}
	m := map[string]bool{}
	for f := range t.Fields() {
		if f.Anonymous && f.Type.Kind() == reflect.Struct { // its fields are the outer's in JSON
			maps.Copy(m, knownFields(f.Type))
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		m[name] = true
	}
	knownFieldsCache.Store(t, m)
	return m
}
