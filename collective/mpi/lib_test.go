package mpi

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferryml/ferry/ir"
)

// TestLoadErrorListsAttempts: a library that is nowhere gives a LoadError
// naming every path tried.
func TestLoadErrorListsAttempts(t *testing.T) {
	_, err := open([]string{"/nonexistent/libmpi.so.40", "libmpi-not-there.so.40"})
	var le *LoadError
	if !errors.As(err, &le) || len(le.Attempts) != 2 {
		t.Fatalf("got %v, want a LoadError with two attempts", err)
	}
	for _, s := range []string{"/nonexistent/libmpi.so.40", "libmpi-not-there.so.40", LibEnv} {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("%q does not mention %q", err, s)
		}
	}
}

// TestCandidates: $FERRY_MPI_LIB comes first, then the system loader.
func TestCandidates(t *testing.T) {
	t.Setenv(LibEnv, "/opt/ompi/lib/libmpi.so.40")
	got := strings.Join(candidates(), " ")
	if got != "/opt/ompi/lib/libmpi.so.40 libmpi.so.40 libmpi.so" {
		t.Fatalf("candidates: %s", got)
	}
}

// TestSettings parses FERRY_COLLECTIVE_TIMEOUT and FERRY_MPI_REDUCE.
func TestSettings(t *testing.T) {
	for _, tc := range []struct {
		timeout, reduce string
		want            time.Duration
		ordered, bad    bool
	}{
		{"", "", DefaultTimeout, false, false},
		{"90s", "native", 90 * time.Second, false, false},
		{"off", "ordered", 0, true, false},
		{"0", "", 0, false, false},
		{"soon", "", 0, false, true},
		{"-1s", "", 0, false, true},
		{"1s", "fast", 0, false, true},
	} {
		t.Setenv(TimeoutEnv, tc.timeout)
		t.Setenv(ReduceEnv, tc.reduce)
		got, ordered, err := settings()
		if tc.bad {
			if err == nil {
				t.Errorf("%s=%q %s=%q: no error", TimeoutEnv, tc.timeout, ReduceEnv, tc.reduce)
			}
			continue
		}
		if err != nil || got != tc.want || ordered != tc.ordered {
			t.Errorf("%s=%q %s=%q: %v %v %v", TimeoutEnv, tc.timeout, ReduceEnv, tc.reduce, got, ordered, err)
		}
	}
}

// TestWorldBeforeInit: outside a job (no Init), World says to call Init.
func TestWorldBeforeInit(t *testing.T) {
	if InMPIJob() {
		t.Skip("in an MPI job: Init has run")
	}
	if _, err := World(); err == nil || !strings.Contains(err.Error(), "Init") {
		t.Fatalf("World before Init: %v", err)
	}
}

// TestLayout checks the block reordering against index arithmetic: blocks
// along axis 1 of a [2, 6, 3] array cut in 3.
func TestLayout(t *testing.T) {
	shape := []int{2, 6, 3}
	src := make([]byte, 36)
	for i := range src {
		src[i] = byte(i)
	}
	dst := make([]byte, 36)
	toBlocks(dst, src, shape, 1, 3, 1)
	for j := range 3 { // block j holds rows 2j, 2j+1 of each of the 2 outer slices
		for o := range 2 {
			for r := range 2 {
				for c := range 3 {
					got := dst[j*12+o*6+r*3+c]
					want := byte(o*18 + (2*j+r)*3 + c)
					if got != want {
						t.Fatalf("block %d [%d %d %d] = %d, want %d", j, o, r, c, got, want)
					}
				}
			}
		}
	}
	back := make([]byte, 36)
	fromBlocks(back, dst, shape, 1, 3, 1)
	if string(back) != string(src) {
		t.Fatal("fromBlocks does not undo toBlocks")
	}
	if contiguous(shape, 1, 3, 1) || !contiguous(shape, 0, 2, 1) || !contiguous([]int{1, 6}, 1, 3, 1) {
		t.Fatal("contiguous is wrong")
	}
}

// TestLoadErrorMissingSymbols: a library that loads but is not libmpi (libc)
// is a LoadError naming it and the entry points it lacks.
func TestLoadErrorMissingSymbols(t *testing.T) {
	_, err := open([]string{"/nonexistent/libmpi.so.40", "libc.so.6"})
	var le *LoadError
	if !errors.As(err, &le) || le.Library != "libc.so.6" || len(le.Attempts) != 0 {
		t.Fatalf("got %v, want a LoadError about libc.so.6's entry points", err)
	}
	for _, s := range []string{"mpi: libc.so.6: missing entry points MPI_Init_thread, ", "ompi_mpi_op_min", "Open MPI 4"} {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("%q does not mention %q", err, s)
		}
	}
}

// TestLoadResolvesEverything: an installed libmpi loads with every entry
// point and predefined handle resolved.
func TestLoadResolvesEverything(t *testing.T) {
	if err := Load(); err != nil {
		t.Skipf("no libmpi: %v", err)
	}
	l := loaded
	for i, p := range []uintptr{l.initThread, l.finalize, l.requestFree, l.commWorld, l.byteType,
		l.moveTypes[1], l.moveTypes[8], l.types[ir.Uint8], l.types[ir.Uint32], l.types[ir.Float64], l.ops[1], l.ops[4]} {
		if p == 0 {
			t.Errorf("entry %d of %s is not resolved", i, l.path)
		}
	}
}
