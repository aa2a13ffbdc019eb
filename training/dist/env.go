// Package dist is where a process stands in a data-parallel training job
// and how the job's ranks meet: the launch environment (torchrun's RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, or SLURM's
// SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID) and the rendezvous at
// MASTER_ADDR:MASTER_PORT, over which rank 0 hands every rank the NCCL
// unique id. The collectives themselves are NCCL's (kernels/cuda's
// Collective); nothing here carries training data.
package dist

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Launcher says which launcher's variables placed the process.
type Launcher int

// The launchers.
const (
	Single   Launcher = iota // no launcher: one rank
	Torchrun                 // RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (torchrun, rpac train --nproc-per-node)
	Slurm                    // SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (srun)
)

func (l Launcher) String() string {
	switch l {
	case Torchrun:
		return "torchrun"
	case Slurm:
		return "slurm"
	}
	return "single"
}

// Env is one process's place in the job.
type Env struct {
	Launcher               Launcher
	Rank, World, LocalRank int
	// Addr is MASTER_ADDR:MASTER_PORT, where rank 0 listens for the
	// rendezvous ("" for a single rank).
	Addr string
	// Job names the job (SLURM_JOB_ID; torchrun: the rendezvous
	// address): the run directory's lock records it.
	Job string
}

// Multi reports whether the job has more than one rank.
func (e Env) Multi() bool { return e.World > 1 }

// DefaultPort is the rendezvous port when MASTER_PORT is not set under
// SLURM: 29500 (torchrun's default) plus the job id modulo 1000, so two
// jobs sharing a node rarely collide.
const DefaultPort = 29500

// FromEnv reads the launch variables through getenv (os.Getenv): torchrun's
// when WORLD_SIZE is set, else SLURM's when SLURM_NTASKS is, else a single
// rank.
func FromEnv(getenv func(string) string) (Env, error) {
	switch {
	case getenv("WORLD_SIZE") != "":
		return torchrunEnv(getenv)
	case getenv("SLURM_NTASKS") != "" && getenv("SLURM_PROCID") != "":
		return slurmEnv(getenv)
	}
	return Env{World: 1}, nil
}

func torchrunEnv(getenv func(string) string) (Env, error) {
	e := Env{Launcher: Torchrun}
	if err := e.readPlace(getenv, "WORLD_SIZE", "RANK", "LOCAL_RANK"); err != nil {
		return e, err
	}
	if e.World > 1 {
		host, port := getenv("MASTER_ADDR"), getenv("MASTER_PORT")
		if host == "" || port == "" {
			return e, fmt.Errorf("WORLD_SIZE=%d needs MASTER_ADDR and MASTER_PORT (where rank 0 listens for the other ranks)", e.World)
		}
		if getenv("TORCHELASTIC_USE_AGENT_STORE") == "True" {
			// torchrun's agent serves its own store on MASTER_PORT: meet
			// on the next port
			p, err := strconv.Atoi(port)
			if err != nil {
				return e, fmt.Errorf("MASTER_PORT=%q: want a port number", port)
			}
			port = strconv.Itoa(p + 1)
		}
		e.Addr = net.JoinHostPort(host, port)
	}
	e.Job = e.Addr
	return e, e.check()
}

func slurmEnv(getenv func(string) string) (Env, error) {
	e := Env{Launcher: Slurm}
	if err := e.readPlace(getenv, "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"); err != nil {
		return e, err
	}
	job := getenv("SLURM_JOB_ID")
	e.Job = job
	if e.World > 1 {
		host := getenv("MASTER_ADDR")
		if host == "" {
			host = FirstHost(getenv("SLURM_JOB_NODELIST"))
		}
		if host == "" {
			return e, fmt.Errorf("SLURM_NTASKS=%d: set MASTER_ADDR or run under srun (SLURM_JOB_NODELIST names rank 0's node)", e.World)
		}
		port := getenv("MASTER_PORT")
		if port == "" {
			id, _ := strconv.Atoi(job)
			port = strconv.Itoa(DefaultPort + id%1000)
		}
		e.Addr = net.JoinHostPort(host, port)
	}
	return e, e.check()
}

// readPlace reads the number of ranks, the rank and the local rank from
// the variables of those names (1, 0 and 0 when unset).
func (e *Env) readPlace(getenv func(string) string, world, rank, local string) error {
	var err error
	if e.World, err = intVar(getenv, world, 1); err != nil {
		return err
	}
	if e.Rank, err = intVar(getenv, rank, 0); err != nil {
		return err
	}
	e.LocalRank, err = intVar(getenv, local, 0)
	return err
}

func intVar(getenv func(string) string, name string, def int) (int, error) {
	s := getenv(name)
	if s == "" {
		return def, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%s=%q: want a non-negative integer", name, s)
	}
	return v, nil
}

func (e Env) check() error {
	if e.World < 1 || e.Rank >= e.World {
		return fmt.Errorf("rank %d of %d ranks: the rank must be below the number of ranks", e.Rank, e.World)
	}
	return nil
}

// FirstHost is the first host of a SLURM host list ("gpu[03-05,07],cpu1"
// gives "gpu03"); "" for an empty list.
func FirstHost(list string) string {
	list = strings.TrimSpace(list)
	end := len(list)
	depth := 0
	for i, c := range list {
		if c == '[' {
			depth++
		} else if c == ']' {
			depth--
		} else if c == ',' && depth == 0 {
			end = i
			break
		}
	}
	first := list[:end]
	open := strings.IndexByte(first, '[')
	if open < 0 {
		return first
	}
	inner := strings.TrimSuffix(first[open+1:], "]")
	inner, _, _ = strings.Cut(inner, ",")
	inner, _, _ = strings.Cut(inner, "-")
	return first[:open] + inner
}
