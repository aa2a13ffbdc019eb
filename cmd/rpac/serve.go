package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/runtime/serve"
	"github.com/rpac-dev/rpac/training/data"
	"github.com/urfave/cli/v2"
)

// serveFlags are the server's limits and batching flags (rpac serve and
// rpac bench serve).
func serveFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.IntFlag{Name: "max-batch", Value: serve.DefaultMaxBatch, Usage: "most sequences in one batched model step (and decoding slots)"},
		&cli.DurationFlag{Name: "max-wait", Value: serve.DefaultMaxWait, Usage: "how long a batch waits for more work after its first request"},
		&cli.IntFlag{Name: "queue", Value: serve.DefaultQueue, Usage: "requests that may wait for a slot (and sequences waiting to be scored); beyond it: 429"},
		&cli.Int64Flag{Name: "max-body", Value: serve.DefaultMaxBodyBytes, Usage: "request body limit in bytes (413 beyond it)"},
		&cli.IntFlag{Name: "max-tokens", Value: serve.DefaultMaxTokens, Usage: "largest max_tokens a completion may ask for"},
		&cli.DurationFlag{Name: "timeout", Value: serve.DefaultTimeout, Usage: "per-request time limit, tokenization and queueing included (504 beyond it; a request estimated not to finish within it behind the work queued ahead of it is refused at once: 429 with Retry-After)"},
		&cli.Int64Flag{Name: "max-response", Value: serve.DefaultMaxResponseBytes, Usage: "most bytes of JSON one KServe inference or score may answer, counted at 15 per value before the model runs (413 beyond it)"},
		&cli.Int64Flag{Name: "response-memory", Value: serve.DefaultResponseMemory, Usage: "most bytes the KServe and score answers in flight may take together (429 beyond it)"},
		&cli.DurationFlag{Name: "read-header-timeout", Value: serve.DefaultReadHeaderTimeout, Usage: "time a client has to send a request's headers"},
		&cli.DurationFlag{Name: "read-timeout", Value: serve.DefaultReadTimeout, Usage: "time a client has to send a whole request, body included (408 for a late body)"},
		&cli.DurationFlag{Name: "write-timeout", Value: serve.DefaultWriteTimeout, Usage: "time a client has to take an answer (on the model routes, from the moment it is ready; streams use --stream-idle-timeout)"},
		&cli.DurationFlag{Name: "stream-idle-timeout", Value: serve.DefaultStreamIdleTimeout, Usage: "time a streaming client has to take each event before it is cut off"},
		&cli.DurationFlag{Name: "idle-timeout", Value: serve.DefaultIdleTimeout, Usage: "time a keep-alive connection may wait for its next request"},
		&cli.IntFlag{Name: "max-conns", Value: serve.DefaultMaxConns, Usage: "most connections open at once (at the limit an idle keep-alive one, else one a second late with its headers, is closed for a new one; failing both, more wait in the listen backlog)"},
		&cli.IntFlag{Name: "max-conns-per-client", Value: serve.DefaultMaxConnsPerClient, Usage: "most connections open at once from one remote IP (more are closed at once)"},
	}, sessionFlags()...)
}

func serveCommand() *cli.Command {
	return &cli.Command{
		Name:  "serve",
		Usage: "serve an exported model over HTTP: OpenAI-style completions (streaming), score, KServe v2, Prometheus metrics",
		Flags: append([]cli.Flag{
			exportFolderFlag(),
			&cli.StringFlag{Name: "addr", Value: "127.0.0.1:8080", Usage: "address to listen on"},
			&cli.StringFlag{Name: "name", Usage: "model name in the API (default: the export folder's name)"},
			&cli.StringFlag{Name: "chat-template", Usage: "file holding the chat template of /v1/chat/completions, in the Jinja syntax of Hugging Face's chat_template (default: a plain \"Role: content\" template for a base model, docs/SERVING.md)"},
			&cli.StringSliceFlag{Name: "allow-origin", Usage: "answer cross-origin (CORS) requests from this origin (repeatable or a comma list; * for any); without it no CORS headers are sent"},
			&cli.StringSliceFlag{Name: "served-model-name", Usage: "names the OpenAI routes answer to and GET /v1/models lists, repeatable or a comma list; the first is the name in answers (default: --name)"},
			&cli.DurationFlag{Name: "shutdown-timeout", Value: serve.DefaultShutdown, Usage: "on SIGTERM, how long requests in flight may take to finish"},
		}, serveFlags()...),
		Action: serveAction,
	}
}

// serveConfig reads the shared flags.
func serveConfig(c *cli.Context) (serve.Config, error) {
	for _, n := range []string{"max-batch", "queue", "max-tokens", "threads"} {
		if c.Int(n) < 0 {
			return serve.Config{}, fmt.Errorf("--%s must not be negative (got %d)", n, c.Int(n))
		}
	}
	if c.Int("max-batch") == 0 {
		return serve.Config{}, errors.New("--max-batch must be positive")
	}
	if c.Int64("max-body") <= 0 || c.Duration("max-wait") < 0 || c.Duration("timeout") <= 0 {
		return serve.Config{}, errors.New("--max-body and --timeout must be positive, --max-wait not negative")
	}
	for _, n := range []string{"read-header-timeout", "read-timeout", "write-timeout", "stream-idle-timeout", "idle-timeout"} {
		if c.Duration(n) <= 0 {
			return serve.Config{}, fmt.Errorf("--%s must be positive (got %v)", n, c.Duration(n))
		}
	}
	for _, n := range []string{"max-response", "response-memory"} {
		if c.Int64(n) <= 0 {
			return serve.Config{}, fmt.Errorf("--%s must be positive (got %d)", n, c.Int64(n))
		}
	}
	if c.Int64("response-memory") < c.Int64("max-response") {
		return serve.Config{}, fmt.Errorf("--response-memory (%d) must hold at least one answer of --max-response (%d)", c.Int64("response-memory"), c.Int64("max-response"))
	}
	for _, n := range []string{"max-conns", "max-conns-per-client"} {
		if c.Int(n) <= 0 {
			return serve.Config{}, fmt.Errorf("--%s must be positive (got %d)", n, c.Int(n))
		}
	}
	return serve.Config{MaxBatch: c.Int("max-batch"), MaxWait: c.Duration("max-wait"), Queue: c.Int("queue"),
		MaxBodyBytes: c.Int64("max-body"), MaxTokens: c.Int("max-tokens"), Timeout: c.Duration("timeout"),
		MaxResponseBytes: c.Int64("max-response"), ResponseMemory: c.Int64("response-memory"),
		ReadHeaderTimeout: c.Duration("read-header-timeout"), ReadTimeout: c.Duration("read-timeout"),
		WriteTimeout: c.Duration("write-timeout"), StreamIdleTimeout: c.Duration("stream-idle-timeout"),
		IdleTimeout: c.Duration("idle-timeout"), MaxConns: c.Int("max-conns"),
		MaxConnsPerClient: c.Int("max-conns-per-client"), Log: logger(c)}, nil
}

// openAIFlags reads the flags of the OpenAI routes.
func openAIFlags(c *cli.Context, cfg *serve.Config) error {
	cfg.ServedModelNames = c.StringSlice("served-model-name")
	cfg.AllowOrigins = serve.ParseOrigins(c.StringSlice("allow-origin"))
	if f := c.String("chat-template"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("--chat-template: %w", err)
		}
		cfg.ChatTemplate = string(b)
	}
	return nil
}

func serveAction(c *cli.Context) error {
	if c.Args().Len() > 0 {
		return fmt.Errorf("unexpected arguments: %v", c.Args().Slice())
	}
	cfg, err := serveConfig(c)
	if err != nil {
		return err
	}
	cfg.ShutdownTimeout = c.Duration("shutdown-timeout")
	dir := c.String("model")
	cfg.Name = c.String("name")
	if cfg.Name == "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return err
		}
		cfg.Name = filepath.Base(abs)
	}
	if err := openAIFlags(c, &cfg); err != nil {
		return err
	}
	man, err := runtime.ReadManifest(dir)
	if err != nil {
		return err
	}
	prov := man.Origin()
	if prov.Tokenizer == data.GPT2TokenizerName {
		cfg.Tokenizer = data.NewTokenizer()
	}
	m, err := openModel(c.Context, dir, sessionOptions(c, cfg.Tokenizer))
	if err != nil {
		return err
	}
	defer m.Close()
	s, err := serve.New(m, cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.String("addr"))
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	report(c, servingEvent{Model: cfg.Name, Dir: dir, Lengths: m.Lengths(), Batch: m.BatchSize(), URL: "http://" + ln.Addr().String(),
		MaxBatch: cfg.MaxBatch, MaxWait: cfg.MaxWait, Queue: cfg.Queue, Tokenizer: prov.Tokenizer, Tokenizes: cfg.Tokenizer != nil,
		KVCacheLength: m.KVCacheLengths(), Weights: prov.Weights, Step: prov.Step})
	t0 := time.Now()
	err = s.Serve(c.Context, ln)
	report(c, stoppedEvent{After: time.Since(t0)})
	return err
}
