"""Run the bare GEMM (the benchmark's baseline (c)) and fused launches once each, for Nsight
Compute to profile side by side: why does a fused kernel trail cuBLAS on a shape?

    ncu --profile-from-start off --clock-control none -o prof \
        python -m benchmarks.profile_kernels --rows qwen2.5-0.5b:8192 llama-3-8b:1 \
        --launches gemm auto 1 interleaved:18,splits=2

Each (model, M) row builds one input set (the benchmark's random data, weights in HBM: ncu
flushes the caches before each kernel replay by default), compiles every variant first,
then calls each once more between cudaProfilerStart/Stop, so `ncu --profile-from-start off`
sees exactly one call per variant. A launch is "gemm", "auto", or a launch in the text form
``swiglu(..., launch=...)`` takes (``explain`` prints it). scripts/gpu_check.sh (NCU=1) runs
it under ncu and writes the report's details page as text.
"""

from __future__ import annotations

import argparse
import ctypes

import jax

from . import bench_swiglu
from . import shapes as shapes_lib


def _compiled(launch, x, w):
    """One launch compiled: "gemm", "auto", or a forced launch (``swiglu(launch=...)``)."""
    if launch == "gemm":
        return jax.jit(bench_swiglu.gemm_only).lower(x, w).compile()
    fn = bench_swiglu.fused("auto", launch=None if launch == "auto" else launch)
    return jax.jit(fn).lower(x, w).compile()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", required=True, help="MODEL:M, e.g. qwen2.5-7b:128")
    parser.add_argument("--launches", nargs="+", default=["gemm", "auto"])
    args = parser.parse_args(argv)
    profiler = _DriverProfiler()

    for row in args.rows:
        model, m = row.rsplit(":", 1)
        k, n = shapes_lib.mlp_shape(model)
        x, w = bench_swiglu._make_sets(jax.random.key(0), int(m), k, n, 1)[0]
        compiled = {launch: _compiled(launch, x, w) for launch in args.launches}
        for fn in compiled.values():
            jax.block_until_ready(fn(x, w))  # warm-up, outside the profiled range
        for launch, fn in compiled.items():
            print(f"profiling {model} M={m} {launch}", flush=True)
            profiler.start()
            jax.block_until_ready(fn(x, w))
            profiler.stop()


class _DriverProfiler:
    """cuProfilerStart/Stop through the driver (always installed, unlike libcudart), on the
    primary context of GPU 0, which is the one XLA runs in. No-ops with no CUDA driver (the
    script then only checks that every launch compiles and runs, as CI does on the CPU)."""

    def __init__(self):
        try:
            self.cuda = ctypes.CDLL("libcuda.so.1")
        except OSError:
            self.cuda = None
            return
        device, context = ctypes.c_int(), ctypes.c_void_p()
        for call, *call_args in (("cuInit", 0), ("cuDeviceGet", ctypes.byref(device), 0),
                                 ("cuDevicePrimaryCtxRetain", ctypes.byref(context), device),
                                 ("cuCtxSetCurrent", context)):
            status = getattr(self.cuda, call)(*call_args)
            if status != 0:
                raise RuntimeError(f"{call} failed with CUDA driver error {status}")

    def start(self):
        if self.cuda:
            self.cuda.cuProfilerStart()

    def stop(self):
        if self.cuda:
            self.cuda.cuProfilerStop()


if __name__ == "__main__":
    main()
