package blas

import "unsafe"

// kernel1x12 computes one 1×12 tile of op(A)·op(B) over kp steps of the
// packed operands: ap holds kp values of one row of A, bp holds kp rows of
// 12 values of one panel of B. kp must be a positive multiple of 8; the
// packing routines pad with zeros to guarantee it.
//
// The loop is written so that the gc compiler keeps all twelve accumulators
// in registers: the body is unrolled eight times, and the loop is a
// bottom-tested loop whose body is a single block, which makes the
// scheduler interleave each multiply with its add instead of issuing all
// multiplies first and spilling.
func kernel1x12[T float32 | float64](kp int, ap, bp []T, out *[nr]T) {
	if kp <= 0 || kp%ku != 0 {
		panic("blas: bad packed depth")
	}
	_ = ap[kp-1]
	_ = bp[kp*nr-1]
	pa := unsafe.Pointer(unsafe.SliceData(ap))
	pb := unsafe.Pointer(unsafe.SliceData(bp))
	sz := unsafe.Sizeof(ap[0])
	var c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11 T
	for p := kp / ku; ; {
		a0 := *(*T)(unsafe.Add(pa, 0*sz))
		b0 := (*[nr]T)(unsafe.Add(pb, 0*sz))
		b00 := b0[0]
		c0 += a0 * b00
		b01 := b0[1]
		c1 += a0 * b01
		b02 := b0[2]
		c2 += a0 * b02
		b03 := b0[3]
		c3 += a0 * b03
		b04 := b0[4]
		c4 += a0 * b04
		b05 := b0[5]
		c5 += a0 * b05
		b06 := b0[6]
		c6 += a0 * b06
		b07 := b0[7]
		c7 += a0 * b07
		b08 := b0[8]
		c8 += a0 * b08
		b09 := b0[9]
		c9 += a0 * b09
		b0a := b0[10]
		c10 += a0 * b0a
		b0b := b0[11]
		c11 += a0 * b0b
		a1 := *(*T)(unsafe.Add(pa, 1*sz))
		b1 := (*[nr]T)(unsafe.Add(pb, 12*sz))
		b10 := b1[0]
		c0 += a1 * b10
		b11 := b1[1]
		c1 += a1 * b11
		b12 := b1[2]
		c2 += a1 * b12
		b13 := b1[3]
		c3 += a1 * b13
		b14 := b1[4]
		c4 += a1 * b14
		b15 := b1[5]
		c5 += a1 * b15
		b16 := b1[6]
		c6 += a1 * b16
		b17 := b1[7]
		c7 += a1 * b17
		b18 := b1[8]
		c8 += a1 * b18
		b19 := b1[9]
		c9 += a1 * b19
		b1a := b1[10]
		c10 += a1 * b1a
		b1b := b1[11]
		c11 += a1 * b1b
		a2 := *(*T)(unsafe.Add(pa, 2*sz))
		b2 := (*[nr]T)(unsafe.Add(pb, 24*sz))
		b20 := b2[0]
		c0 += a2 * b20
		b21 := b2[1]
		c1 += a2 * b21
		b22 := b2[2]
		c2 += a2 * b22
		b23 := b2[3]
		c3 += a2 * b23
		b24 := b2[4]
		c4 += a2 * b24
		b25 := b2[5]
		c5 += a2 * b25
		b26 := b2[6]
		c6 += a2 * b26
		b27 := b2[7]
		c7 += a2 * b27
		b28 := b2[8]
		c8 += a2 * b28
		b29 := b2[9]
		c9 += a2 * b29
		b2a := b2[10]
		c10 += a2 * b2a
		b2b := b2[11]
		c11 += a2 * b2b
		a3 := *(*T)(unsafe.Add(pa, 3*sz))
		b3 := (*[nr]T)(unsafe.Add(pb, 36*sz))
		b30 := b3[0]
		c0 += a3 * b30
		b31 := b3[1]
		c1 += a3 * b31
		b32 := b3[2]
		c2 += a3 * b32
		b33 := b3[3]
		c3 += a3 * b33
		b34 := b3[4]
		c4 += a3 * b34
		b35 := b3[5]
		c5 += a3 * b35
		b36 := b3[6]
		c6 += a3 * b36
		b37 := b3[7]
		c7 += a3 * b37
		b38 := b3[8]
		c8 += a3 * b38
		b39 := b3[9]
		c9 += a3 * b39
		b3a := b3[10]
		c10 += a3 * b3a
		b3b := b3[11]
		c11 += a3 * b3b
		a4 := *(*T)(unsafe.Add(pa, 4*sz))
		b4 := (*[nr]T)(unsafe.Add(pb, 48*sz))
		b40 := b4[0]
		c0 += a4 * b40
		b41 := b4[1]
		c1 += a4 * b41
		b42 := b4[2]
		c2 += a4 * b42
		b43 := b4[3]
		c3 += a4 * b43
		b44 := b4[4]
		c4 += a4 * b44
		b45 := b4[5]
		c5 += a4 * b45
		b46 := b4[6]
		c6 += a4 * b46
		b47 := b4[7]
		c7 += a4 * b47
		b48 := b4[8]
		c8 += a4 * b48
		b49 := b4[9]
		c9 += a4 * b49
		b4a := b4[10]
		c10 += a4 * b4a
		b4b := b4[11]
		c11 += a4 * b4b
		a5 := *(*T)(unsafe.Add(pa, 5*sz))
		b5 := (*[nr]T)(unsafe.Add(pb, 60*sz))
		b50 := b5[0]
		c0 += a5 * b50
		b51 := b5[1]
		c1 += a5 * b51
		b52 := b5[2]
		c2 += a5 * b52
		b53 := b5[3]
		c3 += a5 * b53
		b54 := b5[4]
		c4 += a5 * b54
		b55 := b5[5]
		c5 += a5 * b55
		b56 := b5[6]
		c6 += a5 * b56
		b57 := b5[7]
		c7 += a5 * b57
		b58 := b5[8]
		c8 += a5 * b58
		b59 := b5[9]
		c9 += a5 * b59
		b5a := b5[10]
		c10 += a5 * b5a
		b5b := b5[11]
		c11 += a5 * b5b
		a6 := *(*T)(unsafe.Add(pa, 6*sz))
		b6 := (*[nr]T)(unsafe.Add(pb, 72*sz))
		b60 := b6[0]
		c0 += a6 * b60
		b61 := b6[1]
		c1 += a6 * b61
		b62 := b6[2]
		c2 += a6 * b62
		b63 := b6[3]
		c3 += a6 * b63
		b64 := b6[4]
		c4 += a6 * b64
		b65 := b6[5]
		c5 += a6 * b65
		b66 := b6[6]
		c6 += a6 * b66
		b67 := b6[7]
		c7 += a6 * b67
		b68 := b6[8]
		c8 += a6 * b68
		b69 := b6[9]
		c9 += a6 * b69
		b6a := b6[10]
		c10 += a6 * b6a
		b6b := b6[11]
		c11 += a6 * b6b
		a7 := *(*T)(unsafe.Add(pa, 7*sz))
		b7 := (*[nr]T)(unsafe.Add(pb, 84*sz))
		b70 := b7[0]
		c0 += a7 * b70
		b71 := b7[1]
		c1 += a7 * b71
		b72 := b7[2]
		c2 += a7 * b72
		b73 := b7[3]
		c3 += a7 * b73
		b74 := b7[4]
		c4 += a7 * b74
		b75 := b7[5]
		c5 += a7 * b75
		b76 := b7[6]
		c6 += a7 * b76
		b77 := b7[7]
		c7 += a7 * b77
		b78 := b7[8]
		c8 += a7 * b78
		b79 := b7[9]
		c9 += a7 * b79
		b7a := b7[10]
		c10 += a7 * b7a
		b7b := b7[11]
		c11 += a7 * b7b
		p--
		if p == 0 {
			break
		}
		// Advance only when another step follows: a pointer one past the
		// end of the panel would not point into its allocation.
		pa = unsafe.Add(pa, ku*sz)
		pb = unsafe.Add(pb, ku*nr*sz)
	}
	out[0], out[1], out[2], out[3] = c0, c1, c2, c3
	out[4], out[5], out[6], out[7] = c4, c5, c6, c7
	out[8], out[9], out[10], out[11] = c8, c9, c10, c11
}
