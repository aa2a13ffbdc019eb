package enum

import (
	"strings"
	"testing"
)

type color uint8

var colors = Names[color]{"", "red", "green", "blue"}

func TestNames(t *testing.T) {
	for v, s := range map[color]string{1: "red", 3: "blue", 0: "color(0)", 9: "color(9)"} {
		if got := colors.String("color", v); got != s {
			t.Errorf("String(%d) = %q, want %q", v, got, s)
		}
	}
	if v, err := colors.Parse("--color", "green"); err != nil || v != 2 {
		t.Errorf("Parse(green) = %v, %v", v, err)
	}
	for _, bad := range []string{"", "Red", "purple"} {
		_, err := colors.Parse("--color", bad)
		if err == nil || !strings.Contains(err.Error(), `--color "`+bad+`": want red, green or blue`) {
			t.Errorf("Parse(%q): %v", bad, err)
		}
	}
	if b, err := colors.Marshal("color", 3); err != nil || string(b) != "blue" {
		t.Errorf("Marshal(3) = %q, %v", b, err)
	}
	if b, err := colors.Marshal("color", 0); err != nil || len(b) != 0 {
		t.Errorf("Marshal(unset) = %q, %v; want empty", b, err)
	}
	if _, err := colors.Marshal("color", 4); err == nil {
		t.Error("a value out of range marshalled")
	}
	var c color
	if err := colors.Unmarshal("color", &c, []byte("green")); err != nil || c != 2 {
		t.Errorf("Unmarshal(green) = %v, %v", c, err)
	}
	if err := colors.Unmarshal("color", &c, []byte("grey")); err == nil || c != 2 {
		t.Errorf("Unmarshal(grey) = %v, %v: want an error, the value kept", c, err)
	}
	if err := colors.Unmarshal("color", &c, nil); err != nil || c != 0 {
		t.Errorf("Unmarshal of empty text = %v, %v; want the unset value", c, err)
	}
	if err := (Names[color]{"one"}).Unmarshal("x", &c, nil); err == nil {
		t.Error("empty text read where no value is unset")
	}
	if l := (Names[color]{"one"}).List(); l != "one" {
		t.Errorf("List of one: %q", l)
	}
}
