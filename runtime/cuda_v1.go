//go:build cgo

package runtime

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

// onnxruntime's C API as far as the version-1 CUDA provider options need
// it (onnxruntime_c_api.h). OrtApi is a table of function pointers that
// only ever grows, so an entry's index is fixed: GetErrorMessage is entry
// 2, ReleaseStatus 93, SessionOptionsAppendExecutionProvider_CUDA 152.
typedef struct {
	int device_id;
	int cudnn_conv_algo_search;
	size_t gpu_mem_limit;
	int arena_extend_strategy;
	int do_copy_in_default_stream;
	int has_user_compute_stream;
	void *user_compute_stream;
	void *default_memory_arena_cfg;
	int tunable_op_enable;
	int tunable_op_tuning_enable;
	int tunable_op_max_tuning_duration_ms;
} rpac_cuda_options_v1;

typedef struct {
	const void *(*get_api)(uint32_t version);
	const char *(*get_version_string)(void);
} rpac_api_base;

typedef void *(*rpac_append_cuda_fn)(void *options, const rpac_cuda_options_v1 *cuda);
typedef const char *(*rpac_error_message_fn)(const void *status);
typedef void (*rpac_release_status_fn)(void *status);

enum { rpac_idx_error_message = 2, rpac_idx_release_status = 93, rpac_idx_append_cuda = 152, rpac_api_version = 14 };

// rpac_append_cuda_v1 appends the CUDA provider (device, the options'
// defaults otherwise) to the session options so of the onnxruntime loaded
// from lib. It returns 0, or -1 with the reason in msg.
static int rpac_append_cuda_v1(const char *lib, void *so, int device, char *msg, size_t n) {
	void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	if (!h) {
		snprintf(msg, n, "%s is not loaded in this process", lib);
		return -1;
	}
	const rpac_api_base *(*get_base)(void) = (const rpac_api_base *(*)(void))dlsym(h, "OrtGetApiBase");
	const void *const *api = get_base ? (const void *const *)get_base()->get_api(rpac_api_version) : NULL;
	if (!api) {
		snprintf(msg, n, "%s has no onnxruntime C API of version %d", lib, rpac_api_version);
		dlclose(h);
		return -1;
	}
	rpac_cuda_options_v1 o = {0};
	o.device_id = device;
	o.gpu_mem_limit = SIZE_MAX;
	o.do_copy_in_default_stream = 1;
	void *st = ((rpac_append_cuda_fn)api[rpac_idx_append_cuda])(so, &o);
	int rc = 0;
	if (st) {
		snprintf(msg, n, "%s", ((rpac_error_message_fn)api[rpac_idx_error_message])(st));
		((rpac_release_status_fn)api[rpac_idx_release_status])(st);
		rc = -1;
	}
	dlclose(h);
	return rc;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	ort "github.com/yalue/onnxruntime_go"
)

// appendCUDAV1 appends the CUDA provider to so through the version-1
// options of onnxruntime's C API, for libraries whose version-2 options
// (what onnxruntime_go uses) are compiled out while the provider bridge is
// in: the onnxruntime 1.29 that scripts/fetch-onnxruntime.sh --cuda
// fetches answers the version-2 call with "CUDA execution provider is not
// enabled in this build". v2 is that call's error, kept in the message.
func appendCUDAV1(lib string, so *ort.SessionOptions, device int, v2 error) error {
	if so == nil {
		return errors.New("no session options")
	}
	// onnxruntime_go's SessionOptions holds the OrtSessionOptions pointer
	// as its only field.
	ptr := *(*unsafe.Pointer)(unsafe.Pointer(so))
	if ptr == nil {
		return errors.New("session options already destroyed")
	}
	clib := C.CString(lib)
	defer C.free(unsafe.Pointer(clib))
	var msg [1024]C.char
	if C.rpac_append_cuda_v1(clib, ptr, C.int(device), &msg[0], C.size_t(len(msg))) != 0 {
		return fmt.Errorf("%v; version-1 options: %s", v2, C.GoString(&msg[0]))
	}
	return nil
}
