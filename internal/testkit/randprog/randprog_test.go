package randprog

import (
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

// census counts, over programs, the ops at any depth, device_puts inside
// scan bodies, and scan results computed from constants alone.
type census struct {
	codes        map[ir.Code]int
	scanCopies   int
	constResults int
}

func (c *census) region(r *ir.Region, inScan bool) {
	for _, op := range r.Ops {
		c.codes[op.Code]++
		if inScan && op.Code == ir.DevicePut {
			c.scanCopies++
		}
		for _, sr := range op.Regions {
			c.region(sr, inScan || op.Code == ir.Scan)
		}
		if op.Code == ir.Scan {
			body := op.Regions[0]
			dep := map[*ir.Value]bool{}
			for _, p := range body.Params {
				dep[p] = true
			}
			for _, o := range body.Ops {
				for i, a := range o.Args {
					switch {
					case o.Code == ir.OptimizationBarrier:
						dep[o.Results[i]] = dep[a]
					case dep[a]:
						for _, v := range o.Results {
							dep[v] = true
						}
					}
				}
			}
			for _, v := range body.Results {
				if !dep[v] {
					c.constResults++
				}
			}
		}
	}
}

func take(feat Features, seeds int) *census {
	c := &census{codes: map[ir.Code]int{}}
	for seed := range uint64(seeds) {
		c.region(New(seed, feat).Body, false)
	}
	return c
}

// Every op the generator means to cover shows up, the programs verify, and
// switching a feature off removes what it stands for.
func TestCoverage(t *testing.T) {
	for seed := range uint64(300) {
		require.NoError(t, ir.Verify(New(seed, All())), "seed %d", seed)
	}
	all := take(All(), 300)
	for _, c := range ir.AllCodes() {
		if c == ir.Fusion || c == ir.BitcastConvert && all.codes[c] == 0 {
			continue
		}
		if c.IsCollective() {
			// Programs here run on one device (the differential test):
			// a collective has no meaning there (no axis is bound).
			require.Zero(t, all.codes[c], "%v generated, but no axis is bound", c)
			continue
		}
		require.Positive(t, all.codes[c], "%v never generated", c)
	}
	require.Positive(t, all.scanCopies)
	require.Positive(t, all.constResults)
	t.Logf("with every feature: %d device_puts in scan bodies, %d constant scan results", all.scanCopies, all.constResults)

	f := All()
	f.ScanCopies, f.ScanConstResults = false, false
	off := take(f, 300)
	require.Zero(t, off.scanCopies)
	require.Zero(t, off.constResults)

	none := take(Features{}, 300)
	for _, c := range []ir.Code{ir.Scan, ir.While, ir.Cond, ir.Gather, ir.Sort, ir.ShiftLeft} {
		require.Zero(t, none.codes[c], "%v generated with no features", c)
	}
}

// Remat programs verify and reach the offloading policies and scans.
func TestRemat(t *testing.T) {
	scans, offloads := 0, 0
	for seed := range uint64(60) {
		f, desc, err := Remat(seed, All())
		require.NoError(t, err, desc)
		require.NoError(t, ir.Verify(f))
		f.Body.Walk(func(op *ir.Op) {
			switch {
			case op.Code == ir.Scan:
				scans++
			case op.Code == ir.DevicePut && op.Attrs.Space("space") == ir.PinnedHost:
				offloads++
			}
		})
	}
	require.Positive(t, scans)
	require.Positive(t, offloads)
}

func TestParseFeatures(t *testing.T) {
	f, err := ParseFeatures(Features{}, "+control, +scanconst")
	require.NoError(t, err)
	require.Equal(t, Features{Control: true, ScanConstResults: true}, f)
	f, err = ParseFeatures(All(), "-scancopies")
	require.NoError(t, err)
	require.False(t, f.ScanCopies)
	require.True(t, f.Control)
	require.Equal(t, "control,hostparams,scanconst,extended", f.String())
	f, err = ParseFeatures(All(), "+evendims")
	require.NoError(t, err)
	require.True(t, f.EvenDims && f.Extended)
	require.False(t, All().EvenDims, "a choice of shapes, not a family of ops")
	_, err = ParseFeatures(All(), "+bogus")
	require.ErrorContains(t, err, `unknown feature "bogus"`)
}

// With EvenDims, parameters have dimensions that meshes of 2, 4 and 8
// devices divide (or 1), and there are enough of them split 8 ways.
func TestEvenDims(t *testing.T) {
	feat := All()
	feat.EvenDims = true
	byEight := 0
	for seed := range uint64(200) {
		f := New(seed, feat)
		require.NoError(t, ir.Verify(f))
		for _, p := range f.Body.Params {
			for _, n := range p.Type.Shape {
				require.True(t, n == 1 || n == 2 || n == 4 || n%8 == 0, "seed %d: parameter %v", seed, p.Type)
				if n%8 == 0 {
					byEight++
				}
			}
		}
	}
	require.Positive(t, byEight)
}
