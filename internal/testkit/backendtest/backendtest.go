// Package backendtest runs the same op, autodiff, scan, remat and offload
// programs on every available backend and compares them with the reference
// executor (internal/eval): "cpu" always, "cuda" when a driver, NVRTC,
// cuBLASLt and a device load. The CUDA cases skip with the load error
// otherwise.
package backendtest

import (
	"fmt"
	"sync"

	"github.com/ferryml/ferry/cuda"
	rt "github.com/ferryml/ferry/runtime"
)

// Named is a backend, or the reason it is unavailable.
type Named struct {
	Name    string
	Backend rt.Backend
	// Err says why the backend did not load (Backend is nil then).
	Err error
}

var (
	once sync.Once
	all  []Named
)

// Backends returns "cpu" and "cuda" (with its load error when it did not
// load). The CUDA backend is created once per process.
func Backends() []Named {
	once.Do(func() {
		// Take the CPU backend before CUDA registers (and becomes the default).
		if d := rt.DefaultBackend(); d.Name() == "cpu" {
			all = append(all, Named{Name: "cpu", Backend: d})
		} else {
			all = append(all, Named{Name: "cpu", Err: fmt.Errorf("the default backend is %s (FERRY_BACKEND); the CPU backend is not reachable", d.Name())})
		}
		b, err := cuda.Register()
		if err != nil {
			all = append(all, Named{Name: "cuda", Err: err})
		} else {
			all = append(all, Named{Name: "cuda", Backend: b})
		}
	})
	return all
}
