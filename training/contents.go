package training

import (
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/rpac-dev/rpac/compiler/model"
)

// Contents is what a run's checkpoint holds.
type Contents struct {
	Params       int64 // trainable parameters
	ParamTensors int
	Tensors      int // tensors in the file
	// Lengths have running statistics stored; Trained are those of them
	// whose running statistics all come from training.
	Lengths, Trained []int
	// Averaged counts the tensors of the averaged weight sets (WeightsEMA,
	// WeightsSWA); Guardian those of the Guardian policy.
	Averaged map[WeightSet]int
	Guardian int
}

var lengthSuffix = regexp.MustCompile(`\.T(\d+)$`)

// Contents describes the run's checkpoint.
func (r *Run) Contents() Contents {
	params, _ := model.Params(&r.Config)
	isParam := map[string]bool{}
	for _, p := range params {
		isParam[p] = true
	}
	c := Contents{ParamTensors: len(params), Tensors: len(r.Tensors), Averaged: map[WeightSet]int{}}
	lengths := map[int]bool{}
	for _, t := range r.Tensors {
		if isParam[t.Name] {
			c.Params += int64(t.Numel())
		}
		if m := lengthSuffix.FindStringSubmatch(t.Name); m != nil {
			T, _ := strconv.Atoi(m[1])
			lengths[T] = true
		}
		for _, w := range []WeightSet{WeightsEMA, WeightsSWA} {
			if strings.HasPrefix(t.Name, w.Prefix()) {
				c.Averaged[w]++
			}
		}
		if strings.HasPrefix(t.Name, "guardian.") {
			c.Guardian++
		}
	}
	for T := range lengths {
		c.Lengths = append(c.Lengths, T)
	}
	sort.Ints(c.Lengths)
	for _, T := range c.Lengths {
		if r.trainedAt(T) {
			c.Trained = append(c.Trained, T)
		}
	}
	return c
}

// trainedAt reports whether every running-statistics buffer of length T
// holds trained values (false when the model has none).
func (r *Run) trainedAt(T int) bool {
	bufs, err := model.RunningBuffers(&r.Config, T)
	if err != nil || len(bufs) == 0 {
		return false
	}
	for b := range bufs {
		if !r.Trained(b) {
			return false
		}
	}
	return true
}
