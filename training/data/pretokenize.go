package data

import (
	"context"
	"math"
	"sync"
	"unicode"
	"unicode/utf8"
)

// This file is an exact, dependency-free implementation of GPT-2's
// pre-tokenizer and byte-pair merge; Tokenizer.Encode uses it for every
// input. The tiktoken-go codec supplies only the vocabulary: its generated
// matcher for the class [^\s\p{L}\p{N}] leaves out U+007F (DEL), so the
// codec silently drops every DEL and regroups the text around it, and it
// cannot be stopped once started. Tests check that this implementation and
// the codec agree on every other input (random text and WikiText-2).
//
// Cost: the pre-tokenizer reads each rune a bounded number of times, and
// the merge of a piece of n bytes takes O(n log n) (a heap of candidate
// pairs, no rescans), so any input encodes in time close to linear in its
// length.

// gpt2Split returns the pieces GPT-2's pre-tokenizer regexp
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// cuts s into, with the same character classes as the codec (\s is
// unicode.IsSpace, \p{L} unicode.IsLetter, \p{N} unicode.IsNumber). Like the
// codec, it works on runes, so each invalid UTF-8 byte becomes U+FFFD.
func gpt2Split(s string) []string {
	var out []string
	s = validRunes(s)
	for len(s) > 0 {
		n := gpt2Match(s)
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}

// validRunes returns s with each byte that does not begin a valid UTF-8
// sequence replaced by U+FFFD, as reading s rune by rune sees it.
func validRunes(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]byte, 0, len(s)+len(s)/2)
	for _, r := range s { // an invalid byte reads as one RuneError of width 1
		b = utf8.AppendRune(b, r)
	}
	return string(b)
}

func isLetter(r rune) bool { return unicode.IsLetter(r) }
func isNumber(r rune) bool { return unicode.IsNumber(r) }
func isSpace(r rune) bool  { return unicode.IsSpace(r) }
func isOther(r rune) bool  { return !isSpace(r) && !isLetter(r) && !isNumber(r) }

// gpt2Match returns the length, in bytes, of the regexp's match at the
// start of s (valid UTF-8, len(s) > 0); every position matches at least one
// rune.
func gpt2Match(s string) int {
	// 's|'t|'re|'ve|'m|'ll|'d
	if s[0] == '\'' && len(s) > 1 {
		switch s[1] {
		case 's', 't', 'm', 'd':
			return 2
		case 'r', 'v':
			if len(s) > 2 && s[2] == 'e' {
				return 3
			}
		case 'l':
			if len(s) > 2 && s[2] == 'l' {
				return 3
			}
		}
	}
	// ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`, in that order: the
	// first class that the rune after the optional space belongs to.
	j := 0
	if s[0] == ' ' {
		j = 1
	}
	if j < len(s) {
		r, _ := utf8.DecodeRuneInString(s[j:])
		for _, class := range [...]func(rune) bool{isLetter, isNumber, isOther} {
			if class(r) {
				return j + runLen(s[j:], class)
			}
		}
	}
	// \s+(?!\S) | \s+
	n, last := 0, 0 // bytes of the run of spaces, and of its last rune
	for n < len(s) {
		r, size := utf8.DecodeRuneInString(s[n:])
		if !isSpace(r) {
			break
		}
		n, last = n+size, size
	}
	switch {
	case n == len(s):
		return n // at the end: nothing follows, (?!\S) holds
	case n > last:
		return n - last // two or more spaces: leave the last to prefix the next piece
	case n > 0:
		return n // \s+
	}
	_, size := utf8.DecodeRuneInString(s)
	return size // unreachable: a rune is a space or in one of the classes
}

// runLen is the length in bytes of the run of runes of class at the start
// of s.
func runLen(s string, class func(rune) bool) int {
	n := 0
	for n < len(s) {
		if c := s[n]; c < utf8.RuneSelf {
			if !class(rune(c)) {
				break
			}
			n++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[n:])
		if !class(r) {
			break
		}
		n += size
	}
	return n
}

// scanMergeMax is the piece length below which bpe rescans the pairs after
// every merge (O(n²), the fastest for short pieces); longer pieces merge
// through a heap in O(n log n).
const scanMergeMax = 64

// bpe merges the bytes of piece by GPT-2's ranks (a token's rank is its id)
// and appends the ids to out: repeatedly merge the adjacent pair whose
// concatenation has the lowest rank, leftmost first, until no pair is a
// token. stop, when not nil, is polled during a long merge; once it
// reports true, bpe returns out unchanged and false.
func bpe(piece string, ranks map[string]int32, out []int32, stop func() bool) ([]int32, bool) {
	if id, ok := ranks[piece]; ok {
		return append(out, id), true
	}
	if len(piece) < scanMergeMax {
		return bpeScan(piece, ranks, out), true
	}
	return bpeHeap(piece, ranks, out, stop)
}

// bpeScan is bpe by scanning the pairs' ranks for the lowest after each
// merge; a merge looks up only the two pairs it changes.
func bpeScan(piece string, ranks map[string]int32, out []int32) []int32 {
	// bounds[i] is the start of part i, the last entry len(piece);
	// pair[i] is the rank of merging parts i and i+1.
	var bbuf [scanMergeMax + 1]int
	var pbuf [scanMergeMax]int32
	bounds, pair := bbuf[:0], pbuf[:0]
	for i := 0; i <= len(piece); i++ {
		bounds = append(bounds, i)
	}
	rankOf := func(i int) int32 {
		if i+2 >= len(bounds) {
			return noMerge
		}
		if id, ok := ranks[piece[bounds[i]:bounds[i+2]]]; ok {
			return id
		}
		return noMerge
	}
	for i := 0; i+1 < len(bounds); i++ {
		pair = append(pair, rankOf(i))
	}
	for {
		best, at := int32(noMerge), -1
		for i, r := range pair {
			if r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		bounds = append(bounds[:at+1], bounds[at+2:]...)
		pair = append(pair[:at+1], pair[at+2:]...)
		pair[at] = rankOf(at)
		if at > 0 {
			pair[at-1] = rankOf(at - 1)
		}
	}
	for i := 0; i+1 < len(bounds); i++ {
		out = append(out, ranks[piece[bounds[i]:bounds[i+1]]])
	}
	return out
}

// noMerge is the rank of a pair that is not a token.
const noMerge = math.MaxInt32

// bpeHeap is bpe with the parts in a linked list and the candidate merges
// in a priority queue by (rank, offset) (mergeQueue): each merge pops one
// candidate and pushes at most two, and a candidate whose pair has changed
// since it was pushed is skipped when popped. The merges happen in the same
// order as bpeScan's.
func bpeHeap(piece string, ranks map[string]int32, out []int32, stop func() bool) ([]int32, bool) {
	n := int32(len(piece))
	// Part boundaries at byte offsets 0..n: next[i] is the following
	// boundary (-1 after n), prev[i] the one before, rank[i] the rank of
	// merging the part that starts at i with the next one (noMerge when it
	// is not a token, or when i is no longer a boundary).
	next := make([]int32, n+1)
	prev := make([]int32, n+1)
	rank := make([]int32, n+1)
	for i := range next {
		next[i], prev[i], rank[i] = int32(i)+1, int32(i)-1, noMerge
	}
	next[n] = -1
	rankAt := func(i int32) int32 {
		j := next[i]
		if j < 0 || next[j] < 0 {
			return noMerge
		}
		if id, ok := ranks[piece[i:next[j]]]; ok {
			return id
		}
		return noMerge
	}
	q := newMergeQueue()
	defer q.release()
	for i := int32(0); i+2 <= n; i++ {
		if rank[i] = rankAt(i); rank[i] != noMerge {
			q.push(rank[i], i)
		}
	}
	for polls := 0; ; polls++ {
		if stop != nil && polls&(1<<14-1) == 0 && stop() {
			return out, false
		}
		r, i, ok := q.pop()
		if !ok {
			break
		}
		if rank[i] != r {
			continue // stale: the pair at i changed since
		}
		j := next[i] // merge part j into part i
		k := next[j]
		rank[j] = noMerge
		next[i] = k
		if k >= 0 {
			prev[k] = i
		}
		for _, b := range [2]int32{i, prev[i]} {
			if b < 0 {
				continue
			}
			if rank[b] = rankAt(b); rank[b] != noMerge {
				q.push(rank[b], b)
			}
		}
	}
	for i := int32(0); next[i] >= 0; i = next[i] {
		out = append(out, ranks[piece[i:next[i]]])
	}
	return out, true
}

// mergeQueue holds the candidate merges of bpeHeap and hands them out
// lowest rank first, the leftmost of equal ranks first. Each rank has a
// bucket of offsets: candidates mostly arrive in increasing offset (the
// initial scan, and the merges of one rank, which run left to right), and
// those go to a plain queue; the others go to a small heap beside it. The
// ranks with candidates are in a heap of their own. So the common case costs
// O(1) per candidate, with sequential memory access, and no case costs more
// than a heap would.
type mergeQueue struct {
	index   []int32 // rank -> 1 + its bucket's index; 0: no bucket (pooled, all 0 between uses)
	pooled  *[]int32
	buckets []mergeBucket
	ranks   minHeap32 // ranks whose bucket is queued, each once
}

type mergeBucket struct {
	rank   int32
	queued bool      // in ranks
	q      []int32   // offsets, increasing from head on
	head   int       // next offset of q
	side   minHeap32 // offsets that arrived below q's last one
}

var rankIndexPool = sync.Pool{New: func() any { s := make([]int32, GPT2VocabSize); return &s }}

func newMergeQueue() *mergeQueue {
	p := rankIndexPool.Get().(*[]int32)
	return &mergeQueue{index: *p, pooled: p}
}

// release returns the rank index to its pool (cleared).
func (m *mergeQueue) release() {
	for _, b := range m.buckets {
		m.index[b.rank] = 0
	}
	rankIndexPool.Put(m.pooled)
	m.index, m.pooled = nil, nil
}

func (m *mergeQueue) push(rank, at int32) {
	bi := m.index[rank]
	if bi == 0 {
		m.buckets = append(m.buckets, mergeBucket{rank: rank})
		bi = int32(len(m.buckets))
		m.index[rank] = bi
	}
	b := &m.buckets[bi-1]
	switch {
	case b.head == len(b.q):
		b.q, b.head = append(b.q[:0], at), 0
	case at >= b.q[len(b.q)-1]:
		b.q = append(b.q, at)
	default:
		b.side.push(at)
	}
	if !b.queued {
		b.queued = true
		m.ranks.push(rank)
	}
}

// pop returns the lowest-ranked candidate, the leftmost of its rank; ok is
// false when none is left.
func (m *mergeQueue) pop() (rank, at int32, ok bool) {
	for len(m.ranks) > 0 {
		r := m.ranks[0]
		b := &m.buckets[m.index[r]-1]
		inQ, inSide := b.head < len(b.q), len(b.side) > 0
		switch {
		case inQ && (!inSide || b.q[b.head] <= b.side[0]):
			at = b.q[b.head]
			b.head++
		case inSide:
			at = b.side.pop()
		default:
			m.ranks.pop()
			b.queued = false
			continue
		}
		return r, at, true
	}
	return 0, 0, false
}

// minHeap32 is a binary min-heap of int32.
type minHeap32 []int32

func (h *minHeap32) push(x int32) {
	*h = append(*h, x)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if s[p] <= x {
			break
		}
		s[i] = s[p]
		i = p
	}
	s[i] = x
}

func (h *minHeap32) pop() int32 {
	s := *h
	top := s[0]
	x := s[len(s)-1]
	s = s[:len(s)-1]
	*h = s
	if len(s) == 0 {
		return top
	}
	i := 0
	for {
		c := 2*i + 1
		if c >= len(s) {
			break
		}
		if c+1 < len(s) && s[c+1] < s[c] {
			c++
		}
		if s[c] >= x {
			break
		}
		s[i] = s[c]
		i = c
	}
	s[i] = x
	return top
}

// encodeContext encodes s with gpt2Split and bpe, checking ctx every
// 16 KiB of input (and during the merge of a longer piece), and stopping
// after the piece that takes the ids past max when max > 0.
func encodeContext(ctx context.Context, s string, ranks map[string]int32, max int) ([]int32, error) {
	s = validRunes(s)
	var out []int32
	stop := func() bool { return ctx.Err() != nil }
	for since := 0; len(s) > 0; {
		n := gpt2Match(s)
		piece := s[:n]
		s = s[n:]
		if since += n; since >= 1<<14 {
			since = 0
			if err := ctx.Err(); err != nil {
				return out, err
			}
		}
		var ok bool
		if out, ok = bpe(piece, ranks, out, stop); !ok {
			return out, ctx.Err()
		}
		if max > 0 && len(out) > max {
			return out, nil
		}
	}
	return out, nil
}
