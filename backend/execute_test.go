package backend

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
)

// fakeBuf is a buffer of fakeTarget, a backend with devices fake:0 to
// fake:3: its memory belongs to device dev, or to all of them (host).
type fakeBuf struct {
	st       BufferState
	t        ir.Type
	dev      int
	host     bool
	imported bool
	frees    int
}

func (b *fakeBuf) Type() ir.Type { return b.t }

func (b *fakeBuf) Literal() (*ir.Literal, error) {
	if err := b.st.Usable(b.t, false); err != nil {
		return nil, err
	}
	return ir.NewLiteral(b.t), nil
}

func (b *fakeBuf) Hold(donate bool, site string) error { return b.st.Hold(b.t, donate, site, nil) }

func (b *fakeBuf) Unhold(donate bool) {
	if b.st.Unhold(donate) {
		b.frees++
	}
}

// otherBuf is another backend's buffer.
type otherBuf struct{ t ir.Type }

func (b *otherBuf) Type() ir.Type                 { return b.t }
func (b *otherBuf) Literal() (*ir.Literal, error) { return ir.NewLiteral(b.t), nil }

type fakeTarget struct{ imported []*fakeBuf }

func (*fakeTarget) Platform() string { return "fake" }

func (*fakeTarget) Own(b ir.Buffer) (*fakeBuf, bool) {
	f, ok := b.(*fakeBuf)
	return f, ok
}

func (t *fakeTarget) Import(l *ir.Literal, dev int) (*fakeBuf, error) {
	b := &fakeBuf{t: l.Type, dev: dev, imported: true}
	t.imported = append(t.imported, b)
	return b, nil
}

func (*fakeTarget) Placed(b *fakeBuf) (int, bool) { return b.dev, !b.host }
func (*fakeTarget) State(b *fakeBuf) *BufferState { return &b.st }
func (*fakeTarget) Free(b *fakeBuf)               { b.frees++ }

// callCase is a random signature and matching arguments on device dev.
type callCase struct {
	params  []*ir.Value
	donated []bool
	args    []ir.Buffer
	dev     int
}

func newCallCase(r *rand.Rand) *callCase {
	n := 2 + r.IntN(4)
	c := &callCase{params: make([]*ir.Value, n), donated: make([]bool, n), args: make([]ir.Buffer, n), dev: r.IntN(4)}
	dts := []ir.DType{ir.Float32, ir.Int32, ir.Float64}
	for i := range n {
		t := ir.Type{DType: dts[r.IntN(len(dts))], Shape: ir.Shape{1 + r.IntN(5), 1 + r.IntN(3)}}
		c.params[i] = &ir.Value{Type: t}
		c.donated[i] = r.IntN(2) == 0
		c.args[i] = &fakeBuf{t: t, dev: c.dev}
	}
	return c
}

func (c *callCase) start(t *testing.T, tg *fakeTarget, call *Call[*fakeBuf]) error {
	t.Helper()
	return call.Start(tg, c.params, c.donated, c.args, c.dev, "step.go:7")
}

// wantUntouched fails unless every own argument is live, unheld, not
// donated and never freed, and every imported buffer was freed once.
func (c *callCase) wantUntouched(t *testing.T, tg *fakeTarget, when string) {
	t.Helper()
	for i, a := range c.args {
		b, ok := a.(*fakeBuf)
		if !ok {
			continue
		}
		if _, err := b.Literal(); err != nil {
			t.Fatalf("%s: argument %d: %v", when, i, err)
		}
		if err := b.Hold(true, ""); err != nil { // fails if any hold is left
			t.Fatalf("%s: argument %d is still held: %v", when, i, err)
		}
		b.Unhold(true)
		if b.frees != 0 {
			t.Fatalf("%s: argument %d freed %d times", when, i, b.frees)
		}
	}
	for _, b := range tg.imported {
		if b.frees != 1 {
			t.Fatalf("%s: an imported buffer was freed %d times, want once", when, b.frees)
		}
	}
}

// TestCallRefusesBadArguments breaks one argument of a random call at a
// time: the error names it and nothing is held, donated or freed but the
// buffers imported on the way.
func TestCallRefusesBadArguments(t *testing.T) {
	r := testseed.Rand(t, 1)
	for range 20 {
		c := newCallCase(r)
		k := r.IntN(len(c.args))
		tg := &fakeTarget{}
		var call Call[*fakeBuf]
		if k > 0 && r.IntN(2) == 0 {
			c.args[0] = &otherBuf{t: c.params[0].Type} // imported before k fails
		}
		var want string
		var wantIs error
		kind := r.IntN(6)
		switch kind {
		case 0:
			c.args = c.args[:len(c.args)-1]
			want = fmt.Sprintf("%d arguments, want %d", len(c.args), len(c.params))
		case 1:
			bad := c.params[k].Type.Clone()
			bad.Shape[0]++
			c.args[k] = &fakeBuf{t: bad, dev: c.dev}
			want = fmt.Sprintf("argument %d is %v, want %v", k, bad, c.params[k].Type)
		case 2:
			other := (c.dev + 1 + r.IntN(3)) % 4
			c.args[k].(*fakeBuf).dev = other
			want = fmt.Sprintf("argument %d (%v) is on fake:%d, but the call runs on fake:%d", k, c.params[k].Type, other, c.dev)
		case 3:
			c.args[k].(*fakeBuf).st.Delete()
			want, wantIs = fmt.Sprintf("argument %d: array %v was deleted", k, c.params[k].Type), ErrDeleted
		case 4:
			if err := c.args[k].(*fakeBuf).st.Donate(c.params[k].Type, "old.go:3"); err != nil {
				t.Fatal(err)
			}
			want, wantIs = fmt.Sprintf("argument %d: array %v was donated at old.go:3", k, c.params[k].Type), ErrDonated
		case 5:
			i := (k + 1) % len(c.args)
			c.params[i].Type, c.donated[i], c.donated[k] = c.params[k].Type, true, false
			c.args[i] = c.args[k]
			want = fmt.Sprintf("argument %d (%v) is donated and also passed as argument %d", i, c.params[k].Type, k)
		}
		err := c.start(t, tg, &call)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want an error containing %q", err, want)
		}
		var he *HoldError
		if kind == 5 && (!errors.As(err, &he) || he.Arg != (k+1)%len(c.args) || he.Also != k) {
			t.Fatalf("%v: want a HoldError naming both arguments", err)
		}
		if wantIs != nil && !errors.Is(err, wantIs) {
			t.Fatalf("%v does not match %v", err, wantIs)
		}
		if len(call.Args) != 0 {
			t.Fatalf("a failed Start left %d arguments in the call", len(call.Args))
		}
		for i, a := range c.args {
			if b, ok := a.(*fakeBuf); ok && i != k {
				if _, err := b.Literal(); err != nil {
					t.Fatalf("argument %d after a failed Start: %v", i, err)
				}
			}
		}
		for _, b := range tg.imported {
			if b.frees != 1 {
				t.Fatalf("an imported buffer was freed %d times, want once", b.frees)
			}
		}
	}
}

// TestCallSettlesDonations runs random calls through the envelope, with
// the holds a caller takes around it (HoldArgs): a run that fails leaves
// every argument live and unheld; one that succeeds leaves the donated
// arguments donated at the call's site, each freed once unless the run
// handed its memory to a result, and the others untouched.
func TestCallSettlesDonations(t *testing.T) {
	r := testseed.Rand(t, 2)
	for range 20 {
		c := newCallCase(r)
		for i := range c.args {
			switch r.IntN(4) {
			case 0:
				c.args[i] = &otherBuf{t: c.params[i].Type}
			case 1:
				b := c.args[i].(*fakeBuf)
				b.host, b.dev = true, (c.dev+1)%4 // host memory: any device reads it
			}
		}
		fail := r.IntN(2) == 0
		taken := make([]bool, len(c.args)) // the donated arguments a result takes
		for i := range taken {
			taken[i] = !fail && c.donated[i] && r.IntN(2) == 0
		}
		importedFrees := map[*fakeBuf]int{}
		tg := &fakeTarget{}
		if err := HoldArgs(c.args, c.donated, "step.go:7"); err != nil {
			t.Fatal(err)
		}
		var call Call[*fakeBuf]
		if err := c.start(t, tg, &call); err != nil {
			t.Fatal(err)
		}
		run := func() error { // a backend's run: results take donated memory, then it fails or not
			for i, b := range call.Args {
				if taken[i] {
					if err := b.st.Donate(b.t, "step.go:7"); err != nil {
						return err
					}
				}
				if b.imported != (c.args[i] != ir.Buffer(b)) || call.Imported(i) != b.imported {
					return fmt.Errorf("argument %d: imported %v", i, b.imported)
				}
				if b.imported {
					importedFrees[b] = 1 - btoi(taken[i])
				}
			}
			if fail {
				return errors.New("the device failed")
			}
			return nil
		}
		err := run()
		if fail != (err != nil) {
			t.Fatal(err)
		}
		call.End(err)
		ReleaseArgs(c.args, c.donated)
		if fail {
			c.wantUntouched(t, tg, "after a failed run")
			continue
		}
		for i, a := range c.args {
			b, ok := a.(*fakeBuf)
			if !ok {
				continue
			}
			_, err := b.Literal()
			switch {
			case c.donated[i] && !errors.Is(err, ErrDonated):
				t.Fatalf("donated argument %d after the call: %v, want ErrDonated", i, err)
			case c.donated[i] && !strings.Contains(err.Error(), "step.go:7"):
				t.Fatalf("donated argument %d: %v does not name the call's site", i, err)
			case !c.donated[i] && err != nil:
				t.Fatalf("argument %d after the call: %v", i, err)
			}
			if want := btoi(c.donated[i] && !taken[i]); b.frees != want {
				t.Fatalf("argument %d (donated %v, taken by a result %v) freed %d times, want %d", i, c.donated[i], taken[i], b.frees, want)
			}
		}
		for _, b := range tg.imported {
			if want := importedFrees[b]; b.frees != want {
				t.Fatalf("an imported buffer was freed %d times, want %d", b.frees, want)
			}
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestCallAllocatesNothing: a Call reused from one execution to the next
// checks and settles its backend's own buffers without allocating, as the
// CPU backend's cached dispatch needs.
func TestCallAllocatesNothing(t *testing.T) {
	c := newCallCase(testseed.Rand(t, 3))
	clear(c.donated)
	tg := &fakeTarget{}
	var call Call[*fakeBuf]
	run := func() {
		if err := c.start(t, tg, &call); err != nil {
			t.Fatal(err)
		}
		call.End(nil)
	}
	run()
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Fatalf("%v allocations per call, want 0", n)
	}
}

// abortComm is a communicator that records its aborts.
type abortComm struct {
	collective.Communicator
	errs []error
}

func (c *abortComm) Abort(err error) { c.errs = append(c.errs, err) }

// abortDeviceComm is a device communicator that counts its aborts.
type abortDeviceComm struct {
	DeviceCommunicator
	n int
}

func (c *abortDeviceComm) Abort() error { c.n++; return nil }

// TestAbortComms: every communicator of a failed execution is aborted
// once, with the execution's error where the kind takes one.
func TestAbortComms(t *testing.T) {
	r := testseed.Rand(t, 4)
	failed := errors.New("device 1 failed")
	opts := ExecOptions{Comms: map[string]collective.Communicator{}, DeviceComms: map[string]DeviceCommunicator{}}
	var cs []*abortComm
	var ds []*abortDeviceComm
	for i := range 1 + r.IntN(3) {
		c, d := &abortComm{}, &abortDeviceComm{}
		cs, ds = append(cs, c), append(ds, d)
		opts.Comms[fmt.Sprint("x", i)], opts.DeviceComms[fmt.Sprint("y", i)] = c, d
	}
	opts.Comms["nil"] = nil
	AbortComms(opts, failed)
	for i := range cs {
		if len(cs[i].errs) != 1 || cs[i].errs[0] != failed || ds[i].n != 1 {
			t.Fatalf("communicator %d aborted with %v, device communicator %d times; want once each", i, cs[i].errs, ds[i].n)
		}
	}
}
