// Package serve is the HTTP server behind `rpac serve`: it serves an
// exported model (package runtime) over the standard library's net/http.
//
// Routes:
//
//	POST /v1/completions           OpenAI-style completions; "stream": true sends server-sent events
//	POST /v1/score                 cross-entropy, perplexity and per-token log-probabilities of a text
//	POST /v2/models/{name}/infer   KServe v2 inference: input_ids [B,T] in, logits [B,T,V] out
//	GET  /v2/health/live, /v2/health/ready, /v2/models/{name}, /v2/models/{name}/ready
//	GET  /metrics                  Prometheus text format
//
// Completions are decoded in batches: one loop advances every open
// sequence with one Engine.Step call per step and draws each one's next
// token; new requests join between steps, and a step that takes in new
// sequences waits at most Config.MaxWait for more while it holds fewer than
// Config.MaxBatch (dynamic batching). Scores and KServe inferences are
// batched into Model.Each calls: up to MaxBatch sequences, waiting at most
// MaxWait after the first.
//
// Limits: the request body size, max_tokens, a per-request timeout, and a
// bounded queue that answers 429 when full. A client's mistake gets a 4xx
// with a JSON error body. Serve shuts down gracefully when its context
// ends: the listener closes (new connections are refused) and requests in
// flight, streams included, run to completion.
package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rpac-dev/rpac/internal/logging"
	"github.com/rpac-dev/rpac/runtime"
)

// Defaults of Config.
const (
	DefaultMaxBatch       = 8
	DefaultMaxWait        = 2 * time.Millisecond
	DefaultQueue          = 64
	DefaultMaxBodyBytes   = 1 << 20
	DefaultMaxTokens      = 256
	DefaultTimeout        = 60 * time.Second
	DefaultMaxInferValues = 1 << 22
	DefaultShutdown       = 30 * time.Second
)

// Config configures a Server; zero fields take the defaults above.
type Config struct {
	// Name is the model's name in responses and KServe routes (default "rpac").
	Name string
	// Tokenizer encodes text prompts and decodes completions; without one
	// prompts must be token ids and completions carry ids only.
	Tokenizer runtime.Tokenizer
	// Engine decodes completions (default, with MaxBatch slots:
	// NewKVEngine when the model is a *runtime.Model with KV-cache graphs,
	// else NewWindowEngine).
	Engine Engine
	// MaxBatch is the most sequences in one decoding step or scoring run.
	MaxBatch int
	// MaxWait is how long a batch waits for more work after its first item.
	MaxWait time.Duration
	// Queue bounds the completions waiting for a decoding slot and the
	// sequences waiting to be scored; beyond it requests get 429.
	Queue int
	// MaxBodyBytes bounds a request body (413 beyond it).
	MaxBodyBytes int64
	// MaxTokens bounds max_tokens of a completion.
	MaxTokens int
	// Timeout bounds the time of one request (504 beyond it).
	Timeout time.Duration
	// MaxInferValues bounds the logits of one KServe inference (B·T·V).
	MaxInferValues int
	// ShutdownTimeout bounds how long Serve waits for requests in flight
	// once its context ends.
	ShutdownTimeout time.Duration
	// Registry receives the metrics (default: a new registry that also
	// holds the Go runtime's and the process's collectors).
	Registry *prometheus.Registry
	// Log receives the server's events (events.go; default: discarded).
	Log *slog.Logger
}

func (c *Config) defaults() error {
	if c.Name == "" {
		c.Name = "rpac"
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.MaxWait == 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.Queue == 0 {
		c.Queue = DefaultQueue
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = DefaultMaxTokens
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxInferValues == 0 {
		c.MaxInferValues = DefaultMaxInferValues
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdown
	}
	switch {
	case c.MaxBatch < 0 || c.Queue < 0 || c.MaxTokens < 0 || c.MaxInferValues < 0:
		return errors.New("serve: max batch, queue, max tokens and max infer values must not be negative")
	case c.MaxWait < 0 || c.Timeout < 0 || c.ShutdownTimeout < 0 || c.MaxBodyBytes < 0:
		return errors.New("serve: durations and the body limit must not be negative")
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
		c.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if c.Log == nil {
		c.Log = logging.Discard()
	}
	return nil
}

// Server serves one model. Create it with New, mount Handler or call
// Serve, and Close it when done.
type Server struct {
	cfg      Config
	m        Model
	dec      *decoder
	sc       *scorer
	metrics  *metrics
	mux      *http.ServeMux
	draining chan struct{}
	drain    sync.Once
	created  int64
}

// New returns a server for m.
func New(m Model, cfg Config) (*Server, error) {
	if m == nil {
		return nil, errors.New("serve: no model")
	}
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if cfg.Engine == nil {
		var eng Engine
		var err error
		if rm, ok := m.(*runtime.Model); ok && len(rm.KVCacheLengths()) > 0 {
			eng, err = NewKVEngine(rm, cfg.MaxBatch)
		} else {
			eng, err = NewWindowEngine(m, cfg.MaxBatch)
		}
		if err != nil {
			return nil, err
		}
		cfg.Engine = eng
	}
	s := &Server{cfg: cfg, m: m, metrics: newMetrics(cfg.Registry), draining: make(chan struct{}), created: time.Now().Unix()}
	s.dec = newDecoder(cfg.Engine, m.EOS(), cfg.MaxBatch, cfg.MaxWait, cfg.Queue, s.metrics)
	s.sc = newScorer(m, cfg.MaxBatch, cfg.MaxWait, cfg.Queue, s.metrics)
	s.routes()
	return s, nil
}

// route is one path's handlers by method.
type route map[string]http.HandlerFunc

func (s *Server) routes() {
	s.mux = http.NewServeMux()
	add := func(path, label string, r route) {
		s.mux.Handle(path, s.metrics.instrument(label, s.methods(r)))
	}
	add("/v1/completions", "/v1/completions", route{http.MethodPost: s.completions})
	add("/v1/score", "/v1/score", route{http.MethodPost: s.score})
	add("/v2/models/{name}/infer", "/v2/models/{name}/infer", route{http.MethodPost: s.infer})
	add("/v2/models/{name}", "/v2/models/{name}", route{http.MethodGet: s.modelMetadata})
	add("/v2/models/{name}/ready", "/v2/models/{name}/ready", route{http.MethodGet: s.modelReady})
	add("/v2/health/live", "/v2/health/live", route{http.MethodGet: s.live})
	add("/v2/health/ready", "/v2/health/ready", route{http.MethodGet: s.ready})
	s.mux.Handle("/metrics", s.metrics.instrument("/metrics", s.methods(route{http.MethodGet: s.metrics.handler().ServeHTTP})))
	s.mux.Handle("/", s.metrics.instrument("other", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, http.StatusNotFound, fmt.Sprintf("no route %s %s; see the routes of rpac serve (POST /v1/completions, POST /v1/score, POST /v2/models/%s/infer, GET /v2/health/ready, GET /metrics)", r.Method, r.URL.Path, s.cfg.Name))
	})))
}

// methods dispatches by method and answers others with a JSON 405.
func (s *Server) methods(r route) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		h, ok := r[req.Method]
		if !ok && req.Method == http.MethodHead {
			h, ok = r[http.MethodGet]
		}
		if !ok {
			for m := range r {
				w.Header().Set("Allow", m)
			}
			writeError(w, req, http.StatusMethodNotAllowed, fmt.Sprintf("%s does not accept %s", req.URL.Path, req.Method))
			return
		}
		h(w, req)
	}
}

// Handler is the server's HTTP handler (all routes).
func (s *Server) Handler() http.Handler { return s.mux }

// Serve accepts connections on ln until ctx ends, then shuts down
// gracefully: readiness turns false, the listener closes, requests in
// flight finish (within ShutdownTimeout), and the batchers stop. It
// returns nil after a clean shutdown.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) }}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		s.Close()
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logging.Info(s.cfg.Log, ShutdownEvent{Timeout: s.cfg.ShutdownTimeout})
	s.drain.Do(func() { close(s.draining) })
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	<-errc
	s.Close()
	if err != nil {
		return fmt.Errorf("serve: shutdown: %w (requests still in flight after %v were cut)", err, s.cfg.ShutdownTimeout)
	}
	return nil
}

// Close stops the batchers; requests still waiting get 503.
func (s *Server) Close() {
	s.dec.close()
	s.sc.close()
}

func (s *Server) isDraining() bool {
	select {
	case <-s.draining:
		return true
	default:
		return false
	}
}

// apiError is an HTTP status with a message for the client.
type apiError struct {
	code int
	msg  string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) *apiError {
	return &apiError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// statusOf maps an error to its HTTP status and message: the server's
// own limits and failures are 5xx (or 429), the client's mistakes 4xx.
func statusOf(err error, timeout time.Duration) (int, string) {
	var ae *apiError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		return ae.code, ae.msg
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is larger than the server's limit of %d bytes", mbe.Limit)
	case errors.Is(err, errFull):
		return http.StatusTooManyRequests, err.Error()
	case errors.Is(err, errClosed):
		return http.StatusServiceUnavailable, err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, fmt.Sprintf("the request took longer than the server's limit of %v", timeout)
	case errors.Is(err, context.Canceled):
		return 499, "the client closed the request"
	}
	return http.StatusInternalServerError, err.Error()
}

// writeError writes a JSON error: {"error": "..."} on the KServe v2
// routes (the protocol's form), {"error": {"message", "type", "code"}}
// on the others (the OpenAI form).
func writeError(w http.ResponseWriter, r *http.Request, code int, msg string) {
	if code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	if len(r.URL.Path) >= 4 && r.URL.Path[:4] == "/v2/" {
		writeJSON(w, code, map[string]string{"error": msg})
		return
	}
	typ := "invalid_request_error"
	if code >= 500 || code == http.StatusTooManyRequests {
		typ = "server_error"
	}
	writeJSON(w, code, map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": code}})
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	code, msg := statusOf(err, s.cfg.Timeout)
	if code >= 500 && code != http.StatusServiceUnavailable && code != http.StatusGatewayTimeout {
		logging.Log(r.Context(), s.cfg.Log, slog.LevelError, RequestFailedEvent{Path: r.URL.Path, Status: code, Err: err})
	}
	writeError(w, r, code, msg)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// decodeJSON reads a JSON body of at most MaxBodyBytes into v.
func (s *Server) decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		if errors.Is(err, io.EOF) {
			return badRequest("the request body is empty; send a JSON object")
		}
		return badRequest("the request body is not valid JSON for this route: %v", err)
	}
	if dec.More() {
		return badRequest("the request body holds more than one JSON value")
	}
	return nil
}

func (s *Server) live(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]bool{"live": true})
}

func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	if s.isDraining() {
		writeError(w, r, http.StatusServiceUnavailable, "the server is shutting down")
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"ready": true})
}

// checkName answers 404 for a model name other than the served one.
func (s *Server) checkName(w http.ResponseWriter, r *http.Request) bool {
	if n := r.PathValue("name"); n != s.cfg.Name {
		writeError(w, r, http.StatusNotFound, fmt.Sprintf("no model %q here; this server serves %q", n, s.cfg.Name))
		return false
	}
	return true
}

func (s *Server) modelReady(w http.ResponseWriter, r *http.Request) {
	if !s.checkName(w, r) {
		return
	}
	s.ready(w, r)
}

type tensorMeta struct {
	Name     string  `json:"name"`
	Datatype string  `json:"datatype"`
	Shape    []int64 `json:"shape"`
}

func (s *Server) modelMetadata(w http.ResponseWriter, r *http.Request) {
	if !s.checkName(w, r) {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"name": s.cfg.Name, "versions": []string{"1"}, "platform": "onnxruntime_onnx",
		"inputs":  []tensorMeta{{Name: "input_ids", Datatype: "INT64", Shape: []int64{-1, -1}}},
		"outputs": []tensorMeta{{Name: "logits", Datatype: "FP32", Shape: []int64{-1, -1, int64(s.m.VocabSize())}}},
	})
}
