package serve

import (
	"fmt"
	"log/slog"
	"time"
)

// The server's events, logged on Config.Log.

// ShutdownEvent: the server's context ended; it refuses new connections
// and lets the requests in flight finish ("serve.shutdown").
type ShutdownEvent struct{ Timeout time.Duration }

func (e ShutdownEvent) Name() string { return "serve.shutdown" }

func (e ShutdownEvent) Attrs() []slog.Attr {
	return []slog.Attr{slog.Float64("timeout_s", e.Timeout.Seconds())}
}

func (e ShutdownEvent) Text() string {
	return fmt.Sprintf("shutting down: refusing new connections, finishing the requests in flight (at most %v)", e.Timeout)
}

// RequestFailedEvent: a request failed on the server's side with a 5xx
// other than 503 and 504 ("serve.request_failed", an error).
type RequestFailedEvent struct {
	Path   string
	Status int
	Err    error
}

func (e RequestFailedEvent) Name() string { return "serve.request_failed" }

func (e RequestFailedEvent) Attrs() []slog.Attr {
	return []slog.Attr{slog.String("path", e.Path), slog.Int("status", e.Status), slog.String("err", e.Err.Error())}
}

func (e RequestFailedEvent) Text() string {
	return fmt.Sprintf("%s: %d: %v", e.Path, e.Status, e.Err)
}
