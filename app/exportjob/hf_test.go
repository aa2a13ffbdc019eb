package exportjob

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestHFTokenizerGPT2: GPT-2's vocabulary gives Hugging Face's gpt2 files:
// 50,000 merges beginning "Ġ t", "Ġ a", "h e", "Ġthe" id 262, the EOS id
// 50256; the synthetic tasks' ids have none.
func TestHFTokenizerGPT2(t *testing.T) {
	dir := t.TempDir()
	files, err := writeHFTokenizer(dir, "gpt2-r50k")
	if err != nil || len(files) != 2 {
		t.Fatalf("files %v, %v", files, err)
	}
	var tj struct {
		Model struct {
			Vocab  map[string]int
			Merges [][2]string
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, files[0]))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &tj); err != nil {
		t.Fatal(err)
	}
	m, v := tj.Model.Merges, tj.Model.Vocab
	if len(m) != 50000 || m[0] != [2]string{"Ġ", "t"} || m[1] != [2]string{"Ġ", "a"} || m[2] != [2]string{"h", "e"} {
		t.Errorf("%d merges, first %q", len(m), m[:min(3, len(m))])
	}
	if len(v) != 50257 || v["Ġthe"] != 262 || v["<|endoftext|>"] != 50256 || v["!"] != 0 {
		t.Errorf("vocab of %d: Ġthe %d, <|endoftext|> %d, ! %d", len(v), v["Ġthe"], v["<|endoftext|>"], v["!"])
	}
	for _, name := range []string{"synthetic", "mqar"} {
		if files, err := writeHFTokenizer(t.TempDir(), name); files != nil || err != nil {
			t.Errorf("%s: %v, %v", name, files, err)
		}
	}
}
