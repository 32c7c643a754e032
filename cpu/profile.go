package cpu

import (
	"io"
	"os"
	goruntime "runtime"
	"time"

	"github.com/google/pprof/profile"

	"github.com/ferryml/ferry/backend"
)

// SaveDeviceMemoryProfile writes a profile of the live buffers of every memory
// pool, and of every registered backend that reports its memory (cuda), in
// pprof format (gzip-compressed protobuf), like
// jax.profiler.save_device_memory_profile. Read it with `go tool pprof`. It has
// one sample per live buffer with two values, allocations (count) and space
// (bytes, the default), the Go call stack that allocated the buffer as its
// locations, and labels: device (cpu:0, ...), space (device or pinned_host), kind (array or
// scratch), what, site (the user's file:line), for arrays dtype and shape,
// and platform for memory of a backend other than the CPU one ("cuda");
// the numeric label bytes is the size.
func SaveDeviceMemoryProfile(w io.Writer) error {
	return memPools.memoryProfile().Write(w)
}

// profileEntry is a copy of a record taken under its pool's lock.
type profileEntry struct {
	live backend.LiveArray
	pcs  []uintptr
	born time.Time
}

func (ps *Pools) memoryProfile() *profile.Profile {
	var entries []profileEntry
	now := time.Now()
	for _, p := range ps.set().all {
		p.mu.Lock()
		recs := make([]*allocRecord, 0, p.nlive)
		for r := p.live; r != nil; r = r.next {
			recs = append(recs, r)
		}
		sortRecords(recs)
		for _, r := range recs {
			entries = append(entries, profileEntry{live: r.liveArrayLocked(now), pcs: append([]uintptr(nil), r.pcs()...), born: r.bornTime()})
		}
		p.mu.Unlock()
	}
	for _, m := range otherMemories() {
		for _, a := range m.LiveAllocations() {
			entries = append(entries, profileEntry{live: backend.LiveArrayOf(a, now), pcs: a.PCs, born: a.Born})
		}
	}

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
	for _, e := range entries {
		s := &profile.Sample{
			Value: []int64{1, e.live.Bytes},
			Label: map[string][]string{"space": {e.live.Space.String()}, "what": {e.live.What}, "site": {e.live.Site},
				"device": {backend.DeviceName(e.live.Platform, e.live.Device)}},
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
