#!/usr/bin/env bash
# Downloads into .whl/ (ignored) what scripts/gpu_check.sh installs on the GPU machine, which
# has no network: the CUTLASS headers' package, tokamax with the pure-Python packages its
# import needs beyond the machine's own (for benchmarks/bench_moe.py's peer column), and
# google-tunix with those its Llama 3 model needs (benchmarks/model_swap.py), as wheels for
# the GPU machine's Python 3.12 on x86_64. Carry it: run(carry=[".whl"]).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
wheels=(
  "nvidia-cutlass==4.2.0.0"
  "tokamax==0.0.17" einshape jaxtyping wadler-lindig "pydantic==2.14.4" "pydantic-core==2.50.5"
  annotated-types typing-inspection qwix "typeguard==2.13.3" immutabledict tensorboardx tqdm
  "typing_extensions>=4.16" "xprof==2.24.2" fire termcolor
  "google-tunix==0.1.7" "google-metrax==0.2.4" "clu==0.0.12" "perfetto==0.59.1"
)
python3 -m pip download -q --no-deps --dest .whl --python-version 3.12 --only-binary=:all: \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 "${wheels[@]}"
ls .whl
