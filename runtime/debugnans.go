package runtime

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// EnvDebugNans turns on NaN and Inf checking (see SetDebugNans) when set to 1
// or true, like JAX's jax_debug_nans.
const EnvDebugNans = "FERRY_DEBUG_NANS"

var debugNans atomic.Bool

func init() {
	v := strings.TrimSpace(os.Getenv(EnvDebugNans))
	on, err := strconv.ParseBool(v)
	debugNans.Store(v != "" && (err != nil || on))
}

// SetDebugNans turns NaN and Inf checking on or off and returns the previous
// setting; FERRY_DEBUG_NANS=1 turns it on at start. While it is on, an eager op
// or a jitted call that makes a NaN from operands without NaN, or an Inf from
// operands without NaN or Inf, fails with an error (a *trace.Error wrapping a
// *NaNError) that names the op and the Go file:line of the call that made it.
// Only floating-point results are checked; ops without operands (constants,
// such as a -inf mask) are not.
//
// A jitted call checks its results; when one holds a NaN or Inf it runs the
// traced function again op by op with the reference executor (no fusion) to
// find the first op that made it. Values that only come from NaN or Inf in the
// arguments are no error. When it is off the checks cost nothing.
func SetDebugNans(on bool) (was bool) { return debugNans.Swap(on) }

// DebugNans reports whether NaN and Inf checking is on.
func DebugNans() bool { return debugNans.Load() }

// NaNError says which op made a NaN or Inf while debug NaN checking was on (see
// SetDebugNans). It reaches the caller inside a *trace.Error located at the op
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
			e.Func, e.Call, e.Value, e.Result, e.Index, EnvDebugNans)
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
	return fmt.Sprintf("produced %s (%s) from %s%s (%s)", e.Value, where, from, in, EnvDebugNans)
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

func (n nonFinite) any() bool { return n.nan >= 0 || n.inf >= 0 }

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
// it made a NaN from operands without NaN, or an Inf from operands without NaN
// or Inf; nil otherwise. Ops without operands are never blamed.
func blame(ins, outs []*ir.Literal, scan func(*ir.Literal) nonFinite) *NaNError {
	if len(ins) == 0 {
		return nil
	}
	var found *NaNError
	inspected := false
	var inNaN, inInf bool
	for r, o := range outs {
		s := scan(o)
		if !s.any() {
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
		case s.nan >= 0 && !inNaN:
			return &NaNError{Value: "NaN", Result: r, Index: s.nan}
		case s.inf >= 0 && !inNaN && !inInf && found == nil:
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
func checkEagerNaNs(build func() *ir.Func, args, outs []trace.Buffer) error {
	outLits, err := bufferLiterals(outs)
	if err != nil {
		return nil // results that cannot be read back are not this check's business
	}
	found := false
	for _, o := range outLits {
		if scanNonFinite(o).any() {
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
	e := blame(inLits, outLits, scanNonFinite)
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
func (e *entry) checkNaNs(bufs []trace.Buffer, snap []*ir.Literal, outBufs []trace.Buffer) error {
	outLits, err := bufferLiterals(outBufs)
	if err != nil {
		return nil
	}
	bad, badAt := -1, nonFinite{}
	for i, o := range outLits {
		if s := scanNonFinite(o); s.any() {
			bad, badAt = i, s
			break
		}
	}
	if bad < 0 {
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
	ne, results, err := locateNaN(f, args)
	if err != nil {
		return trace.WrapError("rt.Jit", fmt.Errorf("%s: result %d holds a NaN or Inf, and running %s op by op to find where failed: %w", EnvDebugNans, bad, f.Name, err))
	}
	if ne != nil {
		ne.Func, ne.Call = f.Name, call
		return ne.traceError()
	}
	if s := scanNonFinite(results[bad]); !s.any() {
		ne := &NaNError{Func: f.Name, Call: call, Result: bad}
		if badAt.nan >= 0 {
			ne.Value, ne.Index = "NaN", badAt.nan
		} else {
			ne.Value, ne.Index = infName(badAt.infNeg), badAt.inf
		}
		return ne.traceError()
	}
	return nil // it came from NaN or Inf in the arguments or constants
}

// locateNaN runs f's body op by op with the reference executor and returns the
// first op that made a NaN or Inf (see blame), looking inside scan, while, cond
// and fusion bodies; else nil and the results.
func locateNaN(f *ir.Func, args []*ir.Literal) (*NaNError, []*ir.Literal, error) {
	seen := map[*ir.Literal]nonFinite{}
	scan := func(l *ir.Literal) nonFinite {
		s, ok := seen[l]
		if !ok {
			s = scanNonFinite(l)
			seen[l] = s
		}
		return s
	}
	return walkRegion(f.Body, args, scan)
}

// walkRegion is locateNaN for one region.
func walkRegion(r *ir.Region, args []*ir.Literal, scan func(*ir.Literal) nonFinite) (*NaNError, []*ir.Literal, error) {
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
		if ne := blame(ins, outs, scan); ne != nil {
			if len(op.Regions) > 0 {
				if inner, err := descend(op, ins, scan); err == nil && inner != nil {
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
func descend(op *ir.Op, x []*ir.Literal, scan func(*ir.Literal) nonFinite) (*NaNError, error) {
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
			ne, res, err := walkRegion(body, in, scan)
			if err != nil || ne != nil {
				return where(ne, fmt.Sprintf("scan iteration %d", i)), err
			}
			copy(in[nc:nc+nk], res[:nk])
		}
	case ir.While:
		nc := op.Attrs.Int("num_consts")
		in := append([]*ir.Literal(nil), x...)
		for it := 0; ; it++ {
			ne, c, err := walkRegion(op.Regions[0], in, scan)
			if err != nil || ne != nil {
				return where(ne, fmt.Sprintf("while condition, iteration %d", it)), err
			}
			if c[0].Data[0] == 0 {
				break
			}
			ne, st, err := walkRegion(op.Regions[1], in, scan)
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
		ne, _, err := walkRegion(op.Regions[branch], x[1:], scan)
		return where(ne, name), err
	case ir.Fusion:
		ne, _, err := walkRegion(op.Regions[0], x, scan)
		return where(ne, "fusion"), err
	}
	return nil, nil
}
