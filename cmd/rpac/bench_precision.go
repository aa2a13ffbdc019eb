package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/runtime"
)

// benchPrecision maps a --dtype entry of rpac bench infer to the export's
// precision and quantization.
func benchPrecision(d string) (ir.Precision, string, error) {
	if d == "int8" {
		return ir.FP32, onnx.QuantizeInt8, nil
	}
	p, err := ir.ParsePrecision(d)
	if err != nil || d == "" {
		return ir.FP32, "", fmt.Errorf("--dtype %q: want fp32, fp16, bf16 or int8", d)
	}
	return p, onnx.QuantizeNone, nil
}

// label is the row's fold, with its precision when not fp32.
func (r inferRow) label() string {
	if r.dtype == "" || r.dtype == "fp32" {
		return r.fold
	}
	return r.fold + "/" + r.dtype
}

// inferJSON is one row of rpac bench infer --json.
type inferJSON struct {
	Provider   string  `json:"provider"`
	ORT        string  `json:"onnxruntime"`
	Preset     string  `json:"preset"`
	Model      string  `json:"model"`
	Fold       string  `json:"fold"`
	Attention  string  `json:"attention"`
	DType      string  `json:"dtype"`
	T          int     `json:"T"`
	B          int     `json:"B"`
	Runs       int     `json:"runs"`
	P50ms      float64 `json:"p50_ms"`
	P95ms      float64 `json:"p95_ms"`
	P99ms      float64 `json:"p99_ms"`
	FastHalfMs float64 `json:"fast_half_ms"`
	TokensPerS float64 `json:"tokens_per_s"`
	GFLOP      float64 `json:"gflop"`
	MiB        float64 `json:"mib"`
	Nodes      int     `json:"nodes"`
}

func writeInferJSON(path string, rows []inferRow, provider string) error {
	out := make([]inferJSON, len(rows))
	for i, r := range rows {
		out[i] = inferJSON{Provider: provider, ORT: runtime.LoadedVersion(), Preset: r.preset, Model: r.model, Fold: r.fold,
			Attention: r.attention, DType: r.dtype, T: r.T, B: r.B, Runs: r.lat.n, P50ms: ms(r.lat.p50), P95ms: ms(r.lat.p95),
			P99ms: ms(r.lat.p99), FastHalfMs: ms(r.lat.fast), TokensPerS: float64(r.B*r.T) / r.lat.mean.Seconds(),
			GFLOP: float64(r.flops) / 1e9, MiB: float64(r.bytes) / (1 << 20), Nodes: r.nodes}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("--json: %w", err)
	}
	return nil
}
