package trace

// Reductions that keep the reduced axes as size-1 dimensions, as NumPy's
// keepdims=True: the result broadcasts against the input, so normalisations
// and softmaxes need no reshape after the reduction. Each is the reduction of
// the same name followed by KeepDims, with the same dtype rules, errors and
// gradients.
//
//	mu := MeanKeepDims(x, -1)   // x: [B,T,D] → mu: [B,T,1]
//	xc := Sub(x, mu)            // broadcasts over D

// SumKeepDims is Sum(x, axes...) with the reduced axes kept as size-1
// dimensions.
func SumKeepDims(x *Array, axes ...int) *Array {
	return keepReduce("SumKeepDims", Sum, x, axes)
}

// MeanKeepDims is Mean(x, axes...) with the reduced axes kept as size-1
// dimensions.
func MeanKeepDims(x *Array, axes ...int) *Array {
	return keepReduce("MeanKeepDims", Mean, x, axes)
}

// MaxKeepDims is Max(x, axes...) with the reduced axes kept as size-1
// dimensions.
func MaxKeepDims(x *Array, axes ...int) *Array {
	return keepReduce("MaxKeepDims", Max, x, axes)
}

// MinKeepDims is Min(x, axes...) with the reduced axes kept as size-1
// dimensions.
func MinKeepDims(x *Array, axes ...int) *Array {
	return keepReduce("MinKeepDims", Min, x, axes)
}

// VarKeepDims is Var(x, axes...) with the reduced axes kept as size-1
// dimensions.
func VarKeepDims(x *Array, axes ...int) *Array {
	return keepReduce("VarKeepDims", Var, x, axes)
}

// LogSumExpKeepDims is LogSumExp(x, axes...) with the reduced axes kept as
// size-1 dimensions.
func LogSumExpKeepDims(x *Array, axes ...int) *Array {
	return keepReduce("LogSumExpKeepDims", LogSumExp, x, axes)
}

// keepReduce checks x and axes under the name op, reduces x with f and keeps
// the reduced axes as size-1 dimensions.
func keepReduce(op string, f func(*Array, ...int) *Array, x *Array, axes []int) *Array {
	needArrays(op, x)
	ax := reduceAxes(op, x, axes)
	return keepDims(f(x, ax...), x.typ.Shape, ax)
}
