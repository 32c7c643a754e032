package passes

import (
	"github.com/ferryml/ferry/ir"
)

// Liveness is the live interval of every value of one region that the
// executor sees (parameters and results of the region's ops; not values inside
// fusion ops), by op position in Region.Ops.
type Liveness struct {
	Region *ir.Region
	// Def is the position of the op that defines a value, -1 for parameters.
	Def map[*ir.Value]int
	// Last is the position of the last op that reads a value, len(Region.Ops)
	// when the region returns it, and Def for a value nobody reads.
	Last map[*ir.Value]int
}

// Live reports whether v is live while op position k runs.
func (l *Liveness) Live(v *ir.Value, k int) bool {
	return l.Def[v] <= k && k <= l.Last[v]
}

// ComputeLiveness returns the live intervals of r's values.
func ComputeLiveness(r *ir.Region) *Liveness {
	l := &Liveness{Region: r, Def: map[*ir.Value]int{}, Last: map[*ir.Value]int{}}
	for _, p := range r.Params {
		l.Def[p] = -1
		l.Last[p] = -1
	}
	for k, op := range r.Ops {
		for _, a := range op.Args {
			l.Last[a] = k
		}
		for _, v := range op.Results {
			l.Def[v] = k
			l.Last[v] = k
		}
	}
	for _, v := range r.Results {
		l.Last[v] = len(r.Ops)
	}
	return l
}

// liveness computes the live intervals of the body and of every nested region
// of scan, while and cond ops (fusion regions get none).
func liveness(st *State) error {
	st.Liveness = map[*ir.Region]*Liveness{}
	var walk func(r *ir.Region)
	walk = func(r *ir.Region) {
		st.Liveness[r] = ComputeLiveness(r)
		for _, op := range r.Ops {
			if op.Code == ir.Fusion {
				continue
			}
			for _, sub := range op.Regions {
				walk(sub)
			}
		}
	}
	walk(st.Func.Body)
	return nil
}
