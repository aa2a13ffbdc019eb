//go:build cgo

package runtime

import (
	"context"
	"errors"
	"fmt"
	goruntime "runtime"

	ort "github.com/yalue/onnxruntime_go"
)

// ortKVSession runs a KV-cache graph: its inputs and outputs change shape
// from call to call, so the tensors are made per call over the caller's
// buffers (onnxruntime_go does not copy them).
type ortKVSession struct {
	sess *ort.DynamicAdvancedSession
	path string
}

func (be *ortBackend) newKVSession(path string, inputs, outputs []string) (kvSession, error) {
	so, err := be.sessionOptions()
	if err != nil {
		return nil, err
	}
	defer so.Destroy()
	sess, err := ort.NewDynamicAdvancedSession(path, inputs, outputs, so)
	if err != nil {
		return nil, fmt.Errorf("runtime: onnxruntime cannot load %s: %v (export it again)", path, err)
	}
	return &ortKVSession{sess: sess, path: path}, nil
}

func newValue(a tensorArg) (ort.Value, error) {
	if a.i64 != nil {
		return ort.NewTensor(ort.NewShape(a.shape...), a.i64)
	}
	return ort.NewTensor(ort.NewShape(a.shape...), a.f32)
}

func (s *ortKVSession) run(ctx context.Context, in, out []tensorArg) (err error) {
	var vals []ort.Value
	defer func() {
		for _, v := range vals {
			err = errors.Join(err, v.Destroy())
		}
	}()
	mk := func(args []tensorArg) ([]ort.Value, error) {
		vs := make([]ort.Value, len(args))
		for i, a := range args {
			v, err := newValue(a)
			if err != nil {
				return nil, fmt.Errorf("runtime: tensor %v: %w", a.shape, err)
			}
			vs[i] = v
			vals = append(vals, v)
		}
		return vs, nil
	}
	ins, err := mk(in)
	if err != nil {
		return err
	}
	outs, err := mk(out)
	if err != nil {
		return err
	}
	err = runCancellable(ctx, s.sess, ins, outs)
	goruntime.KeepAlive(in)
	goruntime.KeepAlive(out)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("runtime: onnxruntime run of %s: %w", s.path, err)
	}
	return nil
}

func (s *ortKVSession) close() error { return s.sess.Destroy() }
