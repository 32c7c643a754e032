//go:build amd64 && linux

package vmath

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	e "github.com/ferryml/ferry/cpu/internal/amd64enc"
	"github.com/ferryml/ferry/internal/settings"
)

// Instruction microbenchmarks: loops of generated code that time one
// instruction kind on zmm registers, at throughput (12 independent results
// per iteration from fixed sources) and at latency (each result the next
// one's source), in core clock cycles (calibrated with a chain of dependent
// scalar adds, one cycle each). Run with
//
//	FERRY_BENCH_INSTR=1 go test ./cpu/vmath -run InstrTable -v
//
// The table feeds the choice of instruction sequences in the kernels
// (bench/RESULTS.md, 2026-11-24).

// microLoop compiles a loop running body args[0] times, with Z0, Z1 and
// Z4..Z31 holding 1.0, Z2 1.5, Z3 0.0 and K1 0x5555 on entry.
func microLoop(t testing.TB, body func(a *e.Asm)) *execMem {
	var a e.Asm
	a.MOVQload(e.Mem{Base: e.RDI}, e.RCX)
	for z := e.Z(0); z < 32; z++ {
		a.VBROADCASTSS(a.ConstF(1), z)
	}
	a.VBROADCASTSS(a.ConstF(1.5), 2)
	a.VPXORD(e.Z(3), 3, 3)
	a.MOVL(0x5555, e.RDX)
	a.KMOVW(e.RDX, 1)
	top := a.NewLabel()
	a.Bind(top)
	body(&a)
	a.SUBQ(1, e.RCX)
	a.Jcc(e.CondNE, top)
	a.VZEROUPPER()
	a.RET()
	code, err := a.Finish()
	if err != nil {
		t.Fatal(err)
	}
	m, err := mapExec(code)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// minTime returns the least nanoseconds per unit of f(k) (k units) over
// repeated runs of about 5 ms: the machine is shared, and the least time is
// the one least disturbed by other work.
func minTime(f func(k int)) float64 {
	k := 1
	for {
		t0 := time.Now()
		f(k)
		if time.Since(t0) > 2*time.Millisecond {
			break
		}
		k *= 2
	}
	best := math.Inf(1)
	for range 15 {
		t0 := time.Now()
		f(k)
		best = min(best, float64(time.Since(t0).Nanoseconds())/float64(k))
	}
	return best
}

// timeLoop returns the nanoseconds per iteration of m.
func timeLoop(m *execMem) float64 {
	args := []uint64{0}
	return minTime(func(k int) {
		args[0] = uint64(k)
		m.call(&args[0])
	})
}

type microKind struct {
	name string
	// emit writes one instance reading fixed sources into dst (tp) or,
	// with dep, reading dst itself (latency).
	emit func(a *e.Asm, dst e.Z, dep bool)
}

func src(dep bool, dst, fixed e.Z) e.Z {
	if dep {
		return dst
	}
	return fixed
}

var microKinds = []microKind{
	{"vaddps", func(a *e.Asm, d e.Z, dep bool) { a.VADDPS(e.Z(1), src(dep, d, 0), d) }},
	{"vmulps", func(a *e.Asm, d e.Z, dep bool) { a.VMULPS(e.Z(1), src(dep, d, 0), d) }},
	{"vfmadd231ps", func(a *e.Asm, d e.Z, dep bool) { a.VFMADD231PS(e.Z(3), 1, d) }},
	{"vfmadd213ps {1to16}", func(a *e.Asm, d e.Z, dep bool) { a.VFMADD213PS(a.ConstF(0), 1, d) }},
	{"vmaxps", func(a *e.Asm, d e.Z, dep bool) { a.VMAXPS(e.Z(1), src(dep, d, 0), d) }},
	{"vdivps", func(a *e.Asm, d e.Z, dep bool) { a.VDIVPS(e.Z(1), src(dep, d, 0), d) }},
	{"vsqrtps", func(a *e.Asm, d e.Z, dep bool) { a.VSQRTPS(src(dep, d, 0), d) }},
	{"vrcp14ps", func(a *e.Asm, d e.Z, dep bool) { a.VRCP14PS(src(dep, d, 0), d) }},
	{"vscalefps", func(a *e.Asm, d e.Z, dep bool) { a.VSCALEFPS(e.Z(3), src(dep, d, 0), d) }},
	{"vrndscaleps", func(a *e.Asm, d e.Z, dep bool) { a.VRNDSCALEPS(8, src(dep, d, 2), d) }},
	{"vgetexpps", func(a *e.Asm, d e.Z, dep bool) { a.VGETEXPPS(src(dep, d, 2), d) }},
	{"vgetmantps", func(a *e.Asm, d e.Z, dep bool) { a.VGETMANTPS(2, src(dep, d, 2), d) }},
	{"vcvtps2dq", func(a *e.Asm, d e.Z, dep bool) { a.VCVTPS2DQ(src(dep, d, 2), d) }},
	{"vcvtdq2ps", func(a *e.Asm, d e.Z, dep bool) { a.VCVTDQ2PS(src(dep, d, 3), d) }},
	{"vpermps", func(a *e.Asm, d e.Z, dep bool) { a.VPERMPS(e.Z(0), src(dep, d, 3), d) }},
	{"vpaddd", func(a *e.Asm, d e.Z, dep bool) { a.VPADDD(e.Z(1), src(dep, d, 0), d) }},
	{"vpslld", func(a *e.Asm, d e.Z, dep bool) { a.VPSLLD(1, src(dep, d, 3), d) }},
	{"vpandd", func(a *e.Asm, d e.Z, dep bool) { a.VPANDD(e.Z(1), src(dep, d, 0), d) }},
	{"vpternlogd", func(a *e.Asm, d e.Z, dep bool) { a.VPTERNLOGD(0xb8, e.Z(0), 1, d) }},
	{"vblendmps", func(a *e.Asm, d e.Z, dep bool) { a.VBLENDMPSk(e.Z(1), src(dep, d, 0), 1, d) }},
	{"vmovaps (reg)", func(a *e.Asm, d e.Z, dep bool) { a.VMOVAPS(src(dep, d-1, 0), d) }},
	{"vbroadcastss (mem)", func(a *e.Asm, d e.Z, dep bool) { a.VBROADCASTSS(a.ConstF(1), d) }},
	{"vcmpps -> k", func(a *e.Asm, d e.Z, dep bool) { a.VCMPPS(0x11, e.Z(1), src(dep, d, 0), 2) }},
}

// cycleNs returns the nanoseconds of one core cycle: 100 dependent 64-bit
// adds per iteration take 100 cycles.
func cycleNs(t testing.TB) float64 {
	m := microLoop(t, func(a *e.Asm) {
		for range 100 {
			a.ADDQ(1, e.RDX)
		}
	})
	return timeLoop(m) / 100
}

// kernelCycles returns the cycles per 16-lane vector of a compiled chain
// over 1024 elements (in L1), element j of vals index v drawn as draw(r, v).
func kernelCycles(t testing.TB, code []Instr, nvals int, uniform []bool, cyc float64, draw func(r *rand.Rand, v int) float32) float64 {
	ch, err := CompileChain(code, nvals, uniform)
	if err != nil {
		t.Skip(err)
	}
	const n = 1024
	r := rand.New(rand.NewPCG(7, 8))
	ptrs := make([]*float32, nvals)
	for i := range ptrs {
		v := make([]float32, n+1024)[microOff*i%1024:][:n]
		for j := range v {
			v[j] = draw(r, i)
		}
		ptrs[i] = &v[0]
	}
	ns := minTime(func(k int) {
		for range k {
			ch.Run(ptrs, n)
		}
	})
	if c := cycleNs(t); c < cyc {
		cyc = c // the clock ran faster: recalibrated with the least time too
	}
	return ns / (n / 16) / cyc
}

var microOff = 80

// normal3 draws N(0, 3²) for every value.
func normal3(r *rand.Rand, _ int) float32 { return float32(r.NormFloat64() * 3) }

// geluDraw draws gelu's inputs as N(0, 1) and its uniform constants as
// the trace sets them (0.044715 and 2√(2/π)), so that the logistic sees the
// arguments of a real gelu rather than huge ones whose exp underflows.
func geluDraw(r *rand.Rand, v int) float32 {
	switch v {
	case 3:
		return 0.044715
	case 4:
		return 1.5957691
	}
	return float32(r.NormFloat64())
}

func TestInstrTable(t *testing.T) {
	if !settings.BenchInstr.Get() {
		t.Skip("set FERRY_BENCH_INSTR=1")
	}
	if !JITAvailable() {
		t.Skip(ErrNoJIT)
	}
	cyc := cycleNs(t)
	var sb strings.Builder
	fmt.Fprintf(&sb, "clock %.2f GHz\n| instruction (zmm) | throughput, cycles/instr | latency, cycles |\n|---|---|---|\n", 1/cyc)
	for _, k := range microKinds {
		tp := microLoop(t, func(a *e.Asm) {
			for i := range 12 {
				k.emit(a, e.Z(20+i), false)
			}
		})
		lat := microLoop(t, func(a *e.Asm) {
			for range 12 {
				k.emit(a, 2, true)
			}
		})
		if k.name == "vmovaps (reg)" {
			lat = microLoop(t, func(a *e.Asm) {
				for i := range 12 {
					k.emit(a, e.Z(5+i), true)
				}
			})
		}
		fmt.Fprintf(&sb, "| %s | %.2f | %.2f |\n", k.name, timeLoop(tp)/12/cyc, timeLoop(lat)/12/cyc)
	}
	fmt.Fprintf(&sb, "\n| chain over 1024 f32 (L1) | cycles per 16-lane vector |\n|---|---|\n")
	for _, op := range []struct {
		name string
		code int32
	}{{"copy (x*1 stored)", OpMul}, {"exp", OpExp}, {"log", OpLog}, {"tanh", OpTanh}, {"logistic", OpLogistic}, {"erf", OpErf}, {"div", OpDiv}} {
		fmt.Fprintf(&sb, "| %s | %.1f |\n", op.name, kernelCycles(t, []Instr{{op.code, 2, 0, 1, 0}}, 3, nil, cyc, normal3))
	}
	code, nv, uni := geluCode()
	fmt.Fprintf(&sb, "| gelu(x*w+b), inputs N(0, 1) | %.1f |\n", kernelCycles(t, code, nv, uni, cyc, geluDraw))
	t.Log("\n" + sb.String())
}
