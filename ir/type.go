package ir

import (
	"fmt"
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

// Type is the abstract value of an array: dtype, shape and memory space.
type Type struct {
	DType DType
	Shape Shape
	Space MemorySpace
}

// TypeOf builds a device Type.
func TypeOf(dt DType, dims ...int) Type { return Type{DType: dt, Shape: Shape(dims).Clone()} }

// Equal reports whether two types have the same dtype, shape and space.
func (t Type) Equal(o Type) bool {
	return t.DType == o.DType && t.Space == o.Space && t.Shape.Equal(o.Shape)
}

// Rank returns the number of dimensions.
func (t Type) Rank() int { return len(t.Shape) }

// Size returns the number of elements.
func (t Type) Size() int { return t.Shape.Size() }

// Bytes returns the number of bytes of an array of this type.
func (t Type) Bytes() int64 { return int64(t.Shape.Size()) * int64(t.DType.Size()) }

// WithShape returns t with a different shape.
func (t Type) WithShape(s Shape) Type { return Type{DType: t.DType, Shape: s.Clone(), Space: t.Space} }

// WithDType returns t with a different dtype.
func (t Type) WithDType(d DType) Type { return Type{DType: d, Shape: t.Shape.Clone(), Space: t.Space} }

// WithSpace returns t in a different memory space.
func (t Type) WithSpace(m MemorySpace) Type {
	return Type{DType: t.DType, Shape: t.Shape.Clone(), Space: m}
}

// String formats the type as f32[2,3], with {pinned_host} appended outside device memory.
func (t Type) String() string {
	s := t.DType.String() + t.Shape.String()
	if t.Space != Device {
		s += "{" + t.Space.String() + "}"
	}
	return s
}

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
	if t.Space != Device {
		b = append(b, '{')
		b = append(b, t.Space.String()...)
		b = append(b, '}')
	}
	return b
}

// Key returns a compact string usable as a cache key.
func (t Type) Key() string { return t.String() }

// ParseType parses the output of Type.String.
func ParseType(s string) (Type, error) {
	var t Type
	br := strings.IndexByte(s, '[')
	if br < 0 || !strings.Contains(s[br:], "]") {
		return t, fmt.Errorf("bad type %q: want dtype[dims]", s)
	}
	dt, err := ParseDType(s[:br])
	if err != nil {
		return t, err
	}
	end := br + strings.IndexByte(s[br:], ']')
	dims := s[br+1 : end]
	shape := Shape{}
	if dims != "" {
		for _, p := range strings.Split(dims, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil || n < 0 {
				return t, fmt.Errorf("bad dimension %q in type %q", p, s)
			}
			shape = append(shape, n)
		}
	}
	t = Type{DType: dt, Shape: shape}
	rest := s[end+1:]
	if rest != "" {
		if len(rest) < 2 || rest[0] != '{' || rest[len(rest)-1] != '}' {
			return t, fmt.Errorf("bad memory space suffix %q in type %q", rest, s)
		}
		sp, err := ParseMemorySpace(rest[1 : len(rest)-1])
		if err != nil {
			return t, err
		}
		t.Space = sp
	}
	return t, nil
}
