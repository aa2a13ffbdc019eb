// Package launch starts the ranks of a data-parallel job on this machine,
// as torchrun does (`rpac train --nproc-per-node N`): N processes of the
// same command under torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), their output passed through
// (the other ranks' lines prefixed with their rank), and the job ended,
// naming the rank, as soon as one rank fails.
package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Grace is how long the other ranks have to end after SIGTERM once one
// rank failed, before SIGKILL.
const Grace = 10 * time.Second

// Job is a set of local ranks of one command.
type Job struct {
	Exe    string   // the program (os.Executable)
	Args   []string // its arguments, without the launcher's own flag
	Ranks  int
	Stdout io.Writer
	Stderr io.Writer
}

// exit is how one rank ended.
type exit struct {
	rank, pid int
	err       error
	at        time.Time
}

// Run starts the ranks and waits for them all. When a rank fails, the
// others are stopped (SIGTERM, SIGKILL after Grace) and the error names
// the rank that failed first and how, then the others.
func (j Job) Run(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	env := torchrunEnv(os.Environ())
	cmds := make([]*exec.Cmd, j.Ranks)
	done := make(chan exit, j.Ranks)
	for r := range cmds {
		cmd := exec.Command(j.Exe, j.Args...)
		cmd.Env = append(env, "RANK="+strconv.Itoa(r), "LOCAL_RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(j.Ranks),
			"LOCAL_WORLD_SIZE="+strconv.Itoa(j.Ranks), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
		cmd.Stdout, cmd.Stderr = j.output(r, j.Stdout), j.output(r, j.Stderr)
		if err := cmd.Start(); err != nil {
			stopAll(cmds[:r])
			return fmt.Errorf("starting rank %d: %w", r, err)
		}
		cmds[r] = cmd
		go func() {
			err := cmd.Wait()
			done <- exit{rank: r, pid: cmd.Process.Pid, err: err, at: time.Now()}
		}()
	}
	return failure(j.wait(ctx, cmds, done))
}

// wait collects every rank's exit, stopping the others at the first
// failure (or when ctx ends).
func (j Job) wait(ctx context.Context, cmds []*exec.Cmd, done chan exit) []exit {
	var exits []exit
	stopped := false
	for len(exits) < len(cmds) {
		select {
		case e := <-done:
			exits = append(exits, e)
			if e.err != nil && !stopped {
				stopped = true
				go stopAll(cmds)
			}
		case <-ctx.Done():
			if !stopped {
				stopped = true
				go stopAll(cmds)
			}
			ctx = context.Background()
		}
	}
	return exits
}

// failure is the job's error: nil when every rank succeeded, else the
// failed ranks in the order they ended.
func failure(exits []exit) error {
	sort.SliceStable(exits, func(a, b int) bool { return exits[a].at.Before(exits[b].at) })
	var parts []string
	for _, e := range exits {
		if e.err != nil {
			parts = append(parts, fmt.Sprintf("rank %d (pid %d) %s", e.rank, e.pid, describe(e.err)))
		}
	}
	if len(parts) == 0 {
		return nil
	}
	msg := parts[0] + "; the job was ended"
	if len(parts) > 1 {
		msg += " (then " + strings.Join(parts[1:], ", ") + ")"
	}
	return errors.New(msg)
}

// describe says how a rank ended: "was killed by signal killed" or
// "exited with status 1".
func describe(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "was killed by signal " + ws.Signal().String()
		}
		return "exited with status " + strconv.Itoa(ee.ExitCode())
	}
	return "failed: " + err.Error()
}

// stopAll ends the ranks still running: SIGTERM, then SIGKILL after Grace.
func stopAll(cmds []*exec.Cmd) {
	for _, c := range cmds {
		if c != nil && c.ProcessState == nil {
			_ = c.Process.Signal(syscall.SIGTERM)
		}
	}
	time.Sleep(Grace)
	for _, c := range cmds {
		if c != nil && c.ProcessState == nil {
			_ = c.Process.Kill()
		}
	}
}

// torchrunEnv is env without the variables the launcher sets per rank.
func torchrunEnv(env []string) []string {
	drop := map[string]bool{"RANK": true, "LOCAL_RANK": true, "WORLD_SIZE": true, "LOCAL_WORLD_SIZE": true, "MASTER_ADDR": true, "MASTER_PORT": true}
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if !drop[k] {
			out = append(out, kv)
		}
	}
	return out
}

// freePort is a TCP port free on the loopback now (the rendezvous port).
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// output is where rank r writes w: w itself for rank 0, else a writer
// that prefixes each of its lines with "[rank r] ".
func (j Job) output(r int, w io.Writer) io.Writer {
	if r == 0 || w == nil {
		return w
	}
	return &prefixWriter{w: w, prefix: fmt.Sprintf("[rank %d] ", r)}
}

// prefixWriter writes whole lines, each after prefix (exec copies a
// rank's output to it from one goroutine).
type prefixWriter struct {
	w       io.Writer
	prefix  string
	partial []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			return len(b), nil
		}
		if _, err := fmt.Fprintf(p.w, "%s%s", p.prefix, p.partial[:i+1]); err != nil {
			return 0, err
		}
		p.partial = p.partial[i+1:]
	}
}

// WithoutFlag returns args without --name (with its value, "--name v" or
// "--name=v", one or two dashes).
func WithoutFlag(args []string, name string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--"+name || a == "-"+name:
			i++ // its value
		case strings.HasPrefix(a, "--"+name+"=") || strings.HasPrefix(a, "-"+name+"="):
		default:
			out = append(out, a)
		}
	}
	return out
}
