package runtime

import "strings"

// loadHint says what to do about an onnxruntime error from creating a
// session: a kernel the provider lacks for a type (a bf16 export on the
// CPU provider) needs another provider or precision; anything else, a
// fresh export.
func loadHint(err error) string {
	msg := err.Error()
	if strings.Contains(msg, "Could not find an implementation") ||
		(strings.Contains(msg, "Type Error") && (strings.Contains(msg, "bfloat16") || strings.Contains(msg, "float16"))) {
		return "the execution provider has no kernel for an op in this precision: run a bf16 export on the CUDA provider (--provider cuda), or export with --dtype fp16 or fp32 for the CPU"
	}
	return "export it again"
}
