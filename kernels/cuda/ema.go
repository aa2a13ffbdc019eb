package cuda

import "fmt"

// DeviceEMA is the exponential moving average of a DeviceAdamW's weights,
// kept on the device beside them: Update moves every shadow toward its
// weight (ema_f32, rounding as training/control's EMA.Update); the shadows
// come to the host only through Download.
type DeviceEMA struct {
	o *DeviceAdamW
	s map[string]Buffer
}

// NewDeviceEMA uploads the host shadows (one per parameter of o, by name)
// to the device.
func NewDeviceEMA(o *DeviceAdamW, shadow map[string][]float32) (*DeviceEMA, error) {
	e := &DeviceEMA{o: o, s: map[string]Buffer{}}
	for _, name := range o.names {
		if len(shadow[name]) != o.n[name] {
			return nil, fmt.Errorf("device EMA: shadow of %q has %d values, the parameter %d", name, len(shadow[name]), o.n[name])
		}
	}
	unbind, err := o.be.bind()
	if err != nil {
		return nil, err
	}
	defer unbind()
	for _, name := range o.names {
		b, err := o.be.dev.alloc(uint64(4 * max(1, o.n[name])))
		if err != nil {
			e.freeLocked()
			return nil, err
		}
		e.s[name] = b
	}
	if err := e.uploadLocked(shadow); err != nil {
		e.freeLocked()
		return nil, err
	}
	return e, nil
}

// Upload replaces the device shadows with the host's.
func (e *DeviceEMA) Upload(shadow map[string][]float32) error {
	unbind, err := e.o.be.bind()
	if err != nil {
		return err
	}
	defer unbind()
	return e.uploadLocked(shadow)
}

func (e *DeviceEMA) uploadLocked(shadow map[string][]float32) error {
	for _, name := range e.o.names {
		if err := e.o.be.dev.upload(e.s[name], f32Ptr(shadow[name]), uint64(4*e.o.n[name])); err != nil {
			return err
		}
	}
	return nil
}

// Update sets every shadow to d·shadow + (1 − d)·weight.
func (e *DeviceEMA) Update(d float32) error {
	unbind, err := e.o.be.bind()
	if err != nil {
		return err
	}
	defer unbind()
	for _, name := range e.o.names {
		n := e.o.n[name]
		if err := e.o.be.dev.launch("ema_f32", grid1(n), block1, 0, e.s[name].Ptr, e.o.w[name].Ptr, d, int64(n)); err != nil {
			return err
		}
	}
	return nil
}

// Download copies the device shadows into the host's (one per parameter,
// by name, of the parameters' sizes).
func (e *DeviceEMA) Download(shadow map[string][]float32) error {
	unbind, err := e.o.be.bind()
	if err != nil {
		return err
	}
	defer unbind()
	for _, name := range e.o.names {
		dst := shadow[name]
		if len(dst) != e.o.n[name] {
			return fmt.Errorf("device EMA: host shadow of %q has %d values, want %d", name, len(dst), e.o.n[name])
		}
		if err := e.o.be.dev.download(f32Ptr(dst), e.s[name], uint64(4*len(dst))); err != nil {
			return err
		}
	}
	return nil
}

// Close frees the shadows.
func (e *DeviceEMA) Close() {
	unbind, err := e.o.be.bind()
	if err != nil {
		return
	}
	defer unbind()
	e.freeLocked()
}

func (e *DeviceEMA) freeLocked() {
	for name, b := range e.s {
		e.o.be.dev.free(b)
		delete(e.s, name)
	}
}
