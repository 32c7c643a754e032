package main

// The rates the step is priced at: an NVIDIA H100 SXM5 80GB, from NVIDIA's
// public datasheet (H100 Tensor Core GPU datasheet, SXM5 column):
//
//	rate                                  figure        datasheet line
//	bf16 dense matrix products (FLOP/s)   989.4e12      "BF16 Tensor Core 1,979 TFLOPS" (with sparsity; dense is half)
//	elementwise arithmetic (FLOP/s)       66.9e12       "FP32 67 TFLOPS" (CUDA cores)
//	host↔device bytes/s, one way          64e9          "PCIe Gen5: 128GB/s" (both ways together)
//	collective bus bytes/s (NCCL busbw)   450e9         "NVLink: 900GB/s" (both ways together)
//
// They are peaks: a real step reaches perhaps 40-60 % of the matrix rate, and
// elementwise kernels are bound by HBM3's 3.35 TB/s rather than by
// arithmetic. The planner uses them only to compare plans and to estimate a
// plan's step against the unconstrained one, so the ratio matters more than
// the seconds.
//
// The collective rate is for the -devices mode: the eight H100 SXM5 of an
// HGX/DGX H100 node joined by NVLink 4 through NVSwitch, each GPU 450 GB/s
// one way. It is taken as NCCL's bus bandwidth (busbw in nccl-tests: an
// all-gather or reduce-scatter of S bytes over n GPUs takes S·(n−1)/n /
// busbw, an all-reduce twice that); NCCL reaches less than this peak in
// practice.
const (
	h100MatmulFlops = 989.4e12
	h100ElemFlops   = 66.9e12
	h100HostBytes   = 64e9
	h100BusBytes    = 450e9
)

// Rates prices a per-device program: matrix-product and elementwise FLOP/s,
// host↔device bytes/s one way, and the collectives' bus bytes/s.
type Rates struct{ Matmul, Elem, Host, Bus float64 }

// h100 is the H100 SXM5 node of the table above.
var h100 = Rates{Matmul: h100MatmulFlops, Elem: h100ElemFlops, Host: h100HostBytes, Bus: h100BusBytes}
