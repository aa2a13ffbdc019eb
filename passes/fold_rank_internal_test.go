package passes

import (
	"testing"

	"github.com/rpac-dev/rpac/ir"
)

// The layer of a bias comes from the model description's layer handles,
// not from the names of the tensors it reads.
func TestLayerOfBiasReadsModelInfo(t *testing.T) {
	g := ir.New("bias")
	tau := g.Param("some.tau", ir.Shape{})
	other := g.Param("blocks.7.unrelated", ir.Shape{})
	bias := g.Op1("Mul", nil, g.Op1("Neg", nil, tau), other)
	info := &ModelInfo{Layers: []LayerInfo{{Index: 3, Stored: []string{"some.tau"}}}}
	if l := layerOfBias(bias, info, -1); l != 3 {
		t.Errorf("layer %d, want 3", l)
	}
	if l := layerOfBias(bias, &ModelInfo{}, -1); l != -1 {
		t.Errorf("without layer handles: layer %d, want the default -1", l)
	}
}
