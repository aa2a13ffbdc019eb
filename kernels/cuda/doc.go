// Package cuda is rpac's NVIDIA GPU backend. The CUDA driver API, NVRTC and
// cuBLASLt are bound at run time (dlopen through purego, no cgo), so rpac
// builds, vets and tests on machines without CUDA, and one binary built
// without cgo runs on any Linux x86-64 or arm64 GPU machine. The kernels are
// CUDA C++ sources embedded in the binary (kernels/*.cu), self-contained (no
// toolkit headers), compiled by NVRTC for the GPU at hand on first use.
package cuda
