package runtime

import (
	"github.com/ferryml/ferry/internal/scratch"
	"sync"

	"github.com/ferryml/ferry/trace"
)

// callScratch is the memory one call of a jitted function works in: the
// flattened arguments, the cache key, the buffers passed to the executable
// and the result leaves. Calls take one from scratchPool and give it back,
// so that a cached call allocates only its results.
type callScratch struct {
	args   [4]any
	leaves []*trace.Array
	defs   []*trace.TreeDef
	key    []byte
	bufs   []trace.Buffer
	outs   []trace.Buffer
	arrays []*trace.Array
}

var scratchPool = sync.Pool{New: func() any { return new(callScratch) }}

func getScratch() *callScratch { return scratchPool.Get().(*callScratch) }

// putScratch clears s, so that it keeps no array alive, and pools it.
func putScratch(s *callScratch) {
	s.args = [4]any{}
	scratch.ClearSmall(s.leaves)
	scratch.ClearSmall(s.defs)
	scratch.ClearSmall(s.bufs)
	scratch.ClearSmall(s.outs)
	scratch.ClearSmall(s.arrays)
	s.leaves, s.defs, s.bufs, s.outs, s.arrays = s.leaves[:0], s.defs[:0], s.bufs[:0], s.outs[:0], s.arrays[:0]
	scratchPool.Put(s)
}

// fastWrapper returns the jitted function without reflect.MakeFunc for the
// common signatures: one to three *trace.Array arguments and one
// *trace.Array result, with or without an error result. ok is false for
// other signatures.
func fastWrapper[F any](j *Jitted[F]) (f F, ok bool) {
	must := func(out *trace.Array, err error) *trace.Array {
		if err != nil {
			panic(asTraceError(err))
		}
		return out
	}
	switch p := any(&f).(type) {
	case *func(*trace.Array) *trace.Array:
		*p = func(x *trace.Array) *trace.Array { return must(j.call1(x)) }
	case *func(*trace.Array, *trace.Array) *trace.Array:
		*p = func(x, y *trace.Array) *trace.Array { return must(j.call2(x, y)) }
	case *func(*trace.Array, *trace.Array, *trace.Array) *trace.Array:
		*p = func(x, y, z *trace.Array) *trace.Array { return must(j.call3(x, y, z)) }
	case *func(*trace.Array) (*trace.Array, error):
		*p = j.call1
	case *func(*trace.Array, *trace.Array) (*trace.Array, error):
		*p = j.call2
	case *func(*trace.Array, *trace.Array, *trace.Array) (*trace.Array, error):
		*p = j.call3
	default:
		return f, false
	}
	return f, true
}

// call1, call2 and call3 call a function of one, two or three arrays whose
// first result is an array.
func (j *Jitted[F]) call1(x *trace.Array) (*trace.Array, error) {
	s := getScratch()
	defer putScratch(s)
	s.args[0] = x
	return j.callArray(s, s.args[:1])
}

func (j *Jitted[F]) call2(x, y *trace.Array) (*trace.Array, error) {
	s := getScratch()
	defer putScratch(s)
	s.args[0], s.args[1] = x, y
	return j.callArray(s, s.args[:2])
}

func (j *Jitted[F]) call3(x, y, z *trace.Array) (*trace.Array, error) {
	s := getScratch()
	defer putScratch(s)
	s.args[0], s.args[1], s.args[2] = x, y, z
	return j.callArray(s, s.args[:3])
}
