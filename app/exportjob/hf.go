package exportjob

import (
	"github.com/rpac-dev/rpac/compiler/hf"
	"github.com/rpac-dev/rpac/training/data"
)

// HFTokenizer is the Hugging Face description of the tokenizer named
// name (a manifest's tokenizer), and whether it has one: GPT-2's byte-level
// BPE has; the synthetic tasks' token ids do not.
func HFTokenizer(name string) (*hf.Tokenizer, bool) {
	if name != data.GPT2TokenizerName {
		return nil, false
	}
	return &hf.Tokenizer{Pieces: data.NewTokenizer().Pieces(), EOS: data.GPT2EOS, EOSText: data.GPT2EOSText}, true
}

// writeHFTokenizer writes tokenizer.json and tokenizer_config.json into
// an ONNX export's directory when its tokenizer has them, and returns the
// files written.
func writeHFTokenizer(dir, name string) ([]string, error) {
	tok, ok := HFTokenizer(name)
	if !ok {
		return nil, nil
	}
	if err := hf.WriteTokenizer(dir, tok); err != nil {
		return nil, err
	}
	return []string{hf.TokenizerFile, hf.TokenizerConfigFile}, nil
}
