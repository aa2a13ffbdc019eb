package data

import (
	"fmt"
	"strings"
)

// RecallBucket is the recall of the answers whose query distance lies in
// [Lo, Hi).
type RecallBucket struct {
	Lo      int `json:"lo"`
	Hi      int `json:"hi"`
	Correct int `json:"correct"`
	Total   int `json:"total"`
}

// SlotRecall is the recall of the answers to pair Slot (0: the first pair
// after MQARBOS).
type SlotRecall struct {
	Slot    int `json:"slot"`
	Correct int `json:"correct"`
	Total   int `json:"total"`
}

// OrderRecall is the recall of the answers to the Order-th query of their
// sequence (0: the first query after the pairs). A model that only
// eliminates the values already queried, without matching keys, scores
// 1/(Pairs−Order) here: its last query is always right.
type OrderRecall struct {
	Order   int `json:"order"`
	Correct int `json:"correct"`
	Total   int `json:"total"`
}

// RecallBreakdown splits an MQAR recall count by query distance, by the
// queried pair's slot and by the query's order in its sequence.
type RecallBreakdown struct {
	ByDist  []RecallBucket `json:"recall_by_dist"`
	BySlot  []SlotRecall   `json:"recall_by_slot"`
	ByOrder []OrderRecall  `json:"recall_by_order"`
}

// DistanceEdges returns the bucket edges for distances 1..maxDist: 1, then
// powers of two from 4 up to the first one above maxDist. Bucket i is
// [edges[i], edges[i+1]).
func DistanceEdges(maxDist int) []int {
	edges := []int{1}
	for e := 4; ; e *= 2 {
		edges = append(edges, e)
		if e > maxDist {
			return edges
		}
	}
}

// NewRecallBreakdown returns an empty breakdown for c's distances and
// pairs.
func (c MQARConfig) NewRecallBreakdown() *RecallBreakdown {
	c = c.WithDefaults()
	edges := DistanceEdges(c.MaxDist)
	b := &RecallBreakdown{ByDist: make([]RecallBucket, len(edges)-1), BySlot: make([]SlotRecall, c.Pairs),
		ByOrder: make([]OrderRecall, c.Pairs)}
	for i := range b.ByDist {
		b.ByDist[i].Lo, b.ByDist[i].Hi = edges[i], edges[i+1]
	}
	for i := range b.BySlot {
		b.BySlot[i].Slot, b.ByOrder[i].Order = i, i
	}
	return b
}

// AnswerSlot returns the pair slot queried by the answer at stream position
// p (an answer position: Answers[p]).
func (s *MQARStream) AnswerSlot(p int) int {
	base := (p - 1) / s.Config.SeqLen * s.Config.SeqLen // the answer is never a sequence's first token
	key := p - 1 - int(s.Distances[p]) - base
	return (key - 1) / 2
}

// AnswerOrder returns how many queries of its sequence precede the answer
// at stream position p.
func (s *MQARStream) AnswerOrder(p int) int {
	n := 0
	for i := (p - 1) / s.Config.SeqLen * s.Config.SeqLen; i < p; i++ {
		if s.Answers[i] {
			n++
		}
	}
	return n
}

// Add scores the answers of the chunk whose first input token is
// IDs[start]: pred[j] is the argmax at input position start+j, for
// len(pred) positions, and the target is IDs[start+1+j].
func (b *RecallBreakdown) Add(s *MQARStream, start int, pred []int32) error {
	for j, y := range pred {
		p := start + 1 + j
		if p >= len(s.Answers) || !s.Answers[p] {
			continue
		}
		ok := 0
		if y == s.IDs[p] {
			ok = 1
		}
		d := int(s.Distances[p])
		bi := b.bucket(d)
		if bi < 0 {
			return fmt.Errorf("mqar recall: distance %d at position %d is outside the buckets", d, p)
		}
		b.ByDist[bi].Correct += ok
		b.ByDist[bi].Total++
		slot := s.AnswerSlot(p)
		if slot < 0 || slot >= len(b.BySlot) {
			return fmt.Errorf("mqar recall: pair slot %d at position %d, have %d", slot, p, len(b.BySlot))
		}
		b.BySlot[slot].Correct += ok
		b.BySlot[slot].Total++
		o := s.AnswerOrder(p)
		b.ByOrder[o].Correct += ok
		b.ByOrder[o].Total++
	}
	return nil
}

// bucket returns the index of d's bucket, or -1.
func (b *RecallBreakdown) bucket(d int) int {
	for i, k := range b.ByDist {
		if d >= k.Lo && d < k.Hi {
			return i
		}
	}
	return -1
}

// Total returns the number of answers counted.
func (b *RecallBreakdown) Total() int {
	n := 0
	for _, k := range b.BySlot {
		n += k.Total
	}
	return n
}

// Correct returns the number of answers right.
func (b *RecallBreakdown) Correct() int {
	n := 0
	for _, k := range b.BySlot {
		n += k.Correct
	}
	return n
}

// Text renders the breakdown for people: ", by distance [1,4) 0.950 …;
// by pair 0 0.900 …; by query order 0 0.250 …" (cells without answers are
// left out).
func (b *RecallBreakdown) Text() string {
	var s strings.Builder
	s.WriteString(", by distance")
	for _, k := range b.ByDist {
		if k.Total > 0 {
			fmt.Fprintf(&s, " [%d,%d) %.3f", k.Lo, k.Hi, Recall{k.Correct, k.Total}.Accuracy())
		}
	}
	s.WriteString("; by pair")
	for _, k := range b.BySlot {
		if k.Total > 0 {
			fmt.Fprintf(&s, " %d %.3f", k.Slot, Recall{k.Correct, k.Total}.Accuracy())
		}
	}
	s.WriteString("; by query order")
	for _, k := range b.ByOrder {
		if k.Total > 0 {
			fmt.Fprintf(&s, " %d %.3f", k.Order, Recall{k.Correct, k.Total}.Accuracy())
		}
	}
	return s.String()
}
