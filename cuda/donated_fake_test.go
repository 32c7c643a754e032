//go:build linux && (amd64 || arm64)

package cuda

import (
	"errors"
	"strings"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// The CUDA backend's buffers fail with the errors every backend shares: a
// buffer donated to a call matches rt.ErrDonated (and not rt.ErrDeleted)
// when read, held or passed again, a deleted one rt.ErrDeleted, and one
// being donated to a running call rt.ErrDonated, naming the call's site.
func TestCUDAErrDonatedDeleted(t *testing.T) {
	_, b := fakeBackend(t, false)
	rng := testseed.Rand(t, 31)
	n := 1 + rng.IntN(64)
	typ := f32t(n, n)
	// The result is defined after x's last use, so it takes x's memory.
	f := traceFn(t, []ir.Type{typ}, func(x []*trace.Array) []*trace.Array {
		m := trace.MatMul(x[0], x[0])
		return []*trace.Array{trace.MatMul(m, m)}
	})
	exe, err := b.Compile(f, rt.CompileOptions{Donated: []bool{true}})
	if err != nil {
		t.Fatal(err)
	}
	buf, err := b.FromLiteral(randomLiteral(rng, typ))
	if err != nil {
		t.Fatal(err)
	}
	x := buf.(*Buffer)
	outs, err := exe.Execute([]trace.Buffer{x}, rt.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := outs[0].(*Buffer).m.ptr; got != x.m.ptr {
		t.Fatalf("the result is at %#x, not in the donated argument's memory at %#x", got, x.m.ptr)
	}
	isDonated := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, rt.ErrDonated) || !errors.Is(err, backend.ErrDonated) || errors.Is(err, rt.ErrDeleted) {
			t.Errorf("%s of a donated buffer: %v; want an error matching rt.ErrDonated only", what, err)
		}
	}
	_, err = x.Literal()
	isDonated("Literal", err)
	isDonated("Hold", x.Hold(false, ""))
	_, err = exe.Execute([]trace.Buffer{x}, rt.ExecOptions{})
	isDonated("Execute", err)

	buf, err = b.FromLiteral(randomLiteral(rng, typ))
	if err != nil {
		t.Fatal(err)
	}
	y := buf.(*Buffer)
	if err := y.Delete(); err != nil {
		t.Fatal(err)
	}
	_, err = y.Literal()
	if !errors.Is(err, rt.ErrDeleted) || errors.Is(err, rt.ErrDonated) {
		t.Errorf("Literal of a deleted buffer: %v; want an error matching rt.ErrDeleted only", err)
	}

	buf, err = b.FromLiteral(randomLiteral(rng, typ))
	if err != nil {
		t.Fatal(err)
	}
	z := buf.(*Buffer)
	const site = "train.go:42"
	if err := z.Hold(true, site); err != nil {
		t.Fatal(err)
	}
	err = z.Hold(false, "")
	isDonated("Hold while donating", err)
	if err == nil || !strings.Contains(err.Error(), site) {
		t.Errorf("the hold of a buffer being donated fails with %v, which does not name the donating call at %s", err, site)
	}
	z.Unhold(true)
	if err := z.Hold(false, ""); err != nil {
		t.Fatalf("a buffer whose donating call let it go cannot be held: %v", err)
	}
	z.Unhold(false)
	for _, o := range append(outs, z) {
		if err := o.(*Buffer).Delete(); err != nil {
			t.Fatal(err)
		}
	}
}

// A donated argument whose memory no result takes over (the result has
// another shape, so the buffer plan cannot alias them) is donated all the
// same after the call, as on the CPU backend: reading it fails with
// backend.ErrDonated and its memory is back in the slab, with the runtime's
// holds around the call (backend.HoldArgs) and without them.
func TestDonatedUnusedArgument(t *testing.T) {
	_, b := fakeBackend(t, true)
	rng := testseed.Rand(t, 32)
	n := 2 + rng.IntN(30)
	typ := f32t(n, 3)
	f := traceFn(t, []ir.Type{typ, typ}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Sum(trace.Mul(x[0], x[1]), 0)}
	})
	exe, err := b.Compile(f, rt.CompileOptions{Donated: []bool{true, false}})
	if err != nil {
		t.Fatal(err)
	}
	for _, held := range []bool{false, true} {
		s0, _ := b.MemoryStats(0, ir.Device)
		x, err := b.FromLiteral(randomLiteral(rng, typ))
		if err != nil {
			t.Fatal(err)
		}
		y, err := b.FromLiteral(randomLiteral(rng, typ))
		if err != nil {
			t.Fatal(err)
		}
		args := []trace.Buffer{x, y}
		donated := []bool{true, false}
		if held {
			if err := backend.HoldArgs(args, donated, "step.go:3"); err != nil {
				t.Fatal(err)
			}
		}
		outs, err := exe.Execute(args, rt.ExecOptions{DonationSite: "step.go:3"})
		if held {
			backend.ReleaseArgs(args, donated)
		}
		if err != nil {
			t.Fatal(err)
		}
		if outs[0].(*Buffer).m.ptr == x.(*Buffer).m.ptr {
			t.Fatal("the result took the donated argument's memory; the test wants one that cannot")
		}
		if _, err := x.Literal(); !errors.Is(err, backend.ErrDonated) {
			t.Fatalf("held %v: reading the donated argument after the call: %v, want backend.ErrDonated", held, err)
		}
		if _, err := y.Literal(); err != nil {
			t.Fatalf("the argument not donated: %v", err)
		}
		// x's memory is free again: y and the result are what is left.
		s, _ := b.MemoryStats(0, ir.Device)
		if s.LiveAllocs != s0.LiveAllocs+2 {
			t.Fatalf("held %v: %d live allocations after the call, want %d (y and the result)", held, s.LiveAllocs, s0.LiveAllocs+2)
		}
		_ = y.(*Buffer).Delete()
		_ = outs[0].(*Buffer).Delete()
	}
}
