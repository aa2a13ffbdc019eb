package export

import (
	"fmt"

	"github.com/rpac-dev/rpac/internal/logging"
)

// The export's debug events, logged on Options.Log as each length is done
// (rpac export reports the results when all are).

// CalibratedEvent: the running statistics of a length were computed on
// data ("export.calibrated").
type CalibratedEvent struct {
	_       logging.Name `log:"export.calibrated"`
	T       int          `log:"T"`
	Batches int          `log:"batches"`
	Batch   int          `log:"batch"`
	Source  string       `log:"source"`
}

func (e CalibratedEvent) Text() string {
	return fmt.Sprintf("L=%d: running statistics calibrated on %d×%d chunks (%s)", e.T, e.Batches, e.Batch, e.Source)
}

// CompiledEvent: the graphs of a length are written ("export.compiled").
type CompiledEvent struct {
	_       logging.Name `log:"export.compiled"`
	T       int          `log:"T"`
	File    string       `log:"file"`
	Bytes   int64        `log:"bytes"`
	Nodes   int          `log:"nodes"`
	Seconds float64      `log:"seconds"`
}

func (e CompiledEvent) Text() string {
	return fmt.Sprintf("L=%d: wrote %s (%d nodes) in %.1fs", e.T, e.File, e.Nodes, e.Seconds)
}

// Compiled is the event of a length's graphs.
func (r LengthResult) Compiled() CompiledEvent {
	return CompiledEvent{T: r.T, File: r.File, Bytes: r.Bytes, Nodes: r.Nodes, Seconds: r.Seconds}
}
