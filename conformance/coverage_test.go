package conformance

import (
	"sort"
	"strings"
	"testing"

	"github.com/ferryml/ferry/ir"
)

// rowKey is the dtype key of an op case for the coverage check: the dtype of
// the first operand (of the result for operand-less ops), and for convert and
// bitcast_convert the target dtype after an arrow.
func rowKey(c *opCase) string {
	var k string
	if c.Op == "select" {
		k = c.Args[1].DType
	} else if len(c.Args) > 0 {
		k = c.Args[0].DType
	} else if len(c.Outs) > 0 {
		k = c.Outs[0].DType
	}
	if c.Op == "convert" || c.Op == "bitcast_convert" {
		var dt string
		if raw, ok := c.Attrs["dtype"]; ok {
			dt = strings.Trim(string(raw), `"`)
		}
		k += "->" + dt
	}
	return k
}

// acceptedKeys returns the dtype keys the op table accepts for an op, probed
// from a golden case of it: every dtype substituted for the case's first
// operand dtype (in all operands of that dtype, the attributes of iota and
// constant, and each target of convert and bitcast_convert) that InferTypes
// accepts.
func acceptedKeys(t *testing.T, code ir.Code, probe *opCase) []string {
	attrs, err := decodeAttrs(code, probe.Attrs)
	if err != nil {
		t.Fatalf("%s: %v", probe.Name, err)
	}
	args, err := literals(probe.Args)
	if err != nil {
		t.Fatalf("%s: %v", probe.Name, err)
	}
	var keys []string
	for _, d := range ir.AllDTypes {
		targets := []ir.DType{ir.InvalidDType}
		if code == ir.Convert || code == ir.BitcastConvert {
			targets = ir.AllDTypes
		}
		for _, to := range targets {
			a := cloneAttrs(attrs)
			var types []ir.Type
			pivot := 0 // the operand whose dtype is varied, with all of that dtype
			if code == ir.Select {
				pivot = 1
			}
			for j, l := range args {
				ty := l.Type
				if ty.DType == args[pivot].Type.DType && (code != ir.Select || j > 0) {
					ty.DType = d
				}
				types = append(types, ty)
			}
			switch code {
			case ir.Iota:
				a["dtype"] = d
			case ir.Constant:
				lit := ir.NewLiteral(ir.Type{DType: d, Shape: ir.Shape{2}})
				a["value"] = lit
			case ir.Convert, ir.BitcastConvert:
				a["dtype"] = to
			}
			if _, err := ir.InferTypes(code, types, a, nil); err != nil {
				continue
			}
			k := d.String()
			if to != ir.InvalidDType {
				k += "->" + to.String()
			}
			keys = append(keys, k)
		}
	}
	return keys
}

// TestEveryOpHasGolden fails when an op code of the op table has no golden
// case and is not in excluded, or when a dtype the op accepts has none.
func TestEveryOpHasGolden(t *testing.T) {
	meta, cases := loadOps(t)
	byOp := map[string][]*opCase{}
	for _, c := range cases {
		byOp[c.Op] = append(byOp[c.Op], c)
	}
	// Op and dtype pairs JAX refuses (recorded by gen.py) count as covered:
	// there is nothing to compare with.
	refused := map[string]bool{}
	for _, u := range meta.Unsupported {
		refused[u.Op+"/"+u.Key] = true
		t.Logf("JAX has no counterpart for %s: %s", u.Name, u.Error)
	}
	var summary []string
	for _, code := range ir.AllCodes() {
		rows := byOp[code.String()]
		if why, ok := excluded[code]; ok {
			if len(rows) > 0 {
				t.Errorf("%v is excluded (%s) but has %d golden cases: drop the exclusion", code, why, len(rows))
			}
			t.Logf("excluded: %-22s %s", code, why)
			continue
		}
		if len(rows) == 0 {
			t.Errorf("op %v has no golden case: add it to conformance/gen.py (or to excluded, with a reason)", code)
			continue
		}
		have := map[string]bool{}
		for _, r := range rows {
			have[rowKey(r)] = true
		}
		var missing []string
		keys := acceptedKeys(t, code, rows[0])
		for _, k := range keys {
			if !have[k] && !refused[code.String()+"/"+k] {
				missing = append(missing, k)
			}
		}
		if len(missing) > 0 {
			t.Errorf("op %v accepts dtypes without a golden case: %v", code, missing)
		}
		sort.Strings(keys)
		summary = append(summary, code.String()+": "+strings.Join(keys, " "))
	}
	for _, s := range summary {
		t.Logf("covered %s", s)
	}
}
