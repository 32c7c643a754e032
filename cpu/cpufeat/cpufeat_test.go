package cpufeat

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/settings"
)

// The flags agree with the kernel's view of the CPU in /proc/cpuinfo
// (Linux lists a vector extension only when it enables its state).
func TestMatchesProcCPUInfo(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		if Host != (Features{}) || AVX2FMA || AVX512F || BMI2 {
			t.Fatalf("features on %s: host %+v, AVX2FMA %v AVX512F %v BMI2 %v", runtime.GOARCH, Host, AVX2FMA, AVX512F, BMI2)
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
		"AVX2FMA": {Host.AVX2FMA, avx2fma},
		"AVX512F": {Host.AVX512F, avx2fma && flags["avx512f"]},
		"BMI2":    {Host.BMI2, avx2fma && flags["bmi2"]},
	}
	for name, w := range want {
		if w[0] != w[1] {
			t.Errorf("%s = %v, /proc/cpuinfo says %v", name, w[0], w[1])
		}
	}
	t.Logf("host %+v (path %s); in force: path %s, setting %q", Host, Host.Path(), Path(), Setting)
}

// Apply lowers the host's features by FERRY_CPU or GODEBUG, never raises
// them, and warns on what it cannot honour.
func TestApply(t *testing.T) {
	all := Features{AVX2FMA: true, AVX512F: true, BMI2: true}
	avx2 := Features{AVX2FMA: true, BMI2: true}
	cases := []struct {
		host             Features
		ferry, godebug   string
		want             Features
		setting, warning string
	}{
		{all, "", "", all, "", ""},
		{all, "avx512", "", all, "", ""},
		{all, "AVX2", "", avx2, "FERRY_CPU=avx2", ""},
		{all, "go", "", Features{}, "FERRY_CPU=go", ""},
		{all, "avx2", "cpu.all=off", avx2, "FERRY_CPU=avx2", ""}, // FERRY_CPU first
		{avx2, "avx512", "", avx2, "", "no AVX-512"},
		{Features{}, "avx2", "", Features{}, "", "no AVX2"},
		{all, "sse", "", all, "", "not one of"},
		{all, "", "cpu.avx512f=off", avx2, "GODEBUG=cpu.avx512f=off", ""},
		{all, "", "madvdontneed=1, cpu.avx2=off", Features{}, "GODEBUG=cpu.avx2=off", ""},
		{all, "", "cpu.bmi2=off", Features{AVX2FMA: true, AVX512F: true}, "GODEBUG=cpu.bmi2=off", ""},
		{all, "", "cpu.avx512f=on,cpu.all=off", Features{}, "GODEBUG=cpu.all=off", ""},
		{avx2, "", "cpu.avx512f=off", avx2, "", ""}, // nothing to lower
	}
	for _, c := range cases {
		f, setting, warn := Apply(c.host, c.ferry, c.godebug)
		if f != c.want || setting != c.setting || (c.warning == "") != (warn == "") || !strings.Contains(warn, c.warning) {
			t.Errorf("Apply(%+v, %q, %q) = %+v, %q, %q; want %+v, %q, a warning with %q",
				c.host, c.ferry, c.godebug, f, setting, warn, c.want, c.setting, c.warning)
		}
	}
	if p := Paths(); p[len(p)-1] != "go" || p[0] != Host.Path() {
		t.Errorf("Paths() = %v, host path %s", p, Host.Path())
	}
}

// A process started with FERRY_CPU=go runs with every feature off.
func TestSettingInForce(t *testing.T) {
	if settings.CPUFeatChild.Get() {
		if Path() != settings.CPUFeatWant.Get() {
			t.Fatalf("path %s, want %s (setting %q)", Path(), settings.CPUFeatWant.Get(), Setting)
		}
		return
	}
	for _, p := range Paths() {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSettingInForce$")
		cmd.Env = append(os.Environ(), "FERRY_CPUFEAT_CHILD=1", "FERRY_CPU="+p, "FERRY_CPUFEAT_WANT="+p)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("FERRY_CPU=%s: %v\n%s", p, err, out)
		}
	}
}
