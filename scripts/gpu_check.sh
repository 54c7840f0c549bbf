#!/usr/bin/env bash
# The GPU check, in one command, on an SM90 machine with no network (scripts/gpu_check.sh):
#   1. installs what the machine lacks from wheels carried in .whl/ (nvidia-cutlass for the
#      CUTLASS headers; tokamax and its pure-Python dependencies for the peer benchmark;
#      scripts/fetch_wheels.sh downloads them; carry .whl, or the build finds no CUTLASS),
#   2. builds jax_swiglu with every kernel config (JAX_SWIGLU_ALL_CONFIGS=ON; ALL_CONFIGS=0:
#      the default build's) against this machine's own jaxlib, printing ptxas's register/spill
#      report and how many kernels had their wgmma serialized; PREBUILT=1 instead uses
#      the jax_swiglu/_kernels*.so already in the tree (carried from an earlier build),
#   3. the GPU tests (tests/kernels, the kernel suite, and tests/gpu; PYTEST_ARGS overrides,
#      TESTS=0 skips; TEST_TIMEOUT bounds),
#   4. the demo (python -m jax_swiglu.demo; DEMO=0 skips it),
#   5. with CALIBRATE=1, benchmarks/calibrate.py (CALIBRATE_ARGS; several runs separated by
#      ';'), and with TUNING_DATA=1 their merge into jax_swiglu/data/ (benchmarks/tuning_data.py,
#      with the held-out report),
#   6. the benchmark (BENCH_ARGS, several runs separated by ';'; default "--suite quick";
#      BENCH=0 skips it),
#   7. with SANITIZE=1, scripts/sanitize.sh (compute-sanitizer; TOOLS, TOOL_TIMEOUT and
#      SANITIZE_CONFIGS pass through),
#   8. with SASS=1 (after a build), the kernels' machine code and per kernel its MUFU and
#      FMA-pipe instruction counts in summary.txt,
#   9. with NCU=1, Nsight Compute over benchmarks/profile_kernels.py (NCU_ARGS),
#  10. with TENSOR_PARALLEL=1, benchmarks/tensor_parallel.py (TP_ARGS) on the local GPUs.
# Results go to $OUT (default ./gpu_check_out): summary.txt (the short story), results.tgz
# (every log, JSON, markdown and plot), and with SAVE_SO=1 the built extension gzipped, so a later
# call can carry it back unzipped (PREBUILT=1) and skip the build. Few files: a device call returns few.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
WORK="$OUT/work"
mkdir -p "$WORK"
PY=${PYTHON:-python3}
SUMMARY="$OUT/summary.txt"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

{
  echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo no-git)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  "$PY" -c "import sys, jax, jaxlib; print('python', sys.version.split()[0], 'jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  nvcc --version | tail -1
} > "$SUMMARY" 2>&1

if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps .whl/*.whl >> "$SUMMARY" 2>&1 \
    || echo "some carried wheels did not install (see above)" >> "$SUMMARY"
fi

if [ "${PREBUILT:-0}" = 1 ] && compgen -G "jax_swiglu/_kernels*.so" > /dev/null; then
  echo "== prebuilt extension: $(ls jax_swiglu/_kernels*.so)" | tee -a "$SUMMARY"
else
  echo "== build" | tee -a "$SUMMARY"
  start=$(date +%s)
  if ! JAX_SWIGLU_ALL_CONFIGS=${ALL_CONFIGS:-1} "$PY" -m pip install -v --no-index --no-deps --no-build-isolation \
      -C cmake.define.JAX_SWIGLU_PTXAS_VERBOSE=ON . > "$WORK/build.log" 2>&1; then
    echo "BUILD FAILED (see build.log)" | tee -a "$SUMMARY"
    grep -E "error|Error" "$WORK/build.log" | head -20 | tee -a "$SUMMARY"
    tail -20 "$WORK/build.log"
    tar czf "$OUT/results.tgz" -C "$WORK" . 2>/dev/null
    exit 1
  fi
  echo "built in $(( $(date +%s) - start )) s; ptxas per kernel (registers, spills):" >> "$SUMMARY"
  grep -E "spill stores|Used [0-9]+ registers" "$WORK/build.log" | sort | uniq -c \
    >> "$SUMMARY"
  # ptxas serializing a kernel's wgmma (C7514/C7515: docs/design.md, FP8 weights) leaves
  # its tensor cores one instruction at a time.
  echo "kernels whose wgmma ptxas serialized: $(grep -cE "\(C751[45]\)" "$WORK/build.log")" \
    >> "$SUMMARY"
fi
if [ "${SAVE_SO:-0}" = 1 ]; then
  # gzipped: the extension of every config passes the 16 MiB a returned file may have.
  so=$(ls jax_swiglu/_kernels*.so)
  gzip -c "$so" > "$OUT/$(basename "$so").gz" && echo "saved $so (gzipped)" >> "$SUMMARY"
fi

if [ "${SASS:-0}" = 1 ]; then
  so=$(ls jax_swiglu/_kernels*.so | head -1)
  cuobjdump -sass "$so" > "$WORK/sass.txt" 2>&1 || echo "cuobjdump failed" >> "$SUMMARY"
  awk '/Function :/ { name = $3 } /MUFU/ { mufu[name]++ } /[^A-Z](FFMA|FMUL|FADD)[ .]/ { fma[name]++ }
       END { for (n in mufu) printf "sass %s: MUFU %d, FFMA/FMUL/FADD %d\n", n, mufu[n], fma[n] }' \
    "$WORK/sass.txt" | sed -E 's/_Z[^ ]*(Cooperative|Pingpong)[^ ]*(bfloat16_t|half_t)[^:]*/\1 \2/' \
    | sort | uniq -c >> "$SUMMARY"
  gzip -f "$WORK/sass.txt"
fi

if [ "${TESTS:-1}" = 1 ]; then
  echo "== tests" | tee -a "$SUMMARY"
  # XLA's GEMM autotuning only slows the fp32 references down here; the kernels don't use it.
  # shellcheck disable=SC2086
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" \
  JAX_SWIGLU_GPU_REPORT="$WORK/gpu_report.jsonl" timeout "${TEST_TIMEOUT:-1800}" \
    "$PY" -m pytest -q -rs --durations=8 ${PYTEST_ARGS:-tests/kernels tests/gpu} > "$WORK/pytest.log" 2>&1
  [ $? -eq 0 ] || status=1
  tail -3 "$WORK/pytest.log" | tee -a "$SUMMARY"
  grep -E "^(FAILED|ERROR)" "$WORK/pytest.log" | head -20 >> "$SUMMARY"
  "$PY" - "$WORK/gpu_report.jsonl" >> "$SUMMARY" 2>&1 <<'PYEOF'
import json, os, sys
rows = [json.loads(line) for line in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
if rows:
    bad = sum(r.get("mismatches", 0) for r in rows)
    print(f"GPU cases: {len(rows)}, total mismatches {bad}, "
          f"max rel_fro {max(r.get('rel_fro', 0) for r in rows):.3e}")
PYEOF
fi

if [ "${DEMO:-1}" = 1 ]; then
  echo "== demo" | tee -a "$SUMMARY"
  "$PY" -m jax_swiglu.demo > "$WORK/demo.log" 2>&1 || status=1
  grep -E "kernel:|time per forward|error" "$WORK/demo.log" | tee -a "$SUMMARY"
fi

if [ "${CALIBRATE:-0}" = 1 ]; then
  IFS=';' read -r -a calibrations <<< "${CALIBRATE_ARGS:-}"
  [ ${#calibrations[@]} -gt 0 ] || calibrations=("")
  for i in "${!calibrations[@]}"; do
    echo "== calibration $((i + 1)): ${calibrations[$i]}" | tee -a "$SUMMARY"
    # shellcheck disable=SC2086
    "$PY" -m benchmarks.calibrate ${calibrations[$i]} --out "$WORK/calibration-$((i + 1)).json" \
      > "$WORK/calibration-$((i + 1)).log" 2>&1 || status=1
    tail -3 "$WORK/calibration-$((i + 1)).log" | tee -a "$SUMMARY"
  done
  if [ "${TUNING_DATA:-0}" = 1 ]; then
    echo "== tuning data" | tee -a "$SUMMARY"
    "$PY" -m benchmarks.tuning_data "$WORK"/calibration-*.json --report "$WORK/held-out-report.md" \
      > "$WORK/tuning_data.log" 2>&1 || status=1
    grep -E "entries|geomean|rows" "$WORK/tuning_data.log" | head -8 | tee -a "$SUMMARY"
    cp jax_swiglu/data/*.json "$WORK/" 2>/dev/null
  fi
fi

if [ "${BENCH:-1}" = 1 ]; then
  IFS=';' read -r -a benches <<< "${BENCH_ARGS:---suite quick}"
  for i in "${!benches[@]}"; do
    echo "== benchmark $((i + 1)): ${benches[$i]}" | tee -a "$SUMMARY"
    # shellcheck disable=SC2086
    "$PY" -m benchmarks.bench_swiglu ${benches[$i]} --out-dir "$WORK" > "$WORK/bench-$((i + 1)).log" 2>&1 \
      || status=1
    grep -E "^\| (P|D|H)[0-9] \|" "$WORK/bench-$((i + 1)).log" | tee -a "$SUMMARY"
    tail -1 "$WORK/bench-$((i + 1)).log" | tee -a "$SUMMARY"
  done
fi

if [ "${SANITIZE:-0}" = 1 ]; then
  echo "== sanitize" | tee -a "$SUMMARY"
  OUT="$WORK/sanitize" PYTHON="$PY" scripts/sanitize.sh > "$WORK/sanitize-run.log" 2>&1 || status=1
  cat "$WORK/sanitize/summary.txt" 2>/dev/null | head -20 | tee -a "$SUMMARY"
fi

if [ "${NCU:-0}" = 1 ]; then
  echo "== ncu: ${NCU_ARGS:-}" | tee -a "$SUMMARY"
  NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
  # shellcheck disable=SC2086
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "${NCU_TIMEOUT:-300}" "$NCU_BIN" \
      --profile-from-start off --clock-control none \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
      ${NCU_EXTRA:-} -o "$WORK/ncu" "$PY" -m benchmarks.profile_kernels ${NCU_ARGS:-} > "$WORK/ncu.log" 2>&1 \
    || status=1
  if [ -f "$WORK/ncu.ncu-rep" ]; then
    "$NCU_BIN" --import "$WORK/ncu.ncu-rep" --page details > "$WORK/ncu.txt" 2>&1
    "$NCU_BIN" --import "$WORK/ncu.ncu-rep" --page raw --csv > "$WORK/ncu-raw.csv" 2>&1
    rm -f "$WORK/ncu.ncu-rep"
  fi
fi

if [ "${TENSOR_PARALLEL:-0}" = 1 ]; then
  echo "== tensor parallel" | tee -a "$SUMMARY"
  # shellcheck disable=SC2086
  NCCL_NVLS_ENABLE=0 "$PY" -m benchmarks.tensor_parallel ${TP_ARGS:-} --out-dir "$WORK" \
    > "$WORK/tensor_parallel.log" 2>&1 || status=1
  tail -5 "$WORK/tensor_parallel.log" | tee -a "$SUMMARY"
fi

echo "== done, status $status" | tee -a "$SUMMARY"
tar czf "$OUT/results.tgz" -C "$WORK" . && rm -rf "$WORK"
exit $status
