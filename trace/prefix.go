package trace

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// BroadcastPrefix expands prefix, a tree prefix of the tree whose structure
// is def, into one value per leaf of def, in Flatten's order, as
// jax.tree_util's prefix broadcasting does for jax.jit's in_shardings and
// jax.vmap's in_axes. prefix is walked beside the tree:
//
//   - a T applies to every leaf below it (the whole tree when prefix is a T);
//   - nil (a nil interface, pointer, slice or map) gives none to every leaf
//     below it;
//   - a struct or a map with string keys stands for a struct of the tree:
//     its fields or keys are the struct's field names, each a prefix of that
//     field (fields that hold no array may be left out);
//   - a slice or array stands for a slice or array of the same length;
//   - a map stands for a map of the tree with the same keys (entries that
//     hold no array may be left out);
//   - pointers and interfaces, in either, are looked through.
//
// The prefix's containers need not have the tree's Go types: a
// map[string]any or an anonymous struct can mirror a params struct. An error
// names the path in the tree where the prefix does not fit it.
func BroadcastPrefix[T any](prefix any, def *TreeDef, none T) ([]T, error) {
	if def == nil {
		return nil, fmt.Errorf("trace.BroadcastPrefix: nil structure")
	}
	b := prefixBroadcaster[T]{none: none, out: make([]T, 0, def.numLeaves)}
	if err := b.walk(reflect.ValueOf(prefix), def.root, ""); err != nil {
		return nil, err
	}
	return b.out, nil
}

type prefixBroadcaster[T any] struct {
	none T
	out  []T
}

func (b *prefixBroadcaster[T]) fill(v T, n *treeNode) {
	for range treeCountLeaves(n) {
		b.out = append(b.out, v)
	}
}

func treeCountLeaves(n *treeNode) int {
	if n.kind == tkLeaf {
		return 1
	}
	c := 0
	for _, ch := range n.children {
		c += treeCountLeaves(ch)
	}
	return c
}

func (b *prefixBroadcaster[T]) walk(p reflect.Value, n *treeNode, path string) error {
	for n.kind == tkPtr {
		n = n.children[0]
	}
	want := reflect.TypeFor[T]()
	for {
		if !p.IsValid() {
			b.fill(b.none, n)
			return nil
		}
		if p.Type().AssignableTo(want) && (p.Kind() != reflect.Interface || !p.IsNil()) {
			b.fill(p.Interface().(T), n)
			return nil
		}
		switch p.Kind() {
		case reflect.Interface, reflect.Pointer:
			if p.IsNil() {
				b.fill(b.none, n)
				return nil
			}
			p = p.Elem()
			continue
		case reflect.Slice, reflect.Map:
			if p.IsNil() {
				b.fill(b.none, n)
				return nil
			}
		}
		break
	}
	if treeCountLeaves(n) == 0 {
		return nil // nothing to give a value to: any prefix fits
	}
	where := path
	if where == "" {
		where = "the top"
	}
	mismatch := func(format string, args ...any) error {
		return fmt.Errorf("at %s: %s", where, fmt.Sprintf(format, args...))
	}
	wantName := treeTypeName(want)
	switch n.kind {
	case tkLeaf:
		return mismatch("the prefix has a %v where the tree has an array (give a %s or nil there)", p.Type(), wantName)

	case tkStruct:
		get, names, err := prefixFields(p)
		if err != nil {
			return mismatch("the prefix has a %v where the tree has a struct (%s): give a %s, nil, or a struct or map[string] of its fields", p.Type(), treeTypeName(n.typ), wantName)
		}
		used := map[string]bool{}
		for i, c := range n.children {
			name := n.names[i]
			pv, ok := get(name)
			if !ok {
				if treeCountLeaves(c) == 0 {
					continue
				}
				return mismatch("the prefix (%v) has no field %s, which holds arrays in the tree (%s)", p.Type(), name, treeTypeName(n.typ))
			}
			used[name] = true
			if err := b.walk(pv, c, treeJoinPath(path, name)); err != nil {
				return err
			}
		}
		for _, name := range names {
			if !used[name] && !slices.Contains(n.names, name) {
				return mismatch("the prefix (%v) has a field %s the tree's struct (%s) has not", p.Type(), name, treeTypeName(n.typ))
			}
		}
		return nil

	case tkSlice, tkArray:
		if p.Kind() != reflect.Slice && p.Kind() != reflect.Array {
			return mismatch("the prefix has a %v where the tree has %s of %d elements", p.Type(), treeDescribe(n), len(n.children))
		}
		if p.Len() != len(n.children) {
			return mismatch("the prefix has %d elements where the tree has %d", p.Len(), len(n.children))
		}
		for i, c := range n.children {
			if err := b.walk(p.Index(i), c, treeJoinPath(path, "["+strconv.Itoa(i)+"]")); err != nil {
				return err
			}
		}
		return nil

	case tkMap:
		if p.Kind() != reflect.Map {
			return mismatch("the prefix has a %v where the tree has %s", p.Type(), treeDescribe(n))
		}
		kt := p.Type().Key()
		found := 0
		for i, c := range n.children {
			k := n.keys[i]
			var pv reflect.Value
			switch {
			case k.Type().AssignableTo(kt):
				pv = p.MapIndex(k)
			case k.Type().ConvertibleTo(kt):
				pv = p.MapIndex(k.Convert(kt))
			}
			if !pv.IsValid() {
				if treeCountLeaves(c) == 0 {
					continue
				}
				return mismatch("the prefix (%v) has no key %s, which holds arrays in the tree", p.Type(), n.keyReprs[i])
			}
			found++
			if err := b.walk(pv, c, treeJoinPath(path, "["+n.names[i]+"]")); err != nil {
				return err
			}
		}
		if found != p.Len() {
			return mismatch("the prefix (%v) has keys the tree's map has not (the tree's keys: %s)", p.Type(), strings.Join(n.keyReprs, " "))
		}
		return nil
	}
	return mismatch("the prefix has a %v where the tree has %s", p.Type(), treeDescribe(n))
}

// prefixFields reads a struct or a map with string keys as named fields.
func prefixFields(p reflect.Value) (get func(string) (reflect.Value, bool), names []string, err error) {
	switch {
	case p.Kind() == reflect.Struct:
		t := p.Type()
		for i := range t.NumField() {
			if t.Field(i).IsExported() {
				names = append(names, t.Field(i).Name)
			}
		}
		return func(name string) (reflect.Value, bool) {
			f, ok := t.FieldByName(name)
			if !ok || !f.IsExported() || len(f.Index) != 1 {
				return reflect.Value{}, false
			}
			return p.Field(f.Index[0]), true
		}, names, nil
	case p.Kind() == reflect.Map && p.Type().Key().Kind() == reflect.String:
		kt := p.Type().Key()
		for _, k := range p.MapKeys() {
			names = append(names, k.String())
		}
		return func(name string) (reflect.Value, bool) {
			v := p.MapIndex(reflect.ValueOf(name).Convert(kt))
			return v, v.IsValid()
		}, names, nil
	}
	return nil, nil, fmt.Errorf("not a struct")
}

// broadcastArgs expands per-argument prefixes (one per argument, or one for
// all of them) into one value per leaf of the arguments whose structures are
// defs. what names the option in errors, noun the trees ("argument",
// "result").
func broadcastArgs[T any](what, noun string, prefixes []any, defs []*TreeDef, none T) ([]T, error) {
	if len(prefixes) != 1 && len(prefixes) != len(defs) {
		return nil, fmt.Errorf("%s has %d entries for %d %ss: give one per %s (each a tree prefix of it), or one for all", what, len(prefixes), len(defs), noun, noun)
	}
	var out []T
	for i, d := range defs {
		p := prefixes[0]
		if len(prefixes) == len(defs) {
			p = prefixes[i]
		}
		vs, err := BroadcastPrefix(p, d, none)
		if err != nil {
			return nil, fmt.Errorf("%s: %s %d: %v", what, noun, i, err)
		}
		out = append(out, vs...)
	}
	return out, nil
}
