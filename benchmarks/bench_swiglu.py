"""Benchmark jax_swiglu against XLA, the bare GEMM and the peers a user would pick (GPU).

    python -m benchmarks.bench_swiglu --suite prefill      # Qwen2.5 shapes, M = 128 .. 8192
    python -m benchmarks.bench_swiglu --suite decode       # 12+ public shapes, M = 1 .. 256
    python -m benchmarks.bench_swiglu --suite held-out     # shapes and M never tuned on
    python -m benchmarks.bench_swiglu --models llama-3-8b 5120x13824 --m 1 300

Writes benchmarks/results/<gpu>/<date>-<suite>.json after every row (a cut-short run keeps
its rows), then .md and .png through report.py, which regenerates both from a saved JSON.

Every row times, side by side in one run, on the same inputs:
  xla        act(x @ Wg) * (x @ Wu) in plain XLA on separate weights       (the reference)
  gemm       the bare [M, K] x [K, 2N] GEMM, no activation: what cuBLAS alone costs
  auto       jax_swiglu.swiglu, the launch the selection picks
  tokamax    tokamax.gated_linear_unit (Pallas Mosaic GPU), where it installs and accepts
             the shape (what it refuses is recorded as the row's result)
  torch      PyTorch eager, F.silu(x @ wg) * (x @ wu), and the same replayed as a CUDA graph
  auto_silu  with --activation gelu_tanh (GeGLU; act is SiLU otherwise): the same call with
             SiLU, so the row shows what the activation costs (the peers compute SwiGLU only
             and are skipped then)
GPU time: CUPTI for the JAX variants (jax.experimental.mosaic.gpu.profiler: the sum of a
call's kernel times), CUDA events around the calls for PyTorch (launch gaps included, as
eager runs). Medians over interleaved rounds, each call over a rotation of distinct
input/weight sets larger than the L2, so weights stream from HBM as in a real model. Per
row also: the weight stream (K * 2N * 2 bytes over the time) against the device's measured
copy bandwidth, and which launch auto ran and why.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import jax_swiglu

from . import environment as environment_lib
from . import peers, report
from . import shapes as shapes_lib

SUITES = {
    "prefill": (tuple(shapes_lib.QWEN25_MLPS), (128, 512, 2048, 8192)),
    "decode": (("qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-72b", "qwen3-4b", "qwen3-8b",
                "llama-2-7b", "llama-2-70b", "llama-3-8b", "llama-3.2-1b", "mistral-small-24b",
                "phi-4", "deepseek-coder-33b"),
               shapes_lib.DECODE_M + shapes_lib.DECODE_RAGGED_M),
    "held-out": (shapes_lib.HELD_OUT, shapes_lib.HELD_OUT_M),
}
QUICK = (("qwen2.5-0.5b", 1), ("llama-3-8b", 8), ("qwen2.5-7b", 128), ("qwen2.5-72b", 2048))
L2_BYTES = 60 * 2**20
ROTATION_BYTES = 3 * L2_BYTES  # data touched per measured call, at least
MAX_SETS = 16
ROUNDS = 3


# --- the variants: f(x, weights) with weights = (w_gate, w_up, stacked, packed) ------------

def xla_separate(activation="silu"):
    act = jax_swiglu.ACTIVATIONS[activation]

    def run(x, w):
        return act(x @ w[0]) * (x @ w[1])
    return run


def gemm_only(x, w):
    return x @ w[2]


def fused(kernel="auto", activation="silu", launch=None):
    def run(x, w):
        return jax_swiglu.swiglu(x, w[3], kernel=kernel, activation=activation, launch=launch)
    run.__name__ = kernel
    return run


def variants(activation="silu") -> dict:
    named = {"xla": xla_separate(activation), "gemm": gemm_only,
             "auto": fused("auto", activation)}
    if activation != "silu":
        named["auto_silu"] = fused("auto")
    return named


# --- measurement --------------------------------------------------------------------------

def _gpu_samples_ms(fn, args, iterations):
    """Per-call GPU times (ms) of `iterations` calls of an already warmed-up fn, via CUPTI."""
    from jax.experimental.mosaic.gpu import profiler
    _, times = profiler.measure(fn, iterations=iterations)(*args)
    if times is None:
        raise RuntimeError("CUPTI recorded no GPU kernel for the measured call")
    return list(times) if iterations > 1 else [times]


def kernel_names(fn, args) -> list[str]:
    """The GPU kernels one call of an already warmed-up fn runs, in order, each once (CUPTI):
    cuBLAS's and XLA's names say which tile and library they chose."""
    from jax.experimental.mosaic.gpu import profiler
    _, timings = profiler.measure(fn, aggregate=False)(*args)
    return list(dict.fromkeys(name for name, _ in timings or ()))


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


def round_orders(names, rounds):
    """The order of the variants in each measurement round: as given, then shuffled with
    the round number as the seed (reproducible)."""
    return [list(names)] + [random.Random(r).sample(names, len(names)) for r in range(1, rounds)]


def measure_side_by_side(fns, args, iterations, rounds, wall=True):
    """Median GPU and (with ``wall``; else None) wall ms of each fn, in interleaved rounds.

    A run at the power limit drifts (clocks, temperature) over seconds; timing each variant in
    one block would charge that drift to whichever came last. So every round times every
    variant for ceil(iterations / rounds) calls, in turn, and the medians are over all
    rounds; the order changes from round to round (the first as given, then seeded shuffles),
    so no variant always follows the same one.
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
        sets.append((x, (w_gate, w_up, jnp.concatenate([w_gate, w_up], axis=1),
                         jax_swiglu.pack_weights(w_gate, w_up))))
    return sets


def make_rotation(key, m, k, n):
    """Enough distinct (x, weights) sets that one pass over them overflows the L2."""
    bytes_per_set = 2 * (m * k + 2 * k * n + m * n)
    count = max(1, min(MAX_SETS, math.ceil(ROTATION_BYTES / bytes_per_set)))
    return _make_sets(key, m, k, n, count)


def _check(sets, fn, activation="silu"):
    """Relative Frobenius error of fn against the reference on the first set."""
    x, w = sets[0]
    y = jax.jit(fn)(x, w).astype(jnp.float32)
    r = jax_swiglu.swiglu_reference(x, w[0], w[1], activation=activation).astype(jnp.float32)
    return float(jnp.linalg.norm(y - r) / jnp.linalg.norm(r))


def flops(model, m):
    """Multiply-adds x 2 of the [M, K] x [K, 2N] product (the activation not counted)."""
    k, n = shapes_lib.mlp_shape(model)
    return 2 * m * k * 2 * n


def bench_one(model, m, iterations, key, rounds=ROUNDS, with_peers=True, activation="silu"):
    k, n = shapes_lib.mlp_shape(model)
    sets = make_rotation(key, m, k, n)
    count = len(sets)
    xs = [s[0] for s in sets]
    ws = [s[1] for s in sets]
    row = {"model": model, "m": m, "k": k, "n": n, "rotation_sets": count,
           "flops": flops(model, m), "weight_bytes": 2 * k * 2 * n,
           "gpu_us": {}, "wall_us": {}, "rel_err": {}, "unsupported": {}}
    named = variants(activation)
    with_peers = with_peers and activation == "silu"
    if with_peers:
        tokamax = peers.tokamax_variant()
        if isinstance(tokamax, str):
            row["unsupported"]["tokamax"] = tokamax
        else:
            why = peers.tokamax_refuses(tokamax, xs[0], ws[0])
            if why:
                row["unsupported"]["tokamax"] = why
            else:
                named["tokamax"] = tokamax
    fns = {name: jax.jit(lambda xs, ws, variant=variant: [variant(x, w) for x, w in zip(xs, ws)])
           for name, variant in named.items()}
    gpu_ms, wall_ms = measure_side_by_side(fns, (xs, ws), iterations, rounds)
    row["kernels"] = {name: kernel_names(fns[name], (xs, ws)) for name in ("gemm", "xla")}
    for name, variant in named.items():
        row["gpu_us"][name] = gpu_ms[name] * 1e3 / count
        row["wall_us"][name] = wall_ms[name] * 1e3 / count
        if name != "gemm":
            row["rel_err"][name] = _check(sets, variant,
                                          "silu" if name == "auto_silu" else activation)
    if with_peers:
        torch_us = peers.torch_times_us(sets, iterations)
        if isinstance(torch_us, str):
            row["unsupported"]["torch"] = torch_us
        else:
            row["events_us"] = torch_us
    x0 = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    row["auto_choice"] = jax_swiglu.explain(x0, ws[0][3], activation=activation)
    return row


def measure_peak_tflops(iterations=20):
    """bf16 GEMM rate of XLA (cuBLAS) on 8192^3 random data: the compute roofline."""
    key = jax.random.key(1)
    a = jax.random.normal(key, (8192, 8192), jnp.float32).astype(jnp.bfloat16)
    b = jax.random.normal(jax.random.fold_in(key, 1), (8192, 8192), jnp.float32).astype(jnp.bfloat16)
    fn = jax.jit(jnp.matmul)
    _warm_up(fn, (a, b))
    ms = statistics.median(_gpu_samples_ms(fn, (a, b), iterations))
    return 2 * 8192**3 / (ms * 1e-3) / 1e12


def measure_copy_tb_per_s(iterations=20, gigabytes=2.0):
    """Device-to-device streaming rate: an elementwise pass over a large buffer, counting the
    bytes read and written: the memory roofline."""
    elements = int(gigabytes * 2**30 / 2)
    x = jnp.ones((elements,), jnp.bfloat16)
    fn = jax.jit(lambda x: x + jnp.bfloat16(1))
    _warm_up(fn, (x,))
    ms = statistics.median(_gpu_samples_ms(fn, (x,), iterations))
    return 2 * 2 * elements / (ms * 1e-3) / 1e12


def estimate_remaining_s(done, todo):
    """Seconds left, from (flops, seconds) of the rows done and the flops of those to do.

    Fits seconds = a + b * flops (compiling costs about the same per row, timing grows with
    the work); with too few points, the mean time per row.
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
    parser.add_argument("--suite", choices=tuple(SUITES) + ("quick",), default=None,
                        help="a predefined set of rows (default: prefill)")
    parser.add_argument("--models", nargs="*", default=None,
                        help="model names of jax_swiglu.PUBLIC_MLPS, or KxN")
    parser.add_argument("--m", nargs="*", type=int, default=None)
    parser.add_argument("--iterations", type=int, default=20,
                        help="timed calls per variant and row, split over --rounds")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="interleaved rounds: each times every variant in turn")
    parser.add_argument("--no-peers", action="store_true", help="skip tokamax and PyTorch")
    parser.add_argument("--activation", choices=tuple(jax_swiglu.ACTIVATIONS), default="silu",
                        help="the gate's activation of xla and auto (gelu_tanh adds auto_silu)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no new row after this many seconds")
    parser.add_argument("--out-dir", default=None, help="default: benchmarks/results/<gpu>/")
    parser.add_argument("--tag", default=None, help="file name suffix (default: the suite)")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the head of the report; repeatable")
    args = parser.parse_args(argv)

    if jax.default_backend() != "gpu":
        raise SystemExit("the benchmark needs a GPU (jax.default_backend() is "
                         f"{jax.default_backend()!r})")
    suite = args.suite or ("custom" if args.models or args.m else "prefill")
    if suite == "quick":
        rows = list(QUICK)
    else:
        models, ms = SUITES.get(suite, (None, None))
        models = args.models or models or list(shapes_lib.QWEN25_MLPS)
        ms = args.m or ms or SUITES["prefill"][1]
        # M by M (each M over every model), so a run cut short by --budget-s has whole M.
        rows = [(model, m) for m in sorted(ms) for model in models]
    start = time.perf_counter()
    env = environment_lib.environment()
    tag = args.tag if args.tag is not None else suite
    tag = "-" + tag.lstrip("-") if tag else ""
    out_dir = args.out_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                           env["device"].replace(" ", "_"))
    os.makedirs(out_dir, exist_ok=True)
    stem = output_stem(out_dir, env["date"][:10], tag)

    result = {"suite": suite, "activation": args.activation, "environment": env,
              "iterations": args.iterations,
              "rounds": args.rounds, "notes": args.note, "complete": False,
              "peak_tflops": measure_peak_tflops(), "copy_tb_per_s": measure_copy_tb_per_s(),
              "peers": peers.versions(), "rows": []}
    print(f"bf16 GEMM peak {result['peak_tflops']:.0f} TFLOP/s, copy "
          f"{result['copy_tb_per_s']:.2f} TB/s; {len(rows)} rows -> {stem}.json", flush=True)
    key = jax.random.key(0)
    done = []
    for i, (model, m) in enumerate(rows):
        if args.budget_s is not None and time.perf_counter() - start > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent after {i} of {len(rows)} rows",
                  flush=True)
            break
        began = time.perf_counter()
        row = bench_one(model, m, args.iterations, jax.random.fold_in(key, i), args.rounds,
                        with_peers=not args.no_peers, activation=args.activation)
        result["rows"].append(row)
        result["complete"] = i + 1 == len(rows)
        with open(stem + ".json", "w") as f:  # after every row: a cut-short run keeps its data
            json.dump(result, f, indent=1)
        done.append((row["flops"], time.perf_counter() - began))
        left = estimate_remaining_s(done, [flops(*r) for r in rows[i + 1:]])
        t = row["gpu_us"]
        print(f"[{i + 1}/{len(rows)}] {model} M={m}: xla {t['xla']:.1f} us, gemm {t['gemm']:.1f}"
              f", auto {t['auto']:.1f} (auto/gemm {t['auto'] / t['gemm']:.3f}, "
              f"{t['xla'] / t['auto']:.2f}x xla); {done[-1][1]:.0f} s, "
              f"about {_hms(left)} left", flush=True)

    written = report.write_report(result, stem)
    print(report.markdown(result))
    print(f"wrote {stem}.json, " + ", ".join(os.path.basename(p) for p in written))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
