package metrics

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzMetricsFile: reading and truncating a metrics.jsonl of any content
// never panics, and truncation keeps no record beyond the step (records
// without a step, as the start record, stay).
func FuzzMetricsFile(f *testing.F) {
	f.Add([]byte("{\"step\":1,\"loss\":2}\n{\"step\":2}\n"), 1)
	f.Add([]byte("{\"step\":1e400}\n{"), 0)
	f.Add([]byte(""), 3)
	f.Add([]byte("not json\n{\"step\":\"x\"}\n"), 1)
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte, step int) {
		path := filepath.Join(dir, "metrics.jsonl")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		ReadJSONL(path)
		if err := TruncateAfter(path, step); err != nil {
			return
		}
		recs, err := ReadJSONL(path)
		if err != nil {
			return
		}
		for _, r := range recs {
			// Steps count from 1; a record without one (the start) reads as 0.
			if r.Step != 0 && r.Step > step {
				t.Fatalf("record of step %v kept after truncating to %d", r.Step, step)
			}
		}
	})
}
