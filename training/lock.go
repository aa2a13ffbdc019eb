package training

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rpac-dev/rpac/training/dist"
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
	// Job names the data-parallel job whose rank 0 holds the lock (its
	// launcher, job name and ranks); empty for a run of one process.
	Job string `json:"job,omitempty"`
}

func (h lockHolder) String() string {
	if h.PID == 0 {
		return "another process (it has not recorded itself yet)"
	}
	s := fmt.Sprintf("process %d on host %s, started %s", h.PID, h.Host, h.Started)
	if h.Job != "" {
		s = h.Job + " (its rank 0: " + s + ")"
	}
	return s
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
// that process (pid, host, start time) and its job. The lock is released
// by unlock or when the process ends, however it ends. In a data-parallel
// job rank 0 holds it for the job (env names the job).
func lockRunDir(dir string, env dist.Env) (*runLock, error) {
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
	if env.Multi() {
		h.Job = fmt.Sprintf("%s job %s of %d ranks", env.Launcher, env.Job, env.World)
	}
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
