package runtime

import (
	"fmt"
	"slices"
	"sync"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// Shard is one device's block of an array: the index range [Start, Limit)
// of every dimension of the global array, held by Array, a concrete array
// committed to Device. It is jax.Shard, an element of
// jax.Array.addressable_shards.
type Shard struct {
	// Device holds the block.
	Device Device
	// Start and Limit bound the block in the global array, per dimension.
	Start, Limit []int
	// Array is the block: an unsharded array of shape Limit−Start on
	// Device, sharing its memory with the sharded array (deleting either
	// frees it).
	Array *trace.Array
}

// shardedBuffer is the buffer of an array spread over the devices of a
// mesh (DevicePut): its type is the global type with the sharding, and each
// device of the mesh holds its own block, an ordinary buffer of that
// device's pool, replicas in full on each replica's device.
type shardedBuffer struct {
	typ    ir.Type // global shape, with the sharding
	shards []Shard // one per mesh device of this process, in mesh order (localPositions)

	mu      sync.Mutex
	deleted bool
}

// Type returns the global type, with its sharding.
func (b *shardedBuffer) Type() ir.Type { return b.typ.Clone() }

// Sharding returns the array's sharding.
func (b *shardedBuffer) Sharding() *ir.NamedSharding { return b.typ.Sharding }

// Literal assembles the global array on the host from the shards, reading
// one replica of every block. In a job of several processes
// (InitDistributed) it gathers the blocks of the other processes' devices:
// it is a collective that every process calls, whichever processes hold
// the mesh's devices (processAllGather) — except in a job joined by a TCP
// rendezvous, which carries no array data (see readsFromProcesses).
func (b *shardedBuffer) Literal() (*ir.Literal, error) {
	if b.isDeleted() {
		return nil, fmt.Errorf("sharded array %v was deleted", b.typ)
	}
	if gather, err := readsFromProcesses(b.typ.Sharding.Mesh); err != nil {
		return nil, err
	} else if gather {
		return processAllGather(b)
	}
	out := ir.NewLiteral(b.typ)
	es := b.typ.DType.Size()
	done := map[string]bool{}
	for _, s := range b.shards {
		k := fmt.Sprint(s.Start)
		if done[k] {
			continue // a replica of a block already read
		}
		done[k] = true
		l, err := s.Array.Buffer().Literal()
		if err != nil {
			return nil, fmt.Errorf("shard on %s: %w", backend.DeviceName(s.Device.Platform, s.Device.ID), err)
		}
		copyBlock(out.Data, b.typ.Shape, l.Data, s.Start, s.Limit, es, false)
	}
	return out, nil
}

// Delete frees every shard.
func (b *shardedBuffer) Delete() error {
	b.mu.Lock()
	if b.deleted {
		b.mu.Unlock()
		return nil
	}
	b.deleted = true
	b.mu.Unlock()
	var first error
	for _, s := range b.shards {
		if err := s.Array.Delete(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (b *shardedBuffer) isDeleted() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.deleted
}

// copyBlock copies between the row-major array global of shape shape and
// the row-major block [start, limit) of it held in block: from block into
// global, or (extract) from global into block. es is the element size in
// bytes.
func copyBlock(global []byte, shape ir.Shape, block []byte, start, limit []int, es int, extract bool) {
	rank := len(shape)
	if rank == 0 {
		if extract {
			copy(block, global[:es])
		} else {
			copy(global[:es], block)
		}
		return
	}
	for d := range rank {
		if limit[d] <= start[d] {
			return // an empty block
		}
	}
	// strides of the global array, in elements
	stride := make([]int, rank)
	stride[rank-1] = 1
	for d := rank - 2; d >= 0; d-- {
		stride[d] = stride[d+1] * shape[d+1]
	}
	row := (limit[rank-1] - start[rank-1]) * es // contiguous bytes per block row
	idx := append([]int{}, start...)            // global index of the row's first element
	for off := 0; off < len(block); off += row {
		g := 0
		for d := range rank {
			g += idx[d] * stride[d]
		}
		g *= es
		if extract {
			copy(block[off:off+row], global[g:g+row])
		} else {
			copy(global[g:g+row], block[off:off+row])
		}
		for d := rank - 2; d >= 0; d-- { // next row: odometer over the outer dimensions
			idx[d]++
			if idx[d] < limit[d] {
				break
			}
			idx[d] = start[d]
		}
	}
}

// DevicePut spreads x over the devices of a mesh as sharding s says, like
// jax.device_put(x, NamedSharding(mesh, spec)): every device of s.Mesh (a
// device ID of the default backend) gets its block of x (ir.NamedSharding's
// ShardBounds) in its own pool, in x's memory space; devices that differ
// only along mesh axes the spec does not name each hold a full copy of the
// same block. The result's Type() is x's type with the sharding; it is
// committed (IsCommitted), and Shards lists its blocks. Literal, Float32s
// and the other readers assemble the whole array, and ToDevice gathers it
// onto one device. In a job of several processes (InitDistributed) x is
// the whole host array, the same in every process, and only this process's
// devices get their blocks; reading the result whole is then a collective
// that every process calls. DevicePut is named after JAX's function; ToDevice puts
// an array on one device. x is returned as it is when it already has
// sharding s; an array with another sharding is gathered and split anew.
//
// Jitted functions and eager ops given sharded arrays run partitioned over
// their mesh, each device computing its block (see Jit). Errors name the
// problem: a spec that does not fit x's shape (ir.NamedSharding.Validate), or
// a mesh with devices the backend does not have (set FERRY_CPU_DEVICES or
// SetCPUDeviceCount).
func DevicePut(x *trace.Array, s *ir.NamedSharding) (*trace.Array, error) {
	const op = "DevicePut"
	b, err := concreteBuffer(op, x)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, trace.Errorf(op, "nil sharding: to put %v on one device use rt.ToDevice", x.Type())
	}
	typ := x.Type()
	if err := s.Validate(typ.Shape); err != nil {
		return nil, trace.Errorf(op, "cannot shard %v: %v", typ.WithSharding(nil), err)
	}
	be := DefaultBackend()
	if err := checkMeshDevices(be, s.Mesh); err != nil {
		return nil, trace.Errorf(op, "%v", err)
	}
	if sb, ok := b.(*shardedBuffer); ok && sb.typ.Sharding.Equal(s) && !sb.isDeleted() {
		return x, nil
	}
	p, ok := be.(backend.Placer)
	if !ok && len(localPositions(s.Mesh)) > 1 {
		return nil, trace.Errorf(op, "the %s backend cannot place arrays on several devices", be.Name())
	}
	l, err := b.Literal()
	if err != nil {
		return nil, trace.WrapError(op, err)
	}
	y, err := putShards(be, p, l, typ.WithSharding(s))
	if err != nil {
		return nil, trace.WrapError(op, err)
	}
	return y, nil
}

// putShards copies the blocks of the host array l into new buffers on the
// devices of typ's sharding and returns the sharded array; p places them (nil
// for a single-device backend, whose only device is 0).
func putShards(be Backend, p backend.Placer, l *ir.Literal, typ ir.Type) (*trace.Array, error) {
	local, err := typ.Sharding.ShardShape(typ.Shape)
	if err != nil {
		return nil, err
	}
	es := typ.DType.Size()
	return putBlocks(be, p, typ, func(_ Device, start, limit []int) (*ir.Literal, error) {
		bl := ir.NewLiteral(ir.Type{DType: typ.DType, Shape: local, Space: typ.Space})
		copyBlock(l.Data, typ.Shape, bl.Data, start, limit, es, true)
		return bl, nil
	})
}

// putBlocks makes the sharded array of type typ from the blocks block
// returns, one call per distinct block of this process's devices of the
// mesh (replicas share it), each copied into a new buffer on its devices.
func putBlocks(be Backend, p backend.Placer, typ ir.Type, block func(d Device, start, limit []int) (*ir.Literal, error)) (_ *trace.Array, err error) {
	s := typ.Sharding
	local, err := s.ShardShape(typ.Shape)
	if err != nil {
		return nil, err
	}
	sb := &shardedBuffer{typ: typ}
	defer func() {
		if err != nil {
			_ = sb.Delete()
		}
	}()
	devs := globalDevices(be)
	blocks := map[string]*ir.Literal{} // each block made once, for all its replicas
	for _, g := range s.Mesh.Devices() {
		id, ok := localID(g)
		if !ok {
			continue // another process's device
		}
		start, limit, err := s.ShardBounds(typ.Shape, g)
		if err != nil {
			return nil, err
		}
		d := devs[g]
		k := fmt.Sprint(start)
		bl := blocks[k]
		if bl == nil {
			if bl, err = block(d, start, limit); err != nil {
				return nil, err
			}
			if bl == nil || bl.Type.DType != typ.DType || !slices.Equal(bl.Type.Shape, local) {
				var got any = "nil"
				if bl != nil {
					got = bl.Type.WithSharding(nil)
				}
				return nil, fmt.Errorf("block %v..%v of %v for %s is %v, want %v", start, limit, typ, backend.DeviceName(be.Name(), g),
					got, ir.Type{DType: typ.DType, Shape: local})
			}
			if bl.Type.Space != typ.Space {
				c := *bl
				c.Type = ir.Type{DType: typ.DType, Shape: local, Space: typ.Space}
				bl = &c
			}
			blocks[k] = bl
		}
		var buf trace.Buffer
		if p != nil {
			buf, err = p.FromLiteralOn(bl, id)
		} else {
			buf, err = be.FromLiteral(bl)
		}
		if err != nil {
			return nil, fmt.Errorf("shard %v of %v on %s: %w", start, typ, backend.DeviceName(be.Name(), g), err)
		}
		sb.shards = append(sb.shards, Shard{Device: d, Start: start, Limit: limit, Array: trace.FromBuffer(buf)})
	}
	return trace.FromBuffer(sb), nil
}

// MakeShardedArray makes an array of type typ laid out as typ.Sharding
// says from blocks that block returns, like jax.make_array_from_callback:
// block(d, start, limit) returns the block [start, limit) of the global
// array (a literal of typ's dtype and shape limit−start) for device d. It
// is called once per distinct block among this process's devices of the
// mesh, in mesh order; devices holding replicas of a block get copies of
// it. In a job of several processes (InitDistributed) each process makes
// its own devices' blocks, as DevicePut puts them. The result is what
// DevicePut of the whole array would give; typ.Space places it. Errors:
// typ without a sharding, a sharding that does not fit typ's shape or
// names devices the job lacks, a block of the wrong type, or block's own
// error.
func MakeShardedArray(typ ir.Type, block func(d Device, start, limit []int) (*ir.Literal, error)) (*trace.Array, error) {
	const op = "MakeShardedArray"
	s := typ.Sharding
	if s == nil {
		return nil, trace.Errorf(op, "%v has no sharding: make an unsharded array with rt.FromLiteral", typ)
	}
	if err := s.Validate(typ.Shape); err != nil {
		return nil, trace.Errorf(op, "cannot shard %v: %v", typ.WithSharding(nil), err)
	}
	be := DefaultBackend()
	if err := checkMeshDevices(be, s.Mesh); err != nil {
		return nil, trace.Errorf(op, "%v", err)
	}
	p, ok := be.(backend.Placer)
	if !ok && len(localPositions(s.Mesh)) > 1 {
		return nil, trace.Errorf(op, "the %s backend cannot place arrays on several devices", be.Name())
	}
	y, err := putBlocks(be, p, typ.Clone(), block)
	if err != nil {
		return nil, trace.WrapError(op, err)
	}
	return y, nil
}

// checkMeshDevices returns an error unless every device of m is a device of
// be (of any process of the job: see InitDistributed).
func checkMeshDevices(be Backend, m *ir.Mesh) error {
	n := len(globalDevices(be))
	if _, np, k, on := distInfo(); on {
		for _, d := range m.Devices() {
			if d >= n {
				return fmt.Errorf("%v uses device %d, but the job has devices 0 to %d (%d processes of %d devices)", m, d, n-1, np, k)
			}
		}
		return nil
	}
	if m.NumDevices() > n {
		return fmt.Errorf("%v needs %d devices, the %s backend has %d; set %s=%d (or rt.SetCPUDeviceCount) before making arrays",
			m, m.NumDevices(), be.Name(), n, EnvCPUDevices, m.NumDevices())
	}
	for _, d := range m.Devices() {
		if d >= n {
			return fmt.Errorf("%v uses device %d, but the %s backend has devices 0 to %d; set %s (or rt.SetCPUDeviceCount) for more",
				m, d, be.Name(), n-1, EnvCPUDevices)
		}
	}
	return nil
}

// Shards returns the blocks of a concrete array, one per device holding
// one, like jax.Array.addressable_shards: for an array from DevicePut, one
// per device of its mesh in mesh order (replicated blocks once on each of
// their devices), in a job of several processes (InitDistributed) only
// those of this process's devices; for an unsharded array, the whole array
// on its device.
// The shard arrays share memory with x.
func Shards(x *trace.Array) ([]Shard, error) {
	b, err := concreteBuffer("Shards", x)
	if err != nil {
		return nil, err
	}
	sb, ok := b.(*shardedBuffer)
	if !ok {
		d, err := DeviceOf(x)
		if err != nil {
			return nil, err
		}
		return []Shard{{Device: d, Start: make([]int, x.Rank()), Limit: x.Shape(), Array: x}}, nil
	}
	if sb.isDeleted() {
		return nil, trace.Errorf("Shards", "sharded array %v was deleted", sb.typ)
	}
	out := make([]Shard, len(sb.shards))
	for i, s := range sb.shards {
		out[i] = Shard{Device: s.Device, Start: append([]int{}, s.Start...), Limit: append([]int{}, s.Limit...), Array: s.Array}
	}
	return out, nil
}

// shardedArg returns the index of the first sharded buffer of bufs, or -1.
func shardedArg(bufs []trace.Buffer) int {
	for i, b := range bufs {
		if _, ok := b.(*shardedBuffer); ok {
			return i
		}
	}
	return -1
}

// shardedArgError says that computations do not take sharded arrays yet;
// what names the argument.
func shardedArgError(what string, t ir.Type) string {
	return fmt.Sprintf("%s is sharded (%v): sharded arrays cannot be computed on yet: gather it with rt.ToDevice(x, dev)", what, t)
}

// checkUnshardedLeaves returns an error naming the first sharded leaf of a
// call of the function name, whose arguments have tree structures defs.
func checkUnshardedLeaves(name string, leaves []*trace.Array, defs []*trace.TreeDef) error {
	for i, l := range leaves {
		if l == nil || l.IsTraced() {
			continue
		}
		if _, ok := l.Buffer().(*shardedBuffer); ok {
			return trace.Errorf("rt.Jit", "%s: %s", name, shardedArgError(argLeafName(defs, i), l.Type()))
		}
	}
	return nil
}

// argLeafName names leaf i of arguments with tree structures defs
// ("argument 2", "leaf 1 of argument 0").
func argLeafName(defs []*trace.TreeDef, i int) string {
	k := 0
	for a, d := range defs {
		n := d.NumLeaves()
		if i < k+n {
			if n == 1 {
				return fmt.Sprintf("argument %d", a)
			}
			return fmt.Sprintf("leaf %d of argument %d", i-k, a)
		}
		k += n
	}
	return fmt.Sprintf("argument leaf %d", i)
}

// PutSharded lays a concrete array out over a mesh for
// trace.WithShardingConstraint outside a trace (trace.ShardingPlacer): it is
// DevicePut.
func (eagerExecutor) PutSharded(x *trace.Array, s *ir.NamedSharding) (*trace.Array, error) {
	return DevicePut(x, s)
}
