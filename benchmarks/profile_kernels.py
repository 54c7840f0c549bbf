"""Run the bare GEMM (the benchmark's baseline (c)) and fused launches once each, for Nsight
Compute to profile side by side: why does a fused kernel trail cuBLAS on a shape?

    ncu --profile-from-start off --clock-control none -o prof \
        python -m benchmarks.profile_kernels --rows qwen2.5-0.5b:8192 llama-3-8b:1 \
        --launches gemm auto 1 interleaved:18,splits=2

Each (model, M) row builds one input set (the benchmark's random data, weights in HBM: ncu
flushes the caches before each kernel replay by default), compiles every variant first,
then calls each once more between cudaProfilerStart/Stop, so `ncu --profile-from-start off`
sees exactly one call per variant. A launch is "gemm", "auto", or a launch in the text form
``swiglu(..., launch=...)`` takes (``explain`` prints it). ``--moe MODEL:TOKENS:ROUTING`` rows
(benchmarks/bench_moe.py's expert shapes and routings) profile the grouped call the selection
picks, each grouped row of ``--grouped-launches`` forced, and the dense GEMM of equal FLOPs.
``--fp8-rows MODEL:M`` rows profile fp8 (e4m3) calls on x already in fp8, the kernel alone:
"gemm" is XLA's bare fp8 GEMM (cuBLASLt's kernel into bfloat16 [M, 2N]), "auto" and "fast"
the selection's launch for each accumulation, and a forced launch runs with fast
accumulation where it is a fast-accumulation row or asks for promotion 0.
scripts/gpu_check.sh (NCU=1) runs it under ncu and writes the report's details page as text.
"""

from __future__ import annotations

import argparse
import ctypes

import jax
import numpy as np

from . import bench_fp8
from . import bench_moe
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
    parser.add_argument("--rows", nargs="*", default=[], help="MODEL:M, e.g. qwen2.5-7b:128")
    parser.add_argument("--launches", nargs="+", default=["gemm", "auto"])
    parser.add_argument("--moe", nargs="*", default=[],
                        help="MODEL:TOKENS:ROUTING, e.g. qwen3-30b-a3b:4096:balanced")
    parser.add_argument("--grouped-launches", nargs="*", type=int, default=[])
    parser.add_argument("--fp8-rows", nargs="*", default=[], help="MODEL:M, e.g. llama-3-8b:2048")
    args = parser.parse_args(argv)
    profiler = _DriverProfiler()

    for row in args.fp8_rows:
        _profile_fp8(row, args.launches, profiler)

    for row in args.moe:
        _profile_moe(row, args.grouped_launches, profiler)
    for row in args.rows:
        model, m = row.rsplit(":", 1)
        k, n = shapes_lib.mlp_shape(model)
        x, w = bench_swiglu._make_sets(jax.random.key(0), int(m), k, n, 1)[0]
        compiled = {launch: _compiled(launch, x, w) for launch in args.launches}
        _profile_each(compiled, (x, w), f"{model} M={m}", profiler)


def _profile_each(compiled, args, label, profiler):
    """Every compiled variant once as a warm-up, then once more each between the profiler's
    start and stop, so ncu sees exactly one call per variant."""
    for fn in compiled.values():
        jax.block_until_ready(fn(*args))  # warm-up, outside the profiled range
    for name, fn in compiled.items():
        print(f"profiling {label} {name}", flush=True)
        profiler.start()
        jax.block_until_ready(fn(*args))
        profiler.stop()


def _fp8_variant(launch):
    """One fp8 call on (x_q, x_scale, quantized weights): the module docstring's forms."""
    import jax_swiglu
    from jax_swiglu import _launch

    if launch == "gemm":
        return lambda x_q, s, q: jax.lax.dot_general(
            x_q, q.data, (((1,), (1,)), ((), ())), preferred_element_type=jax.numpy.bfloat16)
    if launch in ("auto", "fast"):
        accumulation = "fast" if launch == "fast" else "promoted"
        return lambda x_q, s, q: jax_swiglu.swiglu(x_q, q, x_scale=s, accumulation=accumulation)
    forced = _launch.parse(launch)
    accumulation = "fast" if forced.fast_accumulation else "promoted"
    return lambda x_q, s, q: jax_swiglu.swiglu(x_q, q, x_scale=s, launch=forced,
                                               accumulation=accumulation)


def _profile_fp8(row, launches, profiler):
    model, m = row.rsplit(":", 1)
    k, n = shapes_lib.mlp_shape(model)
    xs, ws = bench_fp8._sets(jax.random.key(0), int(m), k, n, count=1)
    (_, x_q, x_scale), q = xs[0], ws[0][0]
    compiled = {launch: jax.jit(_fp8_variant(launch)).lower(x_q, x_scale, q).compile()
                for launch in launches}
    _profile_each(compiled, (x_q, x_scale, q), f"fp8 {model} M={m}", profiler)


def _profile_moe(row, launches, profiler):
    model, tokens, routing = row.split(":")
    k, f, experts, top_k = shapes_lib.MOE_MLPS[model]
    rows = int(tokens) * top_k
    weights = bench_moe.make_weights(jax.random.key(0), k, f, experts, concatenated=False)
    sizes = jax.numpy.asarray(bench_moe.group_sizes(routing, rows, experts,
                                                    np.random.default_rng(0)))
    x = jax.random.normal(jax.random.key(1), (rows, k), jax.numpy.bfloat16)
    variants = {"grouped": bench_moe._grouped, "gemm": bench_moe._gemm}
    variants.update({f"grouped:{c}": bench_moe._forced(c) for c in launches})
    compiled = {name: jax.jit(fn).lower(x, sizes, weights).compile()
                for name, fn in variants.items()}
    _profile_each(compiled, (x, sizes, weights), row, profiler)


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
