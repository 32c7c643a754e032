package runtime

import "testing"

// overlapBackend is a backend that answers whether its copies overlap its
// compute.
type overlapBackend struct {
	Backend
	overlap bool
}

func (b overlapBackend) CopiesOverlapCompute() bool { return b.overlap }

// The CPU backend copies on the cores that compute; a backend that says
// otherwise is believed either way.
func TestCopiesOverlap(t *testing.T) {
	cpu := DefaultBackend()
	if cpu.Name() != "cpu" {
		t.Skipf("the default backend is %s", cpu.Name())
	}
	if copiesOverlap(cpu) {
		t.Error("the CPU backend's copies overlap its compute, want not")
	}
	for _, o := range []bool{false, true} {
		if got := copiesOverlap(overlapBackend{cpu, o}); got != o {
			t.Errorf("a backend answering %v: copiesOverlap = %v", o, got)
		}
	}
}
