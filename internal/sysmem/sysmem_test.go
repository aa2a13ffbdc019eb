package sysmem

import "testing"

func TestRSS(t *testing.T) {
	if n, err := RSS(); err != nil || n <= 0 {
		t.Fatalf("RSS %d, %v", n, err)
	}
}
