// Package driver binds what the CUDA backend runs on: the CUDA driver API
// (contexts, memory, module loading, launches), NVRTC (compiling kernel
// sources to cubins or PTX, cached on disk) and cuBLASLt (GEMM plans and
// algorithms), found at run time by the library lookup (libs.go:
// $RPAC_CUDA_LIBS, the loader's path, pip and conda folders) and opened
// through purego without cgo. Probe and Available report what a machine
// offers. The simulator (kernels/cuda/cudasim) provides the same three
// libraries for the CPU; nothing here knows rpac's kernels or graphs.
package driver
