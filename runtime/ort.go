//go:build cgo

package runtime

import (
	"context"
	"errors"
	"fmt"
	goruntime "runtime"
	"strings"
	"sync"

	ort "github.com/yalue/onnxruntime_go"
)

// onnxruntime_go keeps one process-wide environment; env counts the open
// backends that use it, so the last Close releases it. An environment that
// something else in the process initialized is used but never destroyed.
var env struct {
	sync.Mutex
	refs  int
	lib   string
	owned bool
}

type ortBackend struct {
	opts Options
	lib  string
	once sync.Once
}

func openBackend(opts Options) (backend, error) {
	lib, err := LibraryPath(opts.Library)
	if err != nil {
		return nil, err
	}
	env.Lock()
	defer env.Unlock()
	if env.refs == 0 {
		if ort.IsInitialized() {
			env.owned = false
		} else {
			ort.SetSharedLibraryPath(lib)
			if err := ort.InitializeEnvironment(ort.WithLogLevelError()); err != nil {
				return nil, fmt.Errorf("runtime: loading onnxruntime from %s: %v (run scripts/fetch-onnxruntime.sh or set %s to a working libonnxruntime.so %s)", lib, err, LibraryEnv, ORTVersion)
			}
			env.owned = true
		}
		env.lib = lib
		recordVersion(ort.GetVersion())
	} else if env.lib != lib {
		return nil, fmt.Errorf("runtime: onnxruntime is already loaded from %s in this process; it cannot also load %s (close every Model first)", env.lib, lib)
	}
	env.refs++
	return &ortBackend{opts: opts, lib: lib}, nil
}

func (be *ortBackend) close() error {
	var err error
	be.once.Do(func() {
		env.Lock()
		defer env.Unlock()
		env.refs--
		if env.refs == 0 && env.owned {
			if e := ort.DestroyEnvironment(); e != nil {
				err = fmt.Errorf("runtime: releasing onnxruntime: %w", e)
			}
			env.owned = false
			env.lib = ""
		}
	})
	return err
}

func (be *ortBackend) sessionOptions() (*ort.SessionOptions, error) {
	so, err := ort.NewSessionOptions()
	if err != nil {
		return nil, fmt.Errorf("runtime: onnxruntime session options: %w", err)
	}
	if be.opts.Threads > 0 {
		if err := so.SetIntraOpNumThreads(be.opts.Threads); err != nil {
			so.Destroy()
			return nil, fmt.Errorf("runtime: setting %d threads: %w", be.opts.Threads, err)
		}
	}
	if strings.EqualFold(be.opts.Provider, "cuda") {
		cuda, err := ort.NewCUDAProviderOptions()
		if err == nil {
			err = cuda.Update(map[string]string{"device_id": fmt.Sprint(be.opts.DeviceID)})
			if err == nil {
				err = so.AppendExecutionProviderCUDA(cuda)
			}
			cuda.Destroy()
		}
		if err != nil {
			err = appendCUDAV1(be.lib, so, be.opts.DeviceID, err)
		}
		if err != nil {
			so.Destroy()
			return nil, cudaProviderError(be.lib, err)
		}
	}
	return so, nil
}

func (be *ortBackend) newRunner(path string, batch, length, vocab int) (runner, error) {
	so, err := be.sessionOptions()
	if err != nil {
		return nil, err
	}
	defer so.Destroy()
	sess, err := ort.NewDynamicAdvancedSession(path, []string{"input_ids"}, []string{"logits"}, so)
	if err != nil {
		return nil, fmt.Errorf("runtime: onnxruntime cannot load %s: %v (%s)", path, err, loadHint(err))
	}
	par := be.opts.Parallel
	if par <= 0 {
		par = 1
	}
	r := &ortRunner{sess: sess, B: batch, L: length, V: vocab, slots: make(chan *ioBuf, par)}
	for i := 0; i < par; i++ {
		r.slots <- nil // buffers are created on first use
	}
	return r, nil
}

// ortRunner runs one session. Each slot holds the input and output tensors
// of one run in flight; the tensors alias Go slices (onnxruntime_go does not
// copy), which the slot keeps alive.
type ortRunner struct {
	sess    *ort.DynamicAdvancedSession
	B, L, V int
	slots   chan *ioBuf
}

type ioBuf struct {
	ids    []int64
	logits []float32
	in     *ort.Tensor[int64]
	out    *ort.Tensor[float32]
}

func (r *ortRunner) newBuf() (*ioBuf, error) {
	b := &ioBuf{
		ids:    make([]int64, r.B*r.L),
		logits: make([]float32, r.B*r.L*r.V),
	}
	var err error
	if b.in, err = ort.NewTensor(ort.NewShape(int64(r.B), int64(r.L)), b.ids); err != nil {
		return nil, fmt.Errorf("runtime: input tensor: %w", err)
	}
	if b.out, err = ort.NewTensor(ort.NewShape(int64(r.B), int64(r.L), int64(r.V)), b.logits); err != nil {
		b.in.Destroy()
		return nil, fmt.Errorf("runtime: output tensor: %w", err)
	}
	return b, nil
}

func (b *ioBuf) destroy() error {
	return errors.Join(b.in.Destroy(), b.out.Destroy())
}

func (r *ortRunner) run(ctx context.Context, fill func([]int64), read func([]float32)) error {
	var buf *ioBuf
	select {
	case buf = <-r.slots:
	case <-ctx.Done():
		return ctx.Err()
	}
	if buf == nil {
		var err error
		if buf, err = r.newBuf(); err != nil {
			r.slots <- nil
			return err
		}
	}
	defer func() { r.slots <- buf }()
	if err := ctx.Err(); err != nil {
		return err
	}
	fill(buf.ids)
	err := runCancellable(ctx, r.sess, []ort.Value{buf.in}, []ort.Value{buf.out})
	goruntime.KeepAlive(buf)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("runtime: onnxruntime run (length %d): %w", r.L, err)
	}
	read(buf.logits)
	return nil
}

// runCancellable runs sess and terminates the run when ctx ends.
func runCancellable(ctx context.Context, sess *ort.DynamicAdvancedSession, in, out []ort.Value) error {
	if ctx.Done() == nil {
		return sess.RunWithOptions(in, out, nil)
	}
	ropts, err := ort.NewRunOptions()
	if err != nil {
		return fmt.Errorf("runtime: run options: %w", err)
	}
	defer ropts.Destroy()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-ctx.Done():
			ropts.Terminate()
		case <-stop:
		}
	}()
	err = sess.RunWithOptions(in, out, ropts)
	close(stop)
	<-stopped
	return err
}

func (r *ortRunner) close() error {
	var errs []error
	for i := 0; i < cap(r.slots); i++ {
		if b := <-r.slots; b != nil {
			errs = append(errs, b.destroy())
		}
	}
	errs = append(errs, r.sess.Destroy())
	return errors.Join(errs...)
}

const cgoEnabled = true
