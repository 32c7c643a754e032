package runtime_test

import (
	"errors"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// rt.ErrDonated and rt.ErrDeleted are the errors every backend shares
// (backend.ErrDonated, backend.ErrDeleted): reading an array donated to a
// jitted function on the CPU backend matches rt.ErrDonated and not
// rt.ErrDeleted; reading a deleted one the other way round. (The CUDA
// backend's buffers are checked in package cuda, on its fake driver.)
func TestErrDonatedIsTheBackendsError(t *testing.T) {
	if rt.ErrDonated != backend.ErrDonated || rt.ErrDeleted != backend.ErrDeleted {
		t.Fatal("rt.ErrDonated and rt.ErrDeleted are not backend's errors")
	}
	rng := testseed.Rand(t, 1)
	vals := make([]float32, 1+rng.IntN(1000))
	for i := range vals {
		vals[i] = rng.Float32()
	}
	f := rt.Jit(func(x *trace.Array) *trace.Array { return trace.Exp(x) }, rt.Donate(0))
	x := rt.FromSlice(vals)
	y := f(x)
	defer y.Delete()
	_, err := x.Literal()
	if !errors.Is(err, rt.ErrDonated) || errors.Is(err, rt.ErrDeleted) {
		t.Fatalf("reading a donated array: %v; want an error matching rt.ErrDonated only", err)
	}

	z := rt.FromSlice(vals)
	if err := z.Delete(); err != nil {
		t.Fatal(err)
	}
	_, err = z.Literal()
	if !errors.Is(err, rt.ErrDeleted) || errors.Is(err, rt.ErrDonated) {
		t.Fatalf("reading a deleted array: %v; want an error matching rt.ErrDeleted only", err)
	}
}
