package cuda

import (
	"fmt"
	"strings"
)

// LibInfo is what was found of one CUDA library: the file that loaded and
// its version, or why it did not load.
type LibInfo struct {
	// Path is the file (or soname) that loaded; "" when none did.
	Path string
	// Version is the library's version ("13.0", "13.0.2"); "" when unknown.
	Version string
	// Err says why the library did not load or its version is unknown.
	Err error
}

func (l LibInfo) String() string {
	if l.Path == "" {
		if l.Err == nil {
			return "not loaded"
		}
		return "not loaded: " + l.Err.Error()
	}
	s := l.Path
	if l.Version != "" {
		s += ", version " + l.Version
	}
	if l.Err != nil {
		s += " (" + l.Err.Error() + ")"
	}
	return s
}

// Info reports the CUDA libraries the backend uses: the driver, NVRTC and
// the optional cuBLASLt, each with its path and version or the reason it is
// missing; a Backend's Info adds the device and whether cuBLASLt computes
// the dots. The tests and scripts/gpu-test log it.
type Info struct {
	Driver, NVRTC, CublasLt LibInfo
	// Device is the device's name and architecture ("" before a backend is
	// created).
	Device string
	// Matmul says what computes dot_general: "cuBLASLt" or the generated
	// kernel and why ("" before a backend is created).
	Matmul string
}

// String is one line per library (and device), for logs.
func (i Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "CUDA driver: %v\nNVRTC: %v\ncuBLASLt: %v", i.Driver, i.NVRTC, i.CublasLt)
	if i.Device != "" {
		fmt.Fprintf(&b, "\ndevice: %s", i.Device)
	}
	if i.Matmul != "" {
		fmt.Fprintf(&b, "\ndot_general: %s", i.Matmul)
	}
	return b.String()
}

// driverVersion formats a cuDriverGetVersion value (13000 is "13.0").
func driverVersion(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// cublasLtVersion formats a cublasLtGetVersion value (major*10000 +
// minor*100 + patch: 130002 is "13.0.2").
func cublasLtVersion(v int) string { return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100) }

// Info reports the loaded libraries and their versions.
func (d *Driver) Info() Info {
	var i Info
	if d.CUDA != nil {
		i.Driver.Path = d.CUDA.Path
		if v, err := d.Version(); err != nil {
			i.Driver.Err = err
		} else {
			i.Driver.Version = driverVersion(v)
		}
	}
	if d.NVRTC != nil {
		i.NVRTC.Path = d.NVRTC.Path
		if ma, mi, err := d.NVRTC.Version(); err != nil {
			i.NVRTC.Err = err
		} else {
			i.NVRTC.Version = fmt.Sprintf("%d.%d", ma, mi)
		}
	}
	if d.Lt != nil {
		i.CublasLt.Path = d.Lt.Path
		i.CublasLt.Version = cublasLtVersion(d.Lt.Version())
	} else {
		i.CublasLt.Err = d.LtErr
	}
	return i
}

// Probe looks for the driver, NVRTC and cuBLASLt as Load does, each on its
// own (a missing driver does not stop the search for the others), and
// reports what it found. It does not call cuInit.
func Probe() Info {
	dirs := SearchDirs()
	d := &Driver{}
	var derr error
	if dd, err := LoadDriver(dirs); err != nil {
		derr = err
	} else {
		d = dd
	}
	var nerr error
	d.NVRTC, nerr = LoadNVRTC(dirs)
	d.loadCublasLt(dirs)
	i := d.Info()
	if derr != nil {
		i.Driver.Err = derr
	}
	if nerr != nil {
		i.NVRTC.Err = nerr
	}
	return i
}

// Info reports the libraries, the device and what computes dot_general.
func (b *Backend) Info() Info {
	i := b.d.Info()
	i.Device = fmt.Sprintf("%s (%s, %d multiprocessors)", b.name, b.arch, b.sms)
	switch {
	case b.lt != 0:
		i.Matmul = "cuBLASLt"
	case b.d.Lt == nil:
		i.Matmul = "generated kernel (cuBLASLt not loaded)"
	default:
		i.Matmul = fmt.Sprintf("generated kernel (cuBLASLt unavailable: %v)", b.ltErr)
	}
	return i
}
