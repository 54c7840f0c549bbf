"""Measure every compiled (kernel, tile config) on the Qwen2.5 shapes, to derive the selection table.

    python benchmarks/calibrate.py                       # all shapes, M in 128 512 2048 8192
    python benchmarks/calibrate.py --m 1 128 2048 --out calib.json

For each (model, M) it times, side by side on the same rotated inputs and in interleaved
rounds, the XLA reference and every config of every fused kernel (forced through
JAX_SWIGLU_KERNEL/JAX_SWIGLU_CONFIG),
then prints the fastest per (model, M) and, per M, the config that wins most often.
The JSON (written after every row) is rendered as a markdown table next to it by
report.py (python benchmarks/report.py calib.json does it again from a saved JSON).
The table in jax_swiglu/_selection.py is written from this output by hand, with the run
cited there.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import sys
import time

import jax

sys.path.insert(0, os.path.dirname(__file__))
import bench_swiglu  # noqa: E402  (same folder)
import report  # noqa: E402

import jax_swiglu  # noqa: E402
from jax_swiglu import QWEN25_MLPS, _selection  # noqa: E402


@contextlib.contextmanager
def forced(kernel, launch):
    """JAX_SWIGLU_KERNEL/JAX_SWIGLU_CONFIG set to one launch (e.g. "interleaved", "0,swizzle=4")
    while the body compiles: they are read at lowering."""
    os.environ[_selection.ENV_VAR] = kernel
    os.environ[_selection.CONFIG_ENV_VAR] = launch
    try:
        yield
    finally:
        del os.environ[_selection.ENV_VAR], os.environ[_selection.CONFIG_ENV_VAR]


# Timed beside the launches, never a candidate for "best": (a) and, with --gemm, (c).
BASELINES = ("xla", "gemm")


def _compiled(variant, xs, ws):
    # Compiled now, while the forcing variables are set (they are read at lowering).
    return jax.jit(lambda xs, ws: [variant(x, w) for x, w in zip(xs, ws)]).lower(xs, ws).compile()


def calibrate(model, m, iterations, key, launches, rounds=bench_swiglu.ROUNDS, gemm=False):
    k, n = bench_swiglu.mlp_shape(model)
    sets = bench_swiglu.make_rotation(key, m, k, n)
    xs, ws = [s[0] for s in sets], [s[1] for s in sets]
    fns = {"xla": _compiled(bench_swiglu.xla_separate, xs, ws)}
    if gemm:
        fns["gemm"] = _compiled(bench_swiglu.gemm_only, xs, ws)
    for kernel, launch in launches:
        config = launch.split(",")[0]
        multiple = (jax_swiglu.kernel_configs()[kernel][int(config)].m_multiple
                    if config.isdigit() else 1)
        if m % multiple:
            # A config running M in bands runs only multiples of them: no column for this M.
            print(f"  {kernel}:{launch} skipped at M={m} (needs a multiple of {multiple})",
                  flush=True)
            continue
        with forced(kernel, launch):
            fns[f"{kernel}:{launch}"] = _compiled(bench_swiglu.fused("auto"), xs, ws)
    gpu_ms, _ = bench_swiglu.measure_side_by_side(fns, (xs, ws), iterations, rounds, wall=False)
    return {"model": model, "m": m, "k": k, "n": n,
            "gpu_us": {name: t * 1e3 / len(xs) for name, t in gpu_ms.items()}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(QWEN25_MLPS),
                        help="Qwen2.5 names, or KxN for another shape")
    parser.add_argument("--m", nargs="*", type=int, default=[128, 512, 2048, 8192])
    parser.add_argument("--iterations", type=int, default=10,
                        help="timed calls per launch and row, split over --rounds (rounded up "
                             "to a multiple of it)")
    parser.add_argument("--rounds", type=int, default=bench_swiglu.ROUNDS,
                        help="interleaved rounds: each times every launch in turn")
    parser.add_argument("--out", default="calibration.json")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no new (model, M) row after this many seconds; the report"
                             " then says the run is incomplete")
    parser.add_argument("--gemm", action="store_true",
                        help="also time the bare GEMM (the benchmark's baseline (c)), so each"
                             " launch reads against target 2 in the same rounds")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the head of the report; repeatable")
    parser.add_argument(
        "--launches", nargs="*", default=None,
        help="KERNEL:LAUNCH pairs, LAUNCH as in JAX_SWIGLU_CONFIG (e.g. interleaved:0,swizzle=4);"
             " default: every compiled config of every kernel")
    args = parser.parse_args(argv)
    if args.launches is None:
        launches = [(kernel, str(config)) for kernel, configs in jax_swiglu.kernel_configs().items()
                    for config in configs]
    else:
        launches = [tuple(item.split(":", 1)) for item in args.launches]

    start = time.perf_counter()
    rows = []
    kernels = {kernel for kernel, _ in launches}
    result = {"kind": "calibration", "environment": bench_swiglu.environment(),
              "iterations": args.iterations, "rounds": args.rounds, "notes": args.note,
              "launches": [f"{kernel}:{launch}" for kernel, launch in launches],
              "configs": {kernel: {str(i): dataclasses.asdict(c) for i, c in table.items()}
                          for kernel, table in jax_swiglu.kernel_configs().items()
                          if kernel in kernels},
              "complete": False, "rows": rows}
    key = jax.random.key(0)
    configs = [(model, m) for m in args.m for model in args.models]
    done = []
    for i, (model, m) in enumerate(configs):
        if args.budget_s is not None and time.perf_counter() - start > args.budget_s:
            print(f"time budget of {args.budget_s:.0f} s spent: stopping after {i} of "
                  f"{len(configs)} rows", flush=True)
            break
        began = time.perf_counter()
        row = calibrate(model, m, args.iterations, jax.random.fold_in(key, i), launches,
                        args.rounds, args.gemm)
        rows.append(row)
        result["complete"] = i + 1 == len(configs)
        with open(args.out, "w") as f:  # after every row: a cut-short run keeps its data
            json.dump(result, f, indent=1)
        done.append((bench_swiglu.flops(model, m), time.perf_counter() - began))
        left = bench_swiglu.estimate_remaining_s(
            done, [bench_swiglu.flops(*config) for config in configs[i + 1:]])
        fused = {name: t for name, t in row["gpu_us"].items() if name not in BASELINES}
        best = min(fused, key=fused.get)
        print(f"[{i + 1}/{len(configs)}] {model} M={m}: xla {row['gpu_us']['xla']:.1f} us; "
              + ", ".join(f"{name} {t:.1f}" for name, t in fused.items())
              + f" -> best {best} ({row['gpu_us']['xla'] / fused[best]:.2f}x xla); "
              f"elapsed {bench_swiglu._hms(time.perf_counter() - start)}, "
              f"about {bench_swiglu._hms(left)} left", flush=True)

    wins = collections.defaultdict(collections.Counter)
    for row in rows:
        fused = {name: t for name, t in row["gpu_us"].items() if name not in BASELINES}
        wins[row["m"]][min(fused, key=fused.get)] += 1
    print("\nwinner counts per M:")
    for m in sorted(wins):
        print(f"  M={m}: {dict(wins[m])}")
    written = report.write_report(result, os.path.splitext(args.out)[0], source=args.out)
    print(f"wrote {args.out}" + "".join(f", {path}" for path in written))


if __name__ == "__main__":
    main()
