#!/usr/bin/env bash
# Builds and runs the gemv probe (probe.cu) on an SM90 GPU with the CUTLASS headers of the
# installed nvidia-cutlass package and cuBLAS (the gemm probe's build_env.sh finds both).
# Arguments: the M values (comma-separated), then K x N shapes. Writes $OUT/gemv_probe.json
# and .md. MMA=1 adds the mma.sync forms (-DGEMV_PROBE_MMA).
#   OUT=dir bash benchmarks/research/gemv_probe/run.sh 1,2,4,8,16 4096x11008 896x4864
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/gemv_probe_out}
BUILD=${BUILD:-$(mktemp -d)}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$BUILD"
# shellcheck source=benchmarks/research/gemm_probe/build_env.sh
. benchmarks/research/gemm_probe/build_env.sh
[ "${MMA:-0}" = 1 ] && FLAGS+=(-DGEMV_PROBE_MMA)
nvcc "${FLAGS[@]}" -I benchmarks/research/gemv_probe -Xptxas -v \
  -c benchmarks/research/gemv_probe/probe.cu -o "$BUILD/probe.o" > "$BUILD/build.log" 2>&1 \
  || { tail -n 60 "$BUILD/build.log"; exit 1; }
# Each kernel's registers and spills, from ptxas.
awk '/Compiling entry function/ {name = $0} /Used [0-9]+ registers|spill/ {print name; print "  " $0}' \
  "$BUILD/build.log" > "$OUT/gemv_probe-registers.txt"
link_probe "$BUILD" probe
"$BUILD/probe" "$OUT/gemv_probe.json" "$@" | tee "$OUT/gemv_probe.md"
