package training

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// LockFile is the file in a run directory that `rpac train` holds an
// exclusive lock on while it writes the run (checkpoints, metrics.jsonl,
// bias snapshots). It records who holds it.
const LockFile = "train.lock"

// lockHolder is what the lock file records about the process holding it.
type lockHolder struct {
	PID     int    `json:"pid"`
	Host    string `json:"host"`
	Started string `json:"started"` // RFC 3339
}

func (h lockHolder) String() string {
	if h.PID == 0 {
		return "another process (it has not recorded itself yet)"
	}
	return fmt.Sprintf("process %d on host %s, started %s", h.PID, h.Host, h.Started)
}

// ErrRunLocked is returned (wrapped) when another process holds the run
// directory's lock.
var ErrRunLocked = errors.New("run directory is locked")

// runLock is a held lock on a run directory.
type runLock struct {
	f *os.File
}

// lockRunDir takes the exclusive lock of run directory dir (which must
// exist) without waiting: when another process holds it, the error names
// that process (pid, host, start time). The lock is released by unlock or
// when the process ends, however it ends.
func lockRunDir(dir string) (*runLock, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock the run directory: %w", err)
	}
	if err := flock(f); err != nil {
		f.Close()
		if !errors.Is(err, errWouldBlock) {
			return nil, fmt.Errorf("lock the run directory %s: %w", dir, err)
		}
		var h lockHolder
		if b, rerr := os.ReadFile(path); rerr == nil {
			_ = json.Unmarshal(b, &h)
		}
		return nil, fmt.Errorf("%w: %s is in use by %s (%s); wait for that run to end or choose another --out",
			ErrRunLocked, dir, h, path)
	}
	host, _ := os.Hostname()
	h := lockHolder{PID: os.Getpid(), Host: host, Started: time.Now().Format(time.RFC3339)}
	b, _ := json.Marshal(h)
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt(append(b, '\n'), 0)
	}
	return &runLock{f: f}, nil
}

// unlock releases the lock (the file stays, recording the last holder).
func (l *runLock) unlock() {
	if l == nil || l.f == nil {
		return
	}
	funlock(l.f)
	l.f.Close()
	l.f = nil
}
