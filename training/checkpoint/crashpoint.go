package checkpoint

import (
	"os"
	"syscall"
)

// CrashEnv names a save stage ("synced temp", "moved old", "moved new",
// "wrote model.safetensors", ...) at which the process kills itself with
// SIGKILL: the crash test of the CLI uses it to stop a real training run
// inside a save. Unset, it does nothing.
const CrashEnv = "RPAC_CRASH_IN_SAVE"

func init() {
	stage := os.Getenv(CrashEnv)
	if stage == "" {
		return
	}
	crashHook = func(s string) bool {
		if s == stage {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		return false
	}
}
