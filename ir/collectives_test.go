package ir

import (
	"strings"
	"testing"
)

// TestCollectiveShapeRules checks the result types of the collectives and
// that bad attributes are errors naming the problem.
func TestCollectiveShapeRules(t *testing.T) {
	x := TypeOf(Float32, 6, 4)
	ax := func(more Attrs) Attrs {
		a := Attrs{"axis": "i", "size": 3}
		for k, v := range more {
			a[k] = v
		}
		return a
	}
	ok := []struct {
		code  Code
		attrs Attrs
		args  []Type
		want  Type
	}{
		{AllReduce, ax(Attrs{"reduction": "sum"}), []Type{x}, x},
		{AllReduce, ax(Attrs{"reduction": "min"}), []Type{TypeOf(Int32, 2)}, TypeOf(Int32, 2)},
		{AllGather, ax(Attrs{"dimension": 0}), []Type{x}, TypeOf(Float32, 3, 6, 4)},
		{AllGather, ax(Attrs{"dimension": 2}), []Type{x}, TypeOf(Float32, 6, 4, 3)},
		{AllGather, ax(Attrs{"dimension": 1, "tiled": true}), []Type{x}, TypeOf(Float32, 6, 12)},
		{ReduceScatter, ax(Attrs{"dimension": 0, "tiled": true}), []Type{x}, TypeOf(Float32, 2, 4)},
		{ReduceScatter, ax(Attrs{"dimension": 1}), []Type{TypeOf(Float32, 6, 3)}, TypeOf(Float32, 6)},
		{AllToAll, ax(Attrs{"split_dimension": 0, "concat_dimension": 1}), []Type{x}, TypeOf(Float32, 2, 12)},
		{AllToAll, ax(Attrs{"split_dimension": 0, "concat_dimension": 0}), []Type{x}, x},
		{CollectivePermute, ax(Attrs{"pairs": []int{0, 1, 1, 2}}), []Type{x}, x},
		{AxisIndex, ax(nil), nil, TypeOf(Int32)},
	}
	for _, c := range ok {
		got, err := InferTypes(c.code, c.args, c.attrs, nil)
		if err != nil || len(got) != 1 || !got[0].Equal(c.want) {
			t.Errorf("%v %v: got %v, %v, want %v", c.code, c.attrs, got, err, c.want)
		}
	}
	bad := []struct {
		code  Code
		attrs Attrs
		args  []Type
		want  string
	}{
		{AllReduce, ax(Attrs{"reduction": "prod"}), []Type{x}, `unknown reduction "prod"`},
		{AllReduce, ax(Attrs{"reduction": "sum"}), []Type{TypeOf(Bool, 2)}, "sum of bool"},
		{AllReduce, Attrs{"axis": "", "size": 3, "reduction": "sum"}, []Type{x}, "empty axis name"},
		{AllReduce, Attrs{"axis": "i", "size": 0, "reduction": "sum"}, []Type{x}, `axis "i" has size 0`},
		{AllReduce, ax(Attrs{"reduction": "sum"}), []Type{x.WithSpace(PinnedHost)}, "not device"},
		{AllGather, ax(Attrs{"dimension": 3}), []Type{x}, "dimension 3 out of range"},
		{AllGather, ax(Attrs{"dimension": 2, "tiled": true}), []Type{x}, "dimension 2 out of range"},
		{ReduceScatter, ax(Attrs{"dimension": 1, "tiled": true}), []Type{x}, "not divisible by the axis size 3"},
		{ReduceScatter, ax(Attrs{"dimension": 0}), []Type{x}, "is not the axis size 3"},
		{AllToAll, ax(Attrs{"split_dimension": 1, "concat_dimension": 0}), []Type{x}, "not divisible by the axis size 3"},
		{AllToAll, ax(Attrs{"split_dimension": 0, "concat_dimension": 2}), []Type{x}, "out of range"},
		{CollectivePermute, ax(Attrs{"pairs": []int{0}}), []Type{x}, "odd length"},
		{CollectivePermute, ax(Attrs{"pairs": []int{0, 3}}), []Type{x}, "out of range for axis size 3"},
		{CollectivePermute, ax(Attrs{"pairs": []int{0, 1, 2, 1}}), []Type{x}, "repeats a source or a target"},
		{AxisIndex, Attrs{"size": 3}, nil, `missing attribute "axis"`},
	}
	for _, c := range bad {
		_, err := InferTypes(c.code, c.args, c.attrs, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: got error %v, want one containing %q", c.code, c.attrs, err, c.want)
		}
	}
	for _, c := range AllCodes() {
		named := false // has a string attribute "axis", an axis name
		for _, a := range c.Info().Attrs {
			named = named || a.Name == "axis" && a.Kind == AttrString
		}
		if c.IsCollective() != named {
			t.Errorf("%v: IsCollective disagrees with its axis attribute", c)
		}
	}
}
