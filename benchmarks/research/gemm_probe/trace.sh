#!/usr/bin/env bash
# Builds and runs the tile-timeline probe (trace.cu, traced_kernel.cuh) on an SM90 GPU, then
# summarizes it (trace_report.py). Arguments: rows model:M. TRACED: the variants, each
#   CONFIG              as built (CUTLASS's k-loop; clock reads around its calls only),
#   CONFIG:other-store  the other output path (TMA store <-> direct store),
#   CONFIG:skip         an epilogue that only sums its accumulators,
#   CONFIG:stepped1/2   the probe's own k-loop, 1 or 2 k-tiles of wgmmas in flight,
#   CONFIG:early2/3     its k-loop leaving the last 1 or 2 k-tiles unwaited,
#   CONFIG:spin1        stepped1 polling the stage barriers instead of sleeping on them
# (traced_kernel.cuh says what each records). Writes $OUT/trace.csv.gz (every event),
# $OUT/trace-steps.csv.gz (per k-tile times of sampled tiles), $OUT/trace.md + trace.json
# (per row and variant: per-tile times in cycles); with SASS=1 also the kernels' machine
# code ($OUT/trace-sass.txt.gz).
#   OUT=dir TRACED="6 6:other-store 6:skip" bash benchmarks/research/gemm_probe/trace.sh qwen2.5-0.5b:2048
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/trace_out}
BUILD=${BUILD:-$(mktemp -d)}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$BUILD"

# shellcheck source=benchmarks/research/gemm_probe/build_env.sh
. benchmarks/research/gemm_probe/build_env.sh
TRACED=${TRACED:-6 6:skip}
units=() pairs=() matches=()
for variant in $TRACED; do
  config=${variant%%:*}
  case "${variant#"$config"}" in
    "") kind=AsBuilt ;;
    :other-store) kind=OtherStore ;;
    :skip) kind=Skip ;;
    :stepped1) kind=Stepped1 ;;
    :stepped2) kind=Stepped2 ;;
    :early2) kind=Early2 ;;
    :early3) kind=Early3 ;;
    :spin1) kind=Spin1 ;;
    *) echo "unknown variant $variant"; exit 2 ;;
  esac
  unit="traced${config}_${kind}"
  kind="gemm_probe::TraceVariant::$kind"
  printf '#include "traced_instance.cuh"\ntemplate std::string gemm_probe::LaunchTraced<%d, %s>(const jax_swiglu::SwigluProblem&, const jax_swiglu::DeviceFacts&, unsigned long long*, unsigned long long*, cudaStream_t);\n' \
    "$config" "$kind" > "$BUILD/$unit.cu"
  units+=("$unit")
  pairs+=("{$config, $kind}")
  matches+=("GEMM_PROBE_MATCH($config, $kind)")
done
cp benchmarks/research/gemm_probe/trace.cu "$BUILD/trace.cu"
{
  echo "#define GEMM_PROBE_TRACED $(IFS=,; echo "${pairs[*]}")"
  echo "#define GEMM_PROBE_TRACED_MATCHES ${matches[*]}"
} > "$BUILD/trace_ids.h"
units+=(trace)
pids=()
for unit in "${units[@]}"; do
  nvcc "${FLAGS[@]}" -c "$BUILD/$unit.cu" -o "$BUILD/$unit.o" > "$BUILD/$unit.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || { tail -n 40 "$BUILD"/*.log; exit 1; }; done
link_probe "$BUILD" trace
if [ "${SASS:-0}" = 1 ]; then  # the traced kernels' machine code, for reading the k-loop
  cuobjdump -sass "$BUILD/trace" | gzip > "$OUT/trace-sass.txt.gz"
fi
"$BUILD/trace" "$OUT/trace.csv" "$OUT/trace-steps.csv" "$@"
"$PY" benchmarks/research/gemm_probe/trace_report.py "$OUT/trace.csv" "$OUT/trace-steps.csv" \
  --json "$OUT/trace.json" | tee "$OUT/trace.md"
gzip -f "$OUT/trace.csv" "$OUT/trace-steps.csv"
