package backend

import (
	"testing"

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

func TestFragmentation(t *testing.T) {
	if f := (SpaceStats{LargestFreeBlock: 64, FreeBytes: 256}).Fragmentation(); f != 0.75 {
		t.Fatalf("fragmentation %g, want 0.75", f)
	}
	if f := (SpaceStats{}).Fragmentation(); f != 0 {
		t.Fatalf("fragmentation of nothing free %g, want 0", f)
	}
}
