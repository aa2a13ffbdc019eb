// Package serve is the HTTP server behind `rpac serve`: it serves an
// exported model (package runtime) over the standard library's net/http.
//
// Routes:
//
//	POST /v1/completions           OpenAI-style completions; "stream": true sends server-sent events
//	POST /v1/chat/completions      OpenAI-style chat, the messages rendered by a Jinja chat template
//	GET  /v1/models, /v1/models/{id}  OpenAI's model list and model object
//	POST /v1/score                 cross-entropy, perplexity and per-token log-probabilities of a text
//	POST /v2/models/{name}/infer   KServe v2 inference: input_ids [B,T] in, logits [B,T,V] out
//	GET  /v2/health/live, /v2/health/ready, /v2/models/{name}, /v2/models/{name}/ready
//	GET  /v2 (server metadata), /v2/models/{name}/config (Triton's model configuration)
//	     and /v2/models/{name}/versions/{version}/... for each model route
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
// Scores and inferences take turns: each batch takes one sequence from
// each request in the queue in turn, so a small request is not held up by
// a large one queued before it.
//
// Limits: the request body size, max_tokens, a per-request timeout (which
// also bounds tokenization), a bounded queue that answers 429 when full,
// deadline-aware admission (a request that would wait behind work it is
// estimated not to finish after within its timeout gets 429 at once, with
// Retry-After, instead of 504 at its timeout; admit.go),
// the size of a KServe answer and the memory that answers in flight may
// take, the concurrent connections, and read, write and idle timeouts on
// every connection (a stream has its own limit per event instead of the
// write timeout). A client's mistake gets a 4xx with a JSON error body.
// Serve shuts down gracefully when its context ends: the listener closes
// (new connections are refused) and requests in flight, streams included,
// run to completion.
package serve

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	goruntime "runtime"
	"slices"
	"strings"
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

	DefaultMaxResponseBytes  = 16 << 20
	DefaultResponseMemory    = 256 << 20
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultStreamIdleTimeout = 30 * time.Second
	DefaultMaxConns          = 1024
	DefaultMaxConnsPerClient = 256
)

// Config configures a Server; zero fields take the defaults above.
type Config struct {
	// Name is the model's name in responses and KServe routes (default "rpac").
	Name string
	// ServedModelNames are the names the OpenAI routes answer to (GET
	// /v1/models lists them; a request's "model" must be one of them or
	// absent); the first is the name in answers that give none (default:
	// Name).
	ServedModelNames []string
	// ChatTemplate renders the messages of a chat completion, in the Jinja
	// syntax of Hugging Face's chat_template (default:
	// DefaultChatTemplate).
	ChatTemplate string
	// AllowOrigins are the origins whose cross-origin (CORS) requests are
	// answered, "*" for any; empty: no CORS headers, and OPTIONS is a 405.
	AllowOrigins []string
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
	// Timeout bounds the time of one request (504 beyond it). A request
	// that would have to wait behind other work is refused at once (429
	// with Retry-After) when the server estimates, from the model calls it
	// has timed, that it would not end within its remaining time.
	Timeout time.Duration
	// MaxInferValues bounds the logits one KServe inference computes
	// (B·T·V), whichever outputs it asks for.
	MaxInferValues int
	// MaxResponseBytes bounds the JSON answer of one KServe inference or
	// score, counted before the model runs at its largest (15 bytes per FP32
	// value); a request whose answer could be larger gets 413.
	MaxResponseBytes int64
	// ResponseMemory bounds the answers of KServe inferences and scores in
	// flight together (counted as for MaxResponseBytes); a request that
	// finds no room gets 429.
	ResponseMemory int64
	// ReadHeaderTimeout bounds the reading of a request's headers,
	// ReadTimeout the reading of a whole request (headers and body; 408
	// when the body is late).
	ReadHeaderTimeout, ReadTimeout time.Duration
	// WriteTimeout bounds the writing of an answer: from the end of the
	// request's headers on routes that answer at once, from the moment the
	// answer is ready on the model routes (whose computation Timeout
	// bounds). Streams are exempt: StreamIdleTimeout bounds each of their
	// events instead (a client that takes no event for that long is cut
	// off).
	WriteTimeout, StreamIdleTimeout time.Duration
	// IdleTimeout bounds how long a keep-alive connection waits for its
	// next request.
	IdleTimeout time.Duration
	// MaxConns bounds the connections Serve holds open at once. At the
	// bound, an idle keep-alive connection is closed to make room for a new
	// one, else one that has gone a second (or ReadHeaderTimeout, if
	// shorter) without finishing its headers; failing both, new connections
	// wait in the listen backlog.
	MaxConns int
	// MaxConnsPerClient bounds the connections open at once from one remote
	// IP; one more is closed as soon as it is accepted.
	MaxConnsPerClient int
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
	c.Name = cmp.Or(c.Name, "rpac")
	if len(c.ServedModelNames) == 0 {
		c.ServedModelNames = []string{c.Name}
	}
	for i, n := range c.ServedModelNames {
		if n == "" || slices.Contains(c.ServedModelNames[:i], n) {
			return fmt.Errorf("serve: served model names must be non-empty and distinct (got %q)", c.ServedModelNames)
		}
	}
	c.MaxBatch = cmp.Or(c.MaxBatch, DefaultMaxBatch)
	c.MaxWait = cmp.Or(c.MaxWait, DefaultMaxWait)
	c.Queue = cmp.Or(c.Queue, DefaultQueue)
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, DefaultMaxBodyBytes)
	c.MaxTokens = cmp.Or(c.MaxTokens, DefaultMaxTokens)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.MaxInferValues = cmp.Or(c.MaxInferValues, DefaultMaxInferValues)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdown)
	c.ReadHeaderTimeout = cmp.Or(c.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	c.ReadTimeout = cmp.Or(c.ReadTimeout, DefaultReadTimeout)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.StreamIdleTimeout = cmp.Or(c.StreamIdleTimeout, DefaultStreamIdleTimeout)
	c.MaxResponseBytes = cmp.Or(c.MaxResponseBytes, DefaultMaxResponseBytes)
	c.ResponseMemory = cmp.Or(c.ResponseMemory, max(DefaultResponseMemory, c.MaxResponseBytes))
	c.MaxConns = cmp.Or(c.MaxConns, DefaultMaxConns)
	c.MaxConnsPerClient = cmp.Or(c.MaxConnsPerClient, DefaultMaxConnsPerClient)
	switch {
	case c.MaxBatch < 0 || c.Queue < 0 || c.MaxTokens < 0 || c.MaxInferValues < 0 || c.MaxConns < 0 || c.MaxConnsPerClient < 0:
		return errors.New("serve: max batch, queue, max tokens, max infer values and max connections (per client too) must not be negative")
	case c.MaxWait < 0 || c.Timeout < 0 || c.ShutdownTimeout < 0 || c.MaxBodyBytes < 0:
		return errors.New("serve: durations and the body limit must not be negative")
	case c.ReadHeaderTimeout < 0 || c.ReadTimeout < 0 || c.WriteTimeout < 0 || c.IdleTimeout < 0 || c.StreamIdleTimeout < 0:
		return errors.New("serve: the connection timeouts must not be negative")
	case c.MaxResponseBytes < 0 || c.ResponseMemory < 0:
		return errors.New("serve: the response limits must not be negative")
	case c.ResponseMemory < c.MaxResponseBytes:
		return fmt.Errorf("serve: the response memory (%d bytes) must hold at least one answer of the largest size (%d bytes)", c.ResponseMemory, c.MaxResponseBytes)
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
	chat     *chatTemplate
	metrics  *metrics
	mux      *http.ServeMux
	handler  http.Handler // mux, with JSON 404 and 405 answers
	draining chan struct{}
	drain    sync.Once
	created  int64
	// closing ends when Close is called: it cuts the requests still in
	// flight (tokenization included).
	closing     context.Context
	closeCancel context.CancelFunc
	// encodeSlots bounds the long texts tokenized at once (one per core),
	// and so the memory and CPU that tokenization takes.
	encodeSlots chan struct{}
	// respMem is the response memory taken by answers in flight.
	respMu  sync.Mutex
	respMem int64
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
	s := &Server{cfg: cfg, m: m, metrics: newMetrics(cfg.Registry), draining: make(chan struct{}), created: time.Now().Unix(),
		encodeSlots: make(chan struct{}, max(1, goruntime.GOMAXPROCS(0)))}
	eos := ""
	if cfg.Tokenizer != nil {
		eos = cfg.Tokenizer.Decode([]int32{m.EOS()})
	}
	chat, err := newChatTemplate(cfg.ChatTemplate, eos)
	if err != nil {
		return nil, err
	}
	s.chat = chat
	s.closing, s.closeCancel = context.WithCancel(context.Background())
	s.dec = newDecoder(cfg.Engine, m.EOS(), cfg.MaxBatch, cfg.MaxWait, cfg.Queue, cfg.Timeout, s.metrics)
	s.sc = newScorer(m, cfg.MaxBatch, cfg.MaxWait, cfg.Queue, cfg.Timeout, s.metrics)
	s.routes()
	return s, nil
}

// routes registers every route on a standard http.ServeMux with method
// patterns: the mux answers a known path with an unknown method with 405
// and an Allow header listing every method the path accepts (GET implies
// HEAD), and an unknown path with 404; unmatched turns both into the
// server's JSON errors.
func (s *Server) routes() {
	s.mux = http.NewServeMux()
	for _, r := range []struct {
		pattern string
		h       http.HandlerFunc
	}{
		{"POST /v1/completions", s.completions},
		{"POST /v1/chat/completions", s.chatCompletions},
		{"POST /v1/score", s.score},
		{"GET /v1/models", s.listModels},
		{"GET /v1/models/{id...}", s.getModel},
		{"GET /v2", s.serverMetadata},
		{"POST /v2/models/{name}/infer", s.infer},
		{"GET /v2/models/{name}", s.modelMetadata},
		{"GET /v2/models/{name}/ready", s.modelReady},
		{"GET /v2/models/{name}/config", s.modelConfig},
		{"POST /v2/models/{name}/versions/{version}/infer", s.infer},
		{"GET /v2/models/{name}/versions/{version}", s.modelMetadata},
		{"GET /v2/models/{name}/versions/{version}/ready", s.modelReady},
		{"GET /v2/models/{name}/versions/{version}/config", s.modelConfig},
		{"GET /v2/health/live", s.live},
		{"GET /v2/health/ready", s.ready},
		{"GET /metrics", s.metrics.handler().ServeHTTP},
	} {
		_, path, _ := strings.Cut(r.pattern, " ")
		s.mux.Handle(r.pattern, s.metrics.instrument(path, s.cfg.WriteTimeout, r.h))
	}
	s.handler = s.cors(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h, pattern := s.mux.Handler(r); pattern == "" {
			s.metrics.instrument("other", s.cfg.WriteTimeout, s.unmatched(h)).ServeHTTP(w, r)
			return
		}
		s.mux.ServeHTTP(w, r) // sets the request's path values
	}))
}

// unmatched runs the mux's own answer to a request no pattern takes (404,
// or 405 with its Allow header) and writes its status as a JSON error.
func (s *Server) unmatched(h http.Handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rec := &errorRewriter{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		code := rec.code
		if code == 0 {
			code = http.StatusNotFound
		}
		w.Header().Del("X-Content-Type-Options")
		var msg string
		switch code {
		case http.StatusMethodNotAllowed:
			msg = fmt.Sprintf("%s does not accept %s (allowed: %s)", r.URL.Path, r.Method, w.Header().Get("Allow"))
		case http.StatusNotFound:
			msg = fmt.Sprintf("no route %s %s; see the routes of rpac serve (POST /v1/completions, POST /v1/chat/completions, POST /v1/score, GET /v1/models, POST /v2/models/%s/infer, GET /v2/health/ready, GET /metrics)", r.Method, r.URL.Path, s.cfg.Name)
		default:
			msg = http.StatusText(code)
		}
		writeError(w, r, code, msg)
	}
}

// errorRewriter keeps the headers a mux error handler sets (Allow) but
// swallows its status and plain-text body, which unmatched rewrites.
type errorRewriter struct {
	http.ResponseWriter
	code int
}

func (e *errorRewriter) WriteHeader(code int) {
	if e.code == 0 {
		e.code = code
	}
}

func (e *errorRewriter) Write(p []byte) (int, error) {
	if e.code == 0 {
		e.code = http.StatusOK
	}
	return len(p), nil
}

// Handler is the server's HTTP handler (all routes).
func (s *Server) Handler() http.Handler { return s.handler }

// Serve accepts connections on ln (at most MaxConns at once, MaxConnsPerClient
// from one IP) until ctx
// ends, then shuts down gracefully: readiness turns false, the listener
// closes, requests in flight finish (within ShutdownTimeout), and the
// batchers stop. It returns nil after a clean shutdown.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := s.httpServer(ctx)
	ll := limitListener(ln, connLimits{max: s.cfg.MaxConns, perClient: s.cfg.MaxConnsPerClient,
		header: min(crowdedHeaderTimeout, s.cfg.ReadHeaderTimeout)})
	srv.ConnState = ll.track
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ll) }()
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

// httpServer is the http.Server that Serve runs, with the connection
// timeouts of the configuration.
func (s *Server) httpServer(ctx context.Context) *http.Server {
	return &http.Server{Handler: s.handler,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout, ReadTimeout: s.cfg.ReadTimeout,
		WriteTimeout: s.cfg.WriteTimeout, IdleTimeout: s.cfg.IdleTimeout,
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ErrorLog:    slog.NewLogLogger(s.cfg.Log.Handler(), slog.LevelDebug)}
}

// Close stops the batchers and cuts the requests still in flight (their
// tokenization included); requests still waiting get 503.
func (s *Server) Close() {
	s.closeCancel()
	s.dec.close()
	s.sc.close()
}

// requestContext is the context of a model request: it ends after
// Timeout, when the client leaves, or when the server is closed.
func (s *Server) requestContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Timeout)
	stop := context.AfterFunc(s.closing, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// ContextEncoder is a Tokenizer that can encode under a context and stop
// early (*data.Tokenizer is one). The server uses it when its Tokenizer
// implements it, so that tokenization runs under the request's deadline
// and the server's shutdown and stops once a text is too long to use.
type ContextEncoder interface {
	// EncodeContext returns the ids of text, or ctx's error when ctx ends
	// first. With max > 0 it may stop once the text holds more than max
	// tokens, returning only the ids so far (more than max of them).
	EncodeContext(ctx context.Context, text string, max int) ([]int32, error)
}

// longText is the length from which a text waits for one of encodeSlots
// before it is tokenized (shorter ones take microseconds).
const longText = 64 << 10

// encode tokenizes text under ctx; with max > 0, a result longer than max
// means the text has more than max tokens.
func (s *Server) encode(ctx context.Context, text string, max int) ([]int32, error) {
	if len(text) >= longText {
		select {
		case s.encodeSlots <- struct{}{}:
			defer func() { <-s.encodeSlots }()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var ids []int32
	if ce, ok := s.cfg.Tokenizer.(ContextEncoder); ok {
		var err error
		if ids, err = ce.EncodeContext(ctx, text, max); err != nil {
			return nil, err
		}
	} else {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ids = s.cfg.Tokenizer.Encode(text)
	}
	V := int32(s.m.VocabSize())
	for _, id := range ids {
		if id < 0 || id >= V { // the tokenizer does not fit the model: the server's fault
			return nil, fmt.Errorf("the tokenizer gave the id %d, outside the model's vocabulary [0,%d)", id, V)
		}
	}
	return ids, nil
}

// reserve takes n bytes of response memory; release gives them back.
// It fails with 413 when n is above MaxResponseBytes and with 429 when the
// memory is taken by other answers.
func (s *Server) reserve(n int64, what string) (release func(), err error) {
	if n > s.cfg.MaxResponseBytes {
		return nil, &apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf("%s could take up to %d bytes of JSON, more than the server's limit of %d bytes per answer (rpac serve --max-response)", what, n, s.cfg.MaxResponseBytes)}
	}
	s.respMu.Lock()
	defer s.respMu.Unlock()
	if s.respMem+n > s.cfg.ResponseMemory {
		s.metrics.refused.WithLabelValues("score", "response_memory").Inc()
		return nil, &apiError{http.StatusTooManyRequests, fmt.Sprintf("the server's memory for answers (%d bytes) is taken by answers in flight; retry later", s.cfg.ResponseMemory)}
	}
	s.respMem += n
	s.metrics.responseMemory.Add(float64(n))
	return func() {
		s.respMu.Lock()
		s.respMem -= n
		s.respMu.Unlock()
		s.metrics.responseMemory.Sub(float64(n))
	}, nil
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

// errCode is the string "code" of an OpenAI-form error.
type errCode string

const (
	codeInvalidValue         errCode = "invalid_value"
	codeUnsupportedParameter errCode = "unsupported_parameter"
	codeModelNotFound        errCode = "model_not_found"
)

// paramError is an apiError about one request field: the OpenAI-form
// error names it in "param", with a string "code".
type paramError struct {
	err   *apiError
	param string
	code  errCode
}

func (e *paramError) Error() string { return e.err.msg }
func (e *paramError) Unwrap() error { return e.err }

// badParam is a 400 about the request field param.
func badParam(param string, format string, args ...any) *paramError {
	return &paramError{badRequest(format, args...), param, codeInvalidValue}
}

// unsupportedParam is the 400 for a field this server does not implement
// (a field is never silently ignored).
func unsupportedParam(param string) *paramError {
	return &paramError{badRequest("the parameter %s is not supported by this server; leave it out (or send null)", param), param, codeUnsupportedParameter}
}

// statusOf maps an error to its HTTP status and message: the server's
// own limits and failures are 5xx (or 429), the client's mistakes 4xx.
func statusOf(err error, timeout time.Duration) (int, string) {
	var ae *apiError
	var mbe *http.MaxBytesError
	var oe *overloadError
	switch {
	case errors.As(err, &ae):
		return ae.code, ae.msg
	case errors.As(err, &oe):
		return http.StatusTooManyRequests, oe.msg
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is larger than %d bytes, the most this server accepts (rpac serve --max-body); send a smaller body", mbe.Limit)
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
// routes (the protocol's form), OpenAI's {"error": {"message", "type",
// "param", "code"}} on the others, with param and code null.
func writeError(w http.ResponseWriter, r *http.Request, code int, msg string) {
	writeParamError(w, r, code, msg, "", "")
}

// writeParamError writes a JSON error as writeError does, with OpenAI's
// param and code (null when empty).
func writeParamError(w http.ResponseWriter, r *http.Request, code int, msg, param string, ec errCode) {
	if (code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable) && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "1")
	}
	if len(r.URL.Path) >= 4 && r.URL.Path[:4] == "/v2/" {
		writeJSON(w, code, map[string]string{"error": msg})
		return
	}
	writeJSON(w, code, map[string]openAIError{"error": newOpenAIError(code, msg, param, ec)})
}

// openAIError is the body of an error in OpenAI's form.
type openAIError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
	// Status is the HTTP status of an error that ends a stream (whose
	// header said 200); absent elsewhere.
	Status int `json:"status,omitempty"`
}

// newOpenAIError fills OpenAI's error: a status without its own code gets
// one of its kind ("timeout", "rate_limit_exceeded", ...), or null.
func newOpenAIError(code int, msg, param string, ec errCode) openAIError {
	e := openAIError{Message: msg, Type: "invalid_request_error"}
	if code >= 500 || code == http.StatusTooManyRequests {
		e.Type = "server_error"
	}
	if ec == "" {
		ec = statusCodes[code]
	}
	if param != "" {
		e.Param = &param
	}
	if ec != "" {
		c := string(ec)
		e.Code = &c
	}
	return e
}

// statusCodes are the error codes of statuses without a more precise one.
var statusCodes = map[int]errCode{
	http.StatusNotFound:              "not_found",
	http.StatusMethodNotAllowed:      "method_not_allowed",
	http.StatusRequestTimeout:        "request_timeout",
	http.StatusRequestEntityTooLarge: "request_too_large",
	http.StatusTooManyRequests:       "rate_limit_exceeded",
	http.StatusServiceUnavailable:    "service_unavailable",
	http.StatusGatewayTimeout:        "timeout",
	http.StatusInternalServerError:   "internal_error",
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && s.closing.Err() != nil {
		err = errClosed // cut by Close, not by the client
	}
	code, msg := statusOf(err, s.cfg.Timeout)
	if code >= 500 && code != http.StatusServiceUnavailable && code != http.StatusGatewayTimeout {
		logging.Log(r.Context(), s.cfg.Log, slog.LevelError, RequestFailedEvent{Path: r.URL.Path, Status: code, Err: err})
	}
	var oe *overloadError
	if errors.As(err, &oe) {
		w.Header().Set("Retry-After", oe.retryAfterSeconds())
	}
	var pe *paramError
	if errors.As(err, &pe) {
		writeParamError(w, r, code, msg, pe.param, pe.code)
		return
	}
	writeError(w, r, code, msg)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// decodeJSON reads a JSON body of at most MaxBodyBytes into v. Once the
// body is read, it lifts the connection's read deadline (ReadTimeout
// bounds the request's arrival, not the computation: net/http would end
// the request's context when a deadline passes during it).
func (s *Server) decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return &apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is %d bytes, more than the %d bytes this server accepts (rpac serve --max-body); send a smaller body", r.ContentLength, s.cfg.MaxBodyBytes)}
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	dec := json.NewDecoder(body)
	err := dec.Decode(v)
	var rest []byte
	if err == nil { // read the body to its end, under the read deadline
		rest, err = io.ReadAll(io.MultiReader(dec.Buffered(), body))
	}
	if err != nil {
		var mbe *http.MaxBytesError
		var ne net.Error
		switch {
		case errors.As(err, &mbe):
			return err
		case errors.As(err, &ne) && ne.Timeout():
			return &apiError{http.StatusRequestTimeout, fmt.Sprintf("the request body did not arrive within the server's read timeout of %v", s.cfg.ReadTimeout)}
		}
		if errors.Is(err, io.EOF) {
			return badRequest("the request body is empty; send a JSON object")
		}
		return badRequest("the request body is not valid JSON for this route: %v", err)
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return badRequest("the request body holds more than one JSON value")
	}
	// The whole body is in: the deadline may go (only now: with a body
	// left to read, net/http reads it after the handler).
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
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
	if v := r.PathValue("version"); v != "" && v != modelVersion {
		writeError(w, r, http.StatusNotFound, fmt.Sprintf("model %q has no version %q; its versions are [%s]", s.cfg.Name, v, modelVersion))
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
