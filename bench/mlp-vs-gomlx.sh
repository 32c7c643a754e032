#!/usr/bin/env bash
# Runs the same MLP training step (batch 128, 784→512→512→10, ReLU, softmax
# cross-entropy, SGD, f32, parameters donated) in Ferry (bench/cpu, rt.Jit)
# and in GoMLX's pure-Go backend (bench/gomlx), back to back, and prints the
# ratio GoMLX ms/step ÷ Ferry ms/step (≥ 2 is the goal of the issue "CPU
# speed"). GoMLX is measured twice: with its autodiff (graph.Gradient) and
# with the backward pass written by hand with DotGeneral.
#
#   bench/mlp-vs-gomlx.sh [-rounds N] [-steps N]     (flags go to both)
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0

key() { # key NAME JSON: the number after "NAME":
	sed -n "s/.*\"$1\":\([0-9.eE+-]*\).*/\1/p" <<<"$2"
}

ferry=$(go run ./bench/cpu -json -sections mlp "$@")
manual=$(cd bench/gomlx && go run . -json -grad manual "$@")
autodiff=$(cd bench/gomlx && go run . -json -grad autodiff "$@")

f=$(key mlp_step_ms "$ferry")
m=$(key gomlx_step_ms "$manual")
a=$(key gomlx_step_ms "$autodiff")
awk -v f="$f" -v m="$m" -v a="$a" 'BEGIN {
	printf "ferry (rt.Jit, autodiff)          %9.2f ms/step\n", f
	printf "gomlx simplego, manual gradients  %9.2f ms/step   ratio %.1fx\n", m, m / f
	printf "gomlx simplego, autodiff          %9.2f ms/step   ratio %.1fx\n", a, a / f
}'
