//go:build cgo

package runtime

import (
	"testing"
	"unsafe"

	ort "github.com/yalue/onnxruntime_go"
)

// TestSessionOptionsLayout guards appendCUDAV1's one assumption about
// onnxruntime_go: SessionOptions holds the OrtSessionOptions pointer as its
// only field. An onnxruntime_go update that changes the struct fails here,
// not with a wild pointer on a GPU machine.
func TestSessionOptionsLayout(t *testing.T) {
	if got, want := unsafe.Sizeof(ort.SessionOptions{}), unsafe.Sizeof(unsafe.Pointer(nil)); got != want {
		t.Fatalf("onnxruntime_go's SessionOptions is %d bytes, appendCUDAV1 expects one pointer (%d bytes): update it", got, want)
	}
}
