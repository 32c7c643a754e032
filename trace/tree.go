package trace

import (
	"cmp"
	le "encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// TreeDef is the structure of a tree, as in jax.tree_util: everything Flatten
// keeps apart from the leaves. A tree is any Go value. Flatten walks it and splits it into its leaves (the
// non-nil *Array values it contains, in a fixed order) and a *TreeDef, the rest
// of it: the Go types, the container sizes and the static values. Unflatten puts
// leaves back into that structure and rebuilds a value of the same Go type. The
// walk goes through:
//
//   - *Array: a leaf. A nil *Array is a "None" leaf: part of the structure (it is
//     rebuilt as nil), not one of the leaves.
//   - structs: their exported fields, in declaration order. Unexported fields are
//     not walked: Unflatten copies them as they were in the flattened value
//     (shallowly, so pointers in them are shared with it), and they are not part
//     of String or Equal. An *Array in an unexported field is therefore not a
//     leaf. An embedded field counts as exported or unexported by its own name.
//   - pointers: the value pointed to. Unflatten allocates a new pointer, so the
//     rebuilt tree shares no pointers with the flattened one. Nil pointers are
//     kept nil. A pointer to a struct type without exported fields (a handle such
//     as *sync.Mutex or *rand.Rand) is not walked: it is kept as it is, by
//     identity, and String shows its address.
//   - slices and arrays: their elements in index order (nil slices stay nil).
//     Slices and arrays of basic kinds (bool, numbers, strings) are static values
//     as a whole.
//   - maps: their entries in key order: strings and numbers in their natural
//     order, other keys by fmt.Sprint (nil maps stay nil).
//   - interfaces: the dynamic value (a nil interface stays nil).
//   - anything else (bool, numbers, strings, funcs, chans): a static value, kept
//     in the TreeDef and put back by Unflatten. Funcs, chans and unsafe pointers
//     are compared by address (for a func, its code pointer).
//
// A value reached twice through different pointers (shared, as in tied weights)
// is walked twice and rebuilt as two copies, as in JAX: trees are trees. A
// pointer, slice or map that contains itself is an error.
//
// A TreeDef is immutable and safe for concurrent use. Two TreeDefs of trees that
// differ only in their leaves are Equal and have the same String.
type TreeDef struct {
	root      *treeNode
	numLeaves int
	once      sync.Once
	str       string
}

type treeKind uint8

const (
	tkLeaf     treeKind = iota // a non-nil *Array
	tkNone                     // a nil *Array
	tkNilIface                 // a nil interface
	tkStatic                   // a value kept as is (val)
	tkNilPtr                   // a nil pointer (not *Array)
	tkPtr                      // a pointer to children[0]
	tkStruct                   // a struct: template plus exported fields
	tkNilSlice                 // a nil slice
	tkSlice                    // a slice of children
	tkArray                    // an array of children
	tkNilMap                   // a nil map
	tkMap                      // a map: keys and children
)

type treeNode struct {
	kind     treeKind
	typ      reflect.Type    // the node's own (dynamic) type; nil for a nil top-level value
	children []*treeNode     // elements, fields or map values
	fields   []int           // tkStruct: field index of each child
	names    []string        // tkStruct: field names; tkMap: path segments of keys
	keys     []reflect.Value // tkMap: the keys, sorted
	val      reflect.Value   // tkStatic: the value; tkStruct: the template
	repr     string          // tkStatic: the value as text
	keyReprs []string        // tkMap: each key as text
}

var treeArrayType = reflect.TypeFor[*Array]()

// Flatten splits tree into its leaves, in a fixed depth-first order, and its
// structure. TreeDef's documentation says what is walked and how.
// It fails on a tree that contains itself through a pointer, slice or map.
func Flatten(tree any) ([]*Array, *TreeDef, error) {
	f := treeFlattener{onPath: map[treeVisitKey]bool{}}
	var root *treeNode
	if tree == nil {
		root = &treeNode{kind: tkNilIface}
	} else {
		var err error
		root, err = f.walk(reflect.ValueOf(tree))
		if err != nil {
			return nil, nil, err
		}
	}
	return f.leaves, &TreeDef{root: root, numLeaves: len(f.leaves)}, nil
}

// Leaves returns the leaves of tree, in Flatten's order. It panics with *Error if
// the tree contains itself.
func Leaves(tree any) []*Array {
	leaves, _, err := Flatten(tree)
	if err != nil {
		panic(WrapError("Leaves", err))
	}
	return leaves
}

// Structure returns the TreeDef of tree, or an error as Flatten does.
func Structure(tree any) (*TreeDef, error) {
	_, d, err := Flatten(tree)
	return d, err
}

// NumLeaves returns the number of leaves (non-nil arrays) of the structure.
func (d *TreeDef) NumLeaves() int { return d.numLeaves }

// Unflatten rebuilds a value of the flattened tree's Go type with leaves in
// place of the original leaves, in Flatten's order. Static values and unexported
// fields are restored as they were; containers and pointers are new. A nil
// element of leaves is put back as a nil *Array. It is an error if len(leaves) is
// not NumLeaves.
func (d *TreeDef) Unflatten(leaves []*Array) (any, error) {
	if len(leaves) != d.numLeaves {
		return nil, fmt.Errorf("trace.Unflatten: structure has %d leaves, got %d arrays", d.numLeaves, len(leaves))
	}
	if d.root.kind == tkNilIface && d.root.typ == nil {
		return nil, nil
	}
	i := 0
	v := d.root.build(leaves, &i)
	return v.Interface(), nil
}

// UnflattenAs is Unflatten returning the rebuilt value as a T. It is an error if
// the flattened tree was not a T.
func UnflattenAs[T any](d *TreeDef, leaves []*Array) (T, error) {
	var zero T
	v, err := d.Unflatten(leaves)
	if err != nil {
		return zero, err
	}
	if v == nil {
		return zero, nil
	}
	t, ok := v.(T)
	if !ok {
		return zero, fmt.Errorf("trace.UnflattenAs: tree is a %v, not a %v", reflect.TypeOf(v), reflect.TypeFor[T]())
	}
	return t, nil
}

// Map returns a tree of the same structure and Go type as tree with each leaf a
// replaced by fn(a). None leaves (nil arrays) are kept nil and not passed to fn.
func Map(tree any, fn func(*Array) *Array) (any, error) {
	leaves, d, err := Flatten(tree)
	if err != nil {
		return nil, err
	}
	out := make([]*Array, len(leaves))
	for i, a := range leaves {
		out[i] = fn(a)
	}
	return d.Unflatten(out)
}

// MapAs is Map for a tree whose type is known at compile time:
// newParams, err := trace.MapAs(params, fn).
func MapAs[T any](tree T, fn func(*Array) *Array) (T, error) {
	var zero T
	leaves, d, err := Flatten(tree)
	if err != nil {
		return zero, err
	}
	out := make([]*Array, len(leaves))
	for i, a := range leaves {
		out[i] = fn(a)
	}
	return UnflattenAs[T](d, out)
}

// Map2 returns a tree of a's structure with each pair of corresponding leaves x
// of a and y of b replaced by fn(x, y). The trees must have Equal structures; if
// not, the error names the first place where they differ.
func Map2(a, b any, fn func(x, y *Array) *Array) (any, error) {
	la, da, lb, err := treeFlatten2(a, b)
	if err != nil {
		return nil, err
	}
	out := make([]*Array, len(la))
	for i := range la {
		out[i] = fn(la[i], lb[i])
	}
	return da.Unflatten(out)
}

// Map2As is Map2 for trees whose type is known at compile time.
func Map2As[T any](a, b T, fn func(x, y *Array) *Array) (T, error) {
	var zero T
	la, da, lb, err := treeFlatten2(a, b)
	if err != nil {
		return zero, err
	}
	out := make([]*Array, len(la))
	for i := range la {
		out[i] = fn(la[i], lb[i])
	}
	return UnflattenAs[T](da, out)
}

func treeFlatten2(a, b any) ([]*Array, *TreeDef, []*Array, error) {
	la, da, err := Flatten(a)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("first tree: %w", err)
	}
	lb, db, err := Flatten(b)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("second tree: %w", err)
	}
	if diff := da.Diff(db); diff != "" {
		return nil, nil, nil, fmt.Errorf("trace.Map2: trees have different structures: %s", diff)
	}
	return la, da, lb, nil
}

// Equal reports whether d and o are the same structure: the same Go types (by
// identity), containers of the same sizes and keys, None leaves and nil values in
// the same places, and equal static values.
func (d *TreeDef) Equal(o *TreeDef) bool { return d.Diff(o) == "" }

// Diff describes the first difference between the structures d and o, with its
// path, or returns "" if they are Equal.
func (d *TreeDef) Diff(o *TreeDef) string {
	if d == o {
		return ""
	}
	if d == nil || o == nil {
		return "one structure is nil"
	}
	return treeDiffNodes(d.root, o.root, "")
}

// String returns the structure as canonical Go-like text, with a leaf written *,
// a nil *Array None and a nil interface nil, for example
//
//	[]interface {}{*, None, map[string]*github.com/ferryml/ferry/trace.Array{"b": *}, float64(0.5)}
//
// Named types are written with their full package path. Two structures with the
// same String are Equal except in pathological cases (two types with the same
// name declared in different functions of one package), so String can key a
// cache. Array shapes and dtypes are not part of it.
func (d *TreeDef) String() string {
	d.once.Do(func() {
		var b strings.Builder
		d.root.format(&b)
		d.str = b.String()
	})
	return d.str
}

// Paths returns the path of each leaf, in Flatten's order, written as Go
// selectors and indexes from the top: "Layers[0].W", `Params["bias"]`, "[2]".
// Pointers and interfaces do not appear in paths. A tree that is a single array
// has the path "".
func (d *TreeDef) Paths() []string {
	out := make([]string, 0, d.numLeaves)
	var walk func(n *treeNode, path string)
	walk = func(n *treeNode, path string) {
		switch n.kind {
		case tkLeaf:
			out = append(out, path)
		case tkPtr:
			walk(n.children[0], path)
		case tkStruct:
			for i, c := range n.children {
				if path == "" {
					walk(c, n.names[i])
				} else {
					walk(c, path+"."+n.names[i])
				}
			}
		case tkSlice, tkArray:
			for i, c := range n.children {
				walk(c, path+"["+strconv.Itoa(i)+"]")
			}
		case tkMap:
			for i, c := range n.children {
				walk(c, path+"["+n.names[i]+"]")
			}
		}
	}
	walk(d.root, "")
	return out
}

// ---- flattening ----

type treeVisitKey struct {
	typ reflect.Type
	ptr uintptr
	len int
}

type treeFlattener struct {
	leaves []*Array
	onPath map[treeVisitKey]bool
}

// treePathError is an error found while walking, with the path to where it was
// found built while unwinding.
type treePathError struct {
	segs []string // innermost first
	msg  string
}

func (e *treePathError) Error() string {
	var b strings.Builder
	for i := len(e.segs) - 1; i >= 0; i-- {
		s := e.segs[i]
		if b.Len() > 0 && s[0] != '[' {
			b.WriteByte('.')
		}
		b.WriteString(s)
	}
	if b.Len() == 0 {
		return "trace.Flatten: " + e.msg
	}
	return "trace.Flatten: at " + b.String() + ": " + e.msg
}

func treeWithSeg(err error, seg string) error {
	if pe, ok := err.(*treePathError); ok {
		pe.segs = append(pe.segs, seg)
	}
	return err
}

func (f *treeFlattener) enter(k treeVisitKey) error {
	if f.onPath[k] {
		return &treePathError{msg: fmt.Sprintf("the tree contains itself (a cycle through a %v)", k.typ)}
	}
	f.onPath[k] = true
	return nil
}

func (f *treeFlattener) walk(v reflect.Value) (*treeNode, error) {
	t := v.Type()
	if t == treeArrayType {
		a := v.Interface().(*Array)
		if a == nil {
			return &treeNode{kind: tkNone, typ: t}, nil
		}
		f.leaves = append(f.leaves, a)
		return &treeNode{kind: tkLeaf, typ: t}, nil
	}
	switch t.Kind() {
	case reflect.Interface:
		if v.IsNil() {
			return &treeNode{kind: tkNilIface, typ: t}, nil
		}
		return f.walk(v.Elem())

	case reflect.Pointer:
		if v.IsNil() {
			return &treeNode{kind: tkNilPtr, typ: t}, nil
		}
		if t.Elem().Kind() == reflect.Struct && !treeHasExported(t.Elem()) {
			return treeStaticNode(v), nil
		}
		k := treeVisitKey{typ: t, ptr: v.Pointer()}
		if err := f.enter(k); err != nil {
			return nil, err
		}
		defer delete(f.onPath, k)
		c, err := f.walk(v.Elem())
		if err != nil {
			return nil, err
		}
		return &treeNode{kind: tkPtr, typ: t, children: []*treeNode{c}}, nil

	case reflect.Struct:
		n := &treeNode{kind: tkStruct, typ: t}
		tmpl := reflect.New(t).Elem()
		tmpl.Set(v)
		for i := range t.NumField() {
			sf := t.Field(i)
			if !sf.IsExported() {
				continue
			}
			c, err := f.walk(v.Field(i))
			if err != nil {
				return nil, treeWithSeg(err, sf.Name)
			}
			tmpl.Field(i).SetZero() // the template must not keep leaves alive
			n.children = append(n.children, c)
			n.fields = append(n.fields, i)
			n.names = append(n.names, sf.Name)
		}
		n.val = tmpl
		return n, nil

	case reflect.Slice, reflect.Array:
		if treeBasicKind(t.Elem().Kind()) {
			return treeStaticNode(v), nil
		}
		n := &treeNode{kind: tkArray, typ: t}
		if t.Kind() == reflect.Slice {
			if v.IsNil() {
				return &treeNode{kind: tkNilSlice, typ: t}, nil
			}
			n.kind = tkSlice
			if v.Len() > 0 {
				k := treeVisitKey{typ: t, ptr: v.Pointer(), len: v.Len()}
				if err := f.enter(k); err != nil {
					return nil, err
				}
				defer delete(f.onPath, k)
			}
		}
		n.children = make([]*treeNode, v.Len())
		for i := range v.Len() {
			c, err := f.walk(v.Index(i))
			if err != nil {
				return nil, treeWithSeg(err, "["+strconv.Itoa(i)+"]")
			}
			n.children[i] = c
		}
		return n, nil

	case reflect.Map:
		if v.IsNil() {
			return &treeNode{kind: tkNilMap, typ: t}, nil
		}
		n := &treeNode{kind: tkMap, typ: t}
		if v.Len() == 0 {
			return n, nil
		}
		k := treeVisitKey{typ: t, ptr: v.Pointer()}
		if err := f.enter(k); err != nil {
			return nil, err
		}
		defer delete(f.onPath, k)
		keys := v.MapKeys()
		slices.SortFunc(keys, treeCompareKeys)
		for _, key := range keys {
			seg := treeKeySegment(key)
			c, err := f.walk(v.MapIndex(key))
			if err != nil {
				return nil, treeWithSeg(err, "["+seg+"]")
			}
			kc := reflect.New(key.Type()).Elem()
			kc.Set(key)
			n.keys = append(n.keys, kc)
			n.names = append(n.names, seg)
			n.keyReprs = append(n.keyReprs, treeRepr(key, true))
			n.children = append(n.children, c)
		}
		return n, nil
	}
	return treeStaticNode(v), nil
}

func treeHasExported(t reflect.Type) bool {
	for i := range t.NumField() {
		if t.Field(i).IsExported() {
			return true
		}
	}
	return false
}

func treeBasicKind(k reflect.Kind) bool {
	switch k {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128, reflect.String:
		return true
	}
	return false
}

// treeStaticNode keeps a copy of v, deep for slices of basic kinds, so that later
// changes to the flattened tree do not change the structure.
func treeStaticNode(v reflect.Value) *treeNode {
	t := v.Type()
	var c reflect.Value
	if t.Kind() == reflect.Slice {
		if v.IsNil() {
			c = reflect.Zero(t)
		} else {
			c = reflect.MakeSlice(t, v.Len(), v.Len())
			reflect.Copy(c, v)
		}
	} else {
		c = reflect.New(t).Elem()
		c.Set(v)
	}
	return &treeNode{kind: tkStatic, typ: t, val: c, repr: treeRepr(c, false)}
}

// treeKeySegment is the path segment of a map key: a quoted string or the value.
func treeKeySegment(k reflect.Value) string {
	if k.Kind() == reflect.Interface && !k.IsNil() {
		k = k.Elem()
	}
	if k.Kind() == reflect.String {
		return strconv.Quote(k.String())
	}
	return fmt.Sprint(k.Interface())
}

// treeCompareKeys orders map keys: by dynamic type name if they differ (for
// interface keys), then strings, numbers and bools naturally, others by
// fmt.Sprint and then by their canonical text.
func treeCompareKeys(a, b reflect.Value) int {
	if a.Kind() == reflect.Interface {
		if a.IsNil() || b.IsNil() {
			return cmp.Compare(treeBoolInt(!a.IsNil()), treeBoolInt(!b.IsNil()))
		}
		a, b = a.Elem(), b.Elem()
		if a.Type() != b.Type() {
			if c := cmp.Compare(treeTypeName(a.Type()), treeTypeName(b.Type())); c != 0 {
				return c
			}
			return cmp.Compare(a.Type().String(), b.Type().String())
		}
	}
	switch a.Kind() {
	case reflect.String:
		return cmp.Compare(a.String(), b.String())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return cmp.Compare(a.Int(), b.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return cmp.Compare(a.Uint(), b.Uint())
	case reflect.Float32, reflect.Float64:
		return cmp.Compare(a.Float(), b.Float())
	case reflect.Bool:
		return cmp.Compare(treeBoolInt(a.Bool()), treeBoolInt(b.Bool()))
	}
	if c := cmp.Compare(fmt.Sprint(a.Interface()), fmt.Sprint(b.Interface())); c != 0 {
		return c
	}
	return cmp.Compare(treeRepr(a, true), treeRepr(b, true))
}

func treeBoolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ---- rebuilding ----

func (n *treeNode) build(leaves []*Array, i *int) reflect.Value {
	switch n.kind {
	case tkLeaf:
		a := leaves[*i]
		*i++
		return reflect.ValueOf(&a).Elem()
	case tkNone, tkNilIface, tkNilPtr, tkNilSlice, tkNilMap:
		return reflect.Zero(n.typ)
	case tkStatic:
		if n.typ.Kind() == reflect.Slice && !n.val.IsNil() {
			c := reflect.MakeSlice(n.typ, n.val.Len(), n.val.Len())
			reflect.Copy(c, n.val)
			return c
		}
		return n.val
	case tkPtr:
		p := reflect.New(n.typ.Elem())
		p.Elem().Set(n.children[0].build(leaves, i))
		return p
	case tkStruct:
		s := reflect.New(n.typ).Elem()
		s.Set(n.val)
		for j, c := range n.children {
			s.Field(n.fields[j]).Set(c.build(leaves, i))
		}
		return s
	case tkSlice:
		s := reflect.MakeSlice(n.typ, len(n.children), len(n.children))
		for j, c := range n.children {
			s.Index(j).Set(c.build(leaves, i))
		}
		return s
	case tkArray:
		s := reflect.New(n.typ).Elem()
		for j, c := range n.children {
			s.Index(j).Set(c.build(leaves, i))
		}
		return s
	case tkMap:
		m := reflect.MakeMapWithSize(n.typ, len(n.children))
		for j, c := range n.children {
			m.SetMapIndex(n.keys[j], c.build(leaves, i))
		}
		return m
	}
	panic("trace: bad tree node")
}

// ---- text ----

// treeTypeName writes t with full package paths for named types.
func treeTypeName(t reflect.Type) string {
	if t == nil {
		return "nil"
	}
	if t.Name() != "" {
		if t.PkgPath() != "" {
			return t.PkgPath() + "." + t.Name()
		}
		return t.Name()
	}
	switch t.Kind() {
	case reflect.Pointer:
		return "*" + treeTypeName(t.Elem())
	case reflect.Slice:
		return "[]" + treeTypeName(t.Elem())
	case reflect.Array:
		return "[" + strconv.Itoa(t.Len()) + "]" + treeTypeName(t.Elem())
	case reflect.Map:
		return "map[" + treeTypeName(t.Key()) + "]" + treeTypeName(t.Elem())
	case reflect.Struct:
		if t.NumField() == 0 {
			return "struct {}"
		}
		var b strings.Builder
		b.WriteString("struct { ")
		for i := range t.NumField() {
			f := t.Field(i)
			if i > 0 {
				b.WriteString("; ")
			}
			if !f.Anonymous {
				if f.PkgPath != "" {
					b.WriteString(f.PkgPath + ".")
				}
				b.WriteString(f.Name + " ")
			}
			b.WriteString(treeTypeName(f.Type))
			if f.Tag != "" {
				b.WriteString(" " + strconv.Quote(string(f.Tag)))
			}
		}
		b.WriteString(" }")
		return b.String()
	}
	return t.String()
}

// treeConversion writes type(value), parenthesising types that need it.
func treeConversion(t reflect.Type, val string) string {
	name := treeTypeName(t)
	if strings.HasPrefix(name, "*") || strings.HasPrefix(name, "func") || strings.HasPrefix(name, "chan") || strings.HasPrefix(name, "<-") {
		name = "(" + name + ")"
	}
	return name + "(" + val + ")"
}

// treeMaxStaticElems is the number of elements of a static slice or array written
// out in String; longer ones are written as their length and a hash.
const treeMaxStaticElems = 64

// treeRepr writes a static value canonically. Scalars are written with their
// type, as a treeConversion, unless bare (map keys of a known type).
func treeRepr(v reflect.Value, bare bool) string {
	t := v.Type()
	wrap := func(s string) string {
		if bare {
			return s
		}
		return treeConversion(t, s)
	}
	switch t.Kind() {
	case reflect.Interface:
		if v.IsNil() {
			return "nil"
		}
		return treeRepr(v.Elem(), false)
	case reflect.Bool:
		return wrap(strconv.FormatBool(v.Bool()))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return wrap(strconv.FormatInt(v.Int(), 10))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return wrap(strconv.FormatUint(v.Uint(), 10))
	case reflect.Uintptr:
		return wrap("0x" + strconv.FormatUint(v.Uint(), 16))
	case reflect.Float32:
		return wrap(strconv.FormatFloat(v.Float(), 'g', -1, 32))
	case reflect.Float64:
		return wrap(strconv.FormatFloat(v.Float(), 'g', -1, 64))
	case reflect.Complex64:
		return wrap(strconv.FormatComplex(v.Complex(), 'g', -1, 64))
	case reflect.Complex128:
		return wrap(strconv.FormatComplex(v.Complex(), 'g', -1, 128))
	case reflect.String:
		return wrap(strconv.Quote(v.String()))
	case reflect.Func, reflect.Chan, reflect.UnsafePointer, reflect.Pointer, reflect.Map:
		if v.IsNil() {
			return treeConversion(t, "nil")
		}
		return treeConversion(t, "0x"+strconv.FormatUint(uint64(v.Pointer()), 16))
	case reflect.Slice, reflect.Array:
		if t.Kind() == reflect.Slice && v.IsNil() {
			return treeConversion(t, "nil")
		}
		var b strings.Builder
		b.WriteString(treeTypeName(t))
		b.WriteByte('{')
		if v.Len() > treeMaxStaticElems && treeBasicKind(t.Elem().Kind()) {
			fmt.Fprintf(&b, "len=%d fnv64a=%016x", v.Len(), treeHash(v))
		} else {
			for i := range v.Len() {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(treeRepr(v.Index(i), true))
			}
		}
		b.WriteByte('}')
		return b.String()
	case reflect.Struct:
		// Only map keys reach here (struct values are walked).
		var b strings.Builder
		b.WriteString(treeTypeName(t))
		b.WriteByte('{')
		first := true
		for i := range t.NumField() {
			if !t.Field(i).IsExported() {
				continue
			}
			if !first {
				b.WriteString(", ")
			}
			first = false
			b.WriteString(t.Field(i).Name + ": " + treeRepr(v.Field(i), false))
		}
		b.WriteByte('}')
		return b.String()
	}
	return treeConversion(t, fmt.Sprint(v))
}

// treeHash hashes the elements of a slice or array of a basic kind.
func treeHash(v reflect.Value) uint64 {
	h := fnv.New64a()
	var buf [16]byte
	for i := range v.Len() {
		e := v.Index(i)
		switch e.Kind() {
		case reflect.Bool:
			buf[0] = byte(treeBoolInt(e.Bool()))
			h.Write(buf[:1])
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			le.LittleEndian.PutUint64(buf[:], uint64(e.Int()))
			h.Write(buf[:8])
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
			le.LittleEndian.PutUint64(buf[:], e.Uint())
			h.Write(buf[:8])
		case reflect.Float32, reflect.Float64:
			le.LittleEndian.PutUint64(buf[:], math.Float64bits(e.Float()))
			h.Write(buf[:8])
		case reflect.Complex64, reflect.Complex128:
			c := e.Complex()
			le.LittleEndian.PutUint64(buf[:8], math.Float64bits(real(c)))
			le.LittleEndian.PutUint64(buf[8:], math.Float64bits(imag(c)))
			h.Write(buf[:])
		case reflect.String:
			le.LittleEndian.PutUint64(buf[:], uint64(e.Len()))
			h.Write(buf[:8])
			h.Write([]byte(e.String()))
		}
	}
	return h.Sum64()
}

func (n *treeNode) format(b *strings.Builder) {
	switch n.kind {
	case tkLeaf:
		b.WriteByte('*')
	case tkNone:
		b.WriteString("None")
	case tkNilIface:
		b.WriteString("nil")
	case tkStatic:
		b.WriteString(n.repr)
	case tkNilPtr, tkNilSlice, tkNilMap:
		b.WriteString(treeConversion(n.typ, "nil"))
	case tkPtr:
		b.WriteByte('&')
		n.children[0].format(b)
	case tkStruct:
		b.WriteString(treeTypeName(n.typ))
		b.WriteByte('{')
		for i, c := range n.children {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(n.names[i])
			b.WriteString(": ")
			c.format(b)
		}
		b.WriteByte('}')
	case tkSlice, tkArray:
		b.WriteString(treeTypeName(n.typ))
		b.WriteByte('{')
		for i, c := range n.children {
			if i > 0 {
				b.WriteString(", ")
			}
			c.format(b)
		}
		b.WriteByte('}')
	case tkMap:
		b.WriteString(treeTypeName(n.typ))
		b.WriteByte('{')
		for i, c := range n.children {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(n.keyReprs[i])
			b.WriteString(": ")
			c.format(b)
		}
		b.WriteByte('}')
	}
}

var treeKindNames = [...]string{
	tkLeaf: "an array", tkNone: "a nil array", tkNilIface: "a nil interface",
	tkStatic: "a static value", tkNilPtr: "a nil pointer", tkPtr: "a pointer",
	tkStruct: "a struct", tkNilSlice: "a nil slice", tkSlice: "a slice",
	tkArray: "an array value", tkNilMap: "a nil map", tkMap: "a map",
}

func treeDescribe(n *treeNode) string {
	s := treeKindNames[n.kind]
	if n.kind != tkLeaf && n.kind != tkNone && n.typ != nil {
		s += " (" + treeTypeName(n.typ) + ")"
	}
	return s
}

func treeJoinPath(path, seg string) string {
	if path == "" || seg[0] == '[' {
		return path + seg
	}
	return path + "." + seg
}

// treeDiffNodes returns the first difference between two structures, or "".
func treeDiffNodes(a, b *treeNode, path string) string {
	where := path
	if where == "" {
		where = "the top"
	}
	if a.kind != b.kind {
		return fmt.Sprintf("at %s: %s vs %s", where, treeDescribe(a), treeDescribe(b))
	}
	if a.typ != b.typ {
		return fmt.Sprintf("at %s: type %s vs %s", where, treeTypeName(a.typ), treeTypeName(b.typ))
	}
	switch a.kind {
	case tkStatic:
		if a.repr != b.repr {
			return fmt.Sprintf("at %s: static value %s vs %s", where, a.repr, b.repr)
		}
	case tkPtr:
		return treeDiffNodes(a.children[0], b.children[0], path)
	case tkStruct:
		for i := range a.children {
			if d := treeDiffNodes(a.children[i], b.children[i], treeJoinPath(path, a.names[i])); d != "" {
				return d
			}
		}
	case tkSlice, tkArray:
		if len(a.children) != len(b.children) {
			return fmt.Sprintf("at %s: length %d vs %d", where, len(a.children), len(b.children))
		}
		for i := range a.children {
			if d := treeDiffNodes(a.children[i], b.children[i], treeJoinPath(path, "["+strconv.Itoa(i)+"]")); d != "" {
				return d
			}
		}
	case tkMap:
		if !slices.Equal(a.keyReprs, b.keyReprs) {
			return fmt.Sprintf("at %s: map keys [%s] vs [%s]", where, strings.Join(a.keyReprs, " "), strings.Join(b.keyReprs, " "))
		}
		for i := range a.children {
			if d := treeDiffNodes(a.children[i], b.children[i], treeJoinPath(path, "["+a.names[i]+"]")); d != "" {
				return d
			}
		}
	}
	return ""
}
