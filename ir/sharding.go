package ir

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxMeshDevices is the largest number of devices a Mesh may have.
const MaxMeshDevices = 1 << 16

// Mesh is a grid of devices with named axes, like jax.sharding.Mesh: shape
// [2, 4] with names [x, y] arranges 8 devices in 2 rows (x) of 4 (y). The
// devices are IDs: a device's index within its platform (0 for the first
// device). A Mesh is immutable; build it with NewMesh.
type Mesh struct {
	shape []int
	names []string
	n     int // number of devices; 0 in a Mesh not built by NewMesh
	// devices lists the devices row-major (devices[i] is at the coordinates
	// of flat index i), and pos maps them back; both are nil when the
	// devices are 0, 1, …, n-1 in order, so that a mesh costs O(axes).
	devices []int
	pos     map[int]int
}

// NewMesh returns the mesh of the given axis sizes and names over devices,
// listed row-major (the last axis varies fastest); with no devices it uses
// 0, 1, …, N-1, where N is the product of the sizes. Names must be distinct
// identifiers ([A-Za-z_][A-Za-z0-9_]*), sizes positive, devices distinct and
// non-negative, exactly N of them, and N at most MaxMeshDevices. A mesh with no
// axes has one device.
func NewMesh(shape []int, names []string, devices ...int) (*Mesh, error) {
	if len(shape) != len(names) {
		return nil, fmt.Errorf("mesh: %d axis sizes %v but %d names %v", len(shape), shape, len(names), names)
	}
	n := 1
	for i, name := range names {
		if name == "" {
			return nil, fmt.Errorf("mesh: axis %d has an empty name", i)
		}
		if !isIdent(name) {
			return nil, fmt.Errorf("mesh: axis name %q is not an identifier ([A-Za-z_][A-Za-z0-9_]*)", name)
		}
		for j := range i {
			if names[j] == name {
				return nil, fmt.Errorf("mesh: axis name %q is used twice (axes %d and %d)", name, j, i)
			}
		}
		if shape[i] <= 0 {
			return nil, fmt.Errorf("mesh: axis %s has size %d; sizes must be positive", name, shape[i])
		}
		if shape[i] > MaxMeshDevices || n*shape[i] > MaxMeshDevices {
			return nil, fmt.Errorf("mesh: axis sizes %v make more than MaxMeshDevices=%d devices", shape, MaxMeshDevices)
		}
		n *= shape[i]
	}
	m := &Mesh{shape: append([]int{}, shape...), names: append([]string{}, names...), n: n}
	if len(devices) == 0 {
		return m, nil
	}
	if len(devices) != n {
		return nil, fmt.Errorf("mesh: axis sizes %v need %d devices, got %d", shape, n, len(devices))
	}
	pos := make(map[int]int, n)
	iota := true
	for i, d := range devices {
		if d < 0 {
			return nil, fmt.Errorf("mesh: device %d is negative", d)
		}
		if j, dup := pos[d]; dup {
			return nil, fmt.Errorf("mesh: device %d appears twice (positions %d and %d)", d, j, i)
		}
		pos[d] = i
		iota = iota && d == i
	}
	if !iota {
		m.devices, m.pos = append([]int{}, devices...), pos
	}
	return m, nil
}

// device returns the device at flat (row-major) index i.
func (m *Mesh) device(i int) int {
	if m.devices == nil {
		return i
	}
	return m.devices[i]
}

// flat returns the flat index of a device.
func (m *Mesh) flat(device int) (int, bool) {
	if m.devices == nil {
		return device, 0 <= device && device < m.n
	}
	i, ok := m.pos[device]
	return i, ok
}

// check reports whether m was built by NewMesh.
func (m *Mesh) check() error {
	if m == nil {
		return fmt.Errorf("nil mesh")
	}
	if m.n == 0 {
		return fmt.Errorf("mesh is not initialised (build it with NewMesh)")
	}
	return nil
}

// NumAxes returns the number of mesh axes.
func (m *Mesh) NumAxes() int {
	if m == nil {
		return 0
	}
	return len(m.shape)
}

// AxisNames returns a copy of the axis names, major to minor.
func (m *Mesh) AxisNames() []string {
	if m == nil {
		return []string{}
	}
	return append([]string{}, m.names...)
}

// Shape returns a copy of the axis sizes, major to minor.
func (m *Mesh) Shape() []int {
	if m == nil {
		return []int{}
	}
	return append([]int{}, m.shape...)
}

// AxisIndex returns the position of the named axis, or -1 when m has none.
func (m *Mesh) AxisIndex(name string) int {
	if m == nil {
		return -1
	}
	for i, n := range m.names {
		if n == name {
			return i
		}
	}
	return -1
}

// AxisSize returns the size of the named axis, or 0 when m has no such axis.
func (m *Mesh) AxisSize(name string) int {
	if i := m.AxisIndex(name); i >= 0 {
		return m.shape[i]
	}
	return 0
}

// NumDevices returns the number of devices (the product of the axis sizes).
func (m *Mesh) NumDevices() int {
	if m == nil {
		return 0
	}
	return m.n
}

// Devices returns the device IDs in mesh order (row-major), a new slice.
func (m *Mesh) Devices() []int {
	if m == nil {
		return []int{}
	}
	out := make([]int, m.n)
	for i := range out {
		out[i] = m.device(i)
	}
	return out
}

// Device returns the device at the given mesh coordinates, one per axis.
func (m *Mesh) Device(coords ...int) (int, error) {
	if err := m.check(); err != nil {
		return 0, err
	}
	if len(coords) != len(m.shape) {
		return 0, fmt.Errorf("%v: %d coordinates %v for %d axes", m, len(coords), coords, len(m.shape))
	}
	flat := 0
	for i, c := range coords {
		if c < 0 || c >= m.shape[i] {
			return 0, fmt.Errorf("%v: coordinate %d of axis %s is outside [0, %d)", m, c, m.names[i], m.shape[i])
		}
		flat = flat*m.shape[i] + c
	}
	return m.device(flat), nil
}

// Coords returns the mesh coordinates of a device, one per axis.
func (m *Mesh) Coords(device int) ([]int, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	flat, ok := m.flat(device)
	if !ok {
		return nil, fmt.Errorf("device %d is not in %v", device, m)
	}
	c := make([]int, len(m.shape))
	for i := len(m.shape) - 1; i >= 0; i-- {
		c[i] = flat % m.shape[i]
		flat /= m.shape[i]
	}
	return c, nil
}

// AxisGroups partitions the devices into the groups that a collective over
// the named axes works within: devices whose coordinates agree on every other
// axis. Within a group the devices are ordered by their coordinates on the
// named axes, in the order given (the first major), which is the order an
// all-gather concatenates their pieces in; the groups are ordered by the
// mesh position of their first device. With no names every device is its own
// group; with all names there is one group.
func (m *Mesh) AxisGroups(axes ...string) ([][]int, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	in := make([]bool, len(m.shape))
	idx := make([]int, len(axes))
	groupSize := 1
	for i, a := range axes {
		k := m.AxisIndex(a)
		if k < 0 {
			return nil, fmt.Errorf("%v has no axis %q", m, a)
		}
		if in[k] {
			return nil, fmt.Errorf("axis %q is named twice in %v", a, axes)
		}
		in[k], idx[i] = true, k
		groupSize *= m.shape[k]
	}
	groups := make([][]int, m.n/groupSize)
	for flat := range m.n {
		d := m.device(flat)
		c, _ := m.Coords(d)
		g, r := 0, 0 // group: the other axes row-major; rank in it: the named ones in the given order
		for k, ck := range c {
			if !in[k] {
				g = g*m.shape[k] + ck
			}
		}
		for _, k := range idx {
			r = r*m.shape[k] + c[k]
		}
		if groups[g] == nil {
			groups[g] = make([]int, groupSize)
		}
		groups[g][r] = d
	}
	return groups, nil
}

// Equal reports whether two meshes have the same axes (names and sizes, in
// order) over the same devices in the same order. Nil equals only nil.
func (m *Mesh) Equal(o *Mesh) bool {
	if m == nil || o == nil {
		return m == o
	}
	if m == o {
		return true
	}
	if len(m.shape) != len(o.shape) || m.n != o.n || len(m.devices) != len(o.devices) {
		return false
	}
	for i := range m.shape {
		if m.shape[i] != o.shape[i] || m.names[i] != o.names[i] {
			return false
		}
	}
	for i := range m.devices {
		if m.devices[i] != o.devices[i] {
			return false
		}
	}
	return true
}

// String formats the mesh as mesh[x=2,y=4], followed inside the brackets by
// ,devices=[…] when the devices are not 0, 1, …, N-1 in order.
func (m *Mesh) String() string { return string(m.appendText(nil)) }

func (m *Mesh) appendText(b []byte) []byte {
	if m == nil {
		return append(b, "mesh<nil>"...)
	}
	b = append(b, "mesh["...)
	for i, name := range m.names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, name...)
		b = append(b, '=')
		if i < len(m.shape) {
			b = strconv.AppendInt(b, int64(m.shape[i]), 10)
		}
	}
	if m.devices != nil {
		if len(m.names) > 0 {
			b = append(b, ',')
		}
		b = append(b, "devices=["...)
		for i, d := range m.devices {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(d), 10)
		}
		b = append(b, ']')
	}
	return append(b, ']')
}

// PartitionSpec says, for each dimension of an array, which mesh axes it is
// split over, like jax.sharding.PartitionSpec. Entry i lists the axes of
// dimension i: none (nil or empty) leaves the dimension whole (replicated
// along it), one axis splits it into that axis's size of equal blocks, several
// split it over the product of their sizes, the first axis major: on a mesh
// [x=2, y=4], {"x", "y"} gives 8 blocks, block 4·x+y on the device at (x, y).
// Dimensions past the end of the spec are not split. Mesh axes the spec does
// not name replicate the array: devices that differ only along them hold the
// same block. Write one as a composite literal, JAX's
// PartitionSpec(('x', 'y'), None) being
//
//	ir.PartitionSpec{{"x", "y"}, nil}
//
// or, when every dimension has at most one axis, with P. A spec must not be
// modified once it is part of a NamedSharding.
type PartitionSpec [][]string

// P returns the spec that splits dimension i over the mesh axis names[i], or
// leaves it whole where names[i] is "": P("x", "") is PartitionSpec{{"x"}, nil},
// JAX's P('x', None).
func P(names ...string) PartitionSpec {
	s := make(PartitionSpec, len(names))
	for i, n := range names {
		if n != "" {
			s[i] = []string{n}
		}
	}
	return s
}

// Clone returns a deep copy of p.
func (p PartitionSpec) Clone() PartitionSpec {
	if p == nil {
		return nil
	}
	c := make(PartitionSpec, len(p))
	for i, axes := range p {
		if len(axes) > 0 {
			c[i] = append([]string{}, axes...)
		}
	}
	return c
}

// Equal reports whether two specs have the same number of entries and the
// same axes in each, in order; nil and empty entries are equal.
func (p PartitionSpec) Equal(o PartitionSpec) bool {
	if len(p) != len(o) {
		return false
	}
	for i := range p {
		if len(p[i]) != len(o[i]) {
			return false
		}
		for j := range p[i] {
			if p[i][j] != o[i][j] {
				return false
			}
		}
	}
	return true
}

// String formats the spec as [x,{x,y},{}]: a dimension split over one axis
// shows its name, over several their names in braces, a whole one {}.
func (p PartitionSpec) String() string { return string(p.appendText(nil)) }

func (p PartitionSpec) appendText(b []byte) []byte {
	b = append(b, '[')
	for i, axes := range p {
		if i > 0 {
			b = append(b, ',')
		}
		if len(axes) == 1 {
			b = append(b, axes[0]...)
			continue
		}
		b = append(b, '{')
		for j, a := range axes {
			if j > 0 {
				b = append(b, ',')
			}
			b = append(b, a...)
		}
		b = append(b, '}')
	}
	return append(b, ']')
}

// NamedSharding places an array on a mesh: the spec says which mesh axes split
// each dimension, like jax.sharding.NamedSharding. Every device of the mesh
// holds one block of the array (its shard); see ShardShape and ShardBounds.
// Build one with NewNamedSharding, which checks it; Validate checks one
// against an array shape. A NamedSharding is shared by the types that carry it
// and must not be modified.
type NamedSharding struct {
	Mesh *Mesh
	Spec PartitionSpec
}

// NewNamedSharding returns the sharding of spec (which it copies) over mesh,
// checking that every axis the spec names is an axis of the mesh and that no
// axis is named twice.
func NewNamedSharding(mesh *Mesh, spec PartitionSpec) (*NamedSharding, error) {
	s := &NamedSharding{Mesh: mesh, Spec: spec.Clone()}
	if err := s.checkSpec(); err != nil {
		return nil, err
	}
	return s, nil
}

// checkSpec checks the parts of s that do not depend on the array shape.
func (s *NamedSharding) checkSpec() error {
	if s == nil {
		return fmt.Errorf("nil sharding")
	}
	if s.Mesh == nil {
		return fmt.Errorf("sharding %v has no mesh", s.Spec)
	}
	if err := s.Mesh.check(); err != nil {
		return err
	}
	used := map[string]int{}
	for d, axes := range s.Spec {
		for _, a := range axes {
			if s.Mesh.AxisIndex(a) < 0 {
				return fmt.Errorf("partition spec %v: dimension %d names mesh axis %q, which %v does not have", s.Spec, d, a, s.Mesh)
			}
			if prev, dup := used[a]; dup {
				if prev == d {
					return fmt.Errorf("partition spec %v: mesh axis %q is used twice in dimension %d", s.Spec, a, d)
				}
				return fmt.Errorf("partition spec %v: mesh axis %q is used by dimensions %d and %d; an axis may split one dimension only", s.Spec, a, prev, d)
			}
			used[a] = d
		}
	}
	return nil
}

// Validate checks that s can shard an array of the given shape: s has a mesh
// built by NewMesh, its spec names only axes of the mesh, each at most once,
// has no more entries than the shape has dimensions, and the product of each
// dimension's axis sizes divides that dimension.
func (s *NamedSharding) Validate(shape Shape) error {
	if err := s.checkSpec(); err != nil {
		return err
	}
	if len(s.Spec) > len(shape) {
		return fmt.Errorf("partition spec %v has %d entries, more than the %d dimensions of shape %v", s.Spec, len(s.Spec), len(shape), shape)
	}
	for d, axes := range s.Spec {
		n := s.ways(d)
		if shape[d]%n != 0 {
			what := "mesh axis " + axes[0]
			if len(axes) > 1 {
				sizes := make([]string, len(axes))
				for i, a := range axes {
					sizes[i] = strconv.Itoa(s.Mesh.AxisSize(a))
				}
				what = fmt.Sprintf("mesh axes {%s} (%s = %d devices)", strings.Join(axes, ","), strings.Join(sizes, "×"), n)
			} else {
				what += fmt.Sprintf(" (size %d)", n)
			}
			return fmt.Errorf("partition spec %v: dimension %d of shape %v has size %d, which %s does not divide", s.Spec, d, shape, shape[d], what)
		}
	}
	return nil
}

// ways returns how many blocks dimension d is split into.
func (s *NamedSharding) ways(d int) int {
	n := 1
	if d < len(s.Spec) {
		for _, a := range s.Spec[d] {
			n *= s.Mesh.AxisSize(a)
		}
	}
	return n
}

// ShardShape returns the shape of the block every device holds of an array
// of the given shape: each dimension divided by the product of its axis sizes.
func (s *NamedSharding) ShardShape(shape Shape) (Shape, error) {
	if err := s.Validate(shape); err != nil {
		return nil, err
	}
	out := shape.Clone()
	for d := range s.Spec {
		out[d] /= s.ways(d)
	}
	return out, nil
}

// ShardBounds returns the block of an array of the given shape that a device
// holds: for every dimension the index range [start[i], limit[i]).
func (s *NamedSharding) ShardBounds(shape Shape, device int) (start, limit []int, err error) {
	local, err := s.ShardShape(shape)
	if err != nil {
		return nil, nil, err
	}
	coords, err := s.Mesh.Coords(device)
	if err != nil {
		return nil, nil, err
	}
	start, limit = make([]int, len(shape)), make([]int, len(shape))
	for d := range shape {
		block := 0
		if d < len(s.Spec) {
			for _, a := range s.Spec[d] {
				k := s.Mesh.AxisIndex(a)
				block = block*s.Mesh.shape[k] + coords[k]
			}
		}
		start[d] = block * local[d]
		limit[d] = start[d] + local[d]
	}
	return start, limit, nil
}

// NumShards returns how many distinct blocks the array is split into: the
// product of the sizes of the axes the spec names (1 when fully replicated
// or nil).
func (s *NamedSharding) NumShards() int {
	if s == nil {
		return 1
	}
	n := 1
	for d := range s.Spec {
		n *= s.ways(d)
	}
	return n
}

// IsFullyReplicated reports whether every device holds the whole array: the
// spec names no axis, or only axes of size 1. It is true of nil (the whole
// array on one device).
func (s *NamedSharding) IsFullyReplicated() bool { return s.NumShards() == 1 }

// ReplicaGroups returns the sets of devices that hold identical blocks: the
// mesh's AxisGroups over the axes the spec does not name. Every group has
// NumDevices/NumShards devices, listed in mesh order; the groups are ordered
// by the mesh position of their first device.
func (s *NamedSharding) ReplicaGroups() ([][]int, error) {
	if err := s.checkSpec(); err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for _, axes := range s.Spec {
		for _, a := range axes {
			used[a] = true
		}
	}
	var free []string
	for _, a := range s.Mesh.names {
		if !used[a] {
			free = append(free, a)
		}
	}
	return s.Mesh.AxisGroups(free...)
}

// Equal reports whether two shardings have equal meshes and equal specs
// (PartitionSpec.Equal): P("x") and P("x", "") differ here, though they place
// a matrix alike (see EquivalentTo). Nil equals only nil.
func (s *NamedSharding) Equal(o *NamedSharding) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s == o || s.Mesh.Equal(o.Mesh) && s.Spec.Equal(o.Spec)
}

// EquivalentTo reports whether s and o place an array of the given rank
// alike: on equal meshes, every dimension is split over the same axes in the
// same order once axes of size 1 are dropped and missing trailing entries
// count as whole dimensions. Every device then holds the same block under
// both.
func (s *NamedSharding) EquivalentTo(o *NamedSharding, rank int) bool {
	if s == nil || o == nil {
		return s == o
	}
	if !s.Mesh.Equal(o.Mesh) || len(s.Spec) > rank || len(o.Spec) > rank {
		return false
	}
	effective := func(p PartitionSpec, d int) []string {
		var out []string
		if d < len(p) {
			for _, a := range p[d] {
				if s.Mesh.AxisSize(a) != 1 {
					out = append(out, a)
				}
			}
		}
		return out
	}
	for d := range rank {
		x, y := effective(s.Spec, d), effective(o.Spec, d)
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
	}
	return true
}

// String formats the sharding as sharding<mesh[x=2,y=4], [x,{}]>, the form
// types print it in (see Type.String).
func (s *NamedSharding) String() string { return string(s.appendText(nil)) }

func (s *NamedSharding) appendText(b []byte) []byte {
	if s == nil {
		return append(b, "sharding<nil>"...)
	}
	b = append(b, "sharding<"...)
	b = s.Mesh.appendText(b)
	b = append(b, ", "...)
	b = s.Spec.appendText(b)
	return append(b, '>')
}

// ParseSharding parses the output of NamedSharding.String and checks the
// spec against the mesh as NewNamedSharding does.
func ParseSharding(text string) (*NamedSharding, error) {
	return parseAll(text, (*parser).parseSharding)
}

// inferShardingConstraint checks the constraint's sharding against the
// operand's shape; the result has the operand's (unsharded) type, as every
// shape rule gives, and the tracer sets the sharding on it.
func inferShardingConstraint(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	s, err := ParseSharding(a.String("sharding"))
	if err != nil {
		return nil, fmt.Errorf("sharding_constraint: %w", err)
	}
	if err := s.Validate(args[0].Shape); err != nil {
		return nil, fmt.Errorf("sharding_constraint: %w", err)
	}
	return one(args[0].WithSharding(nil)), nil
}

// ConstraintSharding returns the sharding a sharding_constraint op names.
func ConstraintSharding(op *Op) (*NamedSharding, error) {
	if op.Code != ShardingConstraint {
		return nil, fmt.Errorf("%s is not a sharding_constraint", op.Code.Info().Name)
	}
	return ParseSharding(op.Attrs.String("sharding"))
}
