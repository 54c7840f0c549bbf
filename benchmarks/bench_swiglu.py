"""Benchmark the fused SwiGLU kernels against XLA on the Qwen2.5 MLP shapes (bf16, GPU).

    python benchmarks/bench_swiglu.py                 # the full suite: 7 shapes x 4 M
    python benchmarks/bench_swiglu.py --quick         # a few configurations
    python benchmarks/bench_swiglu.py --out-dir DIR   # where the JSON/markdown/plot go

Writes benchmarks/results/<gpu>/<date><tag>.json (after every configuration, so a cut-short
run keeps its rows), then .md (table and the issue's targets) and .png (plot) from it through
report.py, which regenerates both from a saved JSON.

Every configuration times, side by side in one run and on the same inputs:
  xla        SiLU(x @ Wg) * (x @ Wu) in plain XLA, separate weights   (baseline a)
  xla_stack  one XLA dot on pre-stacked [K, 2N] weights, then split/SiLU/mul (b)
  gemm       the bare [M, K] x [K, 2N] GEMM, no activation (what cuBLAS alone costs) (c)
  <kernel>   each fused kernel, forced                                 (d)
  auto       jax_swiglu.swiglu with the selection table                (e)

GPU time comes from CUPTI (jax.experimental.mosaic.gpu.profiler.measure): the sum of
kernel times per call, median over iterations after warm-up, the variants timed in turn
over interleaved rounds so clock drift is shared. Each measured call runs
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
import random
import re
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_swiglu
from jax_swiglu import QWEN25_MLPS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402  (same folder: the markdown, the targets, the plot)

M_VALUES = (128, 512, 2048, 8192)
QUICK = (("qwen2.5-0.5b", 128), ("qwen2.5-0.5b", 2048), ("qwen2.5-7b", 128),
         ("qwen2.5-7b", 2048), ("qwen2.5-72b", 8192))
L2_BYTES = 60 * 2**20
ROTATION_BYTES = 3 * L2_BYTES  # data touched per measured call, at least
MAX_SETS = 16
ROUNDS = 3  # interleaved measurement rounds per configuration (see measure_side_by_side)


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

def _gpu_samples_ms(fn, args, iterations):
    """Per-call GPU times (ms) of `iterations` calls of an already warmed-up fn, via CUPTI."""
    from jax.experimental.mosaic.gpu import profiler
    _, times = profiler.measure(fn, iterations=iterations)(*args)
    if times is None:
        raise RuntimeError("CUPTI recorded no GPU kernel for the measured call")
    return list(times) if iterations > 1 else [times]


def _wall_samples_ms(fn, args, iterations):
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def _warm_up(fn, args):
    fn(*args)  # compile
    jax.block_until_ready(fn(*args))


def _measure_gpu_ms(fn, args, iterations):
    _warm_up(fn, args)
    return statistics.median(_gpu_samples_ms(fn, args, iterations))


def _measure_wall_ms(fn, args, iterations):
    _warm_up(fn, args)
    return statistics.median(_wall_samples_ms(fn, args, iterations))


def round_orders(names, rounds):
    """The order of the variants in each measurement round: as given, then shuffled with
    the round number as the seed (reproducible)."""
    return [list(names)] + [random.Random(r).sample(names, len(names)) for r in range(1, rounds)]


def measure_side_by_side(fns, args, iterations, rounds, wall=True):
    """Median GPU and (with ``wall``; else None) wall ms of each fn, in interleaved rounds.

    A run at the 700 W limit drifts (clocks, temperature) over seconds; timing each
    variant in one block would charge that drift to whichever came last. So every round
    times every variant for ceil(iterations / rounds) calls, in turn, and the medians
    are over all rounds. The order changes from round to round (the first as given, then
    seeded shuffles): in a fixed order a variant always follows the same one, and at the
    72B M=8192 shape `auto` measured 4-11% slower than `interleaved`, the same kernel,
    behind the long pingpong calls (runs 19 and 20).
    """
    if iterations < 1 or rounds < 1:
        raise ValueError(f"iterations and rounds must be >= 1 (got {iterations}, {rounds})")
    for fn in fns.values():
        _warm_up(fn, args)
    per_round = math.ceil(iterations / rounds)
    gpu_samples = {name: [] for name in fns}
    wall_samples = {name: [] for name in fns}
    for order in round_orders(list(fns), rounds):
        for name in order:
            gpu_samples[name] += _gpu_samples_ms(fns[name], args, per_round)
            if wall:
                wall_samples[name] += _wall_samples_ms(fns[name], args, per_round)
    def medians(samples):
        return {name: statistics.median(t) for name, t in samples.items()}
    return medians(gpu_samples), (medians(wall_samples) if wall else None)


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


def mlp_shape(model):
    """(K, N) of `model`: a Qwen2.5 name, or "KxN" for any other shape (e.g. "2048x11040",
    for a calibration run that isolates one dimension)."""
    if model in QWEN25_MLPS:
        return QWEN25_MLPS[model]
    match = re.fullmatch(r"(\d+)x(\d+)", model)
    if not match:
        raise ValueError(f"unknown model {model!r}: a Qwen2.5 name "
                         f"({', '.join(QWEN25_MLPS)}) or KxN")
    return int(match[1]), int(match[2])


def flops(model, m):
    """Multiply-adds x 2 of the [M, K] x [K, 2N] product (the activation not counted)."""
    k, n = mlp_shape(model)
    return 2 * m * k * 2 * n


def bench_one(model, m, iterations, key, rounds=ROUNDS):
    k, n = mlp_shape(model)
    sets = make_rotation(key, m, k, n)
    count = len(sets)
    xs = [s[0] for s in sets]
    ws = [s[1] for s in sets]
    row = {"model": model, "m": m, "k": k, "n": n, "rotation_sets": count,
           "flops": flops(model, m), "gpu_us": {}, "wall_us": {}, "rel_err": {}}
    named = variants()
    fns = {name: jax.jit(lambda xs, ws, variant=variant: [variant(x, w) for x, w in zip(xs, ws)])
           for name, variant in named.items()}
    gpu_ms, wall_ms = measure_side_by_side(fns, (xs, ws), iterations, rounds)
    for name, variant in named.items():
        row["gpu_us"][name] = gpu_ms[name] * 1e3 / count
        row["wall_us"][name] = wall_ms[name] * 1e3 / count
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


def git_commit():
    """Short commit of the checkout, "+" if tracked files differ from it; None outside git."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here,
                              capture_output=True, text=True, timeout=30)
        if head.returncode != 0:
            return None
        diff = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=here,
                              capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+" if diff.returncode == 1 else "")


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
    env["git"] = git_commit()
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,"
             "power.limit", "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        # One line per GPU: the first is the one the runs use (jax.devices()[0]); the count
        # says whether the host had others, idle during a one-GPU run.
        lines = smi.stdout.strip().splitlines()
        env["nvidia_smi"] = lines[0] if lines else None
        env["gpus_on_host"] = len(lines)
    except (OSError, subprocess.SubprocessError):
        env["nvidia_smi"] = None
    try:
        nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30)
        env["nvcc"] = nvcc.stdout.strip().splitlines()[-1]
    except (OSError, subprocess.SubprocessError, IndexError):
        env["nvcc"] = None
    return env


def estimate_remaining_s(done, todo):
    """Seconds left, from (flops, seconds) of the configurations done and the flops of those to do.

    Fits seconds = a + b * flops (compiling costs about the same per configuration, timing
    grows with the work); with too few points, the mean time per configuration.
    """
    if not done or not todo:
        return 0.0
    work = [w for w, _ in done]
    secs = [t for _, t in done]
    mean_w, mean_t = statistics.fmean(work), statistics.fmean(secs)
    var = sum((w - mean_w) ** 2 for w in work)
    b = max(0.0, sum((w - mean_w) * (t - mean_t) for w, t in done) / var) if var > 0 else 0.0
    a = mean_t - b * mean_w
    if a < 0:  # all of the time in the work term
        a, b = 0.0, sum(secs) / sum(work)
    return sum(a + b * w for w in todo)


def _hms(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def output_stem(out_dir, date, tag):
    """out_dir/<date><tag>, with -2, -3, ... added rather than overwrite an earlier run."""
    stem = os.path.join(out_dir, date + tag)
    n = 1
    while os.path.exists(stem + (f"-{n}" if n > 1 else "") + ".json"):
        n += 1
    return stem + (f"-{n}" if n > 1 else "")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few configurations only")
    parser.add_argument("--models", nargs="*", default=list(QWEN25_MLPS))
    parser.add_argument("--m", nargs="*", type=int, default=list(M_VALUES))
    parser.add_argument("--iterations", type=int, default=20,
                        help="timed calls per variant and configuration, split over --rounds "
                             "(rounded up to a multiple of it)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="interleaved rounds: each times every variant in turn")
    parser.add_argument("--out-dir", default=None,
                        help="default: benchmarks/results/<gpu>/")
    parser.add_argument("--tag", default=None,
                        help="suffix of the file names, <date>-<tag>.json (default: quick "
                             "with --quick, none otherwise)")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the head of the report (e.g. what the run is for); "
                             "repeatable")
    args = parser.parse_args(argv)

    if jax.default_backend() != "gpu":
        raise SystemExit("the benchmark needs a GPU (jax.default_backend() is "
                         f"{jax.default_backend()!r})")
    configs = list(QUICK) if args.quick else [(mo, m) for mo in args.models for m in args.m]
    start = time.perf_counter()
    env = environment()
    tag = args.tag if args.tag is not None else ("quick" if args.quick else "")
    tag = "-" + tag.lstrip("-") if tag else ""
    out_dir = args.out_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                           env["device"].replace(" ", "_"))
    os.makedirs(out_dir, exist_ok=True)
    stem = output_stem(out_dir, env["date"][:10], tag)

    result = {"environment": env, "iterations": args.iterations, "rounds": args.rounds,
              "notes": args.note,
              "complete": False, "peak_tflops": measure_peak_tflops(), "rows": []}
    print(f"bf16 GEMM peak {result['peak_tflops']:.0f} TFLOP/s; {len(configs)} configurations "
          f"-> {stem}.json", flush=True)
    key = jax.random.key(0)
    done = []
    for i, (model, m) in enumerate(configs):
        began = time.perf_counter()
        row = bench_one(model, m, args.iterations, jax.random.fold_in(key, i), args.rounds)
        result["rows"].append(row)
        result["complete"] = i + 1 == len(configs)
        with open(stem + ".json", "w") as f:  # after every row: a cut-short run keeps its data
            json.dump(result, f, indent=1)
        done.append((row["flops"], time.perf_counter() - began))
        left = estimate_remaining_s(done, [flops(*config) for config in configs[i + 1:]])
        t = row["gpu_us"]
        print(f"[{i + 1}/{len(configs)}] {model} M={m}: xla {t['xla']:.1f} us, gemm {t['gemm']:.1f} us, "
              f"auto {t['auto']:.1f} us ({t['xla'] / t['auto']:.2f}x xla); {done[-1][1]:.0f} s, "
              f"elapsed {_hms(time.perf_counter() - start)}, about {_hms(left)} left", flush=True)

    written = report.write_report(result, stem)
    print(report.markdown(result))
    print(f"wrote {stem}.json, " + ", ".join(os.path.basename(p) for p in written))
    return result


if __name__ == "__main__":
    main()
