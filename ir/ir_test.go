package ir

import (
	"strings"
	"testing"
)

func TestBroadcastAndReduceShapes(t *testing.T) {
	cases := []struct {
		a, b, want Shape
		ok         bool
	}{
		{Shape{2, 3, 4}, Shape{4}, Shape{2, 3, 4}, true},
		{Shape{2, 1, 4}, Shape{3, 1}, Shape{2, 3, 4}, true},
		{Shape{}, Shape{5}, Shape{5}, true},
		{Shape{2, 3}, Shape{4}, nil, false},
	}
	for _, c := range cases {
		got, err := Broadcast(c.a, c.b)
		if (err == nil) != c.ok || (c.ok && !got.Equal(c.want)) {
			t.Errorf("Broadcast(%v,%v) = %v, %v; want %v ok=%v", c.a, c.b, got, err, c.want, c.ok)
		}
	}
	if s, _ := ReduceShape(Shape{2, 3, 4}, []int{-1}, false); !s.Equal(Shape{2, 3}) {
		t.Errorf("reduce last: %v", s)
	}
	if s, _ := ReduceShape(Shape{2, 3, 4}, nil, true); !s.Equal(Shape{1, 1, 1}) {
		t.Errorf("reduce all keepdims: %v", s)
	}
	if _, err := ReduceShape(Shape{2}, []int{3}, false); err == nil {
		t.Error("out-of-range axis accepted")
	}
}

func TestApplyRejectsBadShapes(t *testing.T) {
	g := New("bad")
	x := g.Input("x", Shape{2, 3}, F32)
	w := g.Param("w", Shape{4, 5})
	if _, err := g.TryApply("Linear", nil, x, w); err == nil || !strings.Contains(err.Error(), "Linear") {
		t.Fatalf("mismatched Linear accepted: %v", err)
	}
	if _, err := g.TryApply("NoSuchOp", nil, x); err == nil {
		t.Fatal("unknown op accepted")
	}
	if _, err := g.TryApply("Reshape", Attrs{"shape": []int{7}}, x); err == nil {
		t.Fatal("reshape to another size accepted")
	}
}

func TestVerify(t *testing.T) {
	build := func() (*Graph, *Value) {
		g := New("v")
		x := g.Input("x", Shape{2, 3}, F32)
		y := g.Apply("Dropout", Attrs{"p": 0.1}, x)[0]
		g.SetOutput("y", g.Op1("Tanh", nil, y))
		return g, x
	}
	g, _ := build()
	if err := Verify(g, false); err != nil {
		t.Fatalf("training graph: %v", err)
	}
	if err := Verify(g, true); err == nil || !strings.Contains(err.Error(), "training-only op Dropout") {
		t.Fatalf("export verify accepted Dropout: %v", err)
	}
	// A node reading a value defined later is rejected.
	g, _ = build()
	g.Nodes[0], g.Nodes[1] = g.Nodes[1], g.Nodes[0]
	if err := Verify(g, false); err == nil || !strings.Contains(err.Error(), "before it is defined") {
		t.Fatalf("use before definition accepted: %v", err)
	}
	// A recorded shape that disagrees with the shape rule is rejected.
	g, _ = build()
	g.Nodes[1].Outputs[0].Shape = Shape{3, 2}
	if err := Verify(g, false); err == nil || !strings.Contains(err.Error(), "rule says") {
		t.Fatalf("wrong shape accepted: %v", err)
	}
	// A training-only buffer is rejected in an export graph.
	g = New("buf")
	b := g.Buffer("bias_scale", Shape{})
	b.TrainingOnly = true
	g.SetOutput("y", g.Op1("Neg", nil, b))
	if err := Verify(g, true); err == nil || !strings.Contains(err.Error(), "training-only buffer") {
		t.Fatalf("training-only buffer accepted: %v", err)
	}
}

func TestPrint(t *testing.T) {
	g := New("p")
	x := g.Input("x", Shape{2, 3}, F32)
	g.SetOutput("y", g.Op1("Scale", Attrs{"alpha": 2.0}, x))
	s := g.String()
	for _, want := range []string{"graph p {", "input %x f32[2,3]", "Scale(%x) {alpha=2}", `output "y"`} {
		if !strings.Contains(s, want) {
			t.Errorf("dump lacks %q:\n%s", want, s)
		}
	}
}
