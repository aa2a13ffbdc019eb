package driver

import "fmt"

// Report is what this machine offers the CUDA backend.
type Report struct {
	Devices []DeviceInfo `json:"devices"`
	Driver  string       `json:"driver"` // "" when it loaded
	// DriverVersion is the CUDA version the driver supports
	// (cuDriverGetVersion, e.g. "12.8"); "" when it did not load.
	DriverVersion string `json:"driver_version"`
	NVRTC         string `json:"nvrtc"` // version (nvrtcVersion, e.g. "13.0"), or why not
	// NVRTCNewer is set when NVRTC is newer than the driver: its PTX would
	// not load (CUDA_ERROR_UNSUPPORTED_PTX_VERSION), only its cubins.
	NVRTCNewer bool   `json:"nvrtc_newer_than_driver,omitempty"`
	CublasLt   string `json:"cublaslt"`
	// Simulated is set when the libraries are rpac's CUDA simulator.
	Simulated bool `json:"simulated,omitempty"`
	// Kernels lists, per source, how it compiled for the first device (a
	// cubin for sm_NN, else PTX for compute_NN and why; sm_90 without a
	// device), or the error.
	Kernels map[string]string `json:"kernels"`
	// Code is "cubin" when every source compiled to a cubin, "ptx" when
	// any fell back to PTX, "" when any failed.
	Code string `json:"code"`
}

// Probe loads what it can and compiles every kernel source of srcs; it
// never fails, it reports.
func Probe(srcs []Source) Report {
	rep := Report{Kernels: map[string]string{}}
	dev := DeviceInfo{Arch: "compute_90", SM: "sm_90"}
	driverMajor, driverMinor := -1, -1
	if d, err := LoadDriver(); err != nil {
		rep.Driver = err.Error()
	} else {
		rep.DriverVersion = d.Version()
		rep.Simulated = d.Simulated()
		fmt.Sscanf(rep.DriverVersion, "%d.%d", &driverMajor, &driverMinor)
		if devs, err := d.Devices(); err != nil {
			rep.Driver = err.Error()
		} else {
			rep.Devices = devs
			if len(devs) > 0 {
				dev = devs[0]
			}
		}
	}
	n, err := LoadNVRTC()
	if err != nil {
		rep.NVRTC = err.Error()
	} else {
		major, minor := n.Version()
		rep.NVRTC = fmt.Sprintf("%d.%d", major, minor)
		rep.NVRTCNewer = driverMajor >= 0 && !n.Simulated() && (major > driverMajor || major == driverMajor && minor > driverMinor)
		rep.Code = "cubin"
		for _, s := range srcs {
			name := s.Name
			img, hit, cubinErr, err := n.DeviceImage(name, s.Text, dev)
			li := LoadedImage{Source: name, Kind: img.Kind, Arch: img.Arch, Cached: hit}
			switch {
			case err != nil:
				rep.Kernels[name] = err.Error()
				rep.Code = ""
				continue
			case cubinErr != nil:
				li.Fallback = cubinErr.Error()
				if rep.Code == "cubin" {
					rep.Code = "ptx"
				}
			}
			rep.Kernels[name] = "ok (" + li.String() + ")"
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
