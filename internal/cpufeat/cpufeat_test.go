package cpufeat

import (
	"os"
	"runtime"
	"strings"
	"testing"
)

// The flags agree with the kernel's view of the CPU in /proc/cpuinfo
// (Linux lists a vector extension only when it enables its state).
func TestMatchesProcCPUInfo(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		if AVX2FMA || AVX512F || BMI2 {
			t.Fatalf("features on %s: AVX2FMA %v AVX512F %v BMI2 %v", runtime.GOARCH, AVX2FMA, AVX512F, BMI2)
		}
		return
	}
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Skipf("no /proc/cpuinfo: %v", err)
	}
	var flags map[string]bool
	for line := range strings.SplitSeq(string(b), "\n") {
		if name, list, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(name) == "flags" {
			flags = map[string]bool{}
			for _, f := range strings.Fields(list) {
				flags[f] = true
			}
			break
		}
	}
	if flags == nil {
		t.Skip("no flags line in /proc/cpuinfo")
	}
	avx2fma := flags["avx2"] && flags["fma"]
	want := map[string][2]bool{
		"AVX2FMA": {AVX2FMA, avx2fma},
		"AVX512F": {AVX512F, avx2fma && flags["avx512f"]},
		"BMI2":    {BMI2, avx2fma && flags["bmi2"]},
	}
	for name, w := range want {
		if w[0] != w[1] {
			t.Errorf("%s = %v, /proc/cpuinfo says %v", name, w[0], w[1])
		}
	}
	t.Logf("AVX2FMA %v AVX512F %v BMI2 %v", AVX2FMA, AVX512F, BMI2)
}
