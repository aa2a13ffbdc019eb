package cuda

import "fmt"

// Report is what this machine offers the CUDA backend.
type Report struct {
	Devices  []DeviceInfo `json:"devices"`
	Driver   string       `json:"driver"` // "" when it loaded
	NVRTC    string       `json:"nvrtc"`  // version, or why not
	CublasLt string       `json:"cublaslt"`
	// Kernels lists, per source, whether it compiled for the first
	// device's architecture (or compute_90 without a device).
	Kernels map[string]string `json:"kernels"`
}

// Probe loads what it can and compiles every kernel source; it never
// fails, it reports.
func Probe() Report {
	rep := Report{Kernels: map[string]string{}}
	arch := "compute_90"
	if d, err := LoadDriver(); err != nil {
		rep.Driver = err.Error()
	} else if devs, err := d.Devices(); err != nil {
		rep.Driver = err.Error()
	} else {
		rep.Devices = devs
		if len(devs) > 0 {
			arch = devs[0].Arch
		}
	}
	n, err := LoadNVRTC()
	if err != nil {
		rep.NVRTC = err.Error()
	} else {
		major, minor := n.Version()
		rep.NVRTC = fmt.Sprintf("%d.%d", major, minor)
		for _, name := range SourceNames() {
			if _, hit, err := n.CompileCached(name, arch); err != nil {
				rep.Kernels[name] = err.Error()
			} else if hit {
				rep.Kernels[name] = "ok (" + arch + ", cached)"
			} else {
				rep.Kernels[name] = "ok (" + arch + ")"
			}
		}
	}
	if len(rep.Devices) > 0 {
		if _, err := LoadBLAS(); err != nil {
			rep.CublasLt = err.Error()
		} else {
			rep.CublasLt = "ok"
		}
	} else {
		rep.CublasLt = "not loaded (no device)"
	}
	return rep
}

// Available reports whether a GPU can be used (nil) or why not.
func Available() error {
	d, err := LoadDriver()
	if err != nil {
		return err
	}
	devs, err := d.Devices()
	if err != nil {
		return err
	}
	if len(devs) == 0 {
		return fmt.Errorf("the CUDA driver sees no GPU")
	}
	return nil
}
