package training

import (
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/training/control"
)

// weightSets are the model's parameters (the "raw" weights the optimizer
// updates) and the averaged sets kept beside them in the store: EMA
// ("ema.<p>") and SWA-select ("swa.<p>").
type weightSets struct {
	store  *kernels.Store
	names  []string
	params map[string][]float32 // the optimizer's view
	raw    [][]float32
	ema    [][]float32 // nil without EMA
	swa    [][]float32 // nil until SWA-select has a member
	backup [][]float32
	// afterSwap, when set, runs after with swaps a set in and after it
	// swaps the raw weights back (a device copy of the weights follows).
	afterSwap func() error
}

func newWeightSets(store *kernels.Store, names []string, cs *ControlState) (*weightSets, error) {
	w := &weightSets{store: store, names: names, params: map[string][]float32{}}
	for _, n := range names {
		d := store.Get(n).F32
		w.params[n] = d
		w.raw = append(w.raw, d)
	}
	var err error
	if cs.EMA != nil {
		fresh := store.Get(control.EMAPrefix+names[0]) == nil
		if w.ema, err = w.shadow(control.EMAPrefix); err != nil {
			return nil, err
		}
		if fresh {
			for i := range w.ema {
				copy(w.ema[i], w.raw[i])
			}
		}
	}
	if cs.SWA != nil && cs.SWA.Count() > 0 {
		if w.swa, err = w.shadow(control.SWAPrefix); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// shadow returns (creating zeros where absent) the averaged set prefix.
func (w *weightSets) shadow(prefix string) ([][]float32, error) {
	out := make([][]float32, len(w.names))
	for i, n := range w.names {
		t, err := w.store.Ensure(prefix+n, w.store.Get(n).Shape)
		if err != nil {
			return nil, err
		}
		out[i] = t.F32
	}
	return out, nil
}

func (w *weightSets) updateEMA(cs *ControlState) {
	if w.ema != nil {
		cs.EMA.Update(w.ema, w.raw)
	}
}

// joinSWA adds the raw weights to the SWA average as its member number n
// (SWASelect's count after the join).
func (w *weightSets) joinSWA(n int) error {
	if w.swa == nil {
		var err error
		if w.swa, err = w.shadow(control.SWAPrefix); err != nil {
			return err
		}
	}
	control.Accumulate(w.swa, w.raw, n)
	return nil
}

// byName indexes a set (raw, ema or swa) by parameter name.
func (w *weightSets) byName(set [][]float32) map[string][]float32 {
	m := make(map[string][]float32, len(w.names))
	for i, n := range w.names {
		m[n] = set[i]
	}
	return m
}

// with runs f with the parameters replaced by set (nil: the raw weights).
func (w *weightSets) with(set [][]float32, f func() error) error {
	if set == nil {
		return f()
	}
	for i := range w.raw {
		if w.backup == nil {
			w.backup = make([][]float32, len(w.raw))
		}
		if w.backup[i] == nil {
			w.backup[i] = make([]float32, len(w.raw[i]))
		}
		copy(w.backup[i], w.raw[i])
		copy(w.raw[i], set[i])
	}
	err := w.swapped()
	if err == nil {
		err = f()
	}
	for i := range w.raw {
		copy(w.raw[i], w.backup[i])
	}
	if serr := w.swapped(); err == nil {
		err = serr
	}
	return err
}

func (w *weightSets) swapped() error {
	if w.afterSwap == nil {
		return nil
	}
	return w.afterSwap()
}
