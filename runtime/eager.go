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
	eagerCache  sync.Map // key → Executable
	eagerHits   atomic.Int64
	eagerMisses atomic.Int64
)

func (eagerExecutor) FromLiteral(l *ir.Literal) (trace.Buffer, error) {
	return DefaultBackend().FromLiteral(l)
}

func (eagerExecutor) Execute(key string, build func() *ir.Func, args []trace.Buffer) ([]trace.Buffer, error) {
	be := DefaultBackend()
	if key != "" {
		if ex, ok := eagerCache.Load(key); ok {
			eagerHits.Add(1)
			return ex.(Executable).Execute(args, ExecOptions{})
		}
	}
	eagerMisses.Add(1)
	ex, err := be.Compile(build(), CompileOptions{})
	if err != nil {
		return nil, err
	}
	if key != "" {
		eagerCache.Store(key, ex)
	}
	return ex.Execute(args, ExecOptions{})
}

// EagerCacheStats returns the hits and misses of the eager op cache.
func EagerCacheStats() (hits, misses int64) { return eagerHits.Load(), eagerMisses.Load() }
