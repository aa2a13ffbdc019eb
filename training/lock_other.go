//go:build !unix

package training

import (
	"errors"
	"os"
)

var errWouldBlock = errors.New("lock held")

// flock is a no-op where flock(2) does not exist: runs are not protected
// against a second process on the same directory there.
func flock(*os.File) error { return nil }

func funlock(*os.File) {}
