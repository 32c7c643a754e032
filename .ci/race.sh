#!/usr/bin/env bash
# CI: the race detector (go test -race) within a few minutes on CI's 2 cores.
#
# Every package of the module takes about 20 minutes under -race on the
# project's loaded 2-core machine (one package at a time; the slowest:
# cpu/gemm 2.7 min, random 1.9, runtime 1.5, trace 1.3, conformance,
# interop, internal/eval, cuda, checkpoint and cpu/vmath about 1 each),
# too long for every run. So each run races:
#
#   - always, the packages whose own code shares memory between goroutines,
#     where a race is most likely to come in: the collective engines
#     (collective/...: ranks as goroutines, MPI and TCP pollers, liveness
#     connections), the SPMD reference (internal/testkit/spmdref: one goroutine per
#     device), the work splitter and allocators (cpu/internal/parallel,
#     internal/bfc, internal/scratch), the backend contract and the CPU
#     backend (backend, cpu: buffers, donation, device pools; the block
#     runner and the ledger of live allocations both backends use), the CPU
#     executor (cpu/cpuexec: asynchronous copies beside compute) and
#     the runtime (runtime: dispatch, donation, sharded calls, with -short);
#   - and one of four groups of the other packages, in turn by the day of
#     the year (FERRY_RACE_GROUP=0..3 picks one), so that each of them is
#     raced every four days. The groups are balanced by their time under
#     -race; a package named in none (a new one) joins the group its name's
#     checksum picks.
#
# A run with group 0, the heaviest (cpu/gemm), took 5 min on the
# shared 2-core machine at load 12 with 2 min 55 s of CPU time: about 2 min
# on two idle cores. FERRY_RACE_ALL=1 races every package instead. Tests run with -short (the
# packages that know it run their quick mix: difftest, passes, runtime,
# trace, datasets, vmath, checkpoint), two test binaries at once. A race or
# a failing test fails the script; the races found are listed.
set -euo pipefail
cd "$(dirname "$0")/.."
always=(
  ./collective ./collective/internal/bufs ./collective/mpi ./collective/rendezvous
  ./internal/testkit/spmdref ./cpu/internal/parallel ./internal/bfc ./internal/scratch
  ./backend ./backend/blockrun ./backend/ledger ./cpu ./cpu/cpuexec ./runtime
)
groups=(
  "./cpu/gemm ./conformance ./ir ./cpu/internal/amd64enc ./cpu/cpufeat ./internal/readsize ./internal/callers"
  "./random ./interop ./passes ./nn ./internal/testkit/backendtest ./internal/memview ./conformance/memory ./datasets ./internal/testkit/randprog"
  "./trace ./internal/eval ./cuda ./cuda/nccl ./examples/init ./optim ./internal/testkit/disttest ./bench/cpu ./bench/gpu ./bench/vsjax ./bench/soak ./bench/internal/host ./bench/internal/fmapeak"
  "./checkpoint ./cpu/vmath ./internal/testkit/difftest ./examples/mlp ./examples/offload ./examples/quickstart ./examples/sharded ./examples/transformer ./internal/testkit/testseed"
)
ngroups=${#groups[@]}
mod=github.com/ferryml/ferry
all=$(go list ./... | sed "s|^$mod|.|")
named=" ${always[*]} ${groups[*]} "
group=${FERRY_RACE_GROUP:-$((10#$(date -u +%j) % ngroups))}
if ! [[ $group =~ ^[0-9]+$ ]] || [ "$group" -ge "$ngroups" ]; then
  echo "race: FERRY_RACE_GROUP=$group: want 0 to $((ngroups - 1))"
  exit 1
fi
pkgs=("${always[@]}")
for p in ${groups[$group]}; do pkgs+=("$p"); done
for p in $all; do
  case "$named" in *" $p "*) continue ;; esac
  if [ $(($(echo -n "$p" | cksum | cut -d' ' -f1) % ngroups)) = "$group" ]; then pkgs+=("$p"); fi
done
what="the packages that share memory between goroutines and group $group of $ngroups"
if [ "${FERRY_RACE_ALL:-}" = 1 ]; then
  mapfile -t pkgs <<<"$all"
  what="every package"
fi
# Packages named here that the module no longer has are dropped, so that a
# moved package fails nothing but is said.
have=()
for p in "${pkgs[@]}"; do
  case " $(echo $all) " in
  *" $p "*) have+=("$p") ;;
  *) echo "race: $p is not a package of the module (update .ci/race.sh)" ;;
  esac
done
echo "race: $what: ${#have[@]} packages"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
if ! go test -race -short -count=1 -p 2 -timeout 10m "${have[@]}" >"$log" 2>&1; then
  grep -E '^(ok|FAIL|---)' "$log" | grep -v '^--- PASS' || true
  if grep -q 'WARNING: DATA RACE' "$log"; then
    echo "race: data races (each with its two stacks in the log below):"
    grep -A12 'WARNING: DATA RACE' "$log" | grep -E '^  [a-z].*\(\)$|^      /' | head -40 || true
  fi
  cat "$log"
  echo "race: failed after $(($(date +%s) - start)) s"
  exit 1
fi
grep -E '^ok' "$log" | sed 's/^ok *//'
echo "race: passed in $(($(date +%s) - start)) s"
