package runtime

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// shardingSpec is InShardings or OutShardings (flat) or their Tree forms
// (trees) as given; resolve expands it per call against the trees of the
// arguments or results.
type shardingSpec struct {
	what  string // the option's name, for errors
	flat  []*ir.NamedSharding
	trees []any
	tree  bool
}

// resolve returns one sharding (nil: none) per array leaf of the trees
// defs, the arguments or results (noun) of one call. A nil spec gives none.
func (sp *shardingSpec) resolve(noun string, defs []*trace.TreeDef) ([]*ir.NamedSharding, error) {
	if sp == nil {
		return nil, nil
	}
	leaves := 0
	for _, d := range defs {
		leaves += d.NumLeaves()
	}
	if sp.tree {
		return prefixesPerTree(sp.what, noun, sp.trees, defs)
	}
	k := len(sp.flat)
	switch {
	case k == 0:
		return nil, nil
	case k == 1 || k == len(defs):
		prefixes := make([]any, k)
		for i, s := range sp.flat {
			prefixes[i] = s
		}
		out, err := prefixesPerTree(sp.what, noun, prefixes, defs)
		if err != nil {
			return nil, err
		}
		if k == leaves && !slices.Equal(out, sp.flat) {
			return nil, fmt.Errorf("%s has %d entries, one per %s and one per array leaf, and the two readings differ (the %ss have %s leaves): give them as tree prefixes with %sTree", sp.what, k, noun, noun, leafCounts(defs), sp.what)
		}
		return out, nil
	case k <= leaves:
		// The flat form: one per leaf; fewer constrain the first leaves
		// only.
		out := make([]*ir.NamedSharding, leaves)
		copy(out, sp.flat)
		return out, nil
	}
	return nil, fmt.Errorf("%s has %d entries for %d %ss (with %s array leaves): give one for all, one per %s (for every array of it), or at most one per array leaf; %sTree takes a tree prefix of each %s", sp.what, k, len(defs), noun, leafCounts(defs), noun, sp.what, noun)
}

// prefixesPerTree expands tree prefixes, one per tree or one for all, into
// one sharding per leaf of the trees defs.
func prefixesPerTree(what, noun string, prefixes []any, defs []*trace.TreeDef) ([]*ir.NamedSharding, error) {
	if len(prefixes) != 1 && len(prefixes) != len(defs) {
		return nil, fmt.Errorf("%s has %d entries for %d %ss: give one per %s (each a tree prefix of it), or one for all", what, len(prefixes), len(defs), noun, noun)
	}
	var out []*ir.NamedSharding
	for i, d := range defs {
		p := prefixes[0]
		if len(prefixes) == len(defs) {
			p = prefixes[i]
		}
		ss, err := trace.BroadcastPrefix[*ir.NamedSharding](p, d, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %s %d: %v", what, noun, i, err)
		}
		out = append(out, ss...)
	}
	return out, nil
}

// leafCounts writes the number of array leaves of each tree: "2, 0".
func leafCounts(defs []*trace.TreeDef) string {
	s := make([]string, len(defs))
	for i, d := range defs {
		s[i] = strconv.Itoa(d.NumLeaves())
	}
	return strings.Join(s, ", ")
}
