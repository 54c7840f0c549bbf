#!/usr/bin/env bash
# The GPU check, in one command, on an SM90 machine with no network:
#   1. installs build requirements the machine lacks from wheels carried in .whl/
#      (nvidia-cutlass, for the CUTLASS headers),
#   2. builds jax_swiglu against this machine's own jaxlib (no build isolation),
#      printing ptxas's register/spill report,
#   3. runs the GPU tests (CI runs the rest; PYTEST_ARGS="tests" runs everything),
#   4. the demo (python -m jax_swiglu.demo; DEMO=0 skips it) and
#   5. a quick benchmark (BENCH_ARGS overrides: e.g. BENCH_ARGS="" runs the full suite;
#      BENCH=0 skips it),
#   6. with CALIBRATE=1, benchmarks/calibrate.py (every tile config; CALIBRATE_ARGS, several
#      runs separated by ';'),
#   7. with TENSOR_PARALLEL=1, benchmarks/tensor_parallel.py (TP_ARGS) on the local GPUs,
#   8. with SASS=1 (after the build), the kernels' machine code (sass.txt.gz) and per kernel
#      its MUFU and FMA-pipe instruction counts in summary.txt,
#   9. with SANITIZE=1, scripts/sanitize.sh (compute-sanitizer; TOOLS, TOOL_TIMEOUT pass
#      through), its summary appended to summary.txt and its logs joined in sanitize.log,
#  10. with GEMM_PROBE=1, benchmarks/gemm_probe/run.sh (GEMM_PROBE_ARGS: the M values): cuBLAS's
#      bare GEMM, plain CUTLASS GEMMs with our kernels' tiles and our fused kernels, side by
#      side, under sustained load and in short bursts (gemm_probe-idle*.{json,md}, -clocks.csv),
#  11. with NCU=1, Nsight Compute over benchmarks/profile_kernels.py (NCU_ARGS: its --rows and
#      --launches): one call each of the bare GEMM and fused launches, clocks left alone;
#      ncu.txt holds the report's details page, ncu-raw.csv every metric collected; NCU_EXTRA
#      adds ncu options (e.g. --section SourceCounters, then ncu-source.csv.gz per instruction).
#  12. with TRACE=1, benchmarks/gemm_probe/trace.sh (TRACED: the variants; TRACE_ARGS: the
#      rows model:M): per-tile timelines of the pingpong configs, in SM clock cycles
#      (trace.md, trace.json, trace.csv.gz).
# TESTS=0 skips step 3; TEST_TIMEOUT (seconds, default 1800) bounds it, so a hung kernel
# still leaves the later steps time to run.
# Results go to $OUT (default ./gpu_check_out): summary.txt, build.log, pytest.log,
# gpu_report.jsonl (per-case errors), demo.log, the benchmark's JSON + markdown,
# calibration.json and sanitize.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SUMMARY="$OUT/summary.txt"
export PYTHONUNBUFFERED=1
status=0

{
  echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo no-git)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  "$PY" -c "import sys, jax, jaxlib; print('python', sys.version.split()[0], 'jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  nvcc --version | tail -1
} > "$SUMMARY" 2>&1

if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps .whl/*.whl >> "$SUMMARY" 2>&1
fi

echo "== build" | tee -a "$SUMMARY"
start=$(date +%s)
if ! "$PY" -m pip install -v --no-index --no-deps --no-build-isolation \
    -C cmake.define.JAX_SWIGLU_PTXAS_VERBOSE=ON . > "$OUT/build.log" 2>&1; then
  echo "BUILD FAILED (see build.log)" | tee -a "$SUMMARY"
  tail -40 "$OUT/build.log"
  exit 1
fi
echo "built in $(( $(date +%s) - start )) s; ptxas per kernel:" >> "$SUMMARY"
grep -E "Compiling entry function|spill stores|Used [0-9]+ registers" "$OUT/build.log" \
  | sed -E 's/Compiling entry function .*(Cooperative|Pingpong)[^ ]*(bfloat16_t|half_t).*/kernel \1 \2/' \
  >> "$SUMMARY"

if [ "${SASS:-0}" = 1 ]; then
  # The kernels' machine code (cuobjdump), and per kernel (by schedule and dtype; the
  # interleaved tile configs share a name) its static count of MUFU instructions (the SM's
  # 16-per-clock special-function unit: SiLU's exp and reciprocals) and FP32 FFMA/FMUL/FADD.
  so=$(cd / && "$PY" -c "import jax_swiglu._kernels as k; print(k.__file__)")
  cuobjdump -sass "$so" > "$OUT/sass.txt" 2>&1 || echo "cuobjdump failed (see sass.txt)" >> "$SUMMARY"
  awk '/Function :/ { name = $3 } /MUFU/ { mufu[name]++ } /[^A-Z](FFMA|FMUL|FADD)[ .]/ { fma[name]++ }
       END { for (n in mufu) printf "sass %s: MUFU %d, FFMA/FMUL/FADD %d\n", n, mufu[n], fma[n] }' \
    "$OUT/sass.txt" | sed -E -e 's/_Z[^ ]*GateThenUpMainloop[^ ]*(bfloat16_t|half_t)[^:]*/GateThenUp \1/' \
    -e 's/_Z[^ ]*(Cooperative|Pingpong)[^ ]*(bfloat16_t|half_t)[^:]*/\1 \2/' | sort \
    >> "$SUMMARY"
  gzip -f "$OUT/sass.txt"
fi

if [ "${TESTS:-1}" = 1 ]; then
  echo "== tests" | tee -a "$SUMMARY"
  rm -f "$OUT/gpu_report.jsonl"
  # XLA's GEMM autotuning only slows the fp32 references down here; the kernels don't use it.
  # (No comment line may sit inside this continued command: it would end it.)
  # shellcheck disable=SC2086
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" \
  JAX_SWIGLU_GPU_REPORT="$OUT/gpu_report.jsonl" timeout "${TEST_TIMEOUT:-1800}" "$PY" -m pytest -q -rs --durations=8 ${PYTEST_ARGS:--m gpu tests} 2>&1 \
    | tee "$OUT/pytest.log" | tail -5
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  tail -3 "$OUT/pytest.log" >> "$SUMMARY"
  "$PY" - "$OUT/gpu_report.jsonl" >> "$SUMMARY" 2>&1 <<'PYEOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])] if __import__("os").path.exists(sys.argv[1]) else []
if rows:
    bad = sum(r["mismatches"] for r in rows)
    print(f"GPU cases: {len(rows)}, total mismatches {bad}, "
          f"max rel_fro {max(r['rel_fro'] for r in rows):.3e}")
PYEOF
fi

if [ "${DEMO:-1}" = 1 ]; then
  echo "== demo" | tee -a "$SUMMARY"
  "$PY" -m jax_swiglu.demo > "$OUT/demo.log" 2>&1 || status=1
  tail -12 "$OUT/demo.log" | tee -a "$SUMMARY"
fi

if [ "${BENCH:-1}" = 1 ]; then
  echo "== benchmark" | tee -a "$SUMMARY"
  # shellcheck disable=SC2086
  "$PY" benchmarks/bench_swiglu.py ${BENCH_ARGS---quick} --out-dir "$OUT" 2>&1 | tail -25 \
    | tee -a "$SUMMARY"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ "${CALIBRATE:-0}" = 1 ]; then
  # CALIBRATE_ARGS may hold several runs separated by ';' (calibration-1.json, -2, ...).
  IFS=';' read -r -a calibrations <<< "${CALIBRATE_ARGS:-}"
  [ ${#calibrations[@]} -gt 0 ] || calibrations=("")
  for i in "${!calibrations[@]}"; do
    name=calibration
    [ ${#calibrations[@]} -gt 1 ] && name="calibration-$((i + 1))"
    echo "== $name: ${calibrations[$i]}" | tee -a "$SUMMARY"
    # shellcheck disable=SC2086
    "$PY" benchmarks/calibrate.py ${calibrations[$i]} --out "$OUT/$name.json" 2>&1 | tail -40 \
      | tee -a "$SUMMARY"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
fi

if [ "${GEMM_PROBE:-0}" = 1 ]; then
  echo "== gemm probe: ${GEMM_PROBE_ARGS:-}" | tee -a "$SUMMARY"
  # shellcheck disable=SC2086
  OUT="$OUT" PYTHON="$PY" bash benchmarks/gemm_probe/run.sh ${GEMM_PROBE_ARGS:-} 2>&1 | tail -30 \
    | tee -a "$SUMMARY"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ "${TRACE:-0}" = 1 ]; then
  echo "== trace: ${TRACED:-6 6:skip} on ${TRACE_ARGS:-}" | tee -a "$SUMMARY"
  # shellcheck disable=SC2086
  OUT="$OUT" PYTHON="$PY" bash benchmarks/gemm_probe/trace.sh ${TRACE_ARGS:-} 2>&1 | tail -30 \
    | tee -a "$SUMMARY"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ "${TENSOR_PARALLEL:-0}" = 1 ]; then
  # The multi-GPU run (benchmarks/tensor_parallel.py; TP_ARGS, e.g. "--tp 2"): tensor-parallel
  # fused_mlp vs the plain XLA sharded MLP, checked against one GPU. NCCL_NVLS_ENABLE=0.
  echo "== tensor parallel" | tee -a "$SUMMARY"
  # shellcheck disable=SC2086
  NCCL_NVLS_ENABLE=0 "$PY" benchmarks/tensor_parallel.py ${TP_ARGS:-} --out-dir "$OUT" 2>&1 \
    | tail -20 | tee -a "$SUMMARY"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ "${SANITIZE:-0}" = 1 ]; then
  echo "== sanitize" | tee -a "$SUMMARY"
  rm -rf "$OUT/sanitize"
  OUT="$OUT/sanitize" PYTHON="$PY" scripts/sanitize.sh 2>&1 | tee -a "$SUMMARY"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  # One file instead of one per tool: few files come back from a device machine.
  for f in "$OUT"/sanitize/summary.txt "$OUT"/sanitize/*.log; do
    [ -f "$f" ] && { echo "=== $(basename "$f")"; cat "$f"; }
  done > "$OUT/sanitize.log"
  rm -rf "$OUT/sanitize"
  if [ "$(stat -c %s "$OUT/sanitize.log")" -gt $((15 << 20)) ]; then gzip -f "$OUT/sanitize.log"; fi
fi

if [ "${NCU:-0}" = 1 ]; then
  echo "== ncu: ${NCU_ARGS:-}" | tee -a "$SUMMARY"
  NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
  rm -f "$OUT/ncu.ncu-rep"
  # No preallocated pool: ncu saves and restores the memory a kernel can reach between passes.
  # shellcheck disable=SC2086
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "${NCU_TIMEOUT:-300}" "$NCU_BIN" \
      --profile-from-start off --clock-control none \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats \
      ${NCU_EXTRA:-} -o "$OUT/ncu" "$PY" benchmarks/profile_kernels.py ${NCU_ARGS:-} > "$OUT/ncu.log" 2>&1
  [ $? -eq 0 ] || status=1
  tail -5 "$OUT/ncu.log" | tee -a "$SUMMARY"
  if [ -f "$OUT/ncu.ncu-rep" ]; then
    "$NCU_BIN" --import "$OUT/ncu.ncu-rep" --page details > "$OUT/ncu.txt" 2>&1
    "$NCU_BIN" --import "$OUT/ncu.ncu-rep" --page raw --csv > "$OUT/ncu-raw.csv" 2>&1
    # With NCU_EXTRA="--section SourceCounters ...": where each kernel's warps stall, per SASS
    # instruction (sampled), compressed.
    if [ -n "${NCU_EXTRA:-}" ]; then
      "$NCU_BIN" --import "$OUT/ncu.ncu-rep" --page source --csv --print-source sass \
        2>&1 | gzip > "$OUT/ncu-source.csv.gz"
    fi
    rm -f "$OUT/ncu.ncu-rep"
  fi
fi

echo "== done, status $status" | tee -a "$SUMMARY"
exit $status
