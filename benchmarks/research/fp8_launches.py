"""Every fp8 kernel config and promotion interval on a few shapes, side by side (GPU).

    python -m benchmarks.research.fp8_launches --models qwen2.5-7b qwen2.5-72b --m 1 2048
    python -m benchmarks.research.fp8_launches --promotions 0 ...   # fast accumulation only
    python -m benchmarks.research.fp8_launches --configs 29 57,splits=2 --m 1 16 ...

For each (model, M) it compiles one function per launch, forced with
``swiglu(..., launch="<config>[,splits=<s>],promotion=<p>")`` (a config of --configs may carry
its splits), on x already in fp8 (the kernel alone),
and times them in interleaved rounds with CUPTI (benchmarks/bench_swiglu.py's
measure_side_by_side) beside XLA's fp8 path, its bare fp8 GEMM and the bf16 kernel's auto.
Promotion 0 is fast accumulation (accumulation="fast"); a fast-accumulation row runs only
that. It also
counts mismatches of every launch against the fp8 spec, so a promotion interval that costs
accuracy shows. Prints one line per row and writes --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np

import jax_swiglu
from jax_swiglu import _reference

from ..bench_swiglu import measure_side_by_side
from ..shapes import mlp_shape

PROMOTIONS = (2, 4, 8, 16)  # wgmma between promotions: whole k tiles of each row


def _compiled(args, launch, accumulation="promoted"):
    """One fused fp8 launch, compiled, after checking that its lowering runs that launch."""
    lowered = jax.jit(lambda x_q, s, q: jax_swiglu.swiglu(
        x_q, q, x_scale=s, launch=launch, accumulation=accumulation)).lower(*args)
    config = launch.split(",")[0]
    if not re.search(rf"\bconfig = {config} : i64", lowered.as_text()):
        raise RuntimeError(f"launch={launch} did not reach the lowering")
    return lowered.compile()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["qwen2.5-7b", "qwen2.5-72b"])
    parser.add_argument("--m", nargs="*", type=int, default=[2048, 8192])
    parser.add_argument("--configs", nargs="*", default=None,
                        help="rows (a row with its splits: 57,splits=2); default every e4m3 row")
    parser.add_argument("--promotions", nargs="*", type=int, default=list(PROMOTIONS))
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--out", default="fp8_launches.json")
    args = parser.parse_args(argv)
    table = {i: row for i, row in jax_swiglu.kernel_configs().items() if row.operands == "e4m3"}
    configs = args.configs if args.configs is not None else [str(i) for i in sorted(table)]
    rows = []
    for model in args.models:
        k, n = mlp_shape(model)
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
            for config in configs:
                row = table[int(config.split(",")[0])]
                label = "c" + config.replace(",splits=", "s")
                if row.fast_accumulation:  # promotion 0, its only value
                    fns[f"{label}fast"] = _compiled(fp8_args, f"{config}", "fast")
                    continue
                for promotion in args.promotions:
                    if promotion and promotion % (row.tile_k // 32):
                        continue  # not a whole number of this config's k tiles
                    fns[f"{label}p{promotion}"] = _compiled(
                        fp8_args, f"{config},promotion={promotion}",
                        "fast" if promotion == 0 else "promoted")
            fns["xla_fp8"] = jax.jit(
                lambda x_q, s, q: _reference.swiglu_xla_quantized(x_q, q, x_scale=s))
            # The bare fp8 GEMM (cuBLASLt's kernel alone, into bfloat16 [M, 2N]).
            fns["xla_fp8_gemm"] = jax.jit(lambda x_q, s, q: jax.lax.dot_general(
                x_q, q.data, (((1,), (1,)), ((), ())), preferred_element_type=jnp.bfloat16))
            bf16 = jax.jit(lambda x, p: jax_swiglu.swiglu(x, p))
            fns["bf16"] = lambda x_q, s, q: bf16(x, packed)
            gpu_ms, _ = measure_side_by_side(fns, fp8_args, args.iterations, 3, wall=False)
            spec = np.asarray(jax_swiglu.swiglu_reference_quantized(x_q, q, x_scale=x_scale),
                              np.float32)
            row = {"model": model, "m": m, "k": k, "n": n,
                   "gpu_us": {name: t * 1e3 for name, t in gpu_ms.items()}, "mismatches": {}}
            for name, fn in fns.items():
                if name in ("bf16", "xla_fp8_gemm"):
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
