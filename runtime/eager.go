package runtime

import (
	"sync"
	"sync/atomic"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// eagerExecutor runs single ops for eager mode, compiling each op signature once.
type eagerExecutor struct{}

var (
	eagerCache  sync.Map // key → *eagerEntry
	eagerHits   atomic.Int64
	eagerMisses atomic.Int64
)

func (eagerExecutor) FromLiteral(l *ir.Literal) (trace.Buffer, error) {
	return DefaultBackend().FromLiteral(l)
}

func (eagerExecutor) Execute(key string, build func() *ir.Func, args []trace.Buffer) ([]trace.Buffer, error) {
	ex, err := eagerCompile(key, build)
	if err != nil {
		return nil, err
	}
	outs, err := ex.Execute(args, ExecOptions{})
	if mode := debugChecks.Load(); err == nil && mode != 0 {
		if err := checkEagerNaNs(mode, build, args, outs); err != nil {
			return nil, err
		}
	}
	return outs, err
}

// eagerEntry is one op signature's executable, or the compile in flight.
type eagerEntry struct {
	ready chan struct{}
	ex    Executable
	err   error
}

// eagerCompile returns the executable for key, compiling build() once per key:
// concurrent first uses wait for one compile and share its result or error. A
// failed compile leaves the cache; an empty key is never cached.
func eagerCompile(key string, build func() *ir.Func) (Executable, error) {
	if key == "" {
		eagerMisses.Add(1)
		return DefaultBackend().Compile(build(), CompileOptions{})
	}
	if v, ok := eagerCache.Load(key); ok {
		// The common case, without making an entry.
		e := v.(*eagerEntry)
		eagerHits.Add(1)
		<-e.ready
		return e.ex, e.err
	}
	fresh := &eagerEntry{ready: make(chan struct{})}
	v, loaded := eagerCache.LoadOrStore(key, fresh)
	e := v.(*eagerEntry)
	if loaded {
		eagerHits.Add(1)
		<-e.ready
		return e.ex, e.err
	}
	eagerMisses.Add(1)
	func() {
		defer close(e.ready)
		defer trace.Recover(&e.err)
		e.ex, e.err = DefaultBackend().Compile(build(), CompileOptions{})
	}()
	if e.err != nil {
		eagerCache.CompareAndDelete(key, e)
	}
	return e.ex, e.err
}

// EagerCacheStats returns the hits and misses of the eager op cache.
func EagerCacheStats() (hits, misses int64) { return eagerHits.Load(), eagerMisses.Load() }
