package data

import (
	"math"
	"unicode"
)

// This file is an exact, dependency-free implementation of GPT-2's
// pre-tokenizer and byte-pair merge. Tokenizer.Encode uses it for inputs the
// tiktoken-go codec mishandles: its generated matcher for the class
// [^\s\p{L}\p{N}] leaves out U+007F (DEL), so the codec silently drops every
// DEL and regroups the text around it. Tests check that this implementation
// and the codec agree on every other input.

// gpt2Split returns the pieces GPT-2's pre-tokenizer regexp
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// cuts s into, with the same character classes as the codec (\s is
// unicode.IsSpace, \p{L} unicode.IsLetter, \p{N} unicode.IsNumber). Like the
// codec, it works on runes, so invalid UTF-8 bytes become U+FFFD.
func gpt2Split(s string) []string {
	rs := []rune(s)
	var out []string
	for i := 0; i < len(rs); {
		n := gpt2Match(rs[i:])
		out = append(out, string(rs[i:i+n]))
		i += n
	}
	return out
}

func isLetter(r rune) bool { return unicode.IsLetter(r) }
func isNumber(r rune) bool { return unicode.IsNumber(r) }
func isSpace(r rune) bool  { return unicode.IsSpace(r) }
func isOther(r rune) bool  { return !isSpace(r) && !isLetter(r) && !isNumber(r) }

// gpt2Match returns the length, in runes, of the regexp's match at the start
// of rs (len(rs) > 0); every position matches at least one rune.
func gpt2Match(rs []rune) int {
	// 's|'t|'re|'ve|'m|'ll|'d
	if rs[0] == '\'' && len(rs) > 1 {
		switch rs[1] {
		case 's', 't', 'm', 'd':
			return 2
		case 'r', 'v':
			if len(rs) > 2 && rs[2] == 'e' {
				return 3
			}
		case 'l':
			if len(rs) > 2 && rs[2] == 'l' {
				return 3
			}
		}
	}
	// ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`, in that order.
	for _, class := range [...]func(rune) bool{isLetter, isNumber, isOther} {
		j := 0
		if rs[0] == ' ' {
			j = 1
		}
		k := j
		for k < len(rs) && class(rs[k]) {
			k++
		}
		if k > j {
			return k
		}
	}
	// \s+(?!\S) | \s+
	n := 0
	for n < len(rs) && isSpace(rs[n]) {
		n++
	}
	switch {
	case n == len(rs):
		return n // at the end: nothing follows, (?!\S) holds
	case n >= 2:
		return n - 1 // leave the last space to prefix the next piece
	case n == 1:
		return 1 // \s+
	}
	return 1 // unreachable: a rune is a space or in one of the classes
}

// bpe merges the bytes of piece by GPT-2's ranks (a token's rank is its id)
// and returns the ids: repeatedly merge the adjacent pair whose
// concatenation has the lowest rank, leftmost first, until no pair is a
// token.
func bpe(piece string, ranks map[string]int32, out []int32) []int32 {
	if id, ok := ranks[piece]; ok {
		return append(out, id)
	}
	// bounds[i] is the start of part i; the last entry is len(piece).
	bounds := make([]int, len(piece)+1)
	for i := range bounds {
		bounds[i] = i
	}
	rankOf := func(i int) int32 { // rank of merging parts i and i+1
		if i+2 >= len(bounds) {
			return math.MaxInt32
		}
		if id, ok := ranks[piece[bounds[i]:bounds[i+2]]]; ok {
			return id
		}
		return math.MaxInt32
	}
	for len(bounds) > 2 {
		best, at := int32(math.MaxInt32), -1
		for i := 0; i+2 < len(bounds); i++ {
			if r := rankOf(i); r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		bounds = append(bounds[:at+1], bounds[at+2:]...)
	}
	for i := 0; i+1 < len(bounds); i++ {
		out = append(out, ranks[piece[bounds[i]:bounds[i+1]]])
	}
	return out
}
