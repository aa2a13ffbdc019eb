package passes

import "github.com/rpac-dev/rpac/internal/enum"

// Dispatch is how a mixture of experts sends the tokens to its experts
// (rpac train --expert-dispatch, rpac bench train --expert-dispatch).
type Dispatch uint8

// Dispatches of the fuzzy block's experts.
const (
	// DispatchAuto is the backend's choice (kernels.Capabilities.RoutedExperts).
	DispatchAuto Dispatch = iota
	// DispatchDense runs every expert on every token and multiplies the
	// outputs outside the top-k by 0 (the paper's listing).
	DispatchDense
	// DispatchRouted runs each expert on the tokens routed to it only
	// (ir.OpExpertFFN): the same outputs and gradients, top_k/E of the
	// experts' GEMM work.
	DispatchRouted
)

var dispatchNames = enum.Names[Dispatch]{"auto", "dense", "routed"}

func (d Dispatch) String() string { return dispatchNames.String("experts", d) }

// ParseDispatch reads --expert-dispatch: auto, dense or routed.
func ParseDispatch(s string) (Dispatch, error) { return dispatchNames.Parse("--expert-dispatch", s) }

// ExpertDispatch is the dispatch the graphs of c are built with: Experts,
// or, for DispatchAuto, the backend's choice that ForBackend recorded.
func (c *Context) ExpertDispatch() Dispatch {
	switch {
	case c.Experts != DispatchAuto:
		return c.Experts
	case c.RoutedExperts:
		return DispatchRouted
	}
	return DispatchDense
}
