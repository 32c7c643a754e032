package main

import (
	"fmt"
	"testing"
)

// TestMemoryAgainstXLA compiles every program with abstract arguments and
// compares Ferry's memory analysis with XLA:CPU's, read from the committed
// testdata/xla_memory.json:
//
//   - argument bytes must equal XLA's (the same parameters, by definition);
//   - output bytes must equal XLA's without its tuple index table;
//   - alias bytes must equal XLA's unless the program is in knownAliasGaps;
//   - temp bytes must be at most XLA's unless the program is in knownGaps.
//
// It logs the temp ratio of every program and the reason of every known gap,
// and fails on a known gap that has closed, so that the list stays true.
func TestMemoryAgainstXLA(t *testing.T) {
	x, err := loadXLA("")
	if err != nil {
		t.Fatal(err)
	}
	ps := programs()
	if len(ps) < 20 {
		t.Fatalf("%d programs, want at least 20", len(ps))
	}
	if len(x.Programs) != len(ps) {
		t.Errorf("testdata/xla_memory.json has %d programs, programs.go %d: regenerate it with xla_memory.py --write", len(x.Programs), len(ps))
	}
	for name := range knownGaps {
		if _, ok := x.Programs[name]; !ok {
			t.Errorf("knownGaps names %s, which is not a program", name)
		}
	}
	for name := range knownAliasGaps {
		if _, ok := x.Programs[name]; !ok {
			t.Errorf("knownAliasGaps names %s, which is not a program", name)
		}
	}
	rs, err := rows(x, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		t.Run(r.Program, func(t *testing.T) {
			if r.Argument != r.XLAArgument {
				t.Errorf("argument bytes: Ferry %d, XLA %d", r.Argument, r.XLAArgument)
			}
			if r.Output != r.XLAOutput {
				t.Errorf("output bytes: Ferry %d, XLA %d (without the tuple table)", r.Output, r.XLAOutput)
			}
			if r.HostTemp != 0 || r.XLAHostTemp != 0 {
				t.Errorf("host temp bytes: Ferry %d, XLA %d; these programs are device-only", r.HostTemp, r.XLAHostTemp)
			}
			aliasGap, aliasKnown := knownAliasGaps[r.Program]
			switch {
			case r.Alias != r.XLAAlias && !aliasKnown:
				t.Errorf("alias bytes: Ferry %d, XLA %d", r.Alias, r.XLAAlias)
			case r.Alias != r.XLAAlias:
				t.Logf("known alias gap: Ferry %d, XLA %d: %s", r.Alias, r.XLAAlias, aliasGap)
			case aliasKnown:
				t.Errorf("alias bytes now equal XLA's (%d): remove %s from knownAliasGaps", r.Alias, r.Program)
			}
			gap, known := knownGaps[r.Program]
			msg := fmt.Sprintf("temp: Ferry %d B, XLA %d B, ratio %s", r.Temp, r.XLATemp, ratioString(r.TempRatio))
			switch {
			case r.Temp > r.XLATemp && !known:
				t.Errorf("%s: Ferry needs more temp memory than XLA:CPU", msg)
			case r.Temp > r.XLATemp:
				t.Logf("%s; known gap: %s", msg, gap)
			case known:
				t.Errorf("%s: the gap has closed, remove %s from knownGaps", msg, r.Program)
			default:
				t.Log(msg)
			}
		})
	}
}

// TestOutputArrays checks the tuple-table correction against XLA's rule: a
// single output has no table; n > 1 outputs have 8 bytes per output.
func TestOutputArrays(t *testing.T) {
	if got := (XLA{Output: 400, OutputLeaves: 1}).OutputArrays(); got != 400 {
		t.Errorf("one output: %d, want 400", got)
	}
	if got := (XLA{Output: 424, OutputLeaves: 3}).OutputArrays(); got != 400 {
		t.Errorf("three outputs: %d, want 400", got)
	}
}
