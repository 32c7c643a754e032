package runtime

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/runtime/budget"
	"github.com/ferryml/ferry/trace"
)

// Option configures Jit.
type Option func(*jitOptions)

type jitOptions struct {
	name         string
	donate       []int
	outSpaces    map[int]ir.MemorySpace
	inShardings  *shardingSpec
	outShardings *shardingSpec
	budget       int64 // MemoryBudget: bytes, or budgetDevice
	budgetSet    bool
	rates        *budget.Rates // BudgetRates: the planner's rates, else measured
	overlap      *bool         // BudgetCopiesOverlap, else the backend's
	collective   *float64      // BudgetCollectiveBandwidth: collectives' bus bytes/s
	probe        bool          // the rate probes: never planned nor dumped
}

// InShardings lays the arguments out over a device mesh, like jax.jit's
// in_shardings, read as a tree prefix of the arguments:
//
//   - one sharding applies to every array of every argument;
//   - one sharding per argument applies to every array leaf of that
//     argument, whatever its tree: rt.InShardings(replicated, batchRows) for
//     f(params Params, batch Batch) replicates every array of params and
//     splits every array of the batch;
//   - one sharding per leaf (the array leaves of all arguments in order) is
//     also accepted when the count is not the number of arguments; fewer
//     lay out the first leaves only.
//
// nil leaves an argument as it comes. InShardingsTree takes a tree prefix
// of each argument for finer control. The function runs partitioned over the
// mesh (see OutShardings): an argument laid out otherwise is copied into the
// layout for each call, so put arrays there once with DevicePut.
//
// A sharding that does not fit its argument (a mesh axis that does not
// divide the dimension it splits) is an error naming the caller's line;
// so is a mesh with more devices than the backend has.
func InShardings(shardings ...*ir.NamedSharding) Option {
	return func(o *jitOptions) {
		o.inShardings = &shardingSpec{what: "InShardings", flat: slices.Clone(shardings)}
	}
}

// InShardingsTree is InShardings given as tree prefixes, as jax.jit's
// in_shardings takes them: one prefix per argument (or one for all), each a
// *ir.NamedSharding for every array below it, nil for none, or a container
// mirroring the argument (a struct or a map[string]any of its field names, a
// slice of its length, a map of its keys; see trace.BroadcastPrefix):
//
//	// step(p Params, b Batch), Params{Embed *trace.Array; Layers []Layer}
//	rt.InShardingsTree(map[string]any{"Embed": vocabSplit, "Layers": replicated}, batchRows)
//
// A prefix that does not fit its argument is an error naming the argument
// and the path in it.
func InShardingsTree(prefixes ...any) Option {
	return func(o *jitOptions) {
		o.inShardings = &shardingSpec{what: "InShardingsTree", trees: slices.Clone(prefixes), tree: true}
	}
}

// OutShardings lays the results out over a device mesh, like jax.jit's
// out_shardings, read as InShardings reads its values: one for every array,
// one per result (for every array leaf of it), or one per array leaf of all
// results (fewer lay out the first leaves only); nil lets the compiler
// choose. OutShardingsTree takes tree prefixes of the results.
//
// A function whose arguments are sharded arrays (DevicePut), or that has
// InShardings, OutShardings or a trace.WithShardingConstraint, runs
// partitioned: the compiler propagates the shardings to every value
// (passes.AnalyzeShardings), splits the function into one program per
// device with the collectives it needs (passes.Partition), and runs it on
// every device of the mesh at once; its results are sharded arrays (Shards
// lists their blocks, ToDevice gathers one). Compiled.MemoryAnalysis is
// then the memory of each device.
func OutShardings(shardings ...*ir.NamedSharding) Option {
	return func(o *jitOptions) {
		o.outShardings = &shardingSpec{what: "OutShardings", flat: slices.Clone(shardings)}
	}
}

// OutShardingsTree is OutShardings given as tree prefixes of the results, one
// per result (or one for all), as InShardingsTree takes them for the
// arguments.
func OutShardingsTree(prefixes ...any) Option {
	return func(o *jitOptions) {
		o.outShardings = &shardingSpec{what: "OutShardingsTree", trees: slices.Clone(prefixes), tree: true}
	}
}

// OutSpaces places results in memory spaces, like jax.jit's out_shardings with a
// memory kind: spaces[i] is where every array of result i goes (for example
// ir.PinnedHost to write new optimizer state back to host memory). Results not
// named stay where the function computed them. Arguments always stay where
// they are.
func OutSpaces(spaces ...ir.MemorySpace) Option {
	return func(o *jitOptions) {
		for i, sp := range spaces {
			OutSpace(i, sp)(o)
		}
	}
}

// OutSpace places result i in a memory space (see OutSpaces).
func OutSpace(i int, space ir.MemorySpace) Option {
	return func(o *jitOptions) {
		if o.outSpaces == nil {
			o.outSpaces = map[int]ir.MemorySpace{}
		}
		o.outSpaces[i] = space
	}
}

func sortedKeys(m map[int]ir.MemorySpace) []int {
	ks := make([]int, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	return ks
}

// Donate marks arguments (by position) as donated, like jax.jit's
// donate_argnums: their buffers may be reused for results, so a training step
// can update parameters and optimizer state in place. A donated array cannot be
// used after the call; trying is an error that names where it was donated.
func Donate(argnums ...int) Option {
	return func(o *jitOptions) { o.donate = append(o.donate, argnums...) }
}

// WithName names the traced function in its IR (default: the Go function's name).
func WithName(name string) Option { return func(o *jitOptions) { o.name = name } }

// CacheStats counts compile cache hits and misses.
type CacheStats struct {
	Hits, Misses int64
}

var globalHits, globalMisses atomic.Int64

// JitCacheStats returns the compile cache hits and misses of all jitted functions.
func JitCacheStats() CacheStats {
	return CacheStats{Hits: globalHits.Load(), Misses: globalMisses.Load()}
}

var errorType = reflect.TypeFor[error]()

// Jitted is a function compiled on demand: it is traced into IR once per input
// signature (tree structure and abstract values of the array leaves), compiled by
// the default backend, cached, and executed. It is safe for concurrent use:
// concurrent first calls with one signature compile it once, the other callers
// wait for that compile and share its executable (or its error).
type Jitted[F any] struct {
	fn       reflect.Value
	ftype    reflect.Type
	opts     jitOptions
	errLast  bool
	mu       sync.Mutex
	cache    map[string]*entry
	hits     atomic.Int64
	misses   atomic.Int64
	last     atomic.Pointer[entry] // the entry of the last call on arrays alone
	wrapped  F
	location string
}

type entry struct {
	// ready is closed when the compile that makes the entry has finished;
	// err is its error (then the entry has left the cache). Entries made by
	// Lowered.Compile are ready from the start (ready is nil).
	ready   chan struct{}
	err     error
	lowered *Lowered
	exe     Executable
	outDefs []*trace.TreeDef
	// When every argument is one array: their types and weak flags, which
	// a call matching them may use the entry by (Jitted.last) without
	// building the cache key.
	argTypes []ir.Type
	argWeak  []bool
}

// matches reports whether arguments with these tree structures and leaves
// have e's signature (false if e has no argTypes).
func (e *entry) matches(defs []*trace.TreeDef, leaves []*trace.Array) bool {
	if len(e.argTypes) == 0 || len(defs) != len(e.argTypes) || len(leaves) != len(e.argTypes) {
		return false
	}
	for i, l := range leaves {
		if defs[i] != arrayDef || l == nil || l.IsWeak() != e.argWeak[i] || !l.HasType(e.argTypes[i]) {
			return false
		}
	}
	return true
}

// Jit returns a function of the same type as fn that traces, compiles and runs fn.
// Arguments and results may be any trees of *trace.Array (structs, slices, maps,
// pointers); other values in them are static and part of the cache key. If fn's
// last result is an error, failures are returned there; otherwise they panic with
// a *trace.Error naming the caller's line (which wraps the error it reports, such
// as a *MemoryBudgetError: errors.As finds it). Called while another function is
// being traced, the jitted function is inlined.
func Jit[F any](fn F, opts ...Option) F { return NewJitted(fn, opts...).Fn() }

// NewJitted is Jit returning the *Jitted, which also gives the error-returning
// Call, Lower and the cache statistics.
func NewJitted[F any](fn F, opts ...Option) *Jitted[F] {
	v := reflect.ValueOf(fn)
	if v.Kind() != reflect.Func || v.IsNil() {
		panic(trace.Errorf("rt.Jit", "want a non-nil function, got %T", fn))
	}
	j := &Jitted[F]{fn: v, ftype: v.Type(), cache: map[string]*entry{}}
	for _, o := range opts {
		o(&j.opts)
	}
	if j.opts.name == "" {
		j.opts.name = funcName(v)
	}
	t := j.ftype
	j.errLast = t.NumOut() > 0 && t.Out(t.NumOut()-1) == errorType
	file, line := trace.CallerLocation()
	j.location = fmt.Sprintf("%s:%d", file, line)
	if f, ok := fastWrapper(j); ok {
		j.wrapped = f
		return j
	}
	wrapped := reflect.MakeFunc(t, func(in []reflect.Value) []reflect.Value {
		args := make([]any, len(in))
		for i, a := range in {
			args[i] = a.Interface()
		}
		outs, err := j.call(args)
		nres := t.NumOut()
		res := make([]reflect.Value, nres)
		if err != nil {
			if !j.errLast {
				panic(asTraceError(err))
			}
			for i := range res {
				res[i] = reflect.Zero(t.Out(i))
			}
			res[nres-1] = reflect.ValueOf(&err).Elem()
			return res
		}
		for i, o := range outs {
			if o == nil {
				res[i] = reflect.Zero(t.Out(i))
			} else {
				res[i] = reflect.ValueOf(o)
			}
		}
		if j.errLast {
			res[nres-1] = reflect.Zero(errorType)
		}
		return res
	})
	j.wrapped = wrapped.Interface().(F)
	return j
}

func funcName(v reflect.Value) string {
	name := "main"
	if f := reflectFuncForPC(v.Pointer()); f != "" {
		name = f
		if i := strings.LastIndexByte(name, '/'); i >= 0 {
			name = name[i+1:]
		}
		name = strings.NewReplacer(".", "_", "-", "_", "(", "", ")", "", "*", "").Replace(name)
	}
	return name
}

// Fn returns the jitted function, of the same type as the original.
func (j *Jitted[F]) Fn() F { return j.wrapped }

// Stats returns this function's compile cache hits and misses.
func (j *Jitted[F]) Stats() CacheStats {
	return CacheStats{Hits: j.hits.Load(), Misses: j.misses.Load()}
}

// Call runs the function on args and returns its results (the error result, if
// fn has one, is returned as the error), or an error instead of panicking.
func (j *Jitted[F]) Call(args ...any) ([]any, error) { return j.call(args) }

// Lower traces the function for these arguments without running it.
func (j *Jitted[F]) Lower(args ...any) (l *Lowered, err error) {
	defer trace.Recover(&err)
	var defs []*trace.TreeDef
	l, defs, err = j.lower(args)
	if l != nil {
		l.outDefs = defs
	}
	return l, err
}

func (j *Jitted[F]) numResults() int {
	n := j.ftype.NumOut()
	if j.errLast {
		n--
	}
	return n
}

func (j *Jitted[F]) checkArgs(args []any) error {
	t := j.ftype
	if t.IsVariadic() {
		if len(args) < t.NumIn()-1 {
			return trace.Errorf("rt.Jit", "%s takes at least %d arguments, got %d", j.opts.name, t.NumIn()-1, len(args))
		}
	} else if len(args) != t.NumIn() {
		return trace.Errorf("rt.Jit", "%s takes %d arguments, got %d", j.opts.name, t.NumIn(), len(args))
	}
	for i, a := range args {
		if a == nil {
			continue
		}
		if at, want := reflect.TypeOf(a), j.argType(i); !at.AssignableTo(want) {
			return trace.Errorf("rt.Jit", "%s: argument %d has type %v, but the function takes %v there", j.opts.name, i, at, want)
		}
	}
	return nil
}

// call flattens the arguments, looks up or builds the executable and runs it.
func (j *Jitted[F]) call(args []any) (outs []any, err error) {
	defer trace.Recover(&err)
	s := getScratch()
	defer putScratch(s)
	e, err := j.prepare(s, args)
	if err != nil {
		return nil, err
	}
	if e == nil {
		return j.inline(args)
	}
	if err := e.execute(s, j.donationSite(), -1); err != nil {
		return nil, err
	}
	return e.results(s.arrays)
}

// callArray is call for a function whose first result is one
// *trace.Array: it returns that array without building the result slice
// (the other results, an error aside, are dropped).
func (j *Jitted[F]) callArray(s *callScratch, args []any) (out *trace.Array, err error) {
	defer trace.Recover(&err)
	e, err := j.prepare(s, args)
	if err != nil {
		return nil, err
	}
	var outs []any
	if e == nil {
		outs, err = j.inline(args)
	} else {
		if err := e.execute(s, j.donationSite(), -1); err != nil {
			return nil, err
		}
		if len(e.outDefs) > 0 && e.outDefs[0] == arrayDef && len(s.arrays) > 0 {
			return s.arrays[0], nil // the common case, without unflattening
		}
		outs, err = e.results(s.arrays)
	}
	if err != nil || len(outs) == 0 {
		return nil, err
	}
	out, _ = outs[0].(*trace.Array)
	return out, nil
}

// prepare checks and flattens the arguments into s and returns the cache
// entry for their signature, compiling it on a miss; a nil entry (and nil
// error) means the call is inside a trace and must be inlined.
func (j *Jitted[F]) prepare(s *callScratch, args []any) (*entry, error) {
	if err := j.checkArgs(args); err != nil {
		return nil, err
	}
	var err error
	s.leaves, s.defs, err = appendFlatArgs(s.leaves[:0], s.defs[:0], args)
	if err != nil {
		return nil, trace.Errorf("rt.Jit", "%s: %v", j.opts.name, err)
	}
	if trace.Current() != nil || anyTraced(s.leaves) {
		return nil, nil
	}
	if e := j.last.Load(); e != nil && e.matches(s.defs, s.leaves) {
		// The same signature as the last call: no key, no lock.
		j.hits.Add(1)
		globalHits.Add(1)
		return e, nil
	}
	s.key = appendSignature(s.key[:0], s.defs, s.leaves)
	e, err := j.entryFor(s.key, args)
	if err == nil && len(e.argTypes) > 0 {
		j.last.Store(e)
	}
	return e, err
}

// entryFor returns the cache entry for key, compiling it on a miss. Concurrent
// first calls with one key compile once: the first caller traces and compiles,
// the others wait for it and share its executable or its error (counted as
// hits). A failed compile is not cached; the next call tries again.
func (j *Jitted[F]) entryFor(key []byte, args []any) (*entry, error) {
	j.mu.Lock()
	e := j.cache[string(key)]
	owner := e == nil
	if owner {
		e = &entry{ready: make(chan struct{})}
		j.cache[string(key)] = e
	}
	j.mu.Unlock()
	if !owner {
		j.hits.Add(1)
		globalHits.Add(1)
		<-e.ready
		if e.err != nil {
			return nil, e.err
		}
		return e, nil
	}
	j.misses.Add(1)
	globalMisses.Add(1)
	e.err = j.build(e, args)
	if e.err != nil {
		j.mu.Lock()
		delete(j.cache, string(key))
		j.mu.Unlock()
	}
	if e.err == nil {
		if alt := e.lowered.hostSignature(args); alt != nil {
			// A call passing the arguments the plan places in pinned_host
			// there (the previous step's results) runs the same program.
			j.mu.Lock()
			if _, ok := j.cache[string(alt)]; !ok {
				j.cache[string(alt)] = e
			}
			j.mu.Unlock()
		}
	}
	close(e.ready)
	if e.err != nil {
		return nil, e.err
	}
	return e, nil
}

// build traces and compiles args' signature into e; a panic becomes the error.
func (j *Jitted[F]) build(e *entry, args []any) (err error) {
	defer trace.Recover(&err)
	l, outDefs, err := j.lower(args)
	if err != nil {
		return err
	}
	exe, err := l.compile()
	if err != nil {
		return trace.WrapError("rt.Jit", err)
	}
	for i, d := range outDefs {
		if d.NumLeaves() == 1 && d.String() == arrayDef.String() {
			outDefs[i] = arrayDef // a single array: results take it as it is
		}
	}
	l.outDefs = outDefs
	e.lowered, e.exe, e.outDefs = l, exe, outDefs
	if leaves, defs, err := flattenArgs(args); err == nil && len(leaves) == len(defs) && len(leaves) > 0 {
		e.argTypes, e.argWeak = make([]ir.Type, len(leaves)), make([]bool, len(leaves))
		for i, l := range leaves {
			if defs[i] != arrayDef || l == nil {
				e.argTypes, e.argWeak = nil, nil
				break
			}
			e.argTypes[i], e.argWeak[i] = l.Type(), l.IsWeak()
		}
	}
	return nil
}

// donationSite is the caller's file:line when the function donates arguments.
func (j *Jitted[F]) donationSite() string {
	if len(j.opts.donate) == 0 {
		return ""
	}
	file, line := trace.CallerLocation()
	return fmt.Sprintf("%s:%d", file, line)
}

// inline calls fn directly (a jitted function called inside another trace).
func (j *Jitted[F]) inline(args []any) ([]any, error) {
	in := make([]reflect.Value, len(args))
	for i, a := range args {
		in[i] = argValue(a, j.argType(i))
	}
	res := j.fn.Call(in)
	return j.splitResults(res)
}

func (j *Jitted[F]) argType(i int) reflect.Type {
	t := j.ftype
	if t.IsVariadic() && i >= t.NumIn()-1 {
		return t.In(t.NumIn() - 1).Elem()
	}
	return t.In(i)
}

func argValue(a any, t reflect.Type) reflect.Value {
	if a == nil {
		return reflect.Zero(t)
	}
	return reflect.ValueOf(a)
}

func (j *Jitted[F]) splitResults(res []reflect.Value) ([]any, error) {
	n := j.numResults()
	if j.errLast {
		if e := res[n]; !e.IsNil() {
			return nil, e.Interface().(error)
		}
	}
	outs := make([]any, n)
	for i := 0; i < n; i++ {
		outs[i] = res[i].Interface()
	}
	return outs, nil
}

func anyTraced(leaves []*trace.Array) bool {
	for _, l := range leaves {
		if l != nil && l.IsTraced() {
			return true
		}
	}
	return false
}

// arrayDef is the TreeDef of an argument that is one non-nil array.
var arrayDef = func() *trace.TreeDef {
	d, err := trace.Structure(new(trace.Array))
	if err != nil {
		panic(err)
	}
	return d
}()

func flattenArgs(args []any) ([]*trace.Array, []*trace.TreeDef, error) {
	return appendFlatArgs(make([]*trace.Array, 0, len(args)), make([]*trace.TreeDef, 0, len(args)), args)
}

// appendFlatArgs appends the leaves of args to leaves and the tree
// structure of each argument to defs.
func appendFlatArgs(leaves []*trace.Array, defs []*trace.TreeDef, args []any) ([]*trace.Array, []*trace.TreeDef, error) {
	for i, a := range args {
		if x, ok := a.(*trace.Array); ok && x != nil {
			// The common case, without reflection.
			leaves = append(leaves, x)
			defs = append(defs, arrayDef)
			continue
		}
		ls, d, err := trace.Flatten(a)
		if err != nil {
			return leaves, defs, fmt.Errorf("argument %d: %v", i, err)
		}
		leaves = append(leaves, ls...)
		defs = append(defs, d)
	}
	return leaves, defs, nil
}

// appendSignature appends the cache key to b: the tree structures and the
// leaves' abstract values (each leaf's type as ir.Type.String writes it, "~"
// for a weak type).
func appendSignature(b []byte, defs []*trace.TreeDef, leaves []*trace.Array) []byte {
	for _, d := range defs {
		b = append(b, d.String()...)
		b = append(b, '|')
	}
	for _, l := range leaves {
		b = l.Type().AppendText(b)
		if l.IsWeak() {
			b = append(b, '~')
		}
		b = append(b, ',')
	}
	return b
}

// lower traces fn on tracers standing for the arguments' leaves.
func (j *Jitted[F]) lower(args []any) (*Lowered, []*trace.TreeDef, error) {
	budget, err := j.opts.resolveBudget()
	if err != nil {
		return nil, nil, trace.Errorf("rt.Jit", "%s: %v", j.opts.name, err)
	}
	if budget > 0 {
		return j.lowerBudget(args, budget)
	}
	return j.lowerWith(args, nil, nil)
}

// lowerWith traces the function for args, with planner (when not nil)
// deciding the scan bodies' residuals (trace.Tracer.SetRematPlanner) and
// the argument leaves hostArgs marks (when not nil) in pinned_host.
func (j *Jitted[F]) lowerWith(args []any, planner trace.RematPlanner, hostArgs []bool) (*Lowered, []*trace.TreeDef, error) {
	if err := j.checkArgs(args); err != nil {
		return nil, nil, err
	}
	for _, a := range j.opts.donate {
		if a < 0 || a >= len(args) {
			return nil, nil, trace.Errorf("rt.Jit", "%s: Donate(%d) but the function takes %d arguments", j.opts.name, a, len(args))
		}
	}
	leaves, defs, err := flattenArgs(args)
	if err != nil {
		return nil, nil, trace.Errorf("rt.Jit", "%s: %v", j.opts.name, err)
	}
	tr := trace.NewFuncTracer(j.opts.name)
	if planner != nil {
		tr.SetRematPlanner(planner)
	}
	in, donated, err := j.traceParams(tr, leaves, defs, hostArgs)
	if err != nil {
		tr.Close()
		return nil, nil, err
	}
	outDefs, outLeaves, err := j.traceCall(tr, in, defs, hostArgs, donated)
	if err != nil {
		tr.Close()
		return nil, nil, err
	}
	results, err := j.traceOutputs(tr, outLeaves)
	tr.Close()
	if err != nil {
		return nil, nil, err
	}
	f := tr.Func()
	f.Body.Results = results
	l := &Lowered{Func: f, numArgs: len(leaves), consts: tr.Captures(), nilArgs: nilMask(leaves), donated: donated, argDefs: defs, noDump: j.opts.probe}
	if slices.Contains(hostArgs, true) {
		l.hostArgs = hostArgs
	}
	return l, outDefs, nil
}

// traceParams makes the parameters of the trace tr for the argument leaves
// (those hostArgs marks in pinned_host, the others like the leaf, laid out
// as InShardings says) and returns the arguments to call the function with,
// and which leaves the call donates.
func (j *Jitted[F]) traceParams(tr *trace.Tracer, leaves []*trace.Array, defs []*trace.TreeDef, hostArgs []bool) ([]reflect.Value, []bool, error) {
	params := make([]*trace.Array, len(leaves))
	inShardings, err := j.opts.inShardings.resolve("argument", defs)
	if err != nil {
		return nil, nil, trace.Errorf("rt.Jit", "%s: %v", j.opts.name, err)
	}
	for i, l := range leaves {
		if l == nil {
			continue
		}
		if i < len(hostArgs) && hostArgs[i] {
			params[i] = tr.HostParam(l.Type())
		} else {
			params[i] = tr.ParamLike(l)
		}
		if i < len(inShardings) && inShardings[i] != nil {
			if err = constrainIn(tr, params, i, inShardings[i]); err != nil {
				return nil, nil, err
			}
		}
	}
	in := make([]reflect.Value, len(defs))
	donated := make([]bool, len(leaves))
	k := 0
	for i, d := range defs {
		n := d.NumLeaves()
		for _, a := range j.opts.donate {
			if a == i {
				for q := k; q < k+n; q++ {
					donated[q] = true
				}
			}
		}
		v, err := d.Unflatten(params[k : k+n])
		if err != nil {
			return nil, nil, trace.Errorf("rt.Jit", "%s: argument %d: %v", j.opts.name, i, err)
		}
		k += n
		in[i] = argValue(v, j.argType(i))
	}
	return in, donated, nil
}

// traceCall calls the function on in inside the trace tr and returns the
// tree structure and leaves of each result, placed as OutSpaces says (or,
// for the new value of an argument hostArgs places in pinned_host, there)
// and laid out as OutShardings says.
func (j *Jitted[F]) traceCall(tr *trace.Tracer, in []reflect.Value, defs []*trace.TreeDef, hostArgs, donated []bool) (outDefs []*trace.TreeDef, outLeaves [][]*trace.Array, err error) {
	outDefs = make([]*trace.TreeDef, j.numResults())
	outLeaves = make([][]*trace.Array, j.numResults())
	tr.Push()
	defer tr.Pop()
	outs, err := j.splitResults(j.fn.Call(in))
	if err != nil {
		return nil, nil, err
	}
	for i, o := range outs {
		ls, d, ferr := trace.Flatten(o)
		if ferr != nil {
			return nil, nil, trace.Errorf("rt.Jit", "%s: result %d: %v", j.opts.name, i, ferr)
		}
		if sp, ok := j.opts.outSpaces[i]; ok {
			for k, l := range ls {
				if l != nil {
					ls[k] = trace.DevicePut(l, sp)
				}
			}
		} else if q := replacedLeaves(defs, d, i, hostArgs, donated); q != nil {
			// The new value of an argument placed in pinned_host
			// goes there too: the next call finds it there.
			for k, l := range ls {
				if l != nil && q[k] {
					ls[k] = trace.DevicePut(l, ir.PinnedHost)
				}
			}
		}
		outDefs[i], outLeaves[i] = d, ls
	}
	outShardings, serr := j.opts.outShardings.resolve("result", outDefs)
	if serr != nil {
		return nil, nil, trace.Errorf("rt.Jit", "%s: %v", j.opts.name, serr)
	}
	k := 0
	for _, ls := range outLeaves {
		for q, l := range ls {
			if k < len(outShardings) && outShardings[k] != nil && l != nil {
				ls[q] = trace.WithShardingConstraint(l, outShardings[k])
			}
			k++
		}
	}
	return outDefs, outLeaves, nil
}

// traceOutputs checks OutSpaces against the results and returns the IR
// values of the result leaves.
func (j *Jitted[F]) traceOutputs(tr *trace.Tracer, outLeaves [][]*trace.Array) ([]*ir.Value, error) {
	for _, i := range sortedKeys(j.opts.outSpaces) {
		if i < 0 || i >= len(outLeaves) {
			return nil, trace.Errorf("rt.Jit", "%s: OutSpaces names result %d but the function has %d results", j.opts.name, i, len(outLeaves))
		}
	}
	var results []*ir.Value
	for i, ls := range outLeaves {
		for _, l := range ls {
			if l == nil {
				continue
			}
			if l.IsTraced() && l.Tracer() != tr {
				return nil, trace.Errorf("rt.Jit", "%s: result %d is a tracer of another trace (leaked from an enclosing function?)", j.opts.name, i)
			}
			results = append(results, tr.Output(l))
		}
	}
	return results, nil
}

func nilMask(leaves []*trace.Array) []bool {
	m := make([]bool, len(leaves))
	for i, l := range leaves {
		m[i] = l == nil
	}
	return m
}

// run runs the executable on leaves, on the device of the committed ones.
func (e *entry) run(leaves []*trace.Array, site string) ([]any, error) {
	return e.runOn(leaves, site, -1)
}

// runOn runs the executable on leaves, on device dev (or, if dev < 0, on
// the device of the committed leaves).
func (e *entry) runOn(leaves []*trace.Array, site string, dev int) ([]any, error) {
	s := getScratch()
	defer putScratch(s)
	s.leaves = append(s.leaves[:0], leaves...)
	if err := e.execute(s, site, dev); err != nil {
		return nil, err
	}
	return e.results(s.arrays)
}

// execute runs the executable on s.leaves and sets s.arrays to the result
// leaves: on device want if want >= 0, else where placeArgs puts it.
func (e *entry) execute(s *callScratch, site string, want int) error {
	var err error
	s.bufs, err = e.lowered.appendBuffers(s.bufs[:0], s.leaves)
	if err != nil {
		return err
	}
	bufs := s.bufs
	if se, ok := e.exe.(*shardedExecutable); ok {
		return e.executeSharded(s, se, site, want)
	}
	if i := shardedArg(bufs); i >= 0 {
		return trace.Errorf("rt.Jit", "%s: %s", e.lowered.Func.Name, shardedArgError(e.lowered.leafName(i), bufs[i].Type()))
	}
	dev, commit, move, clash := placeArgs(bufs, want)
	if clash[0] >= 0 {
		return trace.Errorf("rt.Jit", "%s: %s", e.lowered.Func.Name, clashError(bufs, clash[0], clash[1], dev, e.lowered.leafName))
	}
	// The call holds its arguments while it runs: a Delete in another
	// goroutine leaves their memory in place until it is done, and a
	// donation waits for the calls that read the donated array.
	if err := backend.HoldArgs(bufs, e.lowered.donated, site); err != nil {
		return holdError("rt.Jit", e.lowered.Func.Name, err, e.lowered.leafName)
	}
	held := bufs
	if move {
		held = slices.Clone(bufs) // moveArgs replaces some of bufs by copies
	}
	defer backend.ReleaseArgs(held, e.lowered.donated)
	if move {
		copies, err := moveArgs(bufs, dev, e.lowered.donated, e.lowered.leafName)
		if err != nil {
			return trace.WrapError("rt.Jit", fmt.Errorf("%s: %w", e.lowered.Func.Name, err))
		}
		defer freeCopies(copies)
	}
	var snap []*ir.Literal
	checks := debugChecks.Load()
	if checks != 0 {
		snap = e.snapshotDonated(bufs)
	}
	outBufs, err := e.exe.Execute(bufs, ExecOptions{DonationSite: site, Results: s.outs[:cap(s.outs)], Device: dev, Commit: commit})
	if err != nil {
		return trace.WrapError("rt.Jit", err)
	}
	s.outs = outBufs
	if checks != 0 {
		if err := e.checkNaNs(checks, bufs, snap, outBufs); err != nil {
			return err
		}
	}
	s.arrays = s.arrays[:0]
	for _, b := range outBufs {
		s.arrays = append(s.arrays, trace.FromBuffer(b))
	}
	return nil
}

// asTraceError is err as the *trace.Error a jitted function without an error
// result panics with: err itself if it is one, else a *trace.Error naming
// the caller's line and wrapping err.
func asTraceError(err error) *trace.Error {
	te := trace.WrapError("rt.Jit", err)
	if te.Err == err {
		te.Msg = strings.TrimPrefix(te.Msg, "rt.Jit: ")
	}
	return te
}

// holdError is the error of op (on function fn, if named) for an error of
// backend.HoldArgs, with name naming the arguments; errors.Is still sees
// the reason (backend.ErrDeleted, backend.ErrDonated).
func holdError(op, fn string, err error, name func(int) string) *trace.Error {
	te := trace.WrapError(op, err)
	if he, ok := err.(*backend.HoldError); ok {
		te.Msg = he.Describe(name)
	}
	if fn != "" {
		te.Msg = fn + ": " + te.Msg
	}
	return te
}

// results builds the function's results from the result leaves.
func (e *entry) results(arrays []*trace.Array) ([]any, error) {
	outs := make([]any, len(e.outDefs))
	k := 0
	for i, d := range e.outDefs {
		n := d.NumLeaves()
		if d == arrayDef || (n == 1 && d.String() == arrayDef.String()) {
			outs[i] = arrays[k] // a single array, without reflection
			k++
			continue
		}
		v, err := d.Unflatten(arrays[k : k+n])
		if err != nil {
			return nil, trace.WrapError("rt.Jit", err)
		}
		k += n
		outs[i] = v
	}
	return outs, nil
}
