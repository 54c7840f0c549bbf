#!/usr/bin/env bash
# Builds and runs the TMA probe (tma_probe.cu) on an SM90 GPU with the CUTLASS headers of the
# installed nvidia-cutlass package; writes $OUT/tma_probe.json and prints the table.
#   OUT=dir bash benchmarks/research/tma_probe/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/tma_probe_out}
BUILD=${BUILD:-$(mktemp -d)}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$BUILD"
CUTLASS_INCLUDE=$("$PY" -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))")
nvcc -std=c++17 -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
  -isystem "$CUTLASS_INCLUDE" benchmarks/research/tma_probe/tma_probe.cu -o "$BUILD/tma_probe"
[[ -n ${BUILD_ONLY:-} ]] && exit 0
"$BUILD/tma_probe" "$OUT/tma_probe.json" | tee "$OUT/tma_probe.md"
