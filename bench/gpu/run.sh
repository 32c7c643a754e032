#!/usr/bin/env bash
# The first GPU run in one call (bench/gpu/README.md). Run from the
# repository's root on the GPU machine, after `bash scripts/gpu-test` built
# build/gpu.tar.xz here and the call carried it there:
#
#   tar xJf build/gpu.tar.xz -C /tmp && bash /tmp/gpu/run.sh [STAGE...]
#
# Stages, in order (each under its own timeout; once the total budget
# RUN_BUDGET_S, default 450 s, is spent the remaining ones are reported as
# not run):
#
#   probe      the driver, NVRTC, cuBLASLt and NCCL: found (path, version) or
#              the paths searched. A GPU machine without one of them FAILS.
#   device     the cuda package's device tests (TestDevice*, TestNVRTC*)
#   backend    internal/testkit/backendtest: every backend against the
#              reference executor, CUDA included
#   nccl       NCCL through the CUDA backend
#   offload    REFERENCES.md §1's scan with and without activation offload:
#              Ferry (bench/gpu) beside JAX's memory_analysis() on this GPU;
#              examples/offload's three rows run with their measured peaks;
#              conformance/memory's programs beside XLA:GPU's analyses
#   copy       1 GiB pinned_host↔device copies (GB/s)
#   allocator  the Transformer step under the allocator modes: bfc with
#              pre-allocation, bfc on demand, platform (cuMemAlloc per buffer)
#   steps      bench/vsjax's MLP and Transformer training steps, Ferry on
#              CUDA beside JAX on this GPU (same inputs, checked first)
#
# Standard output gets the progress and, at the end, one summary (pass/fail
# per stage and the figures). $OUT (or ./gpu-results) gets two files:
# summary.txt and gpu-results.tar.gz (every log and JSON). The kernel cache
# lives in /tmp, not under $OUT. The exit status is 0 only when every stage
# that ran passed.
set -uo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)
bin=$bundle/bin
out=${OUT:-$PWD/gpu-results}
work=$(mktemp -d /tmp/ferry-gpu-run.XXXXXX)
mkdir -p "$out"
export FERRY_CACHE_DIR=${FERRY_CACHE_DIR:-/tmp/ferry-kernel-cache}
export FERRY_PROGRESS=0
py=${FERRY_PYTHON:-python3}
budget=${RUN_BUDGET_S:-450}
t_start=$(date +%s)
status=0
summary=()
stages=("$@")
if [[ ${#stages[@]} == 0 ]]; then
  stages=(probe device backend nccl offload copy allocator steps)
fi

say() { summary+=("$1"); echo "$1"; }

# limit WANT: the seconds a step may take (WANT, or what is left of the
# budget), or 0 when the budget is spent.
limit() {
  local left=$((budget - ($(date +%s) - t_start)))
  if ((left < 15)); then echo 0; elif ((left < $1)); then echo "$left"; else echo "$1"; fi
}

# step NAME TIMEOUT COMMAND...: runs COMMAND with stdout to $work/NAME.out
# and stderr to $work/NAME.log; sets rc (124: timed out, 125: not run).
step() {
  local name=$1 lim
  lim=$(limit "$2")
  shift 2
  if ((lim == 0)); then
    rc=125
    say "  $name: NOT RUN (time budget spent)"
    return
  fi
  echo "== $name (timeout ${lim}s)"
  rc=0
  timeout -k 5 "$lim" "$@" >"$work/$name.out" 2>"$work/$name.log" || rc=$?
}

# fail NAME WHY: records a failure.
fail() {
  status=1
  say "  $1: FAIL $2"
}

# gotest NAME TIMEOUT BINARY [FLAGS...]: a test binary; counts and names.
gotest() {
  local name=$1
  step "$@" -test.v -test.timeout 600s
  ((rc == 125)) && return
  local log=$work/$name.out pass fail skip
  pass=$(grep -cE '^\s*--- PASS' "$log")
  fail=$(grep -cE '^\s*--- FAIL' "$log")
  skip=$(grep -cE '^\s*--- SKIP' "$log")
  local line="pass $pass, fail $fail, skip $skip"
  if ((rc == 124 || rc == 137)); then line+=", TIMED OUT"; fi
  if ((rc != 0)); then
    fail "$name" "($line): $(grep -E '^\s*--- FAIL' "$log" | sed -E 's/^\s*--- FAIL: ([^ ]+).*/\1/' | head -6 | tr '\n' ' ')"
  else
    say "  $name: ok ($line)"
  fi
  if ((skip > 0)); then
    say "      skipped: $(grep -E '^\s*--- SKIP' "$log" | sed -E 's/^\s*--- SKIP: ([^ ]+).*/\1/' | head -6 | tr '\n' ' ')"
  fi
}

# json NAME TIMEOUT COMMAND...: a program printing one JSON line; the line
# goes to the summary.
json() {
  local name=$1
  step "$@"
  ((rc == 125)) && return
  if ((rc == 0)) && [[ -s $work/$name.out ]]; then
    say "  $name: $(tail -1 "$work/$name.out" | cut -c1-600)"
  else
    fail "$name" "rc=$rc: $(tail -3 "$work/$name.log" | cut -c1-300 | tr '\n' ' ')"
  fi
}

stage_probe() {
  step probe 30 "$bin/ferry-gpu-bench" -case probe
  if ((rc != 0)); then
    fail probe "(a library did not load; what was found and every path searched:)"
    summary+=("$(sed 's/^/      /' "$work/probe.out" | cut -c1-600)")
    sed 's/^/      /' "$work/probe.out" | cut -c1-600
  else
    say "  probe: ok"
    summary+=("$(sed 's/^/      /' "$work/probe.out" | grep -v 'search path' | cut -c1-200)")
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$work/nvidia-smi.txt" 2>&1 &&
    say "      GPU: $(head -1 "$work/nvidia-smi.txt")"
}

stage_device() { gotest device 180 "$bin/cuda.test" -test.run '^(TestDevice|TestNVRTC)'; }
stage_backend() { gotest backend 120 "$bin/backendtest.test"; }
stage_nccl() { gotest nccl 90 "$bin/nccl.test"; }

stage_offload() {
  local c
  for c in scan scan_offload; do
    json "ferry-$c" 60 "$bin/ferry-gpu-bench" -case "$c" -steps 5
    json "jax-$c" 90 "$py" bench/gpu/jax_bench.py --case "$c" --steps 5
  done
  step offload-example 120 env FERRY_BACKEND=cuda "$bin/offload" -json
  if ((rc == 0)); then
    say "  offload-example: ok"
    "$py" - "$work/offload-example.out" <<'PY' | while IFS= read -r l; do say "$l"; done
import json, sys
for r in json.load(open(sys.argv[1])):
    mib = lambda b: f"{b / 2**20:.2f}"
    print(f"      {r.get('case')}: temp {mib(r.get('temp_bytes', 0))} MiB, total {mib(r.get('total_bytes', 0))} MiB, "
          f"measured peak {mib(r.get('peak_device_bytes', 0))} MiB; XLA (REFERENCES) temp {mib(r.get('xla_temp_bytes', 0))}, total {mib(r.get('xla_total_bytes', 0))}")
PY
  elif ((rc != 125)); then
    fail offload-example "rc=$rc: $(tail -3 "$work/offload-example.log" | cut -c1-300 | tr '\n' ' ')"
  fi
  step xla-gpu-memory 120 "$py" conformance/memory/xla_memory.py --platform cuda --json
  if ((rc == 0)); then
    cp "$work/xla-gpu-memory.out" "$work/xla_gpu_memory.json"
    step memory-vs-xla-gpu 60 env FERRY_BACKEND=cuda "$bin/memory" -xla "$work/xla_gpu_memory.json"
    if ((rc == 0)); then
      say "  memory-vs-xla-gpu: ok (table in memory-vs-xla-gpu.out)"
      summary+=("$(grep '^| ' "$work/memory-vs-xla-gpu.out" | sed 's/^/      /')")
    elif ((rc != 125)); then
      fail memory-vs-xla-gpu "rc=$rc: $(tail -3 "$work/memory-vs-xla-gpu.log" | cut -c1-300 | tr '\n' ' ')"
    fi
  elif ((rc != 125)); then
    fail xla-gpu-memory "rc=$rc: $(tail -3 "$work/xla-gpu-memory.log" | cut -c1-300 | tr '\n' ' ')"
  fi
}

stage_copy() {
  json copy-h2d 60 "$bin/ferry-gpu-bench" -case copy_h2d -steps 5
  json copy-d2h 60 "$bin/ferry-gpu-bench" -case copy_d2h -steps 5
}

stage_allocator() {
  json alloc-bfc-prealloc 60 env FERRY_ALLOCATOR=bfc FERRY_PREALLOCATE=true "$bin/ferry-gpu-bench" -case transformer -steps 5
  json alloc-bfc-ondemand 60 env FERRY_ALLOCATOR=bfc FERRY_PREALLOCATE=false "$bin/ferry-gpu-bench" -case transformer -steps 5
  json alloc-platform 60 env FERRY_ALLOCATOR=platform "$bin/ferry-gpu-bench" -case transformer -steps 5
}

stage_steps() {
  step steps-vs-jax 150 env FERRY_BACKEND=cuda FERRY_PYTHON="$py" "$bin/vsjax" -rows mlp_step,transformer_step -rounds 5
  if ((rc == 0)); then
    say "  steps-vs-jax: ok"
    summary+=("$(grep '^|' "$work/steps-vs-jax.out" | sed 's/^/      /')")
  elif ((rc != 125)); then
    fail steps-vs-jax "rc=$rc: $(tail -4 "$work/steps-vs-jax.log" | cut -c1-300 | tr '\n' ' ')"
  fi
}

for s in "${stages[@]}"; do
  if ! declare -F "stage_$s" >/dev/null; then
    fail "$s" "unknown stage (probe device backend nccl offload copy allocator steps)"
    continue
  fi
  say "[$s]"
  "stage_$s"
done

{
  echo "================ SUMMARY ($(($(date +%s) - t_start)) s; exit $status) ================"
  printf '%s\n' "${summary[@]}"
} | tee "$out/summary.txt"
tar czf "$out/gpu-results.tar.gz" -C "$work" .
echo "logs and JSON: \$OUT/gpu-results.tar.gz ($(du -h "$out/gpu-results.tar.gz" | cut -f1))"
exit $status
