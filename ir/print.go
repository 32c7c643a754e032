package ir

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// maxListedElements is the largest literal printed as a list of numbers.
const maxListedElements = 16

// Canonical NaN bit patterns printed as plain "nan": what math.NaN() gives in
// each dtype.
const (
	canonNaN16   = 0x7e00
	canonNaNBF16 = 0x7fc0
	canonNaN32   = 0x7fc00000
	canonNaN64   = 0x7ff8000000000001
)

// String returns the function in the text form that Parse reads (see Print).
// Parts that cannot be printed faithfully (nil values, unsupported attribute
// values) are shown in a form Parse rejects.
func (f *Func) String() string {
	var p printer
	p.fn(f)
	return p.b.String()
}

// Print writes f in the text form that Parse reads back:
//
//	func @main(%0: f32[2,3], %1: f32[3]) -> (f32[2,3]) {
//	  %2 = broadcast_in_dim(%1) {dims=[1], shape=[2,3]} : f32[2,3] loc("quick.go:12")
//	  %3 = add(%0, %2) : f32[2,3]
//	  %4 = constant() {value=dense<f16[2], [1, nan]>} : f16[2]
//	  return %3
//	}
//
// An op is its results (omitted when it has none), its name, its operands,
// its attributes sorted by name (omitted when it has none), its regions (each
// `^(params) { ops; return values }`), a colon and its result types, and the
// Go source position it came from. Attribute values print as:
//
//	int          5, -3
//	[]int        [1,2], []
//	float64      1.0, 2.5e-07, -0.0, inf, -inf, nan, nan(0x7ff8000000000002)
//	bool         true, false
//	string       "quoted" (strconv.Quote)
//	DType        f32
//	MemorySpace  #device, #pinned_host
//	*Literal     dense<f32[2], [1, 2.5]>, dense<f32[], 1.5>, dense<u8[20], 0x0102…>
//
// Types print as dtype[dims] followed, when the array lives outside device
// memory or is sharded, by braces holding the space and the sharding:
//
//	f32[2,3]  f16[2]{pinned_host}  f32[8,4]{sharding<mesh[x=2,y=4], [x,{}]>}
//	f32[8,4]{pinned_host, sharding<mesh[x=2,y=4,devices=[7,6,5,4,3,2,1,0]], [{x,y},{}]>}
//
// A sharding is its mesh (axis=size, major to minor, then the device list
// when it is not 0…N-1) and its partition spec (per dimension an axis, a
// braced list of axes split over their product, major first, or {} for a
// whole dimension); see Type.String, Mesh.String, PartitionSpec.String.
//
// Literals of at most 16 elements list their elements, the others give their
// raw little-endian bytes in hex; both forms keep every bit (NaN payloads, -0,
// subnormals). A float element is the shortest decimal that reads back to the
// same bits in the literal's dtype, or inf, -inf, nan (the NaN that Go's
// math.NaN converts to in that dtype) or nan(0xBITS).
//
// Print returns the write error, or else an error naming the first part of f
// that cannot be printed so that Parse recovers it (a nil value, op or region,
// an attribute value of an unsupported Go type); the text is written in full
// in either case.
func Print(w io.Writer, f *Func) error {
	var p printer
	p.fn(f)
	if _, err := io.WriteString(w, p.b.String()); err != nil {
		return err
	}
	return p.err
}

// String returns the op as one statement of the text form, without indentation
// or trailing newline; region ops span several lines.
func (o *Op) String() string {
	var p printer
	p.op(o, 0)
	return p.b.String()
}

type printer struct {
	b      strings.Builder
	err    error
	active map[*Region]bool // regions on the current nesting path, to stop on cycles
}

func (p *printer) fail(format string, args ...any) {
	if p.err == nil {
		p.err = fmt.Errorf("ir.Print: "+format, args...)
	}
}

func (p *printer) indent(n int) {
	for range n {
		p.b.WriteString("  ")
	}
}

func (p *printer) fn(f *Func) {
	if f == nil {
		p.b.WriteString("func <nil>\n")
		p.fail("nil function")
		return
	}
	p.b.WriteString("func @")
	p.b.WriteString(formatName(f.Name))
	if f.Body == nil {
		p.b.WriteString(" <nil body>\n")
		p.fail("function @%s has a nil body", f.Name)
		return
	}
	p.params(f.Body.Params)
	p.b.WriteString(" -> (")
	for i, v := range f.Body.Results {
		if i > 0 {
			p.b.WriteString(", ")
		}
		if v == nil {
			p.b.WriteString("<nil>")
			p.fail("function result %d is nil", i)
			continue
		}
		p.b.WriteString(v.Type.String())
	}
	p.b.WriteString(") ")
	p.block(f.Body, 0)
	p.b.WriteByte('\n')
}

// params writes "(%0: f32[2], %1: i32[])".
func (p *printer) params(ps []*Value) {
	p.b.WriteByte('(')
	for i, v := range ps {
		if i > 0 {
			p.b.WriteString(", ")
		}
		if v == nil {
			p.b.WriteString("%<nil>")
			p.fail("region parameter %d is nil", i)
			continue
		}
		p.value(v)
		p.b.WriteString(": ")
		p.b.WriteString(v.Type.String())
	}
	p.b.WriteByte(')')
}

// block writes "{\n ops \n return ...\n}" with the closing brace at depth.
func (p *printer) block(r *Region, depth int) {
	if p.active == nil {
		p.active = map[*Region]bool{}
	}
	p.active[r] = true
	defer delete(p.active, r)
	p.b.WriteString("{\n")
	for _, op := range r.Ops {
		p.indent(depth + 1)
		p.op(op, depth+1)
		p.b.WriteByte('\n')
	}
	p.indent(depth + 1)
	p.b.WriteString("return")
	for i, v := range r.Results {
		if i > 0 {
			p.b.WriteByte(',')
		}
		p.b.WriteByte(' ')
		p.value(v)
	}
	p.b.WriteByte('\n')
	p.indent(depth)
	p.b.WriteByte('}')
}

func (p *printer) value(v *Value) {
	if v == nil {
		p.b.WriteString("%<nil>")
		p.fail("nil value")
		return
	}
	p.b.WriteByte('%')
	p.b.WriteString(strconv.Itoa(v.ID))
}

// op writes one statement; depth is the indentation of the line it starts on.
func (p *printer) op(o *Op, depth int) {
	if o == nil {
		p.b.WriteString("<nil op>")
		p.fail("nil op")
		return
	}
	if len(o.Results) > 0 {
		for i, v := range o.Results {
			if i > 0 {
				p.b.WriteString(", ")
			}
			p.value(v)
		}
		p.b.WriteString(" = ")
	}
	p.b.WriteString(o.Code.String())
	p.b.WriteByte('(')
	for i, v := range o.Args {
		if i > 0 {
			p.b.WriteString(", ")
		}
		p.value(v)
	}
	p.b.WriteByte(')')
	if len(o.Attrs) > 0 {
		p.b.WriteString(" {")
		for i, k := range o.Attrs.Keys() {
			if i > 0 {
				p.b.WriteString(", ")
			}
			p.b.WriteString(formatName(k))
			p.b.WriteByte('=')
			if err := appendAttr(&p.b, o.Attrs[k]); err != nil {
				p.fail("%s attribute %q: %v", o.Code, k, err)
			}
		}
		p.b.WriteByte('}')
	}
	if len(o.Regions) > 0 {
		p.b.WriteString(" (\n")
		for i, r := range o.Regions {
			if i > 0 {
				p.b.WriteString(",\n")
			}
			p.indent(depth + 1)
			switch {
			case r == nil:
				p.b.WriteString("^<nil>")
				p.fail("%s: region %d is nil", o.Code, i)
			case p.active[r]:
				p.b.WriteString("^<cycle>")
				p.fail("%s: region %d contains itself", o.Code, i)
			default:
				p.b.WriteByte('^')
				p.params(r.Params)
				p.b.WriteByte(' ')
				p.block(r, depth+1)
			}
		}
		p.b.WriteByte(')')
	}
	if len(o.Results) > 0 {
		p.b.WriteString(" :")
		for i, v := range o.Results {
			if i > 0 {
				p.b.WriteByte(',')
			}
			p.b.WriteByte(' ')
			if v == nil {
				p.b.WriteString("<nil>")
				continue
			}
			p.b.WriteString(v.Type.String())
		}
	}
	if o.Loc != "" {
		p.b.WriteString(" loc(")
		p.b.WriteString(strconv.Quote(o.Loc))
		p.b.WriteByte(')')
	}
}

// isIdent reports whether s is [A-Za-z_][A-Za-z0-9_]*.
func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// formatName prints a function or attribute name bare when it is an
// identifier, quoted otherwise.
func formatName(s string) string {
	if isIdent(s) {
		return s
	}
	return strconv.Quote(s)
}

// appendAttr writes one attribute value.
func appendAttr(b *strings.Builder, v any) error {
	switch x := v.(type) {
	case int:
		b.WriteString(strconv.Itoa(x))
	case []int:
		b.WriteString(Shape(x).String())
	case float64:
		b.WriteString(formatFloatAttr(x))
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case string:
		b.WriteString(strconv.Quote(x))
	case DType:
		b.WriteString(x.String())
		if !x.Valid() {
			return fmt.Errorf("invalid dtype %d", uint8(x))
		}
	case MemorySpace:
		b.WriteByte('#')
		b.WriteString(x.String())
		if x >= numSpaces {
			return fmt.Errorf("invalid memory space %d", uint8(x))
		}
	case *Literal:
		return appendLiteral(b, x)
	default:
		fmt.Fprintf(b, "<unsupported %T>", v)
		return fmt.Errorf("unsupported attribute value of type %T", v)
	}
	return nil
}

// formatFloatAttr prints a float64 attribute so that it always reads back as a
// float64 with the same bits: it always has a '.' or an exponent, or is one of
// inf, -inf, nan, nan(0xBITS).
func formatFloatAttr(x float64) string {
	switch {
	case math.IsNaN(x):
		if bits := math.Float64bits(x); bits != canonNaN64 {
			return fmt.Sprintf("nan(0x%016x)", bits)
		}
		return "nan"
	case math.IsInf(x, 1):
		return "inf"
	case math.IsInf(x, -1):
		return "-inf"
	}
	s := strconv.FormatFloat(x, 'g', -1, 64)
	if !strings.ContainsAny(s, ".e") {
		s += ".0"
	}
	return s
}

// appendLiteral writes dense<type, data>.
func appendLiteral(b *strings.Builder, l *Literal) error {
	if l == nil {
		b.WriteString("dense<nil>")
		return errors.New("nil literal")
	}
	if l.Type.Sharding != nil {
		fmt.Fprintf(b, "dense<%v, …>", l.Type)
		return fmt.Errorf("literal of type %v: a literal's type has no sharding", l.Type)
	}
	b.WriteString("dense<")
	b.WriteString(l.Type.String())
	b.WriteString(", ")
	n := l.Type.Size()
	ok := l.Type.DType.Valid() && int64(len(l.Data)) == l.Type.Bytes()
	if ok && n <= maxListedElements && listable(l) {
		if l.Type.Rank() == 0 {
			appendElement(b, l, 0)
		} else {
			b.WriteByte('[')
			for i := range n {
				if i > 0 {
					b.WriteString(", ")
				}
				appendElement(b, l, i)
			}
			b.WriteByte(']')
		}
	} else {
		b.WriteString("0x")
		b.WriteString(hex.EncodeToString(l.Data))
	}
	b.WriteByte('>')
	if !ok {
		return fmt.Errorf("literal of type %v has %d bytes, want %d", l.Type, len(l.Data), l.Type.Bytes())
	}
	return nil
}

// listable reports whether every element prints as a number: bool bytes other
// than 0 and 1 need the hex form.
func listable(l *Literal) bool {
	if l.Type.DType != Bool {
		return true
	}
	for _, c := range l.Data {
		if c > 1 {
			return false
		}
	}
	return true
}

func appendElement(b *strings.Builder, l *Literal, i int) {
	switch l.Type.DType {
	case Bool:
		b.WriteString(strconv.FormatBool(l.Data[i] != 0))
	case Uint8:
		b.WriteString(strconv.FormatUint(uint64(l.Data[i]), 10))
	case Int32:
		b.WriteString(strconv.FormatInt(int64(View[int32](l)[i]), 10))
	case Int64:
		b.WriteString(strconv.FormatInt(View[int64](l)[i], 10))
	case Uint32:
		b.WriteString(strconv.FormatUint(uint64(View[uint32](l)[i]), 10))
	case Float16:
		h := View[F16](l)[i]
		b.WriteString(formatSmallFloat(uint16(h), h.Float64(), canonNaN16, func(v float64) uint16 { return uint16(F16FromFloat64(v)) }))
	case BFloat16:
		h := View[BF16](l)[i]
		b.WriteString(formatSmallFloat(uint16(h), h.Float64(), canonNaNBF16, func(v float64) uint16 { return uint16(BF16FromFloat64(v)) }))
	case Float32:
		x := View[float32](l)[i]
		bits := math.Float32bits(x)
		switch {
		case x != x && bits == canonNaN32:
			b.WriteString("nan")
		case x != x:
			fmt.Fprintf(b, "nan(0x%08x)", bits)
		default:
			b.WriteString(formatFinite(float64(x), strconv.FormatFloat(float64(x), 'g', -1, 32)))
		}
	case Float64:
		x := View[float64](l)[i]
		bits := math.Float64bits(x)
		switch {
		case x != x && bits == canonNaN64:
			b.WriteString("nan")
		case x != x:
			fmt.Fprintf(b, "nan(0x%016x)", bits)
		default:
			b.WriteString(formatFinite(x, strconv.FormatFloat(x, 'g', -1, 64)))
		}
	}
}

// formatFinite returns inf/-inf for infinities and s otherwise.
func formatFinite(x float64, s string) string {
	switch {
	case math.IsInf(x, 1):
		return "inf"
	case math.IsInf(x, -1):
		return "-inf"
	}
	return s
}

// formatSmallFloat prints a 16-bit float element with the fewest significant
// digits that read back (through float64 and round) to the same bits.
func formatSmallFloat(bits uint16, x float64, canon uint16, round func(float64) uint16) string {
	if x != x {
		if bits == canon {
			return "nan"
		}
		return fmt.Sprintf("nan(0x%04x)", bits)
	}
	if math.IsInf(x, 0) {
		return formatFinite(x, "")
	}
	for prec := 1; prec < 17; prec++ {
		s := strconv.FormatFloat(x, 'g', prec, 64)
		if v, err := strconv.ParseFloat(s, 64); err == nil && round(v) == bits {
			// Reprint the short decimal without the exponent that 'g' with a
			// precision forces on large values (6.55e+04 → 65500).
			return strconv.FormatFloat(v, 'g', -1, 64)
		}
	}
	return strconv.FormatFloat(x, 'g', -1, 64)
}
