// Package cpufeat reports the x86-64 vector features Ferry's kernels
// choose between (cpu/gemm, cpu/vmath): one CPUID and XGETBV
// probe at start-up, so every package agrees on what the CPU and the
// operating system support. A feature counts only when the OS saves the
// register state it needs (XGETBV's XCR0). On other architectures every
// flag is false.
//
// A lower path can be forced on a higher host, for testing and for
// comparing the paths on one machine:
//
//	FERRY_CPU=avx512   the best the host has (the default)
//	FERRY_CPU=avx2     AVX2 and FMA kernels, no AVX-512
//	FERRY_CPU=go       the portable Go kernels, no generated code
//
// Without FERRY_CPU, Go's own convention is honoured as well:
// GODEBUG=cpu.avx512f=off drops AVX-512 (as it does for Go's runtime),
// cpu.avx2=off or cpu.fma=off drops AVX2 and AVX-512, cpu.bmi2=off drops
// BMI2, cpu.all=off drops every feature. A setting can only lower the path:
// asking for a path the host lacks, or an unknown value, is reported once
// on standard error and the best path the host has is used.
package cpufeat

import (
	"fmt"
	"os"
	"strings"

	"github.com/ferryml/ferry/internal/settings"
)

// The features in force, set once at package initialisation: what the host
// supports (Host), lowered by FERRY_CPU or GODEBUG.
var (
	// AVX2FMA: AVX2 and FMA3, with the YMM (AVX) state enabled by the OS.
	AVX2FMA bool
	// AVX512F: AVX-512 Foundation with the opmask, ZMM_Hi256 and Hi16_ZMM
	// state enabled, on a CPU that has AVX2FMA as well.
	AVX512F bool
	// BMI2: the BMI2 instructions (PDEP, PEXT, SHLX, ...), on a CPU that
	// has AVX2FMA as well.
	BMI2 bool
)

// Features is a set of the flags above.
type Features struct {
	AVX2FMA, AVX512F, BMI2 bool
}

// Path names the best kernel path the features allow: "avx512", "avx2" or
// "go".
func (f Features) Path() string {
	switch {
	case f.AVX512F && f.AVX2FMA:
		return "avx512"
	case f.AVX2FMA:
		return "avx2"
	}
	return "go"
}

// Host holds what the CPU and OS support, before any setting lowered it.
var Host Features

// Setting is the setting that lowered the features ("FERRY_CPU=avx2",
// "GODEBUG=cpu.avx512f=off"), or "" when none did.
var Setting string

func init() {
	Host.AVX2FMA, Host.AVX512F, Host.BMI2 = detect()
	cpu, _, err := settings.CPU.Lookup()
	if err != nil {
		settings.Warn(err, Host.Path())
		cpu = ""
	}
	f, setting, warn := Apply(Host, cpu, os.Getenv("GODEBUG"))
	if warn != "" {
		fmt.Fprintln(os.Stderr, "ferry:", warn)
	}
	AVX2FMA, AVX512F, BMI2 = f.AVX2FMA, f.AVX512F, f.BMI2
	Setting = setting
}

// Path names the kernel path in force: "avx512", "avx2" or "go".
func Path() string { return Features{AVX2FMA, AVX512F, BMI2}.Path() }

// Paths lists the paths the host can run, best first ("go" always last):
// the values FERRY_CPU accepts here.
func Paths() []string {
	switch Host.Path() {
	case "avx512":
		return []string{"avx512", "avx2", "go"}
	case "avx2":
		return []string{"avx2", "go"}
	}
	return []string{"go"}
}

// Apply returns host lowered by a FERRY_CPU value (ferryCPU, which takes
// precedence) or the cpu.* options of a GODEBUG value, the setting that
// lowered it ("" if none), and a warning for a value it could not honour
// ("" if none).
func Apply(host Features, ferryCPU, godebug string) (f Features, setting, warning string) {
	f = host
	if v := strings.ToLower(strings.TrimSpace(ferryCPU)); v != "" {
		switch v {
		case "avx512":
			if host.Path() != "avx512" {
				return host, "", fmt.Sprintf("FERRY_CPU=%s: this CPU has no AVX-512; using %s", ferryCPU, host.Path())
			}
			return host, "", ""
		case "avx2":
			if !host.AVX2FMA {
				return host, "", fmt.Sprintf("FERRY_CPU=%s: this CPU has no AVX2 and FMA; using %s", ferryCPU, host.Path())
			}
			f.AVX512F = false
		case "go":
			f = Features{}
		default:
			return host, "", fmt.Sprintf("FERRY_CPU=%q is not one of avx512, avx2, go; using %s", ferryCPU, host.Path())
		}
		if f != host {
			setting = "FERRY_CPU=" + v
		}
		return f, setting, ""
	}
	var used []string
	for opt := range strings.SplitSeq(godebug, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(opt), "=")
		if !ok || !strings.HasPrefix(k, "cpu.") || v != "off" {
			continue
		}
		before := f
		switch strings.TrimPrefix(k, "cpu.") {
		case "avx512f":
			f.AVX512F = false
		case "avx2", "fma", "avx":
			f = Features{}
		case "bmi2":
			f.BMI2 = false
		case "all":
			f = Features{}
		}
		if f != before {
			used = append(used, strings.TrimSpace(opt))
		}
	}
	if len(used) > 0 {
		setting = "GODEBUG=" + strings.Join(used, ",")
	}
	return f, setting, ""
}
