"""Forced 16-bit launches beside the bare GEMM, XLA and auto, on a few shapes (GPU).

    python -m benchmarks.research.launches --models 4096x12800 --m 200 777 --configs 38 39 40
    python -m benchmarks.research.launches --models llama-3-8b --m 1 8 --configs 45 45,splits=2

For each (model, M) it compiles one function per launch, forced with
``swiglu(..., launch="<config>")`` (a row id, or an id and its split; checked to lower to that config), and times them with
the benchmark's own variants (bench_swiglu: the bare ``[M, K] x [K, 2N]`` GEMM, XLA's
expression, auto) in interleaved rounds with CUPTI, on the benchmark's rotation of inputs past
the L2. It also counts each launch's elements off the fp32 spec by more than 1 % + 1e-3. It
asks where a new row stands against cuBLAS before it is calibrated (issue 42: the swap-AB
mid-M tiles). Prints one line per row and writes --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_swiglu
from jax_swiglu import _launch

from ..bench_swiglu import fused, kernel_names, make_rotation, measure_side_by_side, variants
from ..shapes import mlp_shape


def _forced(sets, config):
    """A jitted call of every set through launch ``config``, after checking its lowering."""
    run = fused(launch=config)
    fn = jax.jit(lambda xs, ws: [run(x, w) for x, w in zip(xs, ws)])
    xs, ws = [s[0] for s in sets], [s[1] for s in sets]
    row_id = _launch.parse(config).config
    if not re.search(rf"\bconfig = {row_id} : i64", fn.lower(xs, ws).as_text()):
        raise RuntimeError(f"launch={config} did not reach the lowering")
    return fn, run


def _mismatches(sets, run) -> int:
    x, w = sets[0]
    y = np.asarray(jax.jit(run)(x, w), np.float32)
    spec = np.asarray(jax_swiglu.swiglu_reference(x, w[0], w[1]), np.float32)
    return int(np.sum(~(np.abs(y - spec) <= 0.01 * np.abs(spec) + 1e-3)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["4096x12800"])
    parser.add_argument("--m", nargs="*", type=int, default=[200, 777])
    parser.add_argument("--configs", nargs="*", required=True,
                        help="launches: a row id, or an id with its split (45,splits=2)")
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=float("inf"),
                        help="start no new row after this many seconds")
    parser.add_argument("--out", default="launches.json")
    args = parser.parse_args(argv)
    table = jax_swiglu.kernel_configs()
    rows = []
    start = time.monotonic()
    for m in args.m:
        for model in args.models:
            if time.monotonic() - start > args.budget_s:
                print(f"budget reached: {model} M={m} and later rows not run", flush=True)
                return rows
            k, n = mlp_shape(model)
            sets = make_rotation(jax.random.key(m), m, k, n)
            xs, ws = [s[0] for s in sets], [s[1] for s in sets]
            fns = {name: jax.jit(lambda xs, ws, v=v: [v(x, w) for x, w in zip(xs, ws)])
                   for name, v in variants().items()}
            runs = {}
            for config in args.configs:
                row = table[_launch.parse(config).config]
                if row.max_m and m > row.max_m:
                    continue
                fns[f"c{config}"], runs[f"c{config}"] = _forced(sets, config)
            gpu_ms, _ = measure_side_by_side(fns, (xs, ws), args.iterations, args.rounds,
                                             wall=False)
            us = {name: t * 1e3 / len(sets) for name, t in gpu_ms.items()}
            record = {"model": model, "m": m, "k": k, "n": n, "gpu_us": us,
                      "mismatches": {name: _mismatches(sets, run) for name, run in runs.items()},
                      "gemm_kernels": kernel_names(fns["gemm"], (xs, ws)),
                      "auto_choice": jax_swiglu.explain(
                          jax.ShapeDtypeStruct((m, k), jnp.bfloat16), ws[0][3])}
            rows.append(record)
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
            gemm = us["gemm"]
            best = min((t, name) for name, t in us.items() if name.startswith("c"))
            print(f"{model} M={m}: gemm {gemm:.1f} xla {us['xla']:.1f} auto {us['auto']:.1f} "
                  f"({us['auto'] / gemm:.3f}); " + ", ".join(
                      f"{name} {t:.1f} ({t / gemm:.3f}, {record['mismatches'][name]} off)"
                      for name, t in us.items() if name.startswith("c"))
                  + f"; best {best[1]} {best[0] / gemm:.3f}; the GEMM ran "
                  + ", ".join(name[:60] for name in record["gemm_kernels"]), flush=True)
    return rows


if __name__ == "__main__":
    main()
