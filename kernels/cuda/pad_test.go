package cuda

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/rpac-dev/rpac/ir"
)

// TestGPUPadBF16: pad_bf16 writes a weight's bf16 copy in a Pad layout
// (rows in head blocks of 85 stored as 88, columns 37 as 40) in rows of ld,
// each value rounded to bf16 and zeros in the padding and up to ld,
// whatever the buffer held; on the simulator again in differential mode.
func TestGPUPadBF16(t *testing.T) {
	differentially(t, []string{"pad_bf16"}, func() { padBF16(t) })
}

func padBF16(t *testing.T) {
	c := gpuContext(t)
	r := rand.New(rand.NewPCG(61, 62))
	pd := padding{rows: ir.PadSpan{Blocks: 3, Size: 85, Padded: 88}, cols: ir.PadSpan{Blocks: 1, Size: 37, Padded: 40}}
	rows, cols, ld := pd.rows.Stored(), pd.cols.Stored(), 48 // ld past the padded columns too
	x := randF32(r, pd.rows.Logical()*pd.cols.Logical(), 10)
	dx := devF32(t, c, x)
	dy := devF32(t, c, randF32(r, rows*ld/2, 1)) // garbage where the padding goes
	n := rows * ld
	if err := c.Launch("pad_bf16", grid1(n), block1, 0, dy.Ptr, dx.Ptr, int32(pd.rows.Size), int32(pd.rows.Padded),
		int32(cols), int32(pd.cols.Size), int32(pd.cols.Padded), int32(ld), int64(n)); err != nil {
		t.Fatal(err)
	}
	words := hostF32(t, c, dy, n/2)
	h := unsafe.Slice((*uint16)(unsafe.Pointer(&words[0])), n)
	for i := 0; i < rows; i++ {
		for j := 0; j < ld; j++ {
			got := float64(math.Float32frombits(uint32(h[i*ld+j]) << 16))
			want := 0.0
			if si, sj := pd.rows.Source(i), pd.cols.Source(j); j < cols && si >= 0 && sj >= 0 {
				want = roundBF16(x[si*pd.cols.Logical()+sj])
			}
			if got != want {
				t.Fatalf("row %d column %d: %g, want %g", i, j, got, want)
			}
		}
	}
}
