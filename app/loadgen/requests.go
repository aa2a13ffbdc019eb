package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"time"
)

func (o *MixOptions) inferPath(name string) string {
	return "/v2/models/" + url.PathEscape(name) + "/infer"
}

// wellFormed builds a request of a well-formed kind.
func (o *MixOptions) wellFormed(k Kind, rng *rand.Rand, i int) (string, []byte) {
	switch k {
	case KindScore:
		return "/v1/score", scoreBody(ids(rng, o.Vocab, o.ScoreLen))
	case KindInfer:
		in := fmt.Sprintf(`{"name": "input_ids", "shape": [1, %d], "datatype": "INT64", "data": %s}`, o.InferLen, ids(rng, o.Vocab, o.InferLen))
		var body string
		switch i % 3 { // the three kinds of outputs selection
		case 0:
			body = `{"inputs": [` + in + `], "outputs": [{"name": "last_logits"}]}`
		case 1:
			body = fmt.Sprintf(`{"inputs": [%s], "outputs": [{"name": "top_k_ids", "parameters": {"top_k": %d}}, {"name": "top_k_logits", "parameters": {"top_k": %d}}]}`, in, o.TopK, o.TopK)
		default:
			target := fmt.Sprintf(`{"name": "target_ids", "shape": [1, %d], "datatype": "INT64", "data": %s}`, o.InferLen, ids(rng, o.Vocab, o.InferLen))
			body = `{"inputs": [` + in + `, ` + target + `], "outputs": [{"name": "target_logprobs"}]}`
		}
		return o.inferPath(o.Model), []byte(body)
	}
	return "/v1/completions", completionBody(ids(rng, o.Vocab, o.PromptLen), o.MaxTokens, i, k == KindStream)
}

// malformed returns the i-th malformed request (Mix sends them in turn,
// every one of them once in every NumMalformed).
func (o *MixOptions) malformed(i int) (string, []byte) {
	list := o.malformedList()
	c := list[i%len(list)]
	return c.path, []byte(c.body)
}

// NumMalformed is the number of different malformed requests.
var NumMalformed = len((&MixOptions{}).malformedList())

// malformedList is the malformed requests: each is a client's mistake
// that the server must answer with a 4xx.
func (o *MixOptions) malformedList() []struct{ path, body string } {
	in := func(shape, data string) string {
		return `{"name": "input_ids", "shape": ` + shape + `, "datatype": "INT64", "data": ` + data + `}`
	}
	list := []struct{ path, body string }{
		{"/v1/completions", `{"prompt": [1, 2, `},                                        // truncated JSON
		{"/v1/completions", `{"prompt": {"ids": [1]}, "max_tokens": 2}`},                 // a prompt of the wrong type
		{"/v1/completions", `{"prompt": [1, 2], "max_tokens": -3}`},                      // negative max_tokens
		{"/v1/completions", fmt.Sprintf(`{"prompt": [%d], "max_tokens": 2}`, o.Vocab+7)}, // an id outside the vocabulary
		{"/v1/completions", `{"prompt": [1], "temperature": "hot"}`},                     // a string for a number
		{"/v1/completions", `{"prompt": [1], "max_tokens": 1000000000}`},                 // max_tokens beyond the limit
		{"/v1/completions", `{"prompt": [1]} {"prompt": [2]}`},                           // two JSON values
		{"/v1/score", ``},             // empty body
		{"/v1/score", `{"ids": [1]}`}, // one id
		{"/v1/score", `{"ids": "1 2 3"}`},
		{o.inferPath(o.Model), `{"inputs": [` + in("[2, 3]", "[1, 2]") + `]}`},                                               // data that does not fill the shape
		{o.inferPath(o.Model), `{"inputs": [` + in("[1, 2]", "[1, 2]") + `], "outputs": [{"name": "probs"}]}`},               // an unknown output
		{o.inferPath(o.Model), `{"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "FP32", "data": [1.5, 2]}]}`}, // a float input
		{o.inferPath(o.Model + "-missing"), `{"inputs": [` + in("[1, 2]", "[1, 2]") + `]}`},                                  // another model
		{o.inferPath(o.Model), `{"inputs": [` + in("[1, 2]", "[1, 2]") + `], "outputs": [{"name": "top_k_ids", "parameters": {"top_k": 0}}]}`},
	}
	return list
}

// slow sends a request whose body comes a byte every Trickle, on a
// connection of its own, and waits for the answer: the server should cut
// it off with a 408 once its read timeout passes.
func (o *MixOptions) slow(ctx context.Context, u *url.URL, rng *rand.Rand) answer {
	t := time.Now()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return answer{}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	paths := []string{"/v1/completions", "/v1/score", o.inferPath(o.Model)}
	path := paths[rng.IntN(len(paths))]
	// A body that cannot arrive within twice the read timeout.
	n := int(2*o.ReadTimeout/o.Trickle) + 64
	body := append([]byte(`{"ids": [`), bytes.Repeat([]byte("1,"), n)...)
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, u.Host, len(body)); err != nil {
		return answer{}
	}
	done := make(chan struct{})
	trickled := make(chan struct{})
	go func() {
		defer close(trickled)
		tick := time.NewTicker(o.Trickle)
		defer tick.Stop()
		for _, b := range body {
			if _, err := conn.Write([]byte{b}); err != nil {
				return
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	close(done)
	a := answer{}
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		a = answer{code: resp.StatusCode, lat: time.Since(t)}
	}
	conn.Close()
	<-trickled
	return a
}
