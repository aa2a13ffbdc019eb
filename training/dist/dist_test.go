package dist

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func vars(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestFromEnv(t *testing.T) {
	e, err := FromEnv(vars(map[string]string{"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}))
	if err != nil || e != (Env{Launcher: Torchrun, Rank: 3, World: 4, LocalRank: 1, Addr: "10.0.0.1:29500", Job: "10.0.0.1:29500"}) {
		t.Errorf("torchrun: %+v, %v", e, err)
	}
	// under torchrun's agent store, which holds MASTER_PORT, the next port
	e, err = FromEnv(vars(map[string]string{"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "29500", "TORCHELASTIC_USE_AGENT_STORE": "True"}))
	if err != nil || e.Addr != "h:29501" {
		t.Errorf("torchrun with its agent store: %+v, %v", e, err)
	}
	e, err = FromEnv(vars(map[string]string{"SLURM_NTASKS": "16", "SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "4242",
		"SLURM_JOB_NODELIST": "gpu[07-08,11],login"}))
	if err != nil || e != (Env{Launcher: Slurm, Rank: 9, World: 16, LocalRank: 1, Addr: "gpu07:29742", Job: "4242"}) {
		t.Errorf("slurm: %+v, %v", e, err)
	}
	if e, err := FromEnv(vars(nil)); err != nil || e.Multi() || e.World != 1 {
		t.Errorf("no launcher: %+v, %v", e, err)
	}
	for _, bad := range []map[string]string{
		{"WORLD_SIZE": "2", "RANK": "1"},                                          // no MASTER_ADDR
		{"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},  // rank too large
		{"WORLD_SIZE": "two", "RANK": "0"},                                        // not a number
		{"SLURM_NTASKS": "2", "SLURM_PROCID": "0"},                                // no node list
		{"WORLD_SIZE": "2", "RANK": "-1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, // negative
	} {
		if _, err := FromEnv(vars(bad)); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

func TestFirstHost(t *testing.T) {
	for in, want := range map[string]string{"": "", "n1": "n1", "n1,n2": "n1", "gpu[03-05,07],cpu1": "gpu03", "a[9],b": "a9", "x[1,2]": "x1"} {
		if got := FirstHost(in); got != want {
			t.Errorf("FirstHost(%q) = %q, want %q", in, got, want)
		}
	}
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func meet(t *testing.T, world int, ranks []int, timeout time.Duration) ([][IDBytes]byte, []error) {
	addr := freeAddr(t)
	ids, errs := make([][IDBytes]byte, world), make([]error, world)
	var wg sync.WaitGroup
	for _, r := range ranks {
		wg.Go(func() {
			e := Env{Launcher: Torchrun, Rank: r, World: world, Addr: addr}
			ids[r], errs[r] = Rendezvous(context.Background(), e, func() ([IDBytes]byte, error) {
				var id [IDBytes]byte
				copy(id[:], "the id")
				return id, nil
			}, timeout)
		})
	}
	wg.Wait()
	return ids, errs
}

func TestRendezvous(t *testing.T) {
	ids, errs := meet(t, 3, []int{2, 1, 0}, 10*time.Second)
	for r := range 3 {
		if errs[r] != nil || !strings.HasPrefix(string(ids[r][:]), "the id") {
			t.Errorf("rank %d: %q, %v", r, ids[r][:6], errs[r])
		}
	}
}

func TestRendezvousMissingRank(t *testing.T) {
	_, errs := meet(t, 3, []int{0, 1}, 500*time.Millisecond)
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "missing ranks [2]") {
		t.Errorf("rank 0: %v, want the missing rank named", errs[0])
	}
	if errs[1] == nil {
		t.Error("rank 1 got an id without rank 2")
	}
}

func TestRendezvousWorldMismatch(t *testing.T) {
	addr := freeAddr(t)
	var wg sync.WaitGroup
	var err0 error
	wg.Go(func() {
		_, err0 = Rendezvous(context.Background(), Env{Rank: 0, World: 2, Addr: addr}, func() ([IDBytes]byte, error) { return [IDBytes]byte{}, nil }, 5*time.Second)
	})
	_, err1 := Rendezvous(context.Background(), Env{Rank: 1, World: 3, Addr: addr}, nil, 5*time.Second)
	wg.Wait()
	if err0 == nil || !strings.Contains(err0.Error(), "says the job has 3 ranks, rank 0 says 2") || err1 == nil {
		t.Errorf("rank 0: %v; rank 1: %v", err0, err1)
	}
}
