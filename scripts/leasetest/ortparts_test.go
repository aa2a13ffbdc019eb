package leasetest

import (
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// parts runs gpu-ort-parts.sh STEP with bin/ort at ort and bin/ort-pack at
// pack (and parts of partBytes when set); it returns the output and error.
func parts(t *testing.T, step, ort, pack, partBytes string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", "../gpu-ort-parts.sh", step)
	cmd.Env = append(os.Environ(), "RPAC_ORT_DIR="+ort, "RPAC_ORT_PACK="+pack)
	if partBytes != "" {
		cmd.Env = append(cmd.Env, "RPAC_ORT_PART_BYTES="+partBytes, "RPAC_ORT_ZSTD_LEVEL=3")
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// fakeORT writes a bin/ort of random files (what does not compress) with
// its SHA256SUMS.
func fakeORT(t *testing.T, dir string) {
	t.Helper()
	files := []string{"bin/rpac", "bin/export.test", "bin/runtime.test", "lib/libonnxruntime.so", "lib/libonnxruntime_providers_shared.so", "lib/libonnxruntime_providers_cuda.so"}
	for _, f := range files {
		b := make([]byte, 700_000)
		rand.Read(b)
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sums := exec.Command("sh", "-c", "sha256sum lib*.so > SHA256SUMS")
	sums.Dir = filepath.Join(dir, "lib")
	if out, err := sums.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
}

// TestORTPartsDry: pack splits bin/ort into compressed parts, the calls'
// appends (one part each) and the reassembly give back every file (the
// dry step); a part carried before the ones ahead of it, a damaged part and
// an incomplete archive are refused.
func TestORTPartsDry(t *testing.T) {
	for _, tool := range []string{"zstd", "sha256sum", "split", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not on PATH: %v (apt-get install zstd)", tool, err)
		}
	}
	dir := t.TempDir()
	ort, pack := filepath.Join(dir, "ort"), filepath.Join(dir, "pack")
	fakeORT(t, ort)
	if out, err := parts(t, "pack", ort, pack, "1000000"); err != nil || !strings.Contains(out, "5 parts") {
		t.Fatalf("pack: %v\n%s", err, out)
	}
	if out, err := parts(t, "dry", ort, pack, ""); err != nil || !strings.Contains(out, "5 calls reassemble") {
		t.Fatalf("dry: %v\n%s", err, out)
	}
	dev := filepath.Join(dir, "dev")
	carry := func(part string, damage bool) {
		t.Helper()
		os.MkdirAll(dev, 0o755)
		for _, f := range []string{"MANIFEST", "zstd", part} {
			b, err := os.ReadFile(filepath.Join(pack, f))
			if err != nil {
				t.Fatal(err)
			}
			if damage && f == part {
				b[len(b)/2] ^= 1
			}
			os.WriteFile(filepath.Join(dev, f), b, 0o755)
		}
	}
	devOrt := filepath.Join(dir, "devort")
	for _, c := range []struct {
		part, step, want string
		damage           bool
	}{
		{"part-01", "append", "came before the parts ahead of it", false},
		{"part-00", "append", "sha256 differs", true},
		{"part-00", "assemble", "incomplete or damaged", false},
	} {
		os.RemoveAll(dev)
		carry(c.part, c.damage)
		if out, err := parts(t, c.step, devOrt, dev, ""); err == nil || !strings.Contains(out, c.want) {
			t.Errorf("%s with %s (damaged %v): %v, want a refusal saying %q\n%s", c.step, c.part, c.damage, err, c.want, out)
		}
	}
}
