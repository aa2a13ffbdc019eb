package logging

import (
	"io"
	"os"
)

// IsTerminal reports whether w is an interactive terminal: an *os.File that
// is a character device other than the null device, with TERM not "dumb".
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || f == nil {
		return false
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	if null, err := os.Stat(os.DevNull); err == nil && os.SameFile(fi, null) {
		return false
	}
	return os.Getenv("TERM") != "dumb"
}
