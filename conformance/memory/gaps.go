package main

// knownGaps lists the programs where Ferry's temp bytes exceed XLA:CPU's, with
// the reason found by reading the optimised IR and the peak's live set
// (go run ./conformance/memory -peak -run NAME). The test fails on any other
// program whose temp is larger, and on a listed one whose gap has closed.
//
// These causes explain them (XLA's side read from compile().as_text() of
// jax 0.10.2, whose CPU backend emits YNNPACK fusions, kind __ynn_fusion):
//
//   - A. XLA:CPU fuses a reduction together with the elementwise ops before
//     and after it (a whole layer norm is one __ynn_fusion; so is the
//     attention scores' matmul with its softmax). Ferry's input fusion ends
//     at the reduction: whatever uses a reduction's result is another fusion,
//     so the reduced row vectors are temps.
//   - B. XLA lets an elementwise fusion write its result over a dying operand
//     even when the result is a program output: the operand then lives in
//     the output's allocation and costs no temp (softmax's exp(x − max),
//     reduce_mixed's row sums). Ferry's outputs are their own buffers; a temp
//     shares one only with a donated parameter (passes/buffers.go
//     assignOutputs).
//   - C. In-place reuse (passes/buffers.go inPlace) covers elementwise ops and
//     loop fusions only, not input (reduction) or output (dot epilogue)
//     fusions, so their results never reuse a dying operand's block.
//   - E. The order of independent ops (passes/schedule.go).
//   - F. The recompute pass does not repeat comparisons and selects (a
//     masked softmax), which the CPU backend evaluates slowly: recomputing
//     an attention's masked scores took its memory to 38 MiB at t = 512 but
//     made its forward pass about 2.5 times slower.
//
// B, C and E are changes to passes/buffers.go and passes/schedule.go. The
// recompute pass (passes/recompute.go) removed the largest gaps of the
// softmax, log softmax and layer norm and closed attention_grad_t512's (the
// elementwise value a reduction reads and its consumers read again is
// recomputed instead of stored); with the softmax's max no longer
// differentiated (as jax.nn.softmax) softmax_grad matches XLA.
var knownGaps = map[string]string{
	"reduce_mixed": "cause B: mean(exp(x), 1) keeps the row sums f32[1024] (4 KiB) as a temp before the division by n; " +
		"XLA also computes them apart but writes the division over them in the output's allocation (temp 0)",
	"softmax": "cause B: two row vectors f32[1024] (the max and the sum, 8 KiB) where XLA keeps one (4 KiB); " +
		"exp(x − max) is recomputed in the division's fusion (the recompute pass; 8 MiB before it)",
	"log_softmax": "cause B: two row vectors f32[1024] (the max and the log-sum, 8 KiB) where XLA keeps one (4 KiB); " +
		"x − max is recomputed (the recompute pass; 8 MiB before it)",
	"layernorm": "cause A: the mean and variance row vectors f32[4096] (32 KiB) are temps; XLA computes the whole layer norm " +
		"in one fusion (temp 0). x − mean is recomputed (the recompute pass; 16 MiB before it)",
	"mlp_value_and_grad": "cause C: the backward product (g·Wᵀ)·relu′ f32[128,512] is written by an input fusion (with the " +
		"bias gradient's reduce_sum) beside its two dying operands, g·Wᵀ and the saved relu′ factor: three 256 KiB temps " +
		"at the peak where XLA has two",
	"attention_t128": "cause A: the masked scores and exp(s − max) f32[8,4,128,128] are two 2 MiB results of input " +
		"fusions, as XLA's two buffers; the 32 KiB more are Ferry's row max and row sum vectors f32[8,4,128]",
	"attention_t512": "causes C and F: the masked scores f32[4,8,512,512] (32 MiB) and exp(s − max) (32 MiB) are both " +
		"live at the row-sum fusion, whose exp result cannot reuse the dying scores (C); recomputing the masked scores " +
		"from the matrix product (which would give 38 MiB) is not done for chains with a select (F). XLA fuses the " +
		"product with the softmax and masks in place: one 32 MiB buffer plus 4 MiB",
	"attention_t2048": "cause A: as attention_t128 at f32[1,8,2048,2048] (2 × 128 MiB, as XLA at this size); the " +
		"128 KiB more are Ferry's row max and row sum vectors f32[1,8,2048]",
}

// knownAliasGaps lists the programs where Ferry's alias bytes differ from
// XLA's, with the reason.
var knownAliasGaps = map[string]string{}
