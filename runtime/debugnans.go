package runtime

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// Environment variables that turn on the checks of SetDebugNans and
// SetDebugInfs when set to 1 or true, like JAX's jax_debug_nans and
// jax_debug_infs.
const (
	EnvDebugNans = "FERRY_DEBUG_NANS"
	EnvDebugInfs = "FERRY_DEBUG_INFS"
)

// debugChecks holds the checks that are on: checkNaN, checkInf.
var debugChecks atomic.Uint32

const (
	checkNaN uint32 = 1 << iota
	checkInf
)

func init() {
	if settings.DebugNans.Get() {
		debugChecks.Or(checkNaN)
	}
	if settings.DebugInfs.Get() {
		debugChecks.Or(checkInf)
	}
}

func setCheck(bit uint32, on bool) (was bool) {
	var old uint32
	if on {
		old = debugChecks.Or(bit)
	} else {
		old = debugChecks.And(^bit)
	}
	return old&bit != 0
}

// SetDebugNans turns NaN checking on or off and returns the previous setting;
// FERRY_DEBUG_NANS=1 turns it on at start, like jax_debug_nans. While it is
// on, an eager op or a jitted call that makes a NaN from operands without NaN
// fails with an error (a *trace.Error wrapping a *NaNError) that names the op
// and the Go file:line of the call that made it. Only floating-point values
// are checked.
//
// A jitted call checks its results; when one holds a NaN it runs the traced
// function again op by op with the reference executor (no fusion, inside scan,
// while and cond bodies too) to find the first op that made it. NaNs that only
// come from NaNs in the arguments are no error. When the checks are off they
// cost one atomic load per call.
func SetDebugNans(on bool) (was bool) { return setCheck(checkNaN, on) }

// DebugNans reports whether NaN checking is on.
func DebugNans() bool { return debugChecks.Load()&checkNaN != 0 }

// SetDebugInfs turns Inf checking on or off and returns the previous setting;
// FERRY_DEBUG_INFS=1 turns it on at start, like jax_debug_infs. It works as
// SetDebugNans does, for an op that makes +Inf or -Inf from operands without
// NaN or Inf (log(0), 1/0, exp overflow). Ops without operands (a -inf mask
// constant) or whose operands are all empty (reduce_max of an empty axis is
// -Inf) are not blamed.
func SetDebugInfs(on bool) (was bool) { return setCheck(checkInf, on) }

// DebugInfs reports whether Inf checking is on.
func DebugInfs() bool { return debugChecks.Load()&checkInf != 0 }

// NaNError says which op made a NaN or Inf while NaN or Inf checking was on
// (see SetDebugNans and SetDebugInfs). It reaches the caller inside a *trace.Error located at the op
// (errors.As finds it).
type NaNError struct {
	// Func is the jitted function's name; empty for an eager op.
	Func string
	// Op is the op that made the value (for example "log" or "div"); empty
	// when the compiled function made it but the op-by-op run did not.
	Op string
	// Loc is the Go file:line of the user's call that made the op.
	Loc string
	// Value is "NaN", "+Inf" or "-Inf".
	Value string
	// Call is the Go file:line of the jitted call; empty for an eager op.
	Call string
	// Region says which region op (and iteration) the op ran in, innermost
	// first, e.g. "scan iteration 2 at model.go:40"; empty at the top level.
	Region string
	// Result is the op's result (or, with an empty Op, the function's result)
	// that holds the value, and Index the flat index of its first such element.
	Result, Index int
}

// Error formats the error as loc: op: what happened.
func (e *NaNError) Error() string {
	loc := ""
	if e.Loc != "" {
		loc = e.Loc + ": "
	}
	op := e.Op
	if op == "" {
		op = "rt.Jit"
	}
	return loc + op + ": " + e.message()
}

func (e *NaNError) message() string {
	if e.Op == "" {
		return fmt.Sprintf("jitted function %s called at %s produced %s in result %d (element %d) but running it op by op did not: the compiled code (fused, or summed in another order) made it (%s)",
			e.Func, e.Call, e.Value, e.Result, e.Index, e.env())
	}
	from := "operands without NaN"
	if e.Value != "NaN" {
		from = "operands without NaN or Inf"
	}
	in := ""
	if e.Func != "" {
		in = " in jitted function " + e.Func
	}
	if e.Call != "" {
		in += " called at " + e.Call
	}
	if e.Region != "" {
		in = " in " + e.Region + in
	}
	where := fmt.Sprintf("element %d", e.Index)
	if e.Result > 0 {
		where = fmt.Sprintf("result %d, %s", e.Result, where)
	}
	return fmt.Sprintf("produced %s (%s) from %s%s (%s)", e.Value, where, from, in, e.env())
}

// env names the switch that found the value.
func (e *NaNError) env() string {
	if e.Value == "NaN" {
		return EnvDebugNans
	}
	return EnvDebugInfs
}

// traceError wraps e for the caller: located at the op when its Loc is known,
// else at the user's call.
func (e *NaNError) traceError() *trace.Error {
	op := e.Op
	if op == "" {
		op = "rt.Jit"
	}
	te := &trace.Error{Op: op, Msg: e.message(), Err: e}
	if i := strings.LastIndexByte(e.Loc, ':'); i > 0 {
		if line, err := strconv.Atoi(e.Loc[i+1:]); err == nil {
			te.File, te.Line = e.Loc[:i], line
			return te
		}
	}
	te.File, te.Line = trace.CallerLocation()
	return te
}

// nonFinite is where a literal's first NaN and first Inf are (-1: none).
type nonFinite struct {
	nan, inf int
	infNeg   bool
}

// bad reports whether the literal holds a value the checks in mode look for.
func (n nonFinite) bad(mode uint32) bool {
	return mode&checkNaN != 0 && n.nan >= 0 || mode&checkInf != 0 && n.inf >= 0
}

// scanNonFinite finds the first NaN and the first Inf of a float literal by
// their bit patterns (all exponent bits set); other dtypes have none.
func scanNonFinite(l *ir.Literal) nonFinite {
	r := nonFinite{nan: -1, inf: -1}
	var size int
	var expMask, fracMask, signMask uint64
	switch l.Type.DType {
	case ir.Float16:
		size, expMask, fracMask, signMask = 2, 0x7c00, 0x03ff, 0x8000
	case ir.BFloat16:
		size, expMask, fracMask, signMask = 2, 0x7f80, 0x007f, 0x8000
	case ir.Float32:
		size, expMask, fracMask, signMask = 4, 0x7f800000, 0x007fffff, 0x80000000
	case ir.Float64:
		size, expMask, fracMask, signMask = 8, 0x7ff0000000000000, 0x000fffffffffffff, 1<<63
	default:
		return r
	}
	n := len(l.Data) / size
	for i := 0; i < n && (r.nan < 0 || r.inf < 0); i++ {
		var bits uint64
		switch size {
		case 2:
			bits = uint64(binary.LittleEndian.Uint16(l.Data[2*i:]))
		case 4:
			bits = uint64(binary.LittleEndian.Uint32(l.Data[4*i:]))
		default:
			bits = binary.LittleEndian.Uint64(l.Data[8*i:])
		}
		if bits&expMask != expMask {
			continue
		}
		if bits&fracMask != 0 {
			if r.nan < 0 {
				r.nan = i
			}
		} else if r.inf < 0 {
			r.inf, r.infNeg = i, bits&signMask != 0
		}
	}
	return r
}

// blame returns the NaNError for an op with operands ins and results outs when
// it made a NaN from operands without NaN (checkNaN in mode), or an Inf from
// operands without NaN or Inf (checkInf); nil otherwise. Ops without operands, or whose operands are all
// empty, are never blamed: like constants they make their values from nothing
// (reduce_max of an empty axis is -Inf by definition).
func blame(mode uint32, ins, outs []*ir.Literal, scan func(*ir.Literal) nonFinite) *NaNError {
	empty := true
	for _, in := range ins {
		empty = empty && len(in.Data) == 0
	}
	if empty {
		return nil
	}
	var found *NaNError
	inspected := false
	var inNaN, inInf bool
	for r, o := range outs {
		s := scan(o)
		if !s.bad(mode) {
			continue
		}
		if !inspected {
			inspected = true
			for _, in := range ins {
				si := scan(in)
				inNaN = inNaN || si.nan >= 0
				inInf = inInf || si.inf >= 0
			}
		}
		switch {
		case mode&checkNaN != 0 && s.nan >= 0 && !inNaN:
			return &NaNError{Value: "NaN", Result: r, Index: s.nan}
		case mode&checkInf != 0 && s.inf >= 0 && !inNaN && !inInf && found == nil:
			found = &NaNError{Value: infName(s.infNeg), Result: r, Index: s.inf}
		}
	}
	return found
}

func infName(neg bool) string {
	if neg {
		return "-Inf"
	}
	return "+Inf"
}

// bufferLiterals reads buffers back as host literals.
func bufferLiterals(bufs []trace.Buffer) ([]*ir.Literal, error) {
	ls := make([]*ir.Literal, len(bufs))
	for i, b := range bufs {
		l, err := b.Literal()
		if err != nil {
			return nil, err
		}
		ls[i] = l
	}
	return ls, nil
}

// checkEagerNaNs checks one eager op's results against its operands.
func checkEagerNaNs(mode uint32, build func() *ir.Func, args, outs []trace.Buffer) error {
	outLits, err := bufferLiterals(outs)
	if err != nil {
		return nil // results that cannot be read back are not this check's business
	}
	found := false
	for _, o := range outLits {
		if scanNonFinite(o).bad(mode) {
			found = true
			break
		}
	}
	if !found {
		return nil
	}
	inLits, err := bufferLiterals(args)
	if err != nil {
		return nil
	}
	e := blame(mode, inLits, outLits, scanNonFinite)
	if e == nil {
		return nil
	}
	f := build()
	e.Op = f.Name
	if len(f.Body.Ops) == 1 {
		e.Op = f.Body.Ops[0].Code.String()
	}
	file, line := trace.CallerLocation()
	e.Loc = file + ":" + strconv.Itoa(line)
	return e.traceError()
}

// snapshotDonated copies the donated arguments before a jitted call consumes
// them, so that a NaN found afterwards can be traced back.
func (e *entry) snapshotDonated(bufs []trace.Buffer) []*ir.Literal {
	var snap []*ir.Literal
	for i, d := range e.lowered.donated {
		if !d || i >= len(bufs) {
			continue
		}
		if snap == nil {
			snap = make([]*ir.Literal, len(bufs))
		}
		if l, err := bufs[i].Literal(); err == nil {
			snap[i] = l.Clone()
		}
	}
	return snap
}

// checkNaNs checks a jitted call's results; when one holds a NaN or Inf it
// re-runs the traced function op by op to find the op that made it.
func (e *entry) checkNaNs(mode uint32, bufs []trace.Buffer, snap []*ir.Literal, outBufs []trace.Buffer) error {
	outLits, err := bufferLiterals(outBufs)
	if err != nil {
		return nil
	}
	bad := map[int]nonFinite{} // results holding what the checks look for
	first := -1
	for i, o := range outLits {
		if s := scanNonFinite(o); s.bad(mode) {
			bad[i] = s
			if first < 0 {
				first = i
			}
		}
	}
	if first < 0 {
		return nil
	}
	args := make([]*ir.Literal, len(bufs))
	for i, b := range bufs {
		if snap != nil && snap[i] != nil {
			args[i] = snap[i]
			continue
		}
		l, err := b.Literal()
		if err != nil {
			return nil // a donated argument that could not be kept
		}
		args[i] = l
	}
	f := e.lowered.Func
	file, line := trace.CallerLocation()
	call := file + ":" + strconv.Itoa(line)
	ne, results, err := locateNaN(mode, f, args)
	if err != nil {
		return trace.WrapError("rt.Jit", fmt.Errorf("debug checks: result %d holds a NaN or Inf, and running %s op by op to find where failed: %w", first, f.Name, err))
	}
	if ne != nil {
		ne.Func, ne.Call = f.Name, call
		return ne.traceError()
	}
	for i := range outLits {
		at, ok := bad[i]
		if !ok || scanNonFinite(results[i]).bad(mode) {
			continue
		}
		ne := &NaNError{Func: f.Name, Call: call, Result: i}
		if mode&checkNaN != 0 && at.nan >= 0 {
			ne.Value, ne.Index = "NaN", at.nan
		} else {
			ne.Value, ne.Index = infName(at.infNeg), at.inf
		}
		return ne.traceError()
	}
	return nil // it came from NaN or Inf in the arguments or constants
}

// locateNaN runs f's body op by op with the reference executor and returns the
// first op that made a NaN or Inf (see blame), looking inside scan, while, cond
// and fusion bodies; else nil and the results.
func locateNaN(mode uint32, f *ir.Func, args []*ir.Literal) (*NaNError, []*ir.Literal, error) {
	ck := &checker{mode: mode, seen: map[*ir.Literal]nonFinite{}}
	return walkRegion(f.Body, args, ck)
}

// checker is the checks in mode with a cache of scanned literals.
type checker struct {
	mode uint32
	seen map[*ir.Literal]nonFinite
}

func (c *checker) scan(l *ir.Literal) nonFinite {
	s, ok := c.seen[l]
	if !ok {
		s = scanNonFinite(l)
		c.seen[l] = s
	}
	return s
}

// walkRegion is locateNaN for one region.
func walkRegion(r *ir.Region, args []*ir.Literal, ck *checker) (*NaNError, []*ir.Literal, error) {
	if len(args) != len(r.Params) {
		return nil, nil, fmt.Errorf("%d arguments for %d parameters", len(args), len(r.Params))
	}
	env := make(map[*ir.Value]*ir.Literal, len(r.Params)+len(r.Ops))
	for i, p := range r.Params {
		env[p] = args[i]
	}
	last := make(map[*ir.Value]int, len(r.Ops))
	for i, op := range r.Ops {
		for _, a := range op.Args {
			last[a] = i
		}
	}
	for _, v := range r.Results {
		last[v] = math.MaxInt
	}
	for i, op := range r.Ops {
		ins := make([]*ir.Literal, len(op.Args))
		for j, a := range op.Args {
			ins[j] = env[a]
		}
		outs, err := eval.EvalOp(op, ins)
		if err != nil {
			return nil, nil, err
		}
		if ne := blame(ck.mode, ins, outs, ck.scan); ne != nil {
			if len(op.Regions) > 0 {
				if inner, err := descend(op, ins, ck); err == nil && inner != nil {
					return inner, nil, nil
				}
			}
			ne.Op, ne.Loc = op.Code.String(), op.Loc
			return ne, nil, nil
		}
		for j, v := range op.Results {
			env[v] = outs[j]
		}
		for _, a := range op.Args {
			if last[a] == i {
				delete(env, a)
			}
		}
	}
	res := make([]*ir.Literal, len(r.Results))
	for i, v := range r.Results {
		res[i] = env[v]
	}
	return nil, res, nil
}

// descend runs a region op's bodies op by op, as the reference executor runs
// the op, to find the op inside that made a NaN or Inf; the error says where.
func descend(op *ir.Op, x []*ir.Literal, ck *checker) (*NaNError, error) {
	where := func(ne *NaNError, what string) *NaNError {
		if ne != nil {
			in := what
			if op.Loc != "" {
				in += " at " + op.Loc
			}
			if ne.Region != "" {
				in = ne.Region + ", in " + in
			}
			ne.Region = in
		}
		return ne
	}
	switch op.Code {
	case ir.Scan:
		a := op.Attrs
		nc, nk, n := a.Int("num_consts"), a.Int("num_carry"), a.Int("length")
		body := op.Regions[0]
		in := append([]*ir.Literal(nil), x...)
		for it := 0; it < n; it++ {
			i := it
			if a.Bool("reverse") {
				i = n - 1 - it
			}
			for j, xl := range x[nc+nk:] {
				t := body.Params[nc+nk+j].Type
				sz := int(t.Bytes())
				in[nc+nk+j] = &ir.Literal{Type: t, Data: xl.Data[i*sz : (i+1)*sz]}
			}
			ne, res, err := walkRegion(body, in, ck)
			if err != nil || ne != nil {
				return where(ne, fmt.Sprintf("scan iteration %d", i)), err
			}
			copy(in[nc:nc+nk], res[:nk])
		}
	case ir.While:
		nc := op.Attrs.Int("num_consts")
		in := append([]*ir.Literal(nil), x...)
		for it := 0; ; it++ {
			ne, c, err := walkRegion(op.Regions[0], in, ck)
			if err != nil || ne != nil {
				return where(ne, fmt.Sprintf("while condition, iteration %d", it)), err
			}
			if c[0].Data[0] == 0 {
				break
			}
			ne, st, err := walkRegion(op.Regions[1], in, ck)
			if err != nil || ne != nil {
				return where(ne, fmt.Sprintf("while body, iteration %d", it)), err
			}
			copy(in[nc:], st)
		}
	case ir.Cond:
		branch, name := 1, "cond false branch"
		if x[0].Data[0] != 0 {
			branch, name = 0, "cond true branch"
		}
		ne, _, err := walkRegion(op.Regions[branch], x[1:], ck)
		return where(ne, name), err
	case ir.Fusion:
		ne, _, err := walkRegion(op.Regions[0], x, ck)
		return where(ne, "fusion"), err
	}
	return nil, nil
}
