package runtime_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/cpu"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// holdN is the side of the square matrices of the hold tests: large enough
// that a product takes long beside a Delete and an allocation.
const holdN = 160

// sumSquare is Σ (x·x) in float64.
func sumSquare(x []float32, n int) float64 {
	s := 0.0
	for i := range n {
		for k := range n {
			xik := float64(x[i*n+k])
			for j := range n {
				s += xik * float64(x[k*n+j])
			}
		}
	}
	return s
}

// closeTo says whether got is want to float32 accuracy for a sum of n³
// products of magnitudes up to 1.
func closeTo(got float32, want float64, n int) bool {
	return math.Abs(float64(got)-want) <= 1e-4*float64(n*n*n)*0x1p-10+1e-3*math.Abs(want)
}

// holdArray is a random n×n array (values in [0.5, 1), so that a product's
// sum is far from that of any other array of the test) and its values.
func holdArray(r *rand.Rand, n int) (*trace.Array, []float32) {
	v := make([]float32, n*n)
	for i := range v {
		v[i] = 0.5 + 0.5*r.Float32()
	}
	return rt.FromSlice(v, n, n), v
}

// churn allocates arrays of x's size with other values, so that memory freed
// under a running call would be overwritten.
func churn(n int) {
	for range 3 {
		_ = trace.Full(ir.Shape{n, n}, 7, ir.Float32).Delete()
	}
	_ = trace.Full(ir.Shape{n, n}, 7, ir.Float32)
}

// pauser stops the next execution of the CPU backend after it has read its
// arguments (cpu.HoldEventRun) until released, and reports donations that
// wait for running executions (cpu.HoldEventWait).
type pauser struct {
	armed   atomic.Bool
	paused  chan struct{}
	release chan struct{}
	waiting chan struct{}
}

// newPauser installs a pauser's hook for the rest of the test.
func newPauser(t *testing.T) *pauser {
	p := &pauser{paused: make(chan struct{}, 1), waiting: make(chan struct{}, 1)}
	cpu.SetHoldHookForTest(t, func(e cpu.HoldEvent) {
		switch e {
		case cpu.HoldEventRun:
			if p.armed.CompareAndSwap(true, false) {
				p.paused <- struct{}{}
				<-p.release
			}
		case cpu.HoldEventWait:
			select {
			case p.waiting <- struct{}{}:
			default:
			}
		}
	})
	return p
}

// start runs call in a goroutine, stopped once it has read its arguments,
// and returns its result's channel; p.resume lets it go on.
func (p *pauser) start(call func() (float32, error)) <-chan callResult {
	p.release = make(chan struct{})
	p.armed.Store(true)
	res := make(chan callResult, 1)
	go func() {
		v, err := call()
		res <- callResult{v, err}
	}()
	<-p.paused
	return res
}

func (p *pauser) resume() { close(p.release) }

type callResult struct {
	v   float32
	err error
}

// sumCall calls f on x and reads the one-element result.
func sumCall(f *rt.Jitted[func(*trace.Array) *trace.Array], x *trace.Array) func() (float32, error) {
	return func() (float32, error) {
		out, err := f.Call(x)
		if err != nil {
			return 0, err
		}
		return out[0].(*trace.Array).Float32s()[0], nil
	}
}

// TestDeleteWhileCallReads deletes an array while another goroutine's jitted
// call reads it, then allocates over its memory: the call still returns the
// right sum (the array's memory is freed when it is done), and the array is
// unusable from the Delete on. Half the trials stop the call after it read
// its arguments, so that the Delete surely comes while it runs; the others
// race as they come (the call may then find the array deleted: an error
// naming the Delete, never a wrong value).
func TestDeleteWhileCallReads(t *testing.T) {
	r := testseed.Rand(t, 1)
	p := newPauser(t)
	f := rt.NewJitted(func(x *trace.Array) *trace.Array { return trace.Sum(trace.MatMul(x, x)) })
	x, v := holdArray(r, holdN)
	ch := p.start(sumCall(f, x)) // compile outside the trials
	p.resume()
	require.NoError(t, (<-ch).err)
	wrong, failed := 0, 0
	for trial := range 20 {
		x, v = holdArray(r, holdN)
		want := sumSquare(v, holdN)
		var ch <-chan callResult
		paused := trial%2 == 0
		if paused {
			ch = p.start(sumCall(f, x))
		} else {
			c := make(chan callResult, 1)
			go func() {
				v, err := sumCall(f, x)()
				c <- callResult{v, err}
			}()
			ch = c
		}
		require.NoError(t, x.Delete())
		_, err := x.Literal()
		require.ErrorIs(t, err, rt.ErrDeleted, "trial %d: the array is unusable at once", trial)
		churn(holdN)
		if paused {
			p.resume()
		}
		res := <-ch
		if res.err != nil {
			require.False(t, paused, "trial %d: a call that held the array failed: %v", trial, res.err)
			require.ErrorIs(t, res.err, rt.ErrDeleted, "trial %d", trial)
			require.Contains(t, res.err.Error(), "holds_test.go", "trial %d: the error names the Delete", trial)
			failed++
			continue
		}
		if !closeTo(res.v, want, holdN) {
			t.Errorf("trial %d (stopped %v): sum %g, want %g", trial, paused, res.v, want)
			wrong++
		}
	}
	t.Logf("20 trials: %d wrong, %d refused (deleted before the call held it)", wrong, failed)
}

// TestDonateWhileCallReads donates an array to one call while another
// goroutine's call reads it: the donating call waits for the reader, so the
// reader's sum is right, and the donating call's result is right. As in
// TestDeleteWhileCallReads, half the trials stop the reader while it runs.
func TestDonateWhileCallReads(t *testing.T) {
	r := testseed.Rand(t, 1)
	p := newPauser(t)
	f := rt.NewJitted(func(x *trace.Array) *trace.Array { return trace.Sum(trace.MatMul(x, x)) })
	double := rt.NewJitted(func(x *trace.Array) *trace.Array { return trace.Mul(x, trace.Scalar(2)) }, rt.Donate(0))
	x, v := holdArray(r, holdN)
	ch := p.start(sumCall(f, x)) // compile outside the trials
	p.resume()
	require.NoError(t, (<-ch).err)
	_, err := double.Call(x)
	require.NoError(t, err)
	wrong, failed, waited := 0, 0, 0
	for trial := range 20 {
		x, v = holdArray(r, holdN)
		want := sumSquare(v, holdN)
		var ch <-chan callResult
		paused := trial%2 == 0
		if paused {
			ch = p.start(sumCall(f, x))
		} else {
			c := make(chan callResult, 1)
			go func() {
				v, err := sumCall(f, x)()
				c <- callResult{v, err}
			}()
			ch = c
		}
		type donated struct {
			out []any
			err error
		}
		dc := make(chan donated, 1)
		go func() {
			out, err := double.Call(x)
			dc <- donated{out, err}
		}()
		var d donated
		if paused {
			// The donation must wait for the stopped reader.
			select {
			case <-p.waiting:
				waited++
			case d = <-dc:
				t.Errorf("trial %d: the donating call did not wait for the call reading its argument (err %v)", trial, d.err)
			}
			churn(holdN)
			p.resume()
		}
		if d.out == nil && d.err == nil {
			d = <-dc
		}
		require.NoError(t, d.err, "trial %d", trial)
		churn(holdN)
		res := <-ch
		if res.err != nil {
			require.False(t, paused, "trial %d: a call that held the array failed: %v", trial, res.err)
			require.ErrorIs(t, res.err, rt.ErrDonated, "trial %d", trial)
			failed++
		} else if !closeTo(res.v, want, holdN) {
			t.Errorf("trial %d (stopped %v): sum %g, want %g", trial, paused, res.v, want)
			wrong++
		}
		y := d.out[0].(*trace.Array).Float32s()
		for i := range v {
			if y[i] != 2*v[i] {
				t.Fatalf("trial %d: donated result [%d] = %g, want %g", trial, i, y[i], 2*v[i])
			}
		}
		_, err := x.Literal()
		require.ErrorIs(t, err, rt.ErrDonated, "trial %d", trial)
	}
	t.Logf("20 trials: %d wrong, %d refused (donated before the call held it), %d donations waited for the reader", wrong, failed, waited)
}

// TestHoldsStress runs calls that read, calls that donate, eager ops and
// deletes on a shared set of arrays from several goroutines at once: every
// value that comes back is checked against float64 math, and every error is
// a deleted or donated array.
func TestHoldsStress(t *testing.T) {
	r := testseed.Rand(t, 1)
	const n, arrays, workers, rounds = 48, 6, 4, 60
	f := rt.NewJitted(func(x *trace.Array) *trace.Array { return trace.Sum(trace.MatMul(x, x)) })
	double := rt.NewJitted(func(x *trace.Array) *trace.Array { return trace.Mul(x, trace.Scalar(2)) }, rt.Donate(0))
	type slot struct {
		mu sync.Mutex
		x  *trace.Array
		v  []float32
	}
	slots := make([]*slot, arrays)
	for i := range slots {
		x, v := holdArray(r, n)
		slots[i] = &slot{x: x, v: v}
	}
	seeds := make([]uint64, workers)
	for i := range seeds {
		seeds[i] = r.Uint64()
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for w := range workers {
		wg.Go(func() {
			rw := rand.New(rand.NewPCG(seeds[w], uint64(w)))
			for range rounds {
				s := slots[rw.IntN(arrays)]
				s.mu.Lock()
				x, v := s.x, s.v
				s.mu.Unlock()
				switch rw.IntN(4) {
				case 0, 1: // read
					out, err := f.Call(x)
					if err != nil {
						if !errors.Is(err, rt.ErrDeleted) && !errors.Is(err, rt.ErrDonated) {
							errs <- err
						}
						continue
					}
					got, want := out[0].(*trace.Array).Float32s()[0], sumSquare(v, n)
					if !closeTo(got, want, n) {
						errs <- errors.New("wrong sum " + strconv.FormatFloat(float64(got), 'g', -1, 32) + ", want " + strconv.FormatFloat(want, 'g', -1, 64))
					}
				case 2: // donate, and put the result in the slot
					out, err := double.Call(x)
					if err != nil {
						if !errors.Is(err, rt.ErrDeleted) && !errors.Is(err, rt.ErrDonated) {
							errs <- err
						}
						continue
					}
					y := out[0].(*trace.Array)
					got := y.Float32s()
					for i := range v {
						if got[i] != 2*v[i] {
							errs <- errors.New("wrong donated result")
							break
						}
					}
					// Halve it back with an eager op, so that values stay bounded.
					h := trace.Mul(y, trace.Scalar(0.5))
					_ = y.Delete()
					s.mu.Lock()
					if s.x == x {
						s.x = h
					}
					s.mu.Unlock()
				case 3: // delete, and put a fresh array in the slot
					_ = x.Delete()
					nx, nv := holdArray(rw, n)
					s.mu.Lock()
					if s.x == x {
						s.x, s.v = nx, nv
					}
					s.mu.Unlock()
					churn(n)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
