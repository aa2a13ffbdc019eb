package cpu

import (
	"fmt"

	"github.com/rpac-dev/rpac/ir"
)

// build returns the kernel of one node. in and out are the node's value
// storages; kernels read their data slices when they run, so parameters and
// feeds rebound by Run are seen.
func (p *program[T]) build(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	for _, t := range in {
		if t.v.DType == ir.I32 {
			switch {
			case n.Op == "Reshape",
				n.Op == "Gather" && t == in[1],
				n.Op == "GatherGrad" && t == in[1],
				n.Op == "CrossEntropy" && t == in[1],
				n.Op == "CrossEntropyGrad" && t == in[2],
				n.Op == "LMHeadCrossEntropy" && t == in[2],
				n.Op == "LMHeadCrossEntropyGrad" && t == in[3]:
			default:
				return nil, fmt.Errorf("input %s is i32; %s takes float data there", t.v, n.Op)
			}
		}
	}
	switch n.Op {
	case "Gather":
		return p.buildGather(in, out)
	case "GatherGrad":
		return p.buildGatherGrad(n, in, out)
	case "Slice":
		return p.buildSlice(n, in, out, false)
	case "SliceGrad":
		return p.buildSlice(n, in, out, true)
	case "Reshape", "StopGradient":
		return p.buildUnary(n, opCopy, in, out)
	case "Transpose":
		return p.buildTranspose(n, in, out)
	case "BroadcastTo":
		return p.buildBroadcastTo(in, out)
	case "SumTo":
		return p.sumToKernel(in[0], out[0], ir.Shape(n.Attrs.Ints("shape")), 1)
	case "Linear":
		return p.buildLinear(in, out)
	case "LinearGradX":
		return p.buildLinearGradX(in, out)
	case "LinearGradW":
		return p.buildLinearGradW(in, out)
	case "MatMul":
		return p.buildMatMul(n, in, out)
	case "Add":
		return p.buildBinary(opAdd, in, out)
	case "Sub":
		return p.buildBinary(opSub, in, out)
	case "Mul":
		return p.buildBinary(opMul, in, out)
	case "Div":
		return p.buildBinary(opDiv, in, out)
	case "Scale":
		return p.buildUnary(n, opScale, in, out)
	case "Neg":
		return p.buildUnary(n, opNeg, in, out)
	case "Exp":
		return p.buildUnary(n, opExp, in, out)
	case "Log":
		return p.buildUnary(n, opLog, in, out)
	case "Sigmoid":
		return p.buildUnary(n, opSigmoid, in, out)
	case "Tanh":
		return p.buildUnary(n, opTanh, in, out)
	case "GELU":
		return p.buildUnary(n, opGELU, in, out)
	case "ReLU":
		return p.buildUnary(n, opReLU, in, out)
	case "Clamp":
		return p.buildUnary(n, opClamp, in, out)
	case "NanToNum":
		return p.buildUnary(n, opNanToNum, in, out)
	case "SigmoidGrad":
		return p.buildGradUnary(n, opSigmoidGrad, in, out)
	case "TanhGrad":
		return p.buildGradUnary(n, opTanhGrad, in, out)
	case "GELUGrad":
		return p.buildGradUnary(n, opGELUGrad, in, out)
	case "ReLUGrad":
		return p.buildGradUnary(n, opReLUGrad, in, out)
	case "ClampGrad":
		return p.buildGradUnary(n, opClampGrad, in, out)
	case "NanToNumGrad":
		return p.buildGradUnary(n, opNanToNumGrad, in, out)
	case "ReduceSum":
		return p.buildReduce(n, in, out, false)
	case "ReduceMean":
		return p.buildReduce(n, in, out, true)
	case "Softmax":
		return p.buildSoftmax(in, out)
	case "SoftmaxGrad":
		return p.buildSoftmaxGrad(in, out)
	case "CausalMask":
		return p.buildCausalMask(n, in, out)
	case "LayerNorm":
		return p.buildLayerNorm(n, in, out)
	case "LayerNormGrad":
		return p.buildLayerNormGrad(n, in, out)
	case "Dropout":
		return p.buildDropout(n, in, out)
	case "GumbelNoise":
		return p.buildGumbel(n, in, out)
	case "TopKMask":
		return p.buildTopKMask(n, in, out)
	case "CrossEntropy":
		return p.buildCrossEntropy(n, in, out)
	case "CrossEntropyGrad":
		return p.buildCrossEntropyGrad(n, in, out)
	case "LMHeadCrossEntropy":
		return p.buildLMHeadCE(n, in, out)
	case "LMHeadCrossEntropyGrad":
		return p.buildLMHeadCEGrad(n, in, out)
	case "GaussianMembership":
		return p.buildGaussian(in, out)
	case "GaussianMembershipGrad":
		return p.buildGaussianGrad(in, out)
	case "Sinkhorn":
		return p.buildSinkhorn(n, in, out)
	case "SinkhornGrad":
		return p.buildSinkhornGrad(n, in, out)
	case "ZScore":
		return p.buildZScore(in, out)
	case "ZScoreGrad":
		return p.buildZScoreGrad(in, out)
	case "FusedAttention":
		return p.buildFusedAttention(n, in, out)
	case "FusedAttentionGrad":
		return p.buildFusedAttentionGrad(n, in, out)
	case "Concat":
		return p.buildConcat(n, in, out)
	}
	return nil, errUnsupported
}
