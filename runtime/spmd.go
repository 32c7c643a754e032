package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/runtime/distributed"
	"github.com/ferryml/ferry/trace"
)

// hasSharding reports whether a value of f (nested regions included) has a
// sharding: then f runs partitioned over the sharding's mesh.
func hasSharding(f *ir.Func) bool {
	found := false
	var walk func(r *ir.Region)
	walk = func(r *ir.Region) {
		for _, v := range r.Params {
			found = found || v.Type.Sharding != nil
		}
		for _, op := range r.Ops {
			for _, v := range op.Results {
				found = found || v.Type.Sharding != nil
			}
			for _, sub := range op.Regions {
				walk(sub)
			}
		}
	}
	walk(f.Body)
	return found
}

// compileFunc compiles f on be; a function with a sharded value is
// partitioned over its mesh first (compileSharded).
func compileFunc(be Backend, f *ir.Func, opts CompileOptions) (Executable, error) {
	if !hasSharding(f) {
		return be.Compile(f, opts)
	}
	return compileSharded(be, f, opts)
}

// shardedExecutable runs a partitioned function: the per-device program on
// every device of the mesh at once, one goroutine per device, with
// communicators between them (package collective's in-process engine).
// Its arguments and results are sharded arrays.
type shardedExecutable struct {
	be      Backend
	part    *passes.Partitioned
	exe     Executable // the per-device program
	params  []ir.Type  // the global parameter types, unsharded
	global  []ir.Type  // the global result types, with their shardings
	donated []bool     // parameters whose blocks the program may reuse
	// blocks holds, for every result and mesh position, the bounds (start,
	// limit) of the block that position's device holds.
	blocks [][][2][]int

	mu      sync.Mutex
	free    [][]map[string]collective.Communicator    // idle communicator sets
	freeDev [][]map[string]backend.DeviceCommunicator // idle device communicator sets (nccl.go)
}

// compileSharded partitions f (passes.Partition) and compiles the
// per-device program once for all devices of the mesh. A donated parameter
// donates its blocks: the per-device program may write a result's block
// over them.
func compileSharded(be Backend, f *ir.Func, opts CompileOptions) (Executable, error) {
	part, err := passes.Partition(f)
	if err != nil {
		return nil, err
	}
	if err := checkMeshDevices(be, part.Mesh); err != nil {
		return nil, err
	}
	// A backend of one device runs one device's program per process: a
	// mesh over several processes' devices (InitDistributed), one each.
	if _, ok := be.(backend.Placer); !ok && len(localPositions(part.Mesh)) > 1 {
		return nil, fmt.Errorf("the %s backend cannot run a program on several devices", be.Name())
	}
	exe, err := be.Compile(part.Func, CompileOptions{Donated: opts.Donated, BoundAxes: part.Axes})
	if err != nil {
		return nil, err
	}
	e := &shardedExecutable{be: be, part: part, exe: exe, donated: opts.Donated}
	for _, v := range f.Body.Params {
		e.params = append(e.params, v.Type.WithSharding(nil))
	}
	all := part.Mesh.Devices()
	for i, v := range f.Body.Results {
		t := v.Type.WithSharding(part.Results[i])
		e.global = append(e.global, t)
		blocks := make([][2][]int, len(all))
		for r, id := range all {
			if blocks[r][0], blocks[r][1], err = t.Sharding.ShardBounds(t.Shape, id); err != nil {
				return nil, err
			}
		}
		e.blocks = append(e.blocks, blocks)
	}
	return e, nil
}

// Program returns the per-device program: its memory analysis is what
// each device needs.
func (e *shardedExecutable) Program() *passes.Program { return e.exe.Program() }

// Partitioned returns the partitioned function.
func (e *shardedExecutable) Partitioned() *passes.Partitioned { return e.part }

// Execute runs the per-device program on every device of the mesh.
// Arguments laid out as the program wants are used in place; any other
// argument (unsharded, or sharded otherwise) is copied into that layout
// for the call. The results are sharded arrays committed to the mesh's
// devices. A donated sharded argument used in place is deleted by the call
// (its blocks are the results' now, or freed).
func (e *shardedExecutable) Execute(args []trace.Buffer, opts ExecOptions) (_ []trace.Buffer, err error) {
	m := e.part.Mesh
	all := m.Devices()
	pos := localPositions(m) // the mesh positions this process runs
	devs := make([]int, len(pos))
	for i, r := range pos {
		devs[i] = all[r]
	}
	if len(args) != len(e.params) {
		return nil, fmt.Errorf("takes %d arguments, got %d", len(e.params), len(args))
	}
	local, temps, given, err := e.layOut(args, len(devs))
	defer func() {
		for _, t := range temps {
			_ = t.Delete()
		}
	}()
	if err != nil {
		return nil, err
	}
	// Every device's blocks are held before any device runs (see
	// backend.HoldArgs), so that a running device never waits for a hold.
	for r := range devs {
		if err := backend.HoldArgs(local[r], e.donated, opts.DonationSite); err != nil {
			for q := range r {
				backend.ReleaseArgs(local[q], e.donated)
			}
			return nil, fmt.Errorf("on %s: %w", backend.DeviceName(e.be.Name(), devs[r]), err)
		}
	}
	defer func() {
		for r := range devs {
			backend.ReleaseArgs(local[r], e.donated)
		}
	}()
	outs, err := e.runDevices(local, devs, opts)
	if err != nil {
		return nil, err
	}
	for _, sb := range given {
		sb.mu.Lock()
		sb.deleted = true // its blocks were handed to the results
		sb.mu.Unlock()
	}
	hw := globalDevices(e.be)
	res := make([]trace.Buffer, len(e.global))
	for i, t := range e.global {
		sb := &shardedBuffer{typ: t.Clone()}
		for r, id := range devs {
			b := e.blocks[i][pos[r]]
			sb.shards = append(sb.shards, Shard{Device: hw[id], Start: b[0], Limit: b[1], Array: trace.FromBuffer(outs[r][i])})
		}
		res[i] = sb
	}
	return res, nil
}

// layOut returns the blocks of args for each of this process's n devices
// of the mesh, in the layout the program takes: arguments laid out so are
// used in place (given lists the donated ones), others are copied into
// that layout (temps, for the caller to delete).
func (e *shardedExecutable) layOut(args []trace.Buffer, n int) (local [][]trace.Buffer, temps, given []*shardedBuffer, err error) {
	local = make([][]trace.Buffer, n)
	placer, _ := e.be.(backend.Placer)
	for i, b := range args {
		want := e.part.Params[i]
		sb, ok := b.(*shardedBuffer)
		if !ok || sb.isDeleted() || !sb.typ.Sharding.EquivalentTo(want, len(e.params[i].Shape)) {
			if ok && sb.isDeleted() {
				return nil, temps, nil, fmt.Errorf("argument %d: sharded array %v was deleted", i, sb.typ)
			}
			l, err := b.Literal()
			if err != nil {
				return nil, temps, nil, fmt.Errorf("argument %d: %w", i, err)
			}
			arr, err := putShards(e.be, placer, l, e.params[i].WithSharding(want))
			if err != nil {
				return nil, temps, nil, fmt.Errorf("argument %d: laying it out as %v: %w", i, want, err)
			}
			sb = arr.Buffer().(*shardedBuffer)
			temps = append(temps, sb)
		} else if i < len(e.donated) && e.donated[i] {
			given = append(given, sb)
		}
		if len(sb.shards) != n {
			return nil, temps, nil, fmt.Errorf("argument %d: sharded array %v holds %d blocks in this process, the mesh has %d devices here", i, sb.typ, len(sb.shards), n)
		}
		for r := range n {
			local[r] = append(local[r], sb.shards[r].Array.Buffer())
		}
	}
	return local, temps, given, nil
}

// runDevices runs the per-device program on the blocks local of each of
// this process's devices devs at once, with their communicators, and
// returns each device's results. When a device fails, the results made are
// deleted and the communicators closed (aborted, for device ones); when all
// succeed, the communicators are kept for the next call.
func (e *shardedExecutable) runDevices(local [][]trace.Buffer, devs []int, opts ExecOptions) ([][]trace.Buffer, error) {
	ctx := opts.Context
	if ctx == nil {
		ctx = context.Background()
	}
	var comms []map[string]collective.Communicator
	var dcomms []map[string]backend.DeviceCommunicator
	var err error
	if usesDeviceComms(e.be) {
		dcomms, err = e.deviceComms(ctx)
	} else {
		comms, err = e.comms(ctx)
	}
	if err != nil {
		return nil, err
	}
	outs := make([][]trace.Buffer, len(devs))
	errs := distributed.OnEachDevice(len(devs), func(r int) (err error) {
		id, _ := localID(devs[r])
		o := ExecOptions{Device: id, Commit: true, Context: ctx, DonationSite: opts.DonationSite}
		if r < len(comms) {
			o.Comms = comms[r]
		}
		if r < len(dcomms) {
			o.DeviceComms = dcomms[r]
		}
		outs[r], err = e.exe.Execute(local[r], o)
		if err != nil && r < len(comms) {
			for _, c := range comms[r] {
				c.Abort(err)
			}
		}
		return err
	})
	if err := firstError(errs, devs); err != nil {
		distributed.AbortDeviceComms(dcomms) // the failed device's executor aborted its own; the others' state is unknown
		for _, o := range outs {
			for _, b := range o {
				_ = trace.FromBuffer(b).Delete()
			}
		}
		for _, set := range comms {
			for _, c := range set {
				_ = c.Close()
			}
		}
		return nil, err
	}
	if len(e.part.Axes) > 0 { // sets without communicators are not kept
		e.mu.Lock()
		if dcomms != nil {
			e.freeDev = append(e.freeDev, dcomms)
		} else if comms != nil {
			e.free = append(e.free, comms)
		}
		e.mu.Unlock()
	}
	return outs, nil
}

// firstError returns the error of the first device that failed on its own
// (not because another device aborted the collectives), naming the device.
func firstError(errs []error, devs []int) error {
	var aborted error
	for r, err := range errs {
		if err == nil {
			continue
		}
		err = fmt.Errorf("device %d: %w", devs[r], err)
		if !errors.Is(err, collective.ErrAborted) {
			return err
		}
		if aborted == nil {
			aborted = err
		}
	}
	return aborted
}

// takeIdle pops a communicator set an earlier call left in free (guarded
// by mu).
func takeIdle[T any](mu *sync.Mutex, free *[]T) (set T, ok bool) {
	mu.Lock()
	defer mu.Unlock()
	if k := len(*free); k > 0 {
		set, *free = (*free)[k-1], (*free)[:k-1]
		return set, true
	}
	return set, false
}

// comms returns a set of communicators, one map per device of this
// process (in mesh order) from each axis string of the program to the
// device's communicator of that group: an idle set of an earlier call, or a
// new one. A mesh over the devices of several processes (InitDistributed)
// gets its communicators from the job's world of devices, and making them is
// collective over the job: every process makes them at the same call.
func (e *shardedExecutable) comms(ctx context.Context) ([]map[string]collective.Communicator, error) {
	m := e.part.Mesh
	n := len(localPositions(m))
	if len(e.part.Axes) == 0 {
		return make([]map[string]collective.Communicator, n), nil
	}
	if set, ok := takeIdle(&e.mu, &e.free); ok {
		return set, nil
	}
	axesOf := func(ax string) []int {
		var idx []int
		for _, name := range strings.Split(ax, ",") {
			idx = append(idx, m.AxisIndex(name))
		}
		return idx
	}
	if job := currentJob(); job != nil {
		switch {
		case job.SpansProcesses(m):
			// Even with no device of the mesh here, this process takes part
			// in the split of the world.
			return job.WorldComms(ctx, m, e.part.Axes, axesOf)
		case !slices.Contains(job.MeshProcesses(m), job.Process()):
			return nil, nil // another process's mesh: nothing runs here
		}
	}
	world, err := collective.NewLocal(n)
	if err != nil {
		return nil, err
	}
	set := make([]map[string]collective.Communicator, n)
	errs := distributed.OnEachDevice(n, func(r int) error {
		set[r] = map[string]collective.Communicator{}
		for _, ax := range e.part.Axes {
			c, err := collective.MeshAxes(ctx, world[r], m.Shape(), axesOf(ax)...)
			if err != nil {
				err = fmt.Errorf("communicator over %s: %w", ax, err)
				world[r].Abort(err)
				return err
			}
			set[r][ax] = c
		}
		return nil
	})
	return set, errors.Join(errs...)
}

// executeSharded runs a partitioned executable for execute; want (a device
// for CallOn) must be unset: the mesh says where the program runs.
func (e *entry) executeSharded(s *callScratch, se *shardedExecutable, site string, want int) error {
	if want >= 0 {
		return trace.Errorf("rt.Jit", "%s: the program is partitioned over %v: it runs on the mesh's devices, not on one chosen device", e.lowered.Func.Name, se.part.Mesh)
	}
	outBufs, err := se.Execute(s.bufs, ExecOptions{DonationSite: site})
	if err != nil {
		return trace.WrapError("rt.Jit", fmt.Errorf("%s: %w", e.lowered.Func.Name, err))
	}
	s.outs = outBufs
	s.arrays = s.arrays[:0]
	for _, b := range outBufs {
		s.arrays = append(s.arrays, trace.FromBuffer(b))
	}
	return nil
}

// executeSharded runs an eager op on arguments of which one at least is
// sharded: the op's one-op function, with the operands' shardings, is
// partitioned like a jitted function's (and cached by its key and the
// shardings).
func executeSharded(key []byte, build func() *ir.Func, args []trace.Buffer) ([]trace.Buffer, error) {
	if len(key) > 0 {
		k := append([]byte(nil), key...)
		for _, a := range args {
			k = append(k, '|')
			if s := a.Type().Sharding; s != nil {
				k = append(k, s.String()...)
			}
		}
		key = k
	}
	ex, err := eagerCompile(key, build)
	if err != nil {
		return nil, err
	}
	if _, ok := ex.(*shardedExecutable); !ok {
		return nil, fmt.Errorf("internal error: the op on sharded operands did not compile to a partitioned program")
	}
	return ex.Execute(args, ExecOptions{})
}

// constrainIn makes parameter i of the trace tr take sharding s
// (InShardings): a sharding constraint on it, from which propagation gives
// the parameter its layout.
func constrainIn(tr *trace.Tracer, params []*trace.Array, i int, s *ir.NamedSharding) (err error) {
	defer trace.Recover(&err)
	tr.Push()
	defer tr.Pop()
	params[i] = trace.WithShardingConstraint(params[i], s)
	return nil
}
