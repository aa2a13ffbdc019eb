package launch

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

const envBehaviour = "RPAC_TEST_LAUNCH"

// TestHelperRank is a rank of the launcher's tests (the test binary run
// again under the launcher's variables).
func TestHelperRank(t *testing.T) {
	switch os.Getenv(envBehaviour) {
	case "":
		t.Skip("run by the launcher's tests as a rank")
	case "greet":
		fmt.Printf("rank %s of %s at %s:%s\n", os.Getenv("RANK"), os.Getenv("WORLD_SIZE"), os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT"))
	case "rank1dies":
		if os.Getenv("RANK") == "1" {
			os.Exit(3)
		}
		time.Sleep(time.Minute) // stopped by the launcher
	}
}

func job(behaviour string, out *strings.Builder) Job {
	os.Setenv(envBehaviour, behaviour)
	return Job{Exe: os.Args[0], Args: []string{"-test.run=^TestHelperRank$"}, Ranks: 2, Stdout: out, Stderr: out}
}

func TestRun(t *testing.T) {
	defer os.Unsetenv(envBehaviour)
	var out strings.Builder
	if err := job("greet", &out).Run(context.Background()); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !regexp.MustCompile(`(?m)^rank 0 of 2 at 127\.0\.0\.1:\d+$`).MatchString(out.String()) ||
		!regexp.MustCompile(`(?m)^\[rank 1\] rank 1 of 2 at 127\.0\.0\.1:\d+$`).MatchString(out.String()) {
		t.Errorf("the ranks' output:\n%s", out.String())
	}
}

func TestRunRankDies(t *testing.T) {
	defer os.Unsetenv(envBehaviour)
	var out strings.Builder
	t0 := time.Now()
	err := job("rank1dies", &out).Run(context.Background())
	if err == nil || !regexp.MustCompile(`^rank 1 \(pid \d+\) exited with status 3; the job was ended \(then rank 0 \(pid \d+\) was killed by signal terminated\)$`).MatchString(err.Error()) {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if d := time.Since(t0); d > 30*time.Second {
		t.Errorf("the job ended after %v", d)
	}
}

func TestWithoutFlag(t *testing.T) {
	for _, c := range []struct{ in, want []string }{
		{[]string{"train", "--nproc-per-node", "2", "--out", "r"}, []string{"train", "--out", "r"}},
		{[]string{"train", "--nproc-per-node=2", "--out", "r"}, []string{"train", "--out", "r"}},
		{[]string{"train", "-nproc-per-node", "2"}, []string{"train"}},
	} {
		if got := WithoutFlag(c.in, "nproc-per-node"); !slices.Equal(got, c.want) {
			t.Errorf("WithoutFlag(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
