package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// TestGPUReport: `rpac gpu` reports every kernel source compiled by NVRTC
// and says why a GPU is unusable when there is none.
func TestGPUReport(t *testing.T) {
	if _, err := driver.LoadNVRTC(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and NVRTC is unavailable: %v", err)
		}
		t.Skipf("NVRTC unavailable: %v", err)
	}
	got, code := rpacEnv(t, []string{"RPAC_CUDA_CACHE=" + t.TempDir()}, "gpu", "--json")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, got)
	}
	var rep driver.Report
	if err := json.Unmarshal([]byte(got), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, got)
	}
	if len(rep.Kernels) != len(cuda.SourceNames()) {
		t.Fatalf("%d kernel results for %d sources", len(rep.Kernels), len(cuda.SourceNames()))
	}
	for n, r := range rep.Kernels {
		if !strings.HasPrefix(r, "ok") {
			t.Errorf("%s: %s", n, r)
		}
	}
	if len(rep.Devices) == 0 && !strings.Contains(rep.Driver, "CUDA driver") {
		t.Errorf("no device and no reason: %q", rep.Driver)
	}
}

// TestDeviceFlag: --device auto trains (on the CPU here), cuda is refused
// with what is missing where no GPU is usable, bf16 is refused on the CPU,
// and an unknown device is named; nothing is written.
func TestDeviceFlag(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	if got, code := rpac(t, "train", "--dataset", "synthetic", "--d-model", "32", "--layers", "1", "--heads", "2", "--steps", "1",
		"--eval-batches", "1", "--device", "auto", "--out", out); code != 0 {
		t.Fatalf("auto: exit %d:\n%s", code, got)
	}
	cases := map[string]string{"tpu": "want cpu, cuda, cuda-sim or auto", "cpu --precision bf16": "needs --device cuda"}
	if driver.Available() != nil {
		cases["cuda"] = "--device cuda: the CUDA"
	}
	for dev, want := range cases {
		out := filepath.Join(t.TempDir(), "run")
		args := append([]string{"train", "--dataset", "synthetic", "--steps", "1", "--out", out, "--device"}, strings.Fields(dev)...)
		got, code := rpac(t, args...)
		if code == 0 || !strings.Contains(got, want) {
			t.Fatalf("--device %s: exit %d:\n%s", dev, code, got)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatalf("--device %s wrote %s", dev, out)
		}
	}
}
