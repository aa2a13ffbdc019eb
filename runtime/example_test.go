package runtime_test

import (
	"context"
	"encoding/json"
	"log"
	"net/http"
	"time"

	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/training/data"
)

// A service that embeds a model exported by `rpac export --run RUN
// --lengths 384,768 --out model/`: one Model serves every request (it is
// safe for concurrent use), prompts are tokenized with the GPT-2 BPE the
// model was trained with, and each request gets its own deadline.
func Example_service() {
	m, err := runtime.Open("model/", runtime.Options{
		Provider:  "cpu",               // or "cuda" with an onnxruntime CUDA build in $ORT_LIB
		Threads:   2,                   // onnxruntime intra-op threads per run
		Parallel:  2,                   // runs of one length in flight at once
		Tokenizer: data.NewTokenizer(), // GPT-2 r50k, as in training
	})
	if err != nil {
		log.Fatal(err) // e.g. no manifest.json, a changed file, onnxruntime missing
	}
	defer m.Close()
	log.Printf("serving lengths %v, vocabulary %d", m.Lengths(), m.VocabSize())

	http.HandleFunc("/generate", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt      string  `json:"prompt"`
			MaxTokens   int     `json:"max_tokens"`
			Temperature float64 `json:"temperature"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		text, err := m.GenerateText(ctx, req.Prompt, runtime.GenerateOptions{
			MaxNewTokens: min(req.MaxTokens, 256), Temperature: req.Temperature, TopK: 40, StopAtEOS: true,
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		json.NewEncoder(w).Encode(map[string]string{"text": text})
	})
	http.HandleFunc("/score", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Text string `json:"text"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		res, err := m.ScoreText(r.Context(), req.Text) // mean next-token CE and perplexity
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		json.NewEncoder(w).Encode(res)
	})
	log.Fatal(http.ListenAndServe("localhost:8080", nil))
}
