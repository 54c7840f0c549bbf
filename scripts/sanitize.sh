#!/usr/bin/env bash
# compute-sanitizer over the fused kernels, on an SM90 GPU, after `pip install .`
# (scripts/gpu_check.sh builds it; SANITIZE=1 there runs this script too):
#   memcheck   out-of-bounds / misaligned accesses, hardware exceptions:
#              M in {1, 63, 65, 129} (partial tiles) x the smallest and the largest Qwen2.5
#              MLP (K, N = 896, 4864 and 8192, 29568) x every fused kernel and tile config,
#   synccheck  invalid use of barriers: the same cases,
#   initcheck  reads of uninitialized global memory: M in {1, 65}, both shapes,
#   racecheck  shared-memory hazards: M in {1, 65}, the small shape only (racecheck
#              instruments every shared-memory access: by far the slowest tool).
# The cases live in scripts/sanitize_cases.py (`python3 scripts/sanitize_cases.py plan`);
# every result is also checked against a host fp32 reference.
#
# XLA's own kernels (a fill, copies) are checked too: findings there are listed, not failed.
# A finding counts as ours when the kernel it names contains jax_swiglu, SwiGluEpilogue,
# GemmUniversal or cutlass (no XLA GEMM, hence no cuBLAS kernel, runs in the driver).
#
# Settings (environment): OUT (default ./sanitize_out), TOOLS (default
# "memcheck synccheck initcheck racecheck"), TOOL_TIMEOUT seconds per tool (default 600),
# PRINT_LIMIT errors printed per tool (default 1000), COMPUTE_SANITIZER (the binary),
# PYTHON (default python3).
# Results: $OUT/<tool>.log (the tool's and the driver's output) and $OUT/summary.txt (one
# line per tool, plus details of any finding).
# Exit status: 0 clean; 1 a finding in our kernels or a wrong result under a tool;
# 2 nothing found but some tool did not finish (timeout, tool error, no GPU, no tool).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/sanitize_out}
TOOLS=${TOOLS:-memcheck synccheck initcheck racecheck}
TOOL_TIMEOUT=${TOOL_TIMEOUT:-600}
PRINT_LIMIT=${PRINT_LIMIT:-1000}
PY=${PYTHON:-python3}
DRIVER=scripts/sanitize_cases.py
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
export PYTHONUNBUFFERED=1

sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer \
  || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -1)}
if [ -z "$sanitizer" ] || [ ! -x "$sanitizer" ]; then
  echo "sanitize: no compute-sanitizer found (set COMPUTE_SANITIZER)" | tee -a "$SUMMARY"
  exit 2
fi
echo "sanitize: $("$sanitizer" --version 2>&1 | grep -i version | head -1) ($sanitizer)" \
  | tee -a "$SUMMARY"
help=$("$sanitizer" --help 2>&1)
has_option() { grep -q -- "$1" <<< "$help"; }

# Full demangling: our kernel's name is cutlass::device_kernel<GemmUniversal<...,
# jax_swiglu::SwiGluEpilogue<...>, ...>>; only the template arguments say it is ours.
common=(--demangle full --print-limit "$PRINT_LIMIT")
has_option --target-processes && common+=(--target-processes application-only)

status=0
for tool in $TOOLS; do
  extra=()
  case $tool in
    # Padding after every allocation, so an overrun cannot land in a neighbouring buffer
    # unseen (the driver also gives every buffer its own allocation).
    memcheck) has_option --padding && extra+=(--padding 1024) ;;
    racecheck) has_option --racecheck-report && extra+=(--racecheck-report analysis) ;;
  esac
  log="$OUT/$tool.log"
  echo "== $tool: $sanitizer --tool $tool ${common[*]} ${extra[*]} $PY $DRIVER run --tool $tool" > "$log"
  start=$(date +%s)
  timeout --kill-after=30 "$TOOL_TIMEOUT" "$sanitizer" --tool "$tool" "${common[@]}" "${extra[@]}" \
    "$PY" "$DRIVER" run --tool "$tool" ${SANITIZE_ARGS:-} >> "$log" 2>&1
  rc=$?
  "$PY" "$DRIVER" report --tool "$tool" --exit-code "$rc" --seconds "$(( $(date +%s) - start ))" \
    "$log" | tee -a "$SUMMARY"
  code=${PIPESTATUS[0]}
  # A finding (1) outranks an incomplete run (2), which outranks a clean one (0).
  if [ "$code" -eq 1 ] || { [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; }; then
    status=$code
  fi
done
echo "sanitize: status $status" | tee -a "$SUMMARY"
exit $status
