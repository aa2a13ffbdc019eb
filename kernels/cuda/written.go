package cuda

import "fmt"

// WrittenHook is a program that reports, during each Run, when named
// outputs are final: the step of the output's last writer has been
// launched on the default stream (the device may still be running it).
type WrittenHook interface {
	// WhenWritten makes every later Run call f with the outputs of names
	// whose last writer it has just launched, in launch order; names nil
	// removes the hook.
	WhenWritten(names []string, f func(outputs []string) error) error
}

// written is a program's WhenWritten hook: the outputs each step index
// finishes (-1: before the first step, for outputs no step writes).
type written struct {
	after map[int][]string
	f     func([]string) error
}

// WhenWritten implements WrittenHook: an output's last writer is the step
// of the node that produces it (an output's buffer is live to the end of
// the Run, so no later step writes it).
func (p *program) WhenWritten(names []string, f func(outputs []string) error) error {
	if names == nil {
		p.written = nil
		return nil
	}
	index := make(map[int]int, len(p.steps))
	for i, s := range p.steps {
		index[s.node.ID] = i
	}
	w := &written{after: map[int][]string{}, f: f}
	for _, name := range names {
		d := p.outV[name]
		if d == nil {
			return fmt.Errorf("cuda: %s does not output %s", p.g.Name, name)
		}
		at := -1
		if n := p.producer[d.v.ID]; n != nil {
			i, ok := index[n.ID]
			if !ok {
				return fmt.Errorf("cuda: %s: the producer of %s has no step", p.g.Name, name)
			}
			at = i
		}
		w.after[at] = append(w.after[at], name)
	}
	p.written = w
	return nil
}

// report calls the hook with the outputs step i finishes (i = -1: those no
// step writes).
func (w *written) report(i int) error {
	if w == nil {
		return nil
	}
	if outs := w.after[i]; len(outs) > 0 {
		return w.f(outs)
	}
	return nil
}
