package ir

import (
	"strconv"
	"strings"
)

// Shape is the list of dimension sizes of an array; a scalar has an empty shape.
type Shape []int

// Rank returns the number of dimensions.
func (s Shape) Rank() int { return len(s) }

// Size returns the number of elements (1 for a scalar, 0 if any dimension is 0).
func (s Shape) Size() int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

// Equal reports whether two shapes have the same dimensions.
func (s Shape) Equal(o Shape) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

// Clone returns a copy of s that shares no memory with it (never nil).
func (s Shape) Clone() Shape {
	c := make(Shape, len(s))
	copy(c, s)
	return c
}

// Strides returns row-major element strides.
func (s Shape) Strides() []int {
	st := make([]int, len(s))
	acc := 1
	for i := len(s) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= s[i]
	}
	return st
}

// String formats the shape as [2,3].
func (s Shape) String() string {
	var b strings.Builder
	b.WriteByte('[')
	for i, d := range s {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(d))
	}
	b.WriteByte(']')
	return b.String()
}

// Type is the abstract value of an array: dtype, shape, memory space and, when
// it is spread over several devices, its sharding.
//
// The fields are ordered so that a Type takes 40 bytes, as it did before
// Sharding was added (DType and Space share a word): runtime objects that
// embed one stay in their allocation size classes.
type Type struct {
	DType DType
	Space MemorySpace
	Shape Shape
	// Sharding places the array on a device mesh (see NamedSharding); nil
	// means the whole array lives on one device. Shape is always the global
	// shape; ShardShape gives each device's block. Shape rules (InferTypes)
	// ignore shardings and give unsharded types; shardings on op results are
	// set by sharding propagation or read back from IR text.
	Sharding *NamedSharding
}

// TypeOf builds a device Type.
func TypeOf(dt DType, dims ...int) Type { return Type{DType: dt, Shape: Shape(dims).Clone()} }

// Equal reports whether two types have the same dtype, shape, space and
// sharding (NamedSharding.Equal; nil equals only nil).
func (t Type) Equal(o Type) bool {
	return t.EqualUnsharded(o) && t.Sharding.Equal(o.Sharding)
}

// EqualUnsharded reports whether two types have the same dtype, shape and
// space, whatever their shardings: the comparison of shape rules.
func (t Type) EqualUnsharded(o Type) bool {
	return t.DType == o.DType && t.Space == o.Space && t.Shape.Equal(o.Shape)
}

// Rank returns the number of dimensions.
func (t Type) Rank() int { return len(t.Shape) }

// Size returns the number of elements of the whole (global) array.
func (t Type) Size() int { return t.Shape.Size() }

// Bytes returns the number of bytes of the whole (global) array of this type.
func (t Type) Bytes() int64 { return int64(t.Shape.Size()) * int64(t.DType.Size()) }

// Clone returns a copy of t whose shape shares no memory with t's (the
// sharding, immutable, is shared).
func (t Type) Clone() Type {
	t.Shape = t.Shape.Clone()
	return t
}

// WithShape returns t with a different shape and no sharding: a sharding
// belongs to the shape it was checked against.
func (t Type) WithShape(s Shape) Type { return Type{DType: t.DType, Shape: s.Clone(), Space: t.Space} }

// WithDType returns t with a different dtype; the sharding is kept.
func (t Type) WithDType(d DType) Type {
	t = t.Clone()
	t.DType = d
	return t
}

// WithSpace returns t in a different memory space; the sharding is kept.
func (t Type) WithSpace(m MemorySpace) Type {
	t = t.Clone()
	t.Space = m
	return t
}

// WithSharding returns t with sharding s (nil: unsharded). It does not check
// s against the shape; Validate, Verify and ShardShape do.
func (t Type) WithSharding(s *NamedSharding) Type {
	t = t.Clone()
	t.Sharding = s
	return t
}

// ShardShape returns the shape of the block of a t array that each device
// holds: the whole shape when t is unsharded.
func (t Type) ShardShape() (Shape, error) {
	if t.Sharding == nil {
		return t.Shape.Clone(), nil
	}
	return t.Sharding.ShardShape(t.Shape)
}

// ShardBounds returns the block of a t array that a device of its mesh holds:
// for every dimension the index range [start[i], limit[i]). An unsharded
// array is held whole, by whichever device it is on.
func (t Type) ShardBounds(device int) (start, limit []int, err error) {
	if t.Sharding == nil {
		return make([]int, len(t.Shape)), t.Shape.Clone(), nil
	}
	return t.Sharding.ShardBounds(t.Shape, device)
}

// String formats the type as f32[2,3], followed by braces when it lives
// outside device memory or is sharded: f32[2,3]{pinned_host},
// f32[8,4]{sharding<mesh[x=2,y=4], [x,{}]>}, or both, the space first.
func (t Type) String() string { return string(t.AppendText(nil)) }

// AppendText appends t as String writes it to b, without allocating when b has
// room: for cache keys built on every call.
func (t Type) AppendText(b []byte) []byte {
	b = append(b, t.DType.String()...)
	b = append(b, '[')
	for i, d := range t.Shape {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(d), 10)
	}
	b = append(b, ']')
	if t.Space == Device && t.Sharding == nil {
		return b
	}
	b = append(b, '{')
	if t.Space != Device {
		b = append(b, t.Space.String()...)
		if t.Sharding != nil {
			b = append(b, ", "...)
		}
	}
	if t.Sharding != nil {
		b = t.Sharding.appendText(b)
	}
	return append(b, '}')
}

// Key returns a compact string usable as a cache key.
func (t Type) Key() string { return t.String() }

// ParseType parses the output of Type.String, checking the type as Verify
// does (a sharding must be valid for the shape).
func ParseType(s string) (Type, error) { return parseAll(s, (*parser).parseType) }
