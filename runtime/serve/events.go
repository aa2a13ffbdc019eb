package serve

import (
	"fmt"
	"time"

	"github.com/rpac-dev/rpac/internal/logging"
)

// The server's events, logged on Config.Log.

// ShutdownEvent: the server's context ended; it refuses new connections
// and lets the requests in flight finish ("serve.shutdown").
type ShutdownEvent struct {
	_       logging.Name  `log:"serve.shutdown"`
	Timeout time.Duration `log:"timeout_s,seconds"`
}

func (e ShutdownEvent) Text() string {
	return fmt.Sprintf("shutting down: refusing new connections, finishing the requests in flight (at most %v)", e.Timeout)
}

// RequestFailedEvent: a request failed on the server's side with a 5xx
// other than 503 and 504 ("serve.request_failed", an error).
type RequestFailedEvent struct {
	_      logging.Name `log:"serve.request_failed"`
	Path   string       `log:"path"`
	Status int          `log:"status"`
	Err    error        `log:"err,string"`
}

func (e RequestFailedEvent) Text() string {
	return fmt.Sprintf("%s: %d: %v", e.Path, e.Status, e.Err)
}
