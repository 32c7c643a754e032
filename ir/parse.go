package ir

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Limits that keep Parse cheap on hostile input.
const (
	// MaxParsedLiteralElements is the largest literal (in elements) Parse accepts.
	MaxParsedLiteralElements = 1 << 24
	// maxValueID is the largest value ID Parse accepts.
	maxValueID = math.MaxInt32
	// maxRegionDepth is how deeply Parse lets regions nest.
	maxRegionDepth = 256
)

// ParseError is an error in IR text: what was expected and what was found, at a
// 1-based line and column (the column counts bytes).
type ParseError struct {
	Line, Col int
	Msg       string
}

// Error formats the error as "line:col: message".
func (e *ParseError) Error() string { return fmt.Sprintf("%d:%d: %s", e.Line, e.Col, e.Msg) }

// Parse reads a function in the text form written by Print (see there for the
// syntax; whitespace is free and // starts a comment). Value IDs are kept;
// every op's result types are inferred again with InferTypes and must equal
// the printed ones apart from shardings, which are taken as printed and must
// be valid for their shapes; a value may be used only after its
// definition in the same region (regions are isolated from above). Errors are
// *ParseError values carrying the line and column. Parse never panics; it
// refuses literals of more than MaxParsedLiteralElements elements, shapes whose
// byte size overflows int64, and value IDs above 2³¹-1.
func Parse(src string) (f *Func, err error) {
	p := &parser{lx: lexer{src: src, line: 1}, ids: map[int]*Value{}}
	defer func() {
		if r := recover(); r != nil {
			pe, ok := r.(*ParseError)
			if !ok {
				panic(r)
			}
			f, err = nil, pe
		}
	}()
	p.next()
	return p.parseFunc(), nil
}

// ---- lexer ----

type tokKind uint8

const (
	tEOF     tokKind = iota
	tIdent           // f32, add, nan, -inf
	tValue           // %12 (text: digits)
	tName            // @main or @"a b" (text: the name)
	tSpace           // #pinned_host (text: the name)
	tNumber          // -12, 1.5e-3
	tHex             // 0x00ff (text: the digits)
	tString          // "..." (text: the unquoted value)
	tPunct           // ( ) { } [ ] < > , : = ^ ->
	tIllegal         // text: what is wrong
)

type token struct {
	kind      tokKind
	text      string
	raw       string // source text, for messages
	line, col int
}

type lexer struct {
	src       string
	pos       int
	line      int
	lineStart int
}

func isLetter(c byte) bool   { return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
func isDigit(c byte) bool    { return '0' <= c && c <= '9' }
func isHexDigit(c byte) bool { return isDigit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

func (lx *lexer) peek(off int) byte {
	if lx.pos+off < len(lx.src) {
		return lx.src[lx.pos+off]
	}
	return 0
}

func (lx *lexer) skip(pred func(byte) bool) {
	for lx.pos < len(lx.src) && pred(lx.src[lx.pos]) {
		lx.pos++
	}
}

func (lx *lexer) next() token {
	for lx.pos < len(lx.src) {
		c := lx.src[lx.pos]
		if c == '\n' {
			lx.pos++
			lx.line++
			lx.lineStart = lx.pos
		} else if c == ' ' || c == '\t' || c == '\r' {
			lx.pos++
		} else if c == '/' && lx.peek(1) == '/' {
			for lx.pos < len(lx.src) && lx.src[lx.pos] != '\n' {
				lx.pos++
			}
		} else {
			break
		}
	}
	t := token{line: lx.line, col: lx.pos - lx.lineStart + 1}
	start := lx.pos
	if lx.pos >= len(lx.src) {
		t.kind = tEOF
		return t
	}
	c := lx.src[lx.pos]
	switch {
	case isLetter(c) || c == '-' && isLetter(lx.peek(1)):
		lx.pos++
		lx.skip(func(c byte) bool { return isLetter(c) || isDigit(c) })
		t.kind, t.text = tIdent, lx.src[start:lx.pos]
	case c == '0' && (lx.peek(1) == 'x' || lx.peek(1) == 'X'):
		lx.pos += 2
		lx.skip(isHexDigit)
		t.kind, t.text = tHex, lx.src[start+2:lx.pos]
	case isDigit(c) || c == '-' && isDigit(lx.peek(1)):
		lx.pos++
		lx.skip(isDigit)
		if lx.peek(0) == '.' {
			lx.pos++
			lx.skip(isDigit)
		}
		if e := lx.peek(0); e == 'e' || e == 'E' {
			off := 1
			if s := lx.peek(1); s == '+' || s == '-' {
				off = 2
			}
			if isDigit(lx.peek(off)) {
				lx.pos += off
				lx.skip(isDigit)
			}
		}
		t.kind, t.text = tNumber, lx.src[start:lx.pos]
	case c == '%':
		lx.pos++
		lx.skip(isDigit)
		if lx.pos == start+1 {
			t.kind, t.text = tIllegal, "'%' not followed by a value number"
		} else {
			t.kind, t.text = tValue, lx.src[start+1:lx.pos]
		}
	case c == '#':
		lx.pos++
		lx.skip(func(c byte) bool { return isLetter(c) || isDigit(c) })
		t.kind, t.text = tSpace, lx.src[start+1:lx.pos]
	case c == '@':
		lx.pos++
		if lx.peek(0) == '"' {
			s, ok := lx.quoted()
			if !ok {
				t.kind, t.text = tIllegal, "malformed quoted function name"
				break
			}
			t.kind, t.text = tName, s
		} else {
			lx.skip(func(c byte) bool { return isLetter(c) || isDigit(c) })
			t.kind, t.text = tName, lx.src[start+1:lx.pos]
		}
	case c == '"':
		s, ok := lx.quoted()
		if !ok {
			t.kind, t.text = tIllegal, "malformed or unterminated string"
			break
		}
		t.kind, t.text = tString, s
	case c == '-' && lx.peek(1) == '>':
		lx.pos += 2
		t.kind, t.text = tPunct, "->"
	case strings.IndexByte("(){}[]<>,:=^", c) >= 0:
		lx.pos++
		t.kind, t.text = tPunct, lx.src[start:lx.pos]
	default:
		lx.pos++
		t.kind, t.text = tIllegal, fmt.Sprintf("unexpected character %q", c)
	}
	t.raw = lx.src[start:lx.pos]
	return t
}

// quoted reads a Go double-quoted string at lx.pos.
func (lx *lexer) quoted() (string, bool) {
	q, err := strconv.QuotedPrefix(lx.src[lx.pos:])
	if err != nil || q == "" || q[0] != '"' {
		// The error token starts at the quote; the parser stops there.
		lx.pos++
		return "", false
	}
	s, err := strconv.Unquote(q)
	if err != nil {
		lx.pos++
		return "", false
	}
	// A Go quoted string never spans lines, so line counting is unaffected.
	lx.pos += len(q)
	return s, true
}

// ---- parser ----

type parser struct {
	lx    lexer
	tok   token
	f     *Func
	ids   map[int]*Value // every value of the function, by ID
	depth int
}

// scope is the set of values visible in one region, by ID.
type scope map[int]*Value

func (p *parser) next() { p.tok = p.lx.next() }

func (p *parser) errAt(t token, format string, args ...any) {
	panic(&ParseError{Line: t.line, Col: t.col, Msg: fmt.Sprintf(format, args...)})
}

func describe(t token) string {
	switch t.kind {
	case tEOF:
		return "end of input"
	case tIllegal:
		return t.text
	}
	s := t.raw
	if len(s) > 24 {
		s = s[:24] + "…"
	}
	return strconv.Quote(s)
}

// expected reports that the current token is not what was wanted.
func (p *parser) expected(what string) {
	if p.tok.kind == tIllegal {
		p.errAt(p.tok, "expected %s, found %s", what, p.tok.text)
	}
	p.errAt(p.tok, "expected %s, found %s", what, describe(p.tok))
}

func (p *parser) isPunct(s string) bool { return p.tok.kind == tPunct && p.tok.text == s }
func (p *parser) isIdent(s string) bool { return p.tok.kind == tIdent && p.tok.text == s }

func (p *parser) expectPunct(s string) token {
	if !p.isPunct(s) {
		p.expected("'" + s + "'")
	}
	t := p.tok
	p.next()
	return t
}

func (p *parser) expectKind(k tokKind, what string) token {
	if p.tok.kind != k {
		p.expected(what)
	}
	t := p.tok
	p.next()
	return t
}

// list parses item (',' item)* up to the closing punctuation, which it consumes.
func (p *parser) list(closing string, item func()) {
	if p.isPunct(closing) {
		p.next()
		return
	}
	for {
		item()
		if p.isPunct(",") {
			p.next()
			continue
		}
		if !p.isPunct(closing) {
			p.expected("',' or '" + closing + "'")
		}
		p.next()
		return
	}
}

func (p *parser) parseFunc() *Func {
	if !p.isIdent("func") {
		p.expected("'func'")
	}
	p.next()
	name := p.expectKind(tName, "function name (@name)")
	p.f = NewFunc(name.text)
	sc := scope{}
	p.parseParams(p.f.Body, sc)
	p.expectPunct("->")
	p.expectPunct("(")
	var want []Type
	var wantToks []token
	p.list(")", func() {
		wantToks = append(wantToks, p.tok)
		want = append(want, p.parseType())
	})
	retTok := p.parseBlock(p.f.Body, sc)
	if len(p.f.Body.Results) != len(want) {
		p.errAt(retTok, "function declares %d results, returns %d", len(want), len(p.f.Body.Results))
	}
	for i, v := range p.f.Body.Results {
		if !v.Type.Equal(want[i]) {
			p.errAt(wantToks[i], "function result %d is declared %v, but returns %%%d of type %v", i, want[i], v.ID, v.Type)
		}
	}
	if p.tok.kind != tEOF {
		p.expected("end of input")
	}
	return p.f
}

// parseParams parses "(%0: f32[2], ...)" and defines the parameters of r.
func (p *parser) parseParams(r *Region, sc scope) {
	p.expectPunct("(")
	p.list(")", func() {
		vt := p.expectKind(tValue, "parameter (%N)")
		p.expectPunct(":")
		t := p.parseType()
		r.Params = append(r.Params, p.define(vt, t, nil, len(r.Params), sc))
	})
}

// define makes the value named by vt, checking that its ID is new.
func (p *parser) define(vt token, t Type, def *Op, idx int, sc scope) *Value {
	id := p.valueID(vt)
	if _, ok := p.ids[id]; ok {
		p.errAt(vt, "value %%%d is defined twice", id)
	}
	v := p.f.NewValueWithID(id, t, def, idx)
	p.ids[id] = v
	sc[id] = v
	return v
}

func (p *parser) valueID(vt token) int {
	id, err := strconv.ParseInt(vt.text, 10, 64)
	if err != nil || id > maxValueID {
		p.errAt(vt, "value number %%%s is too large (the limit is %d)", vt.text, maxValueID)
	}
	return int(id)
}

// use resolves a value reference in scope sc.
func (p *parser) use(sc scope) *Value {
	vt := p.expectKind(tValue, "value (%N)")
	id := p.valueID(vt)
	if v, ok := sc[id]; ok {
		return v
	}
	if _, ok := p.ids[id]; ok {
		p.errAt(vt, "value %%%d is defined outside this region (regions are isolated from above)", id)
	}
	p.errAt(vt, "use of undefined value %%%d", id)
	return nil
}

// parseBlock parses "{ ops return values }" into r; it returns the return token.
func (p *parser) parseBlock(r *Region, sc scope) token {
	p.expectPunct("{")
	for !p.isIdent("return") {
		if p.tok.kind != tValue && p.tok.kind != tIdent {
			p.expected("an op or 'return'")
		}
		p.parseOp(r, sc)
	}
	ret := p.tok
	p.next()
	if p.tok.kind == tValue {
		for {
			r.Results = append(r.Results, p.use(sc))
			if !p.isPunct(",") {
				break
			}
			p.next()
		}
	}
	if !p.isPunct("}") {
		if len(r.Results) == 0 {
			p.expected("return values or '}'")
		}
		p.expected("',' or '}'")
	}
	p.next()
	return ret
}

func (p *parser) parseOp(r *Region, sc scope) {
	var resToks []token
	if p.tok.kind == tValue {
		for {
			resToks = append(resToks, p.expectKind(tValue, "result (%N)"))
			if !p.isPunct(",") {
				break
			}
			p.next()
		}
		p.expectPunct("=")
	}
	nameTok := p.expectKind(tIdent, "op name")
	code, ok := LookupCode(nameTok.text)
	if !ok {
		p.errAt(nameTok, "unknown op %q", nameTok.text)
	}
	op := &Op{Code: code, Attrs: Attrs{}}
	p.expectPunct("(")
	p.list(")", func() { op.Args = append(op.Args, p.use(sc)) })
	if p.isPunct("{") {
		op.Attrs = p.parseAttrDict()
	}
	if p.isPunct("(") {
		p.next()
		p.depth++
		if p.depth > maxRegionDepth {
			p.errAt(p.tok, "regions nested more than %d deep", maxRegionDepth)
		}
		for {
			p.expectPunct("^")
			reg := p.f.NewRegion()
			inner := scope{}
			p.parseParams(reg, inner)
			p.parseBlock(reg, inner)
			op.Regions = append(op.Regions, reg)
			if !p.isPunct(",") {
				break
			}
			p.next()
		}
		p.expectPunct(")")
		p.depth--
	}
	var types []Type
	var typeToks []token
	if p.isPunct(":") {
		p.next()
		for {
			typeToks = append(typeToks, p.tok)
			types = append(types, p.parseType())
			if !p.isPunct(",") {
				break
			}
			p.next()
		}
	}
	if p.isIdent("loc") {
		p.next()
		p.expectPunct("(")
		op.Loc = p.expectKind(tString, "quoted location").text
		p.expectPunct(")")
	}
	if len(types) != len(resToks) {
		p.errAt(nameTok, "%s names %d results but lists %d result types", code, len(resToks), len(types))
	}
	argTypes := make([]Type, len(op.Args))
	for i, a := range op.Args {
		argTypes[i] = a.Type
	}
	inferred, err := inferTypesSafe(code, argTypes, op.Attrs, op.Regions)
	if err != nil {
		p.errAt(nameTok, "%v", err)
	}
	if len(inferred) != len(resToks) {
		p.errAt(nameTok, "%s produces %d results, but %d are named", code, len(inferred), len(resToks))
	}
	for i, t := range inferred {
		if !t.EqualUnsharded(types[i]) {
			p.errAt(typeToks[i], "result %d of %s is written %v, but its shape rule gives %v", i, code, types[i], t)
		}
	}
	for i, vt := range resToks {
		// The shape rule gives dtype, shape and space; the sharding is the written one.
		op.Results = append(op.Results, p.define(vt, types[i], op, i, sc))
	}
	r.Ops = append(r.Ops, op)
}

// parseType parses dtype[dims], optionally followed by braces holding the
// memory space, the sharding, or both: {pinned_host, sharding<...>}.
func (p *parser) parseType() Type {
	start := p.tok
	dtTok := p.expectKind(tIdent, "type (like f32[2,3])")
	dt, err := ParseDType(dtTok.text)
	if err != nil {
		p.errAt(dtTok, "expected a type: %v", err)
	}
	p.expectPunct("[")
	shape := Shape{}
	p.list("]", func() {
		t := p.tok
		n := p.parseInt("dimension")
		if n < 0 {
			p.errAt(t, "negative dimension %d", n)
		}
		shape = append(shape, n)
	})
	t := Type{DType: dt, Shape: shape}
	if p.isPunct("{") {
		p.next()
		seenSpace := false
		p.list("}", func() {
			st := p.expectKind(tIdent, "memory space or sharding")
			if st.text == "sharding" {
				if t.Sharding != nil {
					p.errAt(st, "the type has two shardings")
				}
				t.Sharding = p.parseShardingBody(st)
				return
			}
			sp, err := ParseMemorySpace(st.text)
			if err != nil {
				p.errAt(st, "%v", err)
			}
			if seenSpace {
				p.errAt(st, "the type has two memory spaces")
			}
			t.Space, seenSpace = sp, true
		})
	}
	if err := checkType(t); err != nil {
		p.errAt(start, "%v", err)
	}
	return t
}

// parseSharding parses sharding<mesh[...], [spec]>.
func (p *parser) parseSharding() *NamedSharding {
	st := p.tok
	if !p.isIdent("sharding") {
		p.expected("'sharding'")
	}
	p.next()
	return p.parseShardingBody(st)
}

// parseShardingBody parses <mesh[...], [spec]> after the word sharding (st).
func (p *parser) parseShardingBody(st token) *NamedSharding {
	p.expectPunct("<")
	m := p.parseMesh()
	p.expectPunct(",")
	spec := p.parseSpec()
	p.expectPunct(">")
	s, err := NewNamedSharding(m, spec)
	if err != nil {
		p.errAt(st, "%v", err)
	}
	return s
}

// parseMesh parses mesh[x=2,y=4] or mesh[x=2,y=4,devices=[...]].
func (p *parser) parseMesh() *Mesh {
	mt := p.tok
	if !p.isIdent("mesh") {
		p.expected("'mesh'")
	}
	p.next()
	p.expectPunct("[")
	var shape []int
	var names []string
	var devices []int
	done := false // the device list came: only ']' may follow
	p.list("]", func() {
		nt := p.tok
		if done {
			p.errAt(nt, "the device list must come last in a mesh")
		}
		name := p.expectKind(tIdent, "mesh axis name").text
		p.expectPunct("=")
		if name == "devices" && p.isPunct("[") {
			p.next()
			devices = []int{}
			p.list("]", func() {
				if len(devices) >= MaxMeshDevices {
					p.errAt(p.tok, "a mesh has at most MaxMeshDevices=%d devices", MaxMeshDevices)
				}
				devices = append(devices, p.parseInt("device"))
			})
			if len(devices) == 0 {
				p.errAt(nt, "empty device list")
			}
			done = true
			return
		}
		names = append(names, name)
		shape = append(shape, p.parseInt("mesh axis size"))
	})
	m, err := NewMesh(shape, names, devices...)
	if err != nil {
		p.errAt(mt, "%v", err)
	}
	return m
}

// parseSpec parses [x,{x,y},{}]: per dimension an axis name or a braced list.
func (p *parser) parseSpec() PartitionSpec {
	p.expectPunct("[")
	spec := PartitionSpec{}
	p.list("]", func() {
		if p.isPunct("{") {
			p.next()
			var axes []string
			p.list("}", func() { axes = append(axes, p.expectKind(tIdent, "mesh axis name").text) })
			spec = append(spec, axes)
			return
		}
		spec = append(spec, []string{p.expectKind(tIdent, "mesh axis name or '{'").text})
	})
	return spec
}

// parseAll parses all of src with one parser method, as ParseType and
// ParseSharding do.
func parseAll[T any](src string, parse func(*parser) T) (v T, err error) {
	p := &parser{lx: lexer{src: src, line: 1}}
	defer func() {
		if r := recover(); r != nil {
			pe, ok := r.(*ParseError)
			if !ok {
				panic(r)
			}
			var zero T
			v, err = zero, pe
		}
	}()
	p.next()
	v = parse(p)
	if p.tok.kind != tEOF {
		p.expected("end of input")
	}
	return v, nil
}

func isIntSyntax(s string) bool { return !strings.ContainsAny(s, ".eE") }

func (p *parser) parseInt(what string) int {
	t := p.tok
	if t.kind != tNumber || !isIntSyntax(t.text) {
		p.expected(what + " (an integer)")
	}
	n, err := strconv.ParseInt(t.text, 10, strconv.IntSize)
	if err != nil {
		p.errAt(t, "%s %s out of range", what, t.text)
	}
	p.next()
	return int(n)
}

func (p *parser) parseAttrDict() Attrs {
	p.expectPunct("{")
	attrs := Attrs{}
	p.list("}", func() {
		kt := p.tok
		var key string
		switch kt.kind {
		case tIdent, tString:
			key = kt.text
		default:
			p.expected("attribute name")
		}
		p.next()
		if _, dup := attrs[key]; dup {
			p.errAt(kt, "duplicate attribute %q", key)
		}
		p.expectPunct("=")
		attrs[key] = p.parseAttrValue()
	})
	return attrs
}

func (p *parser) parseAttrValue() any {
	t := p.tok
	switch t.kind {
	case tNumber:
		if isIntSyntax(t.text) {
			return p.parseInt("integer")
		}
		v, err := strconv.ParseFloat(t.text, 64)
		if err != nil {
			p.errAt(t, "float %s out of range", t.text)
		}
		p.next()
		return v
	case tString:
		p.next()
		return t.text
	case tSpace:
		sp, err := ParseMemorySpace(t.text)
		if err != nil {
			p.errAt(t, "%v", err)
		}
		p.next()
		return sp
	case tPunct:
		if t.text == "[" {
			p.next()
			ints := []int{}
			p.list("]", func() { ints = append(ints, p.parseInt("list element")) })
			return ints
		}
	case tIdent:
		switch t.text {
		case "true", "false":
			p.next()
			return t.text == "true"
		case "inf", "-inf", "nan":
			return math.Float64frombits(p.parseSpecialFloat(Float64))
		case "dense":
			p.next()
			return p.parseLiteral()
		}
		if dt, err := ParseDType(t.text); err == nil {
			p.next()
			return dt
		}
	}
	p.expected("attribute value")
	return nil
}

// floatBits describes the bit layout of a float dtype: the bits of +inf
// (all exponent bits), the sign bit, the NaN printed as "nan", the width.
type floatBits struct {
	inf, sign, canon uint64
	width            int
}

var floatLayouts = map[DType]floatBits{
	Float16:  {0x7c00, 0x8000, canonNaN16, 16},
	BFloat16: {0x7f80, 0x8000, canonNaNBF16, 16},
	Float32:  {0x7f800000, 0x80000000, canonNaN32, 32},
	Float64:  {0x7ff0000000000000, 1 << 63, canonNaN64, 64},
}

// parseSpecialFloat parses inf, -inf, nan or nan(0xBITS) for the float dtype
// dt and returns its bits.
func (p *parser) parseSpecialFloat(dt DType) uint64 {
	fl := floatLayouts[dt]
	t := p.tok
	p.next()
	switch t.text {
	case "inf":
		return fl.inf
	case "-inf":
		return fl.inf | fl.sign
	}
	if !p.isPunct("(") {
		return fl.canon
	}
	p.next()
	ht := p.expectKind(tHex, "NaN bits (0x...)")
	bits, err := strconv.ParseUint(ht.text, 16, fl.width)
	if err != nil || ht.text == "" {
		p.errAt(ht, "NaN bits 0x%s do not fit in %d bits", ht.text, fl.width)
	}
	p.expectPunct(")")
	if mag := bits &^ fl.sign; mag&fl.inf != fl.inf || mag == fl.inf {
		p.errAt(ht, "0x%s is not a %v NaN", ht.text, dt)
	}
	return bits
}

// parseLiteral parses <type, data> after "dense".
func (p *parser) parseLiteral() *Literal {
	p.expectPunct("<")
	tt := p.tok
	t := p.parseType()
	if t.Sharding != nil {
		p.errAt(tt, "a literal's type has no sharding (shard the constant's result instead)")
	}
	n := t.Size()
	if n > MaxParsedLiteralElements {
		p.errAt(tt, "literal of type %v has %d elements, more than the limit %d", t, n, MaxParsedLiteralElements)
	}
	p.expectPunct(",")
	var l *Literal
	switch {
	case p.tok.kind == tHex:
		ht := p.tok
		if int64(len(ht.text)) != 2*t.Bytes() {
			p.errAt(ht, "literal of type %v needs %d bytes (%d hex digits), got %d hex digits", t, t.Bytes(), 2*t.Bytes(), len(ht.text))
		}
		l = NewLiteral(t)
		if _, err := hex.Decode(l.Data, []byte(ht.text)); err != nil {
			p.errAt(ht, "bad hex data: %v", err)
		}
		p.next()
	case p.isPunct("["):
		lt := p.tok
		// Every element takes at least one byte of input: refuse before
		// allocating a literal the text cannot fill.
		if n > len(p.lx.src)-p.lx.pos {
			p.errAt(lt, "literal of type %v needs %d elements; the input is too short", t, n)
		}
		p.next()
		l = NewLiteral(t)
		i := 0
		p.list("]", func() {
			if i >= n {
				p.errAt(p.tok, "literal of type %v has more than %d elements", t, n)
			}
			p.parseElement(l, i)
			i++
		})
		if i != n {
			p.errAt(lt, "literal of type %v needs %d elements, got %d", t, n, i)
		}
	default:
		if n != 1 {
			p.expected(fmt.Sprintf("'[' or hex data for a literal of %d elements", n))
		}
		l = NewLiteral(t)
		p.parseElement(l, 0)
	}
	p.expectPunct(">")
	return l
}

// parseElement reads element i of l.
func (p *parser) parseElement(l *Literal, i int) {
	t := p.tok
	dt := l.Type.DType
	if dt == Bool {
		switch {
		case p.isIdent("true"):
			l.Data[i] = 1
		case p.isIdent("false"):
			l.Data[i] = 0
		default:
			p.expected("true or false")
		}
		p.next()
		return
	}
	if dt.IsInteger() {
		if t.kind != tNumber || !isIntSyntax(t.text) {
			p.expected(dt.String() + " element (an integer)")
		}
		var err error
		switch dt {
		case Uint8:
			var v uint64
			v, err = strconv.ParseUint(t.text, 10, 8)
			l.Data[i] = uint8(v)
		case Uint32:
			var v uint64
			v, err = strconv.ParseUint(t.text, 10, 32)
			View[uint32](l)[i] = uint32(v)
		case Int32:
			var v int64
			v, err = strconv.ParseInt(t.text, 10, 32)
			View[int32](l)[i] = int32(v)
		case Int64:
			View[int64](l)[i], err = strconv.ParseInt(t.text, 10, 64)
		}
		if err != nil {
			p.errAt(t, "%s is not a valid %v", t.text, dt)
		}
		p.next()
		return
	}
	if t.kind == tIdent && (t.text == "nan" || t.text == "inf" || t.text == "-inf") {
		bits := p.parseSpecialFloat(dt)
		switch dt {
		case Float16:
			View[F16](l)[i] = F16(bits)
		case BFloat16:
			View[BF16](l)[i] = BF16(bits)
		case Float32:
			View[float32](l)[i] = math.Float32frombits(uint32(bits))
		case Float64:
			View[float64](l)[i] = math.Float64frombits(bits)
		}
		return
	}
	if t.kind != tNumber {
		p.expected(dt.String() + " element (a number, inf, -inf or nan)")
	}
	bitSize := 64
	if dt == Float32 {
		bitSize = 32
	}
	v, err := strconv.ParseFloat(t.text, bitSize)
	if err != nil {
		p.errAt(t, "%s is out of range for %v", t.text, dt)
	}
	switch dt {
	case Float16:
		h := F16FromFloat64(v)
		if math.IsInf(h.Float64(), 0) {
			p.errAt(t, "%s is out of range for f16", t.text)
		}
		View[F16](l)[i] = h
	case BFloat16:
		h := BF16FromFloat64(v)
		if math.IsInf(h.Float64(), 0) {
			p.errAt(t, "%s is out of range for bf16", t.text)
		}
		View[BF16](l)[i] = h
	case Float32:
		View[float32](l)[i] = float32(v)
	case Float64:
		View[float64](l)[i] = v
	}
	p.next()
}

var errShapeRulePanic = errors.New("shape rule panicked")

// inferTypesSafe is InferTypes with any panic of a shape rule turned into an
// error, so that hostile attribute values cannot crash Parse or Verify.
func inferTypesSafe(code Code, args []Type, attrs Attrs, regions []*Region) (ts []Type, err error) {
	defer func() {
		if r := recover(); r != nil {
			ts, err = nil, fmt.Errorf("%v: %w: %v", code, errShapeRulePanic, r)
		}
	}()
	return InferTypes(code, args, attrs, regions)
}
