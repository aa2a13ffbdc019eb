// Package enum spells the values of rpac's small enumerations (fold modes,
// attention lowerings, model kinds, weight sets, ...): each is an integer
// type whose spellings a Names lists in value order, so that String,
// parsing with an error that lists the valid values, and text marshalling
// that keeps the spelling in files are written once.
package enum

import (
	"fmt"
	"strings"
)

// Names are the spellings of an enumeration's values: Names[v] is v's.
// An empty spelling (at most the zero value's) is a value that is never
// parsed: an unset zero value, written as empty text.
type Names[T ~uint8] []string

// String is v's spelling, or what(v) for a value without one.
func (n Names[T]) String(what string, v T) string {
	if int(v) < len(n) && n[v] != "" {
		return n[v]
	}
	return fmt.Sprintf("%s(%d)", what, uint8(v))
}

// Parse reads a spelling; what names the setting in the error ("--fold").
func (n Names[T]) Parse(what, s string) (T, error) {
	for v, name := range n {
		if name != "" && name == s {
			return T(v), nil
		}
	}
	return 0, fmt.Errorf("%s %q: want %s", what, s, n.List())
}

// List is the valid spellings for a message: "a, b or c".
func (n Names[T]) List() string {
	var valid []string
	for _, name := range n {
		if name != "" {
			valid = append(valid, name)
		}
	}
	if len(valid) < 2 {
		return strings.Join(valid, "")
	}
	return strings.Join(valid[:len(valid)-1], ", ") + " or " + valid[len(valid)-1]
}

// Marshal is v's spelling as text (empty for an unset zero value); a
// value out of range is an error.
func (n Names[T]) Marshal(what string, v T) ([]byte, error) {
	if int(v) < len(n) {
		return []byte(n[v]), nil
	}
	return nil, fmt.Errorf("%s: no spelling for %d", what, uint8(v))
}

// Unmarshal reads v from its spelling; empty text is the unset zero value
// where there is one.
func (n Names[T]) Unmarshal(what string, v *T, text []byte) error {
	if len(text) == 0 && len(n) > 0 && n[0] == "" {
		*v = 0
		return nil
	}
	p, err := n.Parse(what, string(text))
	if err == nil {
		*v = p
	}
	return err
}
