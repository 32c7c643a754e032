package settings

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestParse checks each kind's parser against values written out by hand.
func TestParse(t *testing.T) {
	for _, c := range []struct {
		v    *Var
		in   string
		want any
		bad  bool
	}{
		{AsyncCopy.Var, "0", false, false},
		{AsyncCopy.Var, " On ", true, false},
		{AsyncCopy.Var, "no", false, false},
		{AsyncCopy.Var, "maybe", nil, true},
		{CPUDevices.Var, "8", int64(8), false},
		{CPUDevices.Var, "0", nil, true},
		{CPUDevices.Var, "1025", nil, true},
		{CPUDevices.Var, "two", nil, true},
		{MemFraction.Var, "0.5", 0.5, false},
		{MemFraction.Var, "1.5", nil, true},
		{MemFraction.Var, "NaN", nil, true},
		{CollectiveTimeout.Var, "90s", 90 * time.Second, false},
		{CollectiveTimeout.Var, "OFF", time.Duration(0), false},
		{CollectiveTimeout.Var, "-1s", nil, true},
		{MPILiveness.Var, "0", time.Duration(0), false},
		{MPILiveness.Var, "20s", 20 * time.Second, false},
		{DeviceMemory.Var, "1.5GiB", int64(3 << 29), false},
		{DeviceMemory.Var, "Unlimited", int64(0), false},
		{DeviceMemory.Var, "64M", nil, true},
		{MemoryBudget.Var, "device", int64(BudgetDevice), false},
		{MemoryBudget.Var, "2K", int64(2048), false},
		{MemoryBudget.Var, "lots", nil, true},
		{CPU.Var, "AVX2", "avx2", false},
		{CPU.Var, "sse", nil, true},
		{TestSeed.Var, "18446744073709551615", uint64(1<<64 - 1), false},
		{TestSeed.Var, "-1", nil, true},
		{VerifyIR.Var, "0", true, false},
		{DumpIR.Var, " /tmp/x ", "/tmp/x", false},
	} {
		got, err := parseAny(c.v, c.in)
		if c.bad {
			var e *Error
			if !errors.As(err, &e) || e.Name != c.v.Name || e.Value != c.in || !strings.Contains(err.Error(), c.v.Name+"=") {
				t.Errorf("%s=%q: got %v, %v; want an *Error naming the variable and the value", c.v.Name, c.in, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s=%q: got %v (%T), %v; want %v (%T)", c.v.Name, c.in, got, got, err, c.want, c.want)
		}
	}
	if r, err := BudgetRates.Parse("1e11, 2e9,5e9"); err != nil || len(r) != 3 || r[0] != 1e11 || r[1] != 2e9 || r[2] != 5e9 {
		t.Errorf("BudgetRates: %v, %v", r, err)
	}
	for _, s := range []string{"1,2", "1,2,x", "1,2,-3", "1,2,inf"} {
		if _, err := BudgetRates.Parse(s); err == nil {
			t.Errorf("BudgetRates %q: no error", s)
		}
	}
}

// parseAny parses s with the Setting that declares v.
func parseAny(v *Var, s string) (any, error) {
	for _, p := range []func() (any, error, bool){
		func() (any, error, bool) { return try(boolSettings, v, s) },
		func() (any, error, bool) { return try(intSettings, v, s) },
		func() (any, error, bool) { return try([]*Setting[uint64]{TestSeed}, v, s) },
		func() (any, error, bool) { return try([]*Setting[float64]{MemFraction}, v, s) },
		func() (any, error, bool) { return try([]*Setting[time.Duration]{CollectiveTimeout, MPILiveness}, v, s) },
		func() (any, error, bool) { return try([]*Setting[string]{CPU, DumpIR}, v, s) },
	} {
		if got, err, ok := p(); ok {
			return got, err
		}
	}
	return nil, errors.New("no setting declares " + v.Name)
}

var (
	boolSettings = []*Setting[bool]{AsyncCopy, VerifyIR}
	intSettings  = []*Setting[int64]{CPUDevices, DeviceMemory, MemoryBudget}
)

func try[T any](ss []*Setting[T], v *Var, s string) (any, error, bool) {
	for _, x := range ss {
		if x.Var == v {
			got, err := x.Parse(s)
			return got, err, true
		}
	}
	return nil, nil, false
}

// TestReadRule: every read sees the environment as it is now (t.Setenv
// after an earlier read), an Override wins over it until the test ends, and
// a blank value is unset.
func TestReadRule(t *testing.T) {
	t.Setenv(CPUDevices.Name, "3")
	if n := CPUDevices.Get(); n != 3 {
		t.Fatalf("got %d, want 3", n)
	}
	t.Setenv(CPUDevices.Name, "5")
	if n := CPUDevices.Get(); n != 5 {
		t.Fatalf("after Setenv: got %d, want 5", n)
	}
	t.Setenv(CPUDevices.Name, "  ")
	if n, set, err := CPUDevices.Lookup(); n != 1 || set || err != nil {
		t.Fatalf("blank: got %d, %v, %v; want the default, unset", n, set, err)
	}
	t.Run("override", func(t *testing.T) {
		Override(t, CPUDevices.Name, "7")
		if n := CPUDevices.Get(); n != 7 {
			t.Fatalf("override: got %d, want 7", n)
		}
		OverrideUnset(t, DumpIR.Name)
		if DumpIR.IsSet() {
			t.Fatal("OverrideUnset: still set")
		}
	})
	if n := CPUDevices.Get(); n != 1 {
		t.Fatalf("after the override's test: got %d, want 1", n)
	}
	if _, err := Set("FERRY_"+"NO_SUCH_VARIABLE", "1", true); err == nil {
		t.Fatal("Set of an undeclared name: no error")
	}
}

// TestGetWarnsOnce: a bad value read with Get is reported once, in the one
// format, and the default is used.
func TestGetWarnsOnce(t *testing.T) {
	var buf bytes.Buffer
	old := Stderr
	Stderr = &buf
	t.Cleanup(func() { Stderr = old })
	t.Setenv(MPISpin.Name, "fast")
	for range 3 {
		if d := MPISpin.Get(); d != time.Millisecond {
			t.Fatalf("got %v, want the default 1ms", d)
		}
	}
	want := `ferry: warning: FERRY_MPI_SPIN="fast": want a non-negative duration such as 1ms; using the default (1ms)` + "\n"
	if buf.String() != want {
		t.Fatalf("warnings:\n%s\nwant once:\n%s", buf.String(), want)
	}
}

// TestTable checks the declarations: names, kinds, documentation, readers,
// and that an Enum's default is one of its values.
func TestTable(t *testing.T) {
	if len(All()) < 60 {
		t.Fatalf("the table has %d variables", len(All()))
	}
	for _, v := range All() {
		if !strings.HasPrefix(v.Name, "FERRY_") || strings.ToUpper(v.Name) != v.Name {
			t.Errorf("%s: not a FERRY_ name in capitals", v.Name)
		}
		if v.Kind == 0 || v.Type == "" || v.Default == "" || v.Doc == "" || len(v.Readers) == 0 {
			t.Errorf("%s: kind, type, default, doc or readers missing: %+v", v.Name, v)
		}
		if got, ok := Lookup(v.Name); !ok || got != v {
			t.Errorf("Lookup(%s) = %v, %v", v.Name, got, ok)
		}
	}
	for _, s := range []*Setting[string]{Allocator, CPU, GemmKernel, VMath, MPIReduce, CkptMPI, CPUFeatWant} {
		if d := s.Default(); d != "" && !strings.Contains(" "+strings.Join(s.Values, " ")+" ", " "+d+" ") {
			t.Errorf("%s: default %q is not one of %v", s.Name, d, s.Values)
		}
	}
}

// TestUpdateDoc: the section between the markers is replaced, the text
// around it kept, and a page without the markers is an error.
func TestUpdateDoc(t *testing.T) {
	page := "# Title\n\nintro\n\n" + BeginMarker + "\n| stale |\n" + EndMarker + "\n\nafter\n"
	out, err := UpdateDoc([]byte(page))
	if err != nil {
		t.Fatal(err)
	}
	want := "# Title\n\nintro\n\n" + BeginMarker + "\n\n" + Markdown() + "\n" + EndMarker + "\n\nafter\n"
	if string(out) != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
	if !strings.Contains(Markdown(), "| `FERRY_TEST_SEED` | integer | a fresh random seed | *tests*: The seed") {
		t.Errorf("the FERRY_TEST_SEED row is not as written in the table:\n%s", Markdown())
	}
	if _, err := UpdateDoc([]byte("# Title\n")); err == nil {
		t.Error("a page without markers: no error")
	}
}
