package backend

import (
	"io"
	"os"
	goruntime "runtime"
	"time"

	"github.com/google/pprof/profile"
)

// WriteMemoryProfile writes allocs (the live allocations of one or more
// backends, as Memory.LiveAllocations lists them) as a pprof profile
// (gzip-compressed protobuf), like jax.profiler.save_device_memory_profile;
// read it with `go tool pprof`. It has one sample per allocation with two
// values, allocations (count) and space (bytes, the default), the Go call
// stack that allocated it as its locations, and labels: device (cpu:0,
// ...), space (device or pinned_host), kind (array or scratch), what, site
// (the user's file:line), for arrays dtype and shape, and platform for
// memory of a backend other than the CPU one ("cuda"); the numeric label
// bytes is the size.
func WriteMemoryProfile(w io.Writer, allocs []Allocation) error {
	return memoryProfile(allocs, time.Now()).Write(w)
}

// AllLiveAllocations lists the live allocations of every registered backend
// that reports its memory, backend by backend in name order.
func AllLiveAllocations() []Allocation {
	var out []Allocation
	for _, b := range All() {
		if m, ok := b.(Memory); ok {
			out = append(out, m.LiveAllocations()...)
		}
	}
	return out
}

func memoryProfile(allocs []Allocation, now time.Time) *profile.Profile {
	exe, _ := os.Executable()
	mapping := &profile.Mapping{ID: 1, Start: 0, Limit: ^uint64(0), File: exe,
		HasFunctions: true, HasFilenames: true, HasLineNumbers: true, HasInlineFrames: true}
	prof := &profile.Profile{
		SampleType:        []*profile.ValueType{{Type: "allocations", Unit: "count"}, {Type: "space", Unit: "bytes"}},
		DefaultSampleType: "space",
		PeriodType:        &profile.ValueType{Type: "space", Unit: "bytes"},
		Period:            1,
		TimeNanos:         now.UnixNano(),
		Mapping:           []*profile.Mapping{mapping},
		Comments:          []string{"ferry memory profile: live buffers of the device and pinned_host pools"},
	}
	locs := map[uintptr]*profile.Location{}
	funcs := map[[2]string]*profile.Function{}
	function := func(name, file string, start int) *profile.Function {
		k := [2]string{name, file}
		if f := funcs[k]; f != nil {
			return f
		}
		f := &profile.Function{ID: uint64(len(prof.Function) + 1), Name: name, SystemName: name, Filename: file, StartLine: int64(start)}
		funcs[k] = f
		prof.Function = append(prof.Function, f)
		return f
	}
	location := func(pc uintptr) *profile.Location {
		if l := locs[pc]; l != nil {
			return l
		}
		l := &profile.Location{ID: uint64(len(prof.Location) + 1), Mapping: mapping, Address: uint64(pc)}
		frames := goruntime.CallersFrames([]uintptr{pc})
		for {
			fr, more := frames.Next()
			name := fr.Function
			if name == "" {
				name = "?"
			}
			l.Line = append(l.Line, profile.Line{Function: function(name, fr.File, 0), Line: int64(fr.Line)})
			if !more {
				break
			}
		}
		locs[pc] = l
		prof.Location = append(prof.Location, l)
		return l
	}
	for _, a := range allocs {
		e := struct {
			live LiveArray
			pcs  []uintptr
		}{LiveArrayOf(a, now), a.PCs}
		s := &profile.Sample{
			Value: []int64{1, e.live.Bytes},
			Label: map[string][]string{"space": {e.live.Space.String()}, "what": {e.live.What}, "site": {e.live.Site},
				"device": {DeviceName(e.live.Platform, e.live.Device)}},
			NumLabel: map[string][]int64{"bytes": {e.live.Bytes}},
			NumUnit:  map[string][]string{"bytes": {"bytes"}},
		}
		if e.live.Platform != "" && e.live.Platform != "cpu" {
			s.Label["platform"] = []string{e.live.Platform}
		}
		if e.live.IsArray {
			s.Label["kind"] = []string{"array"}
			s.Label["dtype"] = []string{e.live.Type.DType.String()}
			s.Label["shape"] = []string{e.live.Type.Shape.String()}
		} else {
			s.Label["kind"] = []string{"scratch"}
		}
		for _, pc := range e.pcs {
			s.Location = append(s.Location, location(pc))
		}
		prof.Sample = append(prof.Sample, s)
	}
	return prof
}
