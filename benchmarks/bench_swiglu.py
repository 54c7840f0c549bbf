"""Benchmark the fused SwiGLU kernels against XLA on the Qwen2.5 MLP shapes (bf16, GPU).

    python benchmarks/bench_swiglu.py                 # the full suite: 7 shapes x 4 M
    python benchmarks/bench_swiglu.py --quick         # a few configurations
    python benchmarks/bench_swiglu.py --out-dir DIR   # where the JSON/markdown/plot go

Every configuration times, side by side in one run and on the same inputs:
  xla        SiLU(x @ Wg) * (x @ Wu) in plain XLA, separate weights   (baseline a)
  xla_stack  one XLA dot on pre-stacked [K, 2N] weights, then split/SiLU/mul (b)
  gemm       the bare [M, K] x [K, 2N] GEMM, no activation (what cuBLAS alone costs) (c)
  <kernel>   each fused kernel, forced                                 (d)
  auto       jax_swiglu.swiglu with the selection table                (e)

GPU time comes from CUPTI (jax.experimental.mosaic.gpu.profiler.measure): the sum of
kernel times per call, median over iterations after warm-up. Each measured call runs
over a rotation of distinct input/weight sets whose total exceeds the L2 several times,
so weights stream from HBM as in a real model. Wall time of the jitted call (launch
gaps included) is reported too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_swiglu
from jax_swiglu import QWEN25_MLPS

M_VALUES = (128, 512, 2048, 8192)
QUICK = (("qwen2.5-0.5b", 128), ("qwen2.5-0.5b", 2048), ("qwen2.5-7b", 128),
         ("qwen2.5-7b", 2048), ("qwen2.5-72b", 8192))
L2_BYTES = 60 * 2**20
ROTATION_BYTES = 3 * L2_BYTES  # data touched per measured call, at least
MAX_SETS = 16


def _stack(w_gate, w_up):
    return jnp.concatenate([w_gate, w_up], axis=1)


# --- the variants: f(x, weights) with weights = (w_gate, w_up, stacked, packed) ------------

def xla_separate(x, w):
    return jax.nn.silu(x @ w[0]) * (x @ w[1])


def xla_stacked(x, w):
    n = w[0].shape[1]
    h = x @ w[2]
    return jax.nn.silu(h[:, :n]) * h[:, n:]


def gemm_only(x, w):
    return x @ w[2]


def fused(kernel):
    def run(x, w):
        return jax_swiglu.swiglu(x, w[3], kernel=kernel)
    run.__name__ = kernel
    return run


def variants():
    table = {"xla": xla_separate, "xla_stack": xla_stacked, "gemm": gemm_only}
    for kernel in jax_swiglu.KERNELS:
        if kernel != "xla":
            table[kernel] = fused(kernel)
    table["auto"] = fused("auto")
    return table


# --- measurement --------------------------------------------------------------------------

def _measure_gpu_ms(fn, args, iterations):
    from jax.experimental.mosaic.gpu import profiler
    fn(*args)  # compile + warm up
    jax.block_until_ready(fn(*args))
    _, times = profiler.measure(fn, iterations=iterations)(*args)
    return statistics.median(times)


def _measure_wall_ms(fn, args, iterations):
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def _make_sets(key, m, k, n, count):
    sets = []
    for i in range(count):
        kx, kg, ku = jax.random.split(jax.random.fold_in(key, i), 3)
        x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
        w_gate = (jax.random.normal(kg, (k, n), jnp.float32) / math.sqrt(k)).astype(jnp.bfloat16)
        w_up = (jax.random.normal(ku, (k, n), jnp.float32) / math.sqrt(k)).astype(jnp.bfloat16)
        sets.append((x, (w_gate, w_up, _stack(w_gate, w_up), jax_swiglu.pack_weights(w_gate, w_up))))
    return sets


def make_rotation(key, m, k, n):
    """Enough distinct (x, weights) sets that one pass over them overflows the L2."""
    bytes_per_set = 2 * (m * k + 2 * k * n + m * n)
    count = max(1, min(MAX_SETS, math.ceil(ROTATION_BYTES / bytes_per_set)))
    return _make_sets(key, m, k, n, count)


def _check(sets, fn):
    """Max relative error of fn against the reference on the first set (guards timings)."""
    x, w = sets[0]
    y = jax.jit(fn)(x, w).astype(jnp.float32)
    r = jax_swiglu.swiglu_reference(x, w[0], w[1]).astype(jnp.float32)
    return float(jnp.linalg.norm(y - r) / jnp.linalg.norm(r))


def bench_one(model, m, iterations, key):
    k, n = QWEN25_MLPS[model]
    sets = make_rotation(key, m, k, n)
    count = len(sets)
    xs = [s[0] for s in sets]
    ws = [s[1] for s in sets]
    row = {"model": model, "m": m, "k": k, "n": n, "rotation_sets": count,
           "flops": 2 * m * k * 2 * n, "gpu_us": {}, "wall_us": {}, "rel_err": {}}
    for name, variant in variants().items():
        fn = jax.jit(lambda xs, ws, variant=variant: [variant(x, w) for x, w in zip(xs, ws)])
        row["gpu_us"][name] = _measure_gpu_ms(fn, (xs, ws), iterations) * 1e3 / count
        row["wall_us"][name] = _measure_wall_ms(fn, (xs, ws), iterations) * 1e3 / count
        if name not in ("gemm",):
            row["rel_err"][name] = _check(sets, variant)
    x0 = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    row["auto_choice"] = jax_swiglu.explain(x0, ws[0][3])
    return row


def measure_peak_tflops(iterations=20):
    """bf16 GEMM rate of XLA (cuBLAS) on 8192^3 random data: the roofline we report against."""
    key = jax.random.key(1)
    a = jax.random.normal(key, (8192, 8192), jnp.float32).astype(jnp.bfloat16)
    b = jax.random.normal(jax.random.fold_in(key, 1), (8192, 8192), jnp.float32).astype(jnp.bfloat16)
    ms = _measure_gpu_ms(jax.jit(jnp.matmul), (a, b), iterations)
    return 2 * 8192**3 / (ms * 1e-3) / 1e12


def environment():
    device = jax.devices()[0]
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "device": getattr(device, "device_kind", str(device)),
        "jax": jax.__version__,
        "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else None,
        "jax_swiglu": jax_swiglu.__version__,
        "python": platform.python_version(),
    }
    try:
        import jaxlib
        env["jaxlib"] = jaxlib.__version__
    except Exception:  # pragma: no cover
        pass
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,"
             "power.limit", "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        env["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        env["nvidia_smi"] = None
    try:
        nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30)
        env["nvcc"] = nvcc.stdout.strip().splitlines()[-1]
    except (OSError, subprocess.SubprocessError, IndexError):
        env["nvcc"] = None
    return env


def markdown(result):
    env = result["environment"]
    fused_names = [k for k in jax_swiglu.KERNELS if k != "xla"]
    lines = [
        f"GPU: {env['device']} ({env.get('nvidia_smi')}); jax {env['jax']}, jaxlib {env['jaxlib']}; "
        f"{env['date']}; measured bf16 GEMM peak {result['peak_tflops']:.0f} TFLOP/s.",
        f"Command: `{env['command']}`. GPU time (CUPTI), microseconds per call, median.",
        "",
        "| model | M | xla (a) | xla_stack (b) | gemm (c) | " + " | ".join(fused_names)
        + " | auto (e) | a/auto | auto/c | auto TFLOP/s |",
        "|---|---|---|---|---|" + "---|" * len(fused_names) + "---|---|---|---|",
    ]
    for row in result["rows"]:
        t = row["gpu_us"]
        tflops = row["flops"] / (t["auto"] * 1e-6) / 1e12
        lines.append(
            f"| {row['model']} | {row['m']} | {t['xla']:.1f} | {t['xla_stack']:.1f} | "
            f"{t['gemm']:.1f} | " + " | ".join(f"{t[k]:.1f}" for k in fused_names)
            + f" | {t['auto']:.1f} | {t['xla'] / t['auto']:.2f} | {t['auto'] / t['gemm']:.2f} | "
            f"{tflops:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few configurations only")
    parser.add_argument("--models", nargs="*", default=list(QWEN25_MLPS))
    parser.add_argument("--m", nargs="*", type=int, default=list(M_VALUES))
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--out-dir", default=None,
                        help="default: benchmarks/results/<gpu>/")
    args = parser.parse_args(argv)

    if jax.default_backend() != "gpu":
        raise SystemExit("the benchmark needs a GPU (jax.default_backend() is "
                         f"{jax.default_backend()!r})")
    configs = list(QUICK) if args.quick else [(mo, m) for mo in args.models for m in args.m]
    env = environment()
    result = {"environment": env, "peak_tflops": measure_peak_tflops(), "rows": []}
    key = jax.random.key(0)
    for i, (model, m) in enumerate(configs):
        row = bench_one(model, m, args.iterations, jax.random.fold_in(key, i))
        result["rows"].append(row)
        t = row["gpu_us"]
        print(f"[{i + 1}/{len(configs)}] {model} M={m}: xla {t['xla']:.1f} us, gemm {t['gemm']:.1f} us, "
              f"auto {t['auto']:.1f} us ({t['xla'] / t['auto']:.2f}x xla)", flush=True)

    gpu_dir = env["device"].replace(" ", "_")
    out_dir = args.out_dir or os.path.join(os.path.dirname(__file__), "results", gpu_dir)
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, env["date"][:10] + ("-quick" if args.quick else ""))
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    table = markdown(result)
    with open(stem + ".md", "w") as f:
        f.write(table)
    print(table)
    print(f"wrote {stem}.json and {stem}.md")
    return result


if __name__ == "__main__":
    main()
