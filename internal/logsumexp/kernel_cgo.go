//go:build cgo

package logsumexp

/*
#cgo CFLAGS: -O3 -Wno-psabi
#include "kernel.h"
*/
import "C"

import "unsafe"

// Path names the implementation LogSumExp and Exp run: "c" or "go".
const Path = "c"

func maxSumExp(row []float32) (float32, float64) {
	var m C.float
	s := C.rpac_max_sumexp((*C.float)(unsafe.Pointer(&row[0])), C.long(len(row)), &m)
	return float32(m), float64(s)
}

func expRow(dst, src []float32) {
	C.rpac_exp((*C.float)(unsafe.Pointer(&dst[0])), (*C.float)(unsafe.Pointer(&src[0])), C.long(len(dst)))
}
