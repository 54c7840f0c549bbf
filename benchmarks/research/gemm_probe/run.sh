#!/usr/bin/env bash
# Builds and runs the GEMM probe (probe.cu) on an SM90 GPU with the CUTLASS headers of the
# installed nvidia-cutlass package and the CUDA toolkit's (else the nvidia-cublas wheel's)
# cuBLAS. Arguments: the M values. For each IDLE_MS value (default "0 30": sustained load,
# then short bursts; see probe.cu) writes $OUT/gemm_probe-idle<ms>.json, .md
# and -clocks.csv (nvidia-smi's SM clock and power draw through the run).
# PLAIN_IDS (may be empty) and FUSED_IDS (default "0 1") name the interleaved configs to time;
# GEMM_PROBE_SHAPES="KxN,..." replaces the Qwen2.5 shapes; BUILD keeps the binary for a rerun
# (e.g. under ncu), BUILD_ONLY=1 builds it without running.
#   OUT=dir IDLE_MS="0 30" bash benchmarks/research/gemm_probe/run.sh 2048 8192
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/gemm_probe_out}
BUILD=${BUILD:-$(mktemp -d)}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$BUILD"

# shellcheck source=benchmarks/research/gemm_probe/build_env.sh
. benchmarks/research/gemm_probe/build_env.sh
# GEMM_PROBE_FLAGS: more nvcc flags (a research form's -D) for a probe of another form.
read -r -a extra_flags <<< "${GEMM_PROBE_FLAGS:-}"
FLAGS+=("${extra_flags[@]}")
echo "CUTLASS: $CUTLASS_INCLUDE; cuBLAS: $CUBLAS_HEADER, $CUBLAS_LIBRARY"
# The interleaved configs (ffi/kernel_configs.h) to time as plain GEMMs and as fused kernels.
PLAIN_IDS=${PLAIN_IDS-0 1}
FUSED_IDS=${FUSED_IDS:-0 1}
# One kernel per translation unit, compiled in parallel (each takes about a minute).
units=()
for id in $PLAIN_IDS; do
  printf '#include "plain_gemm.cuh"\ntemplate std::string gemm_probe::LaunchPlain<%d>(const jax_swiglu::SwigluProblem&, const jax_swiglu::DeviceFacts&, cudaStream_t);\ntemplate bool gemm_probe::PlainReadsKMajorWeights<%d>();\n' "$id" "$id" > "$BUILD/plain$id.cu"
  units+=("plain$id")
done
for id in $FUSED_IDS; do
  printf '#include "kernels/interleaved_kernel.cuh"\ntemplate std::string jax_swiglu::LaunchInterleaved<%d, jax_swiglu::BF16, jax_swiglu::Activation::Silu>(const jax_swiglu::SwigluProblem&, const jax_swiglu::DeviceFacts&, cudaStream_t);\n' "$id" > "$BUILD/fused$id.cu"
  units+=("fused$id")
done
cp benchmarks/research/gemm_probe/probe.cu "$BUILD/probe.cu"
printf '#define GEMM_PROBE_PLAIN_IDS %s\n#define GEMM_PROBE_FUSED_IDS %s\n' \
  "$(echo $PLAIN_IDS | tr ' ' ,)" "$(echo $FUSED_IDS | tr ' ' ,)" > "$BUILD/probe_ids.h"
units+=(probe)
pids=()
for unit in "${units[@]}"; do
  nvcc "${FLAGS[@]}" -c "$BUILD/$unit.cu" -o "$BUILD/$unit.o" > "$BUILD/$unit.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || { tail -n 40 "$BUILD"/*.log; exit 1; }; done
link_probe "$BUILD" probe
# BUILD_ONLY=1: stop here (the binary in $BUILD, to run later, e.g. after another build).
[[ -n ${BUILD_ONLY:-} ]] && exit 0
for idle in ${IDLE_MS:-0 30}; do
  # The SM clock and power draw through the run, every 100 ms, for reading the regime.
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 100 \
    > "$OUT/gemm_probe-idle$idle-clocks.csv" &
  sampler=$!
  "$BUILD/probe" "$OUT/gemm_probe-idle$idle.json" "$idle" "$@" | tee "$OUT/gemm_probe-idle$idle.md"
  kill "$sampler"
done
