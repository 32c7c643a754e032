package difftest

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// regressions are programs that once failed the differential tests, run
// through cpuexec against eval on fresh random arguments.
var regressions = []struct{ name, src string }{
	// Found by TestShardedRandom (seed 21261), a bug of buffer assignment,
	// not of sharding: the loop fusion wrote its u8[4,10] result over its
	// f32[10] operand (40 bytes both, other elements) and clobbered operand
	// elements it had still to read for the f32 result.
	{"fusion in place over another element count", `func @f(%0: f32[8], %1: f32[1,8], %2: i32[], %3: u8[8,11], %4: f32[10], %5: f32[]) -> (f32[]) {
  %6 = pad(%0, %5) {high=[1], interior=[0], low=[1]} : f32[10]
  %7 = floor(%6) : f32[10]
  %8 = tanh(%4) : f32[10]
  %9 = broadcast_in_dim(%8) {dims=[1], shape=[4,10]} : f32[4,10]
  %10 = convert(%9) {dtype=u8} : u8[4,10]
  %16, %17, %18, %19 = scan(%10, %3, %2, %3, %1) {length=1, num_carry=4, num_consts=0, reverse=true} (
    ^(%11: u8[4,10], %12: u8[8,11], %13: i32[], %14: u8[8,11], %15: f32[8]) {
      return %11, %12, %13, %14
    }) : u8[4,10], u8[8,11], i32[], u8[8,11]
  %20 = mul(%7, %8) : f32[10]
  %21 = dynamic_slice(%20, %18) {sizes=[10]} : f32[10]
  %22 = reduce_prod(%21) {axes=[0]} : f32[]
  return %22
}`},
}

func TestRegressions(t *testing.T) {
	for _, r := range regressions {
		t.Run(r.name, func(t *testing.T) {
			f, err := ir.Parse(r.src)
			if err != nil {
				t.Fatal(err)
			}
			rng := testseed.Rand(t, 7)
			for range 4 {
				c := &testCase{f: f, args: randprog.Args(rng, f), concurrent: 1, donated: make([]bool, len(f.Body.Params)),
					opts: passes.Options{Verify: true, FusionInPlace: true}}
				if fail := run(c); fail != nil {
					t.Fatalf("%v\n%v", fail, c)
				}
			}
		})
	}
}
