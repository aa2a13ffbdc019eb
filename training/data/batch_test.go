package data

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func seqIDs(n int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(i)
	}
	return ids
}

func TestBatchSize(t *testing.T) {
	tests := []struct{ tokens, T, want int }{
		{8192, 256, 32},
		{8192, 384, 21},
		{100, 256, 1},
		{0, 256, 1},
		{256, 256, 1},
	}
	for _, tc := range tests {
		if got := BatchSize(tc.tokens, tc.T); got != tc.want {
			t.Errorf("BatchSize(%d, %d) = %d, want %d", tc.tokens, tc.T, got, tc.want)
		}
	}
}

func TestTrainBatcher(t *testing.T) {
	tests := []struct {
		name        string
		n, T, tok   int
		wantB       int
		errContains []string
	}{
		{"typical", 1000, 16, 64, 4, nil},
		{"batch at least one", 100, 16, 8, 1, nil},
		{"exactly T+1 tokens", 17, 16, 32, 2, nil},
		{"too short", 16, 16, 32, 0, []string{"16 tokens", "T = 16", "T+1 = 17"}},
		{"empty", 0, 4, 32, 0, []string{"0 tokens"}},
		{"bad T", 100, 0, 32, 0, []string{"T = 0"}},
		{"bad tokens per step", 100, 4, 0, 0, []string{"tokens per step = 0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ids := seqIDs(tc.n)
			tb, err := NewTrainBatcher(ids, tc.T, tc.tok, 7)
			if tc.errContains != nil {
				if err == nil {
					t.Fatal("no error")
				}
				for _, w := range tc.errContains {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tb.BatchSize() != tc.wantB || tb.ContextLen() != tc.T {
				t.Fatalf("B %d T %d, want %d %d", tb.BatchSize(), tb.ContextLen(), tc.wantB, tc.T)
			}
			for range 50 {
				b := tb.Next()
				if b.B != tc.wantB || b.T != tc.T || len(b.X) != b.B*b.T || len(b.Y) != b.B*b.T {
					t.Fatalf("batch shape %dx%d, %d %d", b.B, b.T, len(b.X), len(b.Y))
				}
				for r := range b.B {
					x, y := b.X[r*b.T:(r+1)*b.T], b.Y[r*b.T:(r+1)*b.T]
					i := int(x[0])
					if i < 0 || i > tc.n-tc.T-1 {
						t.Fatalf("start %d outside [0, %d]", i, tc.n-tc.T-1)
					}
					if !slices.Equal(x, ids[i:i+tc.T]) || !slices.Equal(y, ids[i+1:i+tc.T+1]) {
						t.Fatalf("row %d is not a contiguous chunk and its shift", r)
					}
				}
			}
		})
	}
}

func TestTrainBatcherCoversAllStarts(t *testing.T) {
	const n, T = 20, 4
	tb, err := NewTrainBatcher(seqIDs(n), T, T, 1)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int32]int{}
	for range 4000 {
		seen[tb.Next().X[0]]++
	}
	if len(seen) != n-T {
		t.Fatalf("saw %d distinct starts, want %d (0..%d)", len(seen), n-T, n-T-1)
	}
	for s, c := range seen {
		if c < 150 { // expectation 250
			t.Errorf("start %d drawn %d times of 4000", s, c)
		}
	}
}

func TestTrainBatcherDeterminismAndResume(t *testing.T) {
	ids := seqIDs(5000)
	a, _ := NewTrainBatcher(ids, 32, 128, 42)
	b, _ := NewTrainBatcher(ids, 32, 128, 42)
	c, _ := NewTrainBatcher(ids, 32, 128, 43)
	same := true
	for range 10 {
		ba, bb, bc := a.Next(), b.Next(), c.Next()
		if !slices.Equal(ba.X, bb.X) {
			t.Fatal("same seed, different batches")
		}
		same = same && slices.Equal(ba.X, bc.X)
	}
	if same {
		t.Fatal("different seeds, same batches")
	}

	st, err := a.State()
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var want []Batch
	for range 5 {
		want = append(want, a.Next())
	}
	var back RNGState
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	fresh, _ := NewTrainBatcher(ids, 32, 128, 999)
	if err := fresh.SetState(back); err != nil {
		t.Fatal(err)
	}
	buf := Batch{}
	for i := range 5 {
		fresh.NextInto(&buf)
		if !slices.Equal(buf.X, want[i].X) || !slices.Equal(buf.Y, want[i].Y) {
			t.Fatalf("resumed batch %d differs", i)
		}
	}
}

func TestNumChunks(t *testing.T) {
	tests := []struct{ n, T, want int }{
		{0, 4, 0}, {4, 4, 0}, {5, 4, 1}, {8, 4, 1}, {9, 4, 2}, {249750, 256, 975}, {10, 0, 0},
	}
	for _, tc := range tests {
		if got := NumChunks(tc.n, tc.T); got != tc.want {
			t.Errorf("NumChunks(%d, %d) = %d, want %d", tc.n, tc.T, got, tc.want)
		}
	}
}

func TestEvalChunks(t *testing.T) {
	ids := seqIDs(23)
	c, err := NewEvalChunks(ids, 5)
	if err != nil {
		t.Fatal(err)
	}
	if c.NumChunks() != 4 {
		t.Fatalf("NumChunks = %d, want 4", c.NumChunks())
	}
	n := 0
	for i, b := range c.All() {
		if b.B != 1 || b.T != 5 || c.Start(i) != i*5 {
			t.Fatalf("chunk %d shape", i)
		}
		if !slices.Equal(b.X, ids[i*5:i*5+5]) || !slices.Equal(b.Y, ids[i*5+1:i*5+6]) {
			t.Fatalf("chunk %d: x %v y %v", i, b.X, b.Y)
		}
		n++
	}
	if n != 4 {
		t.Fatalf("iterated %d chunks", n)
	}
	for _, bad := range []struct {
		n, T int
		want string
	}{{5, 5, "5 tokens, fewer than context T = 5 plus 1"}, {10, -1, "T = -1"}} {
		if _, err := NewEvalChunks(seqIDs(bad.n), bad.T); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("NewEvalChunks(%d, %d): %v", bad.n, bad.T, err)
		}
	}
}

func TestEvalBatcher(t *testing.T) {
	tests := []struct {
		name           string
		n, T, B        int
		batches        int
		errContains    []string
		lastChunkStart int
	}{
		{"drop last", 23, 5, 3, 1, nil, 10},
		{"exact", 25, 4, 2, 3, nil, 20},
		{"batch of one", 23, 5, 1, 4, nil, 15},
		{"too few chunks", 23, 5, 5, 0, []string{"23 tokens", "4 chunks", "T = 5", "batch of 5", "26 tokens"}, 0},
		{"context too long", 10, 10, 1, 0, []string{"10 tokens", "T = 10"}, 0},
		{"bad B", 23, 5, 0, 0, []string{"batch size 0"}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ids := seqIDs(tc.n)
			eb, err := NewEvalBatcher(ids, tc.T, tc.B)
			if tc.errContains != nil {
				if err == nil {
					t.Fatal("no error")
				}
				for _, w := range tc.errContains {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if eb.NumBatches() != tc.batches || eb.BatchSize() != tc.B {
				t.Fatalf("NumBatches %d, want %d", eb.NumBatches(), tc.batches)
			}
			k := 0
			var last int32
			for i, b := range eb.All() {
				if i != k || b.B != tc.B || b.T != tc.T {
					t.Fatalf("batch %d: index %d shape %dx%d", k, i, b.B, b.T)
				}
				for r := range b.B {
					s := (k*tc.B + r) * tc.T
					if !slices.Equal(b.X[r*tc.T:(r+1)*tc.T], ids[s:s+tc.T]) || !slices.Equal(b.Y[r*tc.T:(r+1)*tc.T], ids[s+1:s+tc.T+1]) {
						t.Fatalf("batch %d row %d is not chunk %d", k, r, k*tc.B+r)
					}
				}
				last = b.X[(b.B-1)*b.T]
				k++
			}
			if k != tc.batches || int(last) != tc.lastChunkStart {
				t.Fatalf("iterated %d batches, last chunk starts at %d; want %d, %d", k, last, tc.batches, tc.lastChunkStart)
			}
			var bt Batch
			if err := eb.BatchInto(tc.batches, &bt); err == nil {
				t.Error("batch index past the end accepted")
			}
			if err := eb.BatchInto(-1, &bt); err == nil {
				t.Error("negative batch index accepted")
			}
		})
	}
}

func TestEvalAllChunksOtherBatch(t *testing.T) {
	// The chunks behind a batcher can be walked with another batch size.
	eb, err := NewEvalBatcher(seqIDs(101), 10, 4)
	if err != nil {
		t.Fatal(err)
	}
	if eb.NumBatches() != 2 || eb.Chunks().NumChunks() != 10 {
		t.Fatalf("batches %d chunks %d", eb.NumBatches(), eb.Chunks().NumChunks())
	}
	eb5, err := eb.Chunks().Batcher(5)
	if err != nil || eb5.NumBatches() != 2 {
		t.Fatalf("Batcher(5): %v", err)
	}
}
