package runtime

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// eagerExecutor runs single ops for eager mode, compiling each op signature once.
type eagerExecutor struct{}

var (
	eagerMu     sync.RWMutex
	eagerCache  = map[string]*eagerEntry{}
	eagerHits   atomic.Int64
	eagerMisses atomic.Int64
)

func (eagerExecutor) FromLiteral(l *ir.Literal) (trace.Buffer, error) {
	return DefaultBackend().FromLiteral(l)
}

func (e eagerExecutor) Execute(key string, build func() *ir.Func, args []trace.Buffer) ([]trace.Buffer, error) {
	return e.execute([]byte(key), build, args, nil)
}

// ExecuteOp runs op on args (trace.OpExecutor): a cache hit builds
// nothing and allocates only the results.
func (e eagerExecutor) ExecuteOp(op *trace.EagerOp, args []trace.Buffer, results []trace.Buffer) ([]trace.Buffer, error) {
	return e.execute(op.Key, op.Build, args, results)
}

func (eagerExecutor) execute(key []byte, build func() *ir.Func, args []trace.Buffer, results []trace.Buffer) ([]trace.Buffer, error) {
	if shardedArg(args) >= 0 {
		return executeSharded(key, build, args)
	}
	ex, err := eagerCompile(key, build)
	if err != nil {
		return nil, err
	}
	opts := ExecOptions{Results: results[:cap(results)]}
	var move bool
	var clash [2]int
	opts.Device, opts.Commit, move, clash = placeArgs(args, -1)
	if clash[0] >= 0 {
		return nil, fmt.Errorf("%s", clashError(args, clash[0], clash[1], opts.Device, operandName))
	}
	// The op holds its operands while it runs (see entry.execute).
	if err := backend.HoldArgs(args, nil, ""); err != nil {
		if he, ok := err.(*backend.HoldError); ok && he.Err != nil {
			return nil, fmt.Errorf("%s: %w", operandName(he.Arg), he.Err)
		}
		return nil, err
	}
	held := args
	if move {
		held = slices.Clone(args)
	}
	defer backend.ReleaseArgs(held, nil)
	if move {
		copies, err := moveArgs(args, opts.Device, nil, operandName)
		if err != nil {
			return nil, err
		}
		defer freeCopies(copies)
	}
	outs, err := ex.Execute(args, opts)
	if mode := debugChecks.Load(); err == nil && mode != 0 {
		if err := checkEagerNaNs(mode, build, args, outs); err != nil {
			return nil, err
		}
	}
	return outs, err
}

// operandName names operand i of an eager op.
func operandName(i int) string { return fmt.Sprintf("operand %d", i) }

// eagerEntry is one op signature's executable, or the compile in flight.
type eagerEntry struct {
	ready chan struct{}
	ex    Executable
	err   error
}

// eagerCompile returns the executable for key, compiling build() once per key:
// concurrent first uses wait for one compile and share its result or error. A
// failed compile leaves the cache; an empty key is never cached.
func eagerCompile(key []byte, build func() *ir.Func) (Executable, error) {
	if len(key) == 0 {
		eagerMisses.Add(1)
		return compileFunc(DefaultBackend(), build(), CompileOptions{})
	}
	eagerMu.RLock()
	e := eagerCache[string(key)]
	eagerMu.RUnlock()
	if e == nil {
		eagerMu.Lock()
		if e = eagerCache[string(key)]; e == nil {
			fresh := &eagerEntry{ready: make(chan struct{})}
			eagerCache[string(key)] = fresh
			eagerMu.Unlock()
			return compileEntry(string(key), fresh, build)
		}
		eagerMu.Unlock()
	}
	eagerHits.Add(1)
	<-e.ready
	return e.ex, e.err
}

// compileEntry compiles build() into the fresh entry e of key.
func compileEntry(key string, e *eagerEntry, build func() *ir.Func) (Executable, error) {
	eagerMisses.Add(1)
	func() {
		defer close(e.ready)
		defer trace.Recover(&e.err)
		e.ex, e.err = compileFunc(DefaultBackend(), build(), CompileOptions{})
	}()
	if e.err != nil {
		eagerMu.Lock()
		if eagerCache[key] == e {
			delete(eagerCache, key)
		}
		eagerMu.Unlock()
	}
	return e.ex, e.err
}

// EagerCacheStats returns the hits and misses of the eager op cache.
func EagerCacheStats() (hits, misses int64) { return eagerHits.Load(), eagerMisses.Load() }
