package training

import (
	"fmt"

	"github.com/rpac-dev/rpac/ir"
)

// LossTargets chooses the tokens whose cross-entropy the training loss
// averages.
type LossTargets string

const (
	// LossAll averages over every token of the batch (the default; "" too).
	LossAll LossTargets = "all"
	// LossAnswers averages over the answer positions of a generated corpus
	// (synthetic, MQAR) only, as Zoology trains MQAR: every other target is
	// ir.IgnoreTarget, and the loss is the mean over the counted tokens.
	LossAnswers LossTargets = "answers"
)

// ParseLossTargets reads a --loss value.
func ParseLossTargets(s string) (LossTargets, error) {
	switch l := LossTargets(s); l {
	case "", LossAll:
		return LossAll, nil
	case LossAnswers:
		return l, nil
	}
	return "", fmt.Errorf("unknown loss targets %q (choose all or answers)", s)
}

// counted reports whether the loss averages over the counted targets (the
// step graph then takes the scale as an input).
func (l LossTargets) counted() bool { return l == LossAnswers }

// trainAnswers returns the answer marks of ds's training stream, or nil
// for data without answer positions.
func (ds *Dataset) trainAnswers() []bool {
	switch {
	case ds.MQAR != nil:
		return ds.MQAR.Train.Answers
	case ds.Synthetic != nil:
		return ds.Synthetic.Train.Answers
	}
	return nil
}

// countTargets returns the number of targets that are not ir.IgnoreTarget.
func countTargets(y []int32) int {
	n := 0
	for _, t := range y {
		if t != ir.IgnoreTarget {
			n++
		}
	}
	return n
}
