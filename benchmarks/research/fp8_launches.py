"""Every fp8 kernel config and promotion interval on a few shapes, side by side (GPU).

    python -m benchmarks.research.fp8_launches --models qwen2.5-7b qwen2.5-72b --m 1 2048

For each (model, M) it compiles one function per launch, ``JAX_SWIGLU_CONFIG`` set while
that function is lowered ("<config>,promotion=<p>"; for the gemv rows, which promote after
every mma, "<config>,splits=<s>" at each cluster size, where M fits their tokens), on x
already in fp8 (the kernel alone),
and times them in interleaved rounds with CUPTI (benchmarks/bench_swiglu.py's
measure_side_by_side) beside XLA's fp8 GEMM baseline and the bf16 kernel's auto. It also
counts mismatches of every launch against the fp8 spec, so a promotion interval that costs
accuracy shows. Prints one line per row and writes --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np

import jax_swiglu
from jax_swiglu import _reference, _shapes, selection
from jax_swiglu.selection import _fp8

from ..bench_swiglu import measure_side_by_side


def _compiled(fn, args, forced):
    previous = os.environ.get(selection.CONFIG_ENV_VAR)
    os.environ[selection.CONFIG_ENV_VAR] = forced
    try:
        lowered = jax.jit(fn).lower(*args)
        config = forced.split(",")[0]
        if not re.search(rf"\bconfig = {config} : i64", lowered.as_text()):
            raise RuntimeError(f"{selection.CONFIG_ENV_VAR}={forced} did not reach the lowering")
        return lowered.compile()
    finally:
        if previous is None:
            os.environ.pop(selection.CONFIG_ENV_VAR)
        else:
            os.environ[selection.CONFIG_ENV_VAR] = previous


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["qwen2.5-7b", "qwen2.5-72b"])
    parser.add_argument("--m", nargs="*", type=int, default=[2048, 8192])
    parser.add_argument("--configs", nargs="*", type=int, default=None)
    parser.add_argument("--promotions", nargs="*", type=int, default=list(_fp8.PROMOTIONS))
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--out", default="fp8_launches.json")
    args = parser.parse_args(argv)
    table = jax_swiglu._native.fp8_configs()
    configs = args.configs if args.configs is not None else sorted(table)
    rows = []
    for model in args.models:
        k, n = _shapes.mlp_shape(model)
        key = jax.random.key(0)
        kx, kg, ku = jax.random.split(key, 3)
        w_gate = (jax.random.normal(kg, (k, n)) / math.sqrt(k)).astype(jnp.bfloat16)
        w_up = (jax.random.normal(ku, (k, n)) / math.sqrt(k)).astype(jnp.bfloat16)
        q = jax_swiglu.quantize_weights(w_gate, w_up)
        packed = jax_swiglu.pack_weights(w_gate, w_up)
        for m in args.m:
            x = jax.random.normal(kx, (m, k)).astype(jnp.bfloat16)
            x_q, x_scale = jax_swiglu.quantize_tokens(x)
            fp8_args = (x_q, x_scale, q)
            fns = {}
            def fused():  # a new function per launch: jit caches a function's lowering
                return lambda x_q, s, q: jax_swiglu.swiglu(x_q, q, x_scale=s)
            for config in configs:
                c = table[config]
                if c.is_gemv:
                    if c.runs(m):
                        for splits in c.split_choices(k):
                            fns[f"c{config}s{splits}"] = _compiled(fused(), fp8_args,
                                                                   f"{config},splits={splits}")
                    continue
                for promotion in args.promotions:
                    if promotion % _fp8.tile_promotion(c):
                        continue  # not a whole number of this config's k tiles
                    fns[f"c{config}p{promotion}"] = _compiled(fused(), fp8_args,
                                                              f"{config},promotion={promotion}")
            fns["xla_fp8"] = jax.jit(
                lambda x_q, s, q: _reference.swiglu_xla_quantized(x_q, q, x_scale=s))
            bf16 = jax.jit(lambda x, p: jax_swiglu.swiglu(x, p))
            fns["bf16"] = lambda x_q, s, q: bf16(x, packed)
            gpu_ms, _ = measure_side_by_side(fns, fp8_args, args.iterations, 3, wall=False)
            spec = np.asarray(jax_swiglu.swiglu_reference_quantized(x_q, q, x_scale=x_scale),
                              np.float32)
            row = {"model": model, "m": m, "k": k, "n": n,
                   "gpu_us": {name: t * 1e3 for name, t in gpu_ms.items()}, "mismatches": {}}
            for name, fn in fns.items():
                if name == "bf16":
                    continue
                y = np.asarray(fn(*fp8_args), np.float32)
                row["mismatches"][name] = int(np.sum(~(np.abs(y - spec)
                                                       <= 0.01 * np.abs(spec) + 1e-3)))
            rows.append(row)
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
            best = min((t, name) for name, t in row["gpu_us"].items())
            print(f"{model} M={m}: " + ", ".join(
                f"{name} {t:.1f} ({row['mismatches'].get(name, '-')})"
                for name, t in row["gpu_us"].items()) + f"; best {best[1]}", flush=True)
    return rows


if __name__ == "__main__":
    main()
