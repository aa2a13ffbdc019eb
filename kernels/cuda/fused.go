package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// fusedStepKind is how a generated chain evaluates a step (fusedgen.go).
type fusedStepKind int32

const (
	fusedBinary fusedStepKind = iota
	fusedUnary
	fusedGrad
	fusedDraw // Dropout, DropoutGrad: a stream key slot, a register
)

// fusedStep encodes one step of a FusedElementwise body for the generator:
// its kind, op code (a drawing step: slot, its stream key's place among
// the launch's keys), registers and parameters.
func fusedStep(s ir.FusedStep, slot int) (prog [4]int32, params [3]float32, err error) {
	reg := func(i int) int32 {
		if i < len(s.Args) {
			return int32(s.Args[i])
		}
		return 0
	}
	if s.Op == ir.OpStopGradient {
		return [4]int32{int32(fusedUnary), uCopy, reg(0), 0}, params, nil
	}
	if kind, code, ok := ewCode(s.Op); ok {
		k := ewParams(ir.ElementwiseOf(s.Op), s.Attrs)
		switch kind {
		case ir.EwBinary:
			return [4]int32{int32(fusedBinary), code, reg(0), reg(1)}, params, nil
		case ir.EwGrad:
			return [4]int32{int32(fusedGrad), code, reg(0), reg(1)}, [3]float32{k[0], k[1], 0}, nil
		}
		return [4]int32{int32(fusedUnary), code, reg(0), 0}, k, nil
	}
	if d := ir.Ops[s.Op]; d != nil && d.ElementDraws {
		thresh, scale := dropoutThreshold(s.Attrs.Float("p", 0))
		all := float32(0)
		if thresh > math.MaxUint32 {
			all, thresh = 1, 0
		}
		return [4]int32{int32(fusedDraw), int32(slot), reg(0), 0}, [3]float32{scale, math.Float32frombits(uint32(thresh)), all}, nil
	}
	return prog, params, fmt.Errorf("fused step %s: no chain code", s.Op)
}

// A generated chain takes exactly eight stream keys (k0..k7):
// ir.MaxFusedDraws must be 8 (these fail to compile otherwise).
var (
	_ [8 - ir.MaxFusedDraws]struct{}
	_ [ir.MaxFusedDraws - 8]struct{}
)

// fusedMaxRegs bounds a chain's inputs and steps together (the registers
// of the interpreter the generated chains replaced; passes.FuseElementwise
// builds no larger chains).
const fusedMaxRegs = 24

// buildFused launches a FusedElementwise node's generated kernel
// (fusedgen.go). The chain interpreter fused_ew_f32 that ran them before
// was removed: an H200 measured it bound by its instructions (51.2 ms of a
// paper step against the generated chains' 19.7 predicted).
func (p *program) buildFused(n *ir.Node, in, out []*dval) (func() error, error) {
	body, err := n.Body()
	if err != nil {
		return nil, err
	}
	if len(body) > ir.MaxFusedSteps || len(in)+len(body) > fusedMaxRegs {
		return nil, fmt.Errorf("FusedElementwise: %d inputs and %d steps exceed %d steps or %d registers", len(in), len(body), ir.MaxFusedSteps, fusedMaxRegs)
	}
	if len(in) == 0 {
		return nil, fmt.Errorf("FusedElementwise: no inputs")
	}
	o := out[0]
	prog := make([]int32, 0, 4*len(body))
	params := make([]float32, 0, 3*len(body))
	var streams []int // the drawing steps' streams, by slot
	for _, s := range body {
		c, k, err := fusedStep(s, len(streams))
		if err != nil {
			return nil, err
		}
		if c[0] == int32(fusedDraw) {
			if len(streams) == ir.MaxFusedDraws {
				return nil, fmt.Errorf("FusedElementwise: more than %d drawing steps", ir.MaxFusedDraws)
			}
			streams = append(streams, s.Attrs.Int("stream", -1))
		}
		prog, params = append(prog, c[:]...), append(params, k[:]...)
	}
	v := view{dims: dims64(o.v.Shape)}
	ptrs := make([]uint64, len(in))
	dense := make([]int32, len(in))
	for k, x := range in {
		st, err := broadcastStrides(x.v.Shape, o.v.Shape)
		if err != nil {
			return nil, err
		}
		v.strides = append(v.strides, st)
		ptrs[k] = x.buf.Ptr
		if x.v.Shape.Equal(o.v.Shape) {
			dense[k] = 1
		}
	}
	v = v.collapse()
	packCols := 0
	var tw twin
	hasTwin := false
	if p.packsOutput(n) {
		packCols = lastDim(o.v.Shape)
		if err := p.packInto(o, packCols); err != nil {
			return nil, err
		}
	} else {
		if tw, hasTwin, err = p.twinFor(n); err != nil {
			return nil, err
		}
	}
	var sum chainSum
	hasSum, skipOut := false, false
	if packCols == 0 && v.rank() <= 2 {
		if f, ok := p.foldedSum(n); ok {
			if sum, hasSum, err = p.foldSum(n, f); err != nil {
				return nil, err
			}
			skipOut = hasSum && !p.keepsF32(n, f.r)
		}
	}
	bytes := 4 * float64(o.n) // each input read once (a broadcast one stays in cache), the output written
	switch {
	case packCols > 0:
		bytes = 2 * float64(o.n/packCols*bf16LD(packCols))
	case skipOut:
		bytes = 0
	}
	if hasTwin {
		bytes += 2 * float64(o.n)
	}
	var y Buffer // a sum of products' other factor
	if hasSum {
		bytes += float64(sum.part.Bytes)
		if sum.y != nil {
			y = p.vals[sum.y.ID].buf
			bytes += 4 * float64(o.n)
		}
	}
	half := make([]bool, len(in))
	for k, x := range in {
		half[k] = p.half[x.v.ID]
		size := 4.0
		if half[k] {
			size = 2
		}
		bytes += size * float64(x.n)
	}
	keys := func() [ir.MaxFusedDraws]uint64 { // this run's stream keys
		var k [ir.MaxFusedDraws]uint64
		for i, s := range streams {
			k[i] = kernels.StreamKey(p.seed, s)
		}
		if h, ok := p.be.dev.(costHinter); ok {
			h.hintBytes(bytes)
		}
		return k
	}
	{
		c := fusedChain{prog: prog, params: params, idx32: o.n <= math.MaxInt32, packCols: packCols, skipOut: skipOut, half: half}
		var twinBuf Buffer
		if hasTwin {
			c.twinCols, c.twinLD, c.twinOff, twinBuf = lastDim(o.v.Shape), tw.ld, tw.off, tw.buf
		}
		if hasSum {
			c.sum, c.sumY = sum.plan, sum.y != nil
		}
		return p.buildFusedGen(c, o, twinBuf, sum.part, y, in, v, dense, keys)
	}
}

// buildFusedGen launches the chain's generated kernel (fusedgen.go), which
// the program's module defines once every node is built (loadGenerated).
func (p *program) buildFusedGen(c fusedChain, o *dval, twinBuf, part, y Buffer, in []*dval, v view, dense []int32,
	keys func() [ir.MaxFusedDraws]uint64) (func() error, error) {
	c.dense = make([]bool, len(in))
	for k := range in {
		c.dense[k] = dense[k] != 0
		if !c.dense[k] {
			c.view = v
		}
	}
	name := c.name()
	if p.gen == nil {
		p.gen = map[string]string{}
	}
	p.gen[name] = c.source(name)
	args := make([]any, 0, len(in)+8)
	args = append(args, o.buf.Ptr)
	if c.twinCols > 0 {
		args = append(args, twinBuf.Ptr)
	}
	for _, x := range in {
		args = append(args, x.buf.Ptr)
	}
	if c.sum.m.C > 0 {
		args = append(args, part.Ptr)
		if c.sumY {
			args = append(args, y.Ptr)
		}
	}
	n := o.n // the threads' items: elements, or groups of eight bf16
	if c.packCols > 0 {
		n = o.n / c.packCols * bf16LD(c.packCols) / 8
	}
	args = append(args, int64(n))
	nk := len(args)
	for range ir.MaxFusedDraws {
		args = append(args, uint64(0))
	}
	return func() error {
		k := keys()
		for i := range k {
			args[nk+i] = k[i]
		}
		if c.sum.m.C > 0 {
			if n == 0 {
				return nil
			}
			return p.launch(name, chainSumGrid(c.sum), reduceBlock, 0, args...)
		}
		return p.each(name, n, args...)
	}, nil
}

// loadGenerated compiles and loads the module of the program's generated
// kernels (nothing when it has none).
func (p *program) loadGenerated() error {
	if len(p.gen) == 0 {
		return nil
	}
	src, err := fusedModule(p.gen)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(p.gen))
	for n := range p.gen {
		names = append(names, n)
	}
	if dir := os.Getenv("RPAC_CUDA_DUMP_GEN"); dir != "" {
		if err := dumpGenerated(dir, src); err != nil {
			return err
		}
	}
	return p.be.dev.loadModule("fused_gen.cu", src, names)
}

// dumpGenerated writes a generated source into dir as
// fused_gen-HASH.cu (RPAC_CUDA_DUMP_GEN=dir: to read or compile it alone).
func dumpGenerated(dir, src string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("RPAC_CUDA_DUMP_GEN: %w", err)
	}
	h := sha256.Sum256([]byte(src))
	return os.WriteFile(filepath.Join(dir, "fused_gen-"+hex.EncodeToString(h[:8])+".cu"), []byte(src), 0o644)
}
