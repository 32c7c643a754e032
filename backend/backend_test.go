package backend

import (
	"math"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"

	"github.com/ferryml/ferry/ir"
)

type fakeBackend struct{ name string }

func (f *fakeBackend) Name() string                               { return f.name }
func (f *fakeBackend) Devices() []Device                          { return []Device{{Platform: f.name, Kind: "fake"}} }
func (f *fakeBackend) FromLiteral(*ir.Literal) (ir.Buffer, error) { return nil, nil }
func (f *fakeBackend) Compile(*ir.Func, CompileOptions) (Executable, error) {
	return nil, nil
}

// An accelerator backend becomes the default over "cpu"; unregistering it
// gives the default back; FERRY_BACKEND=cpu keeps "cpu" the default.
func TestRegistry(t *testing.T) {
	t.Setenv(EnvBackend, "")
	saved, savedDefault := backends, defaultBE
	backends, defaultBE = map[string]Backend{}, nil
	t.Cleanup(func() { backends, defaultBE = saved, savedDefault })
	cpu, gpu := &fakeBackend{"cpu"}, &fakeBackend{"gpu"}
	if Default() != nil {
		t.Fatal("default with nothing registered")
	}
	Register(cpu)
	Register(gpu)
	if Default() != gpu || Lookup("cpu") != cpu || len(All()) != 2 || All()[0] != cpu {
		t.Fatalf("default %v, all %v", Default(), All())
	}
	Unregister(&fakeBackend{"gpu"}) // not the registered one: no effect
	if Default() != gpu {
		t.Fatal("unregistering another backend of the same name removed gpu")
	}
	Unregister(gpu)
	if Default() != cpu || Lookup("gpu") != nil {
		t.Fatalf("after Unregister: default %v", Default())
	}
	t.Setenv(EnvBackend, "cpu")
	Register(gpu)
	if Default() != cpu {
		t.Fatal("FERRY_BACKEND=cpu but gpu became the default")
	}
	if got := (Device{Platform: "cpu", ID: 0, Kind: "cpu"}).String(); got != "cpu:0(cpu)" {
		t.Fatalf("Device.String = %q", got)
	}
}

// Fragmentation is the part of the free memory outside its largest block:
// 0 when the free memory is one block or there is none.
func TestFragmentation(t *testing.T) {
	rng := testseed.Rand(t, 1)
	for range 100 {
		free := 1 + rng.Int64N(1<<40)
		largest := 1 + rng.Int64N(free)
		want := float64(free-largest) / float64(free)
		if f := Fragmentation(largest, free); math.Abs(f-want) > 1e-12 {
			t.Fatalf("Fragmentation(%d, %d) = %g, want %g", largest, free, f, want)
		}
	}
	if f := Fragmentation(0, 0); f != 0 {
		t.Fatalf("fragmentation of nothing free %g, want 0", f)
	}
}
