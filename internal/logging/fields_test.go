package logging

import (
	"bytes"
	"errors"
	"log/slog"
	"math"
	"regexp"
	"testing"
	"time"
)

// taggedEvent says its name and fields in tags, with every option.
type taggedEvent struct {
	_       Name          `log:"test.tagged"`
	Step    int           `log:"step"`
	Seed    uint64        `log:"seed"`
	CE      float64       `log:"val_ce,omitnan"`
	Note    string        `log:"note,omitempty"`
	Lengths []int         `log:"lengths,omitempty"`
	Ranked  bool          `log:"ranked,omitempty"`
	Rank    int           `log:"rank,with=Ranked"`
	Wait    time.Duration `log:"wait_s,seconds"`
	Err     error         `log:"err,string"`
	Scratch int           // not a field
}

func (e taggedEvent) Text() string { return "tagged" }

// renamedEvent has a name of its own.
type renamedEvent struct {
	_    Name   `log:"test.fixed"`
	Kind string `log:"kind"`
}

func (e renamedEvent) Name() string { return "test." + e.Kind }
func (e renamedEvent) Text() string { return e.Kind }

// sizes is a part of events, its fields declared once.
type sizes struct {
	Bytes int64 `log:"bytes"`
	Nodes int   `log:"nodes,with=Bytes"`
}

// outerEvent has the fields of an embedded struct among its own.
type outerEvent struct {
	_ Name `log:"test.outer"`
	T int  `log:"T"`
	sizes
	Note string `log:"note"`
}

func (e outerEvent) Text() string { return "outer" }

// TestFields: the tags give the name and the fields in the struct's order,
// each option leaving out what it should and writing the rest as slog's
// own attributes would.
func TestFields(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf, JSON, slog.LevelInfo)
	Info(l, taggedEvent{Step: 3, Seed: 7, CE: 2.5, Note: "n", Lengths: []int{32, 64}, Ranked: true, Rank: 0, Wait: 1500 * time.Millisecond, Err: errors.New("gone"), Scratch: 9})
	Info(l, taggedEvent{Step: 4, CE: math.NaN(), Lengths: []int{}, Rank: 5, Err: errors.New("e")})
	Info(l, renamedEvent{Kind: "dyn"})
	Info(l, outerEvent{T: 1, sizes: sizes{Bytes: 5, Nodes: 2}, Note: "x"})
	Info(l, outerEvent{T: 2, sizes: sizes{Nodes: 2}})
	got := regexp.MustCompile(`"time":"[^"]*",`).ReplaceAllString(buf.String(), "")
	want := `{"level":"INFO","msg":"test.tagged","step":3,"seed":7,"val_ce":2.5,"note":"n","lengths":[32,64],"ranked":true,"rank":0,"wait_s":1.5,"err":"gone"}` + "\n" +
		`{"level":"INFO","msg":"test.tagged","step":4,"seed":0,"wait_s":0,"err":"e"}` + "\n" +
		`{"level":"INFO","msg":"test.dyn","kind":"dyn"}` + "\n" +
		`{"level":"INFO","msg":"test.outer","T":1,"bytes":5,"nodes":2,"note":"x"}` + "\n" +
		`{"level":"INFO","msg":"test.outer","T":2,"bytes":0,"note":""}` + "\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if n := NameOf(taggedEvent{}); n != "test.tagged" {
		t.Errorf("NameOf = %q", n)
	}
	if a := AttrsOf(testEvent{Step: 1, CE: math.NaN()}); len(a) != 1 || a[0].Key != "step" {
		t.Errorf("an Attrs method is not what AttrsOf gives: %v", a)
	}
}

// TestFieldsBadTag: a tag that names no field, or an option no one
// knows, is a mistake found on the first use of the type.
func TestFieldsBadTag(t *testing.T) {
	type withNothing struct {
		A int `log:"a,with=Missing"`
	}
	type unknown struct {
		A int `log:"a,omitzero"`
	}
	for _, ev := range []any{withNothing{}, unknown{}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%T: no panic", ev)
				}
			}()
			Fields(ev)
		}()
	}
}
