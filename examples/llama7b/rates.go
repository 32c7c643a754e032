package main

// The rates the step is priced at: an NVIDIA H100 SXM5 80GB, from NVIDIA's
// public datasheet (H100 Tensor Core GPU datasheet, SXM5 column):
//
//	rate                                  figure        datasheet line
//	bf16 dense matrix products (FLOP/s)   989.4e12      "BF16 Tensor Core 1,979 TFLOPS" (with sparsity; dense is half)
//	elementwise arithmetic (FLOP/s)       66.9e12       "FP32 67 TFLOPS" (CUDA cores)
//	host↔device bytes/s, one way          64e9          "PCIe Gen5: 128GB/s" (both ways together)
//
// They are peaks: a real step reaches perhaps 40-60 % of the matrix rate, and
// elementwise kernels are bound by HBM3's 3.35 TB/s rather than by
// arithmetic. The planner uses them only to compare plans and to estimate a
// plan's step against the unconstrained one, so the ratio matters more than
// the seconds.
const (
	h100MatmulFlops = 989.4e12
	h100ElemFlops   = 66.9e12
	h100HostBytes   = 64e9
)
