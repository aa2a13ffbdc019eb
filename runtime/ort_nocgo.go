//go:build !cgo

package runtime

func openBackend(opts Options) (backend, error) { return nil, ErrNoCgo }

const cgoEnabled = false
