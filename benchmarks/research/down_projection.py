"""A gated MLP's down projection at decode sizes on the gemv rows, beside XLA's dot (GPU).

    python -m benchmarks.research.down_projection --models llama-3-8b qwen2.5-14b --m 1 8 16
    python -m benchmarks.research.down_projection --models llama-3-8b --m 1 16 --fp8

The down projection ``h [M, N] @ w_down [N, K]`` of a model's MLP is a stream of its weights
at a few tokens, like the gate/up half the gemv rows already run fused. This asks whether the
same stream as a plain projection (``jax_swiglu._projection.gemv_projection``: each column's
sum stored, no pairing) beats the dot XLA runs in ``fused_mlp`` today, before ``fused_mlp``
uses it (issue 43 item 3; with ``--fp8`` issue 44's fp8 block, whose down projection is XLA's
scaled fp8 dot on h quantized per row: both sides here read the same quantized h).

Per (model, M) every gemv row of the operands at each split K allows (up to 4) and XLA's dot
(``--fp8``: at default precision, which asks for fast accumulation, and at HIGHEST, promoted)
are timed side by side with CUPTI in interleaved rounds, each call streaming one of a rotation
of weight sets larger than the L2; per launch also its elements off the fp32 spec by more than
1 % + 1e-3 (the off column: the best gemv launch's count and every nonzero one). Prints one
line per row, writes --out (JSON) and the same table as markdown.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_swiglu
from jax_swiglu import _native
from jax_swiglu._projection import gemv_projection

from ..bench_swiglu import measure_side_by_side
from ..shapes import mlp_shape

ROTATION_BYTES = 256 << 20  # more than the L2 of any SM90 part, so every call reads HBM


def _sets(key, m, k_mlp, n, fp8):
    """[(h, w)] rotating weight sets of the down projection (h [m, n]; w [n, k_mlp] bf16 or a
    QuantizedDown, with h quantized per row and its scales), and the fp32 spec of set 0."""
    weight_bytes = n * k_mlp * (1 if fp8 else 2)
    count = max(1, math.ceil(ROTATION_BYTES / weight_bytes))
    sets, spec = [], None
    for i in range(count):
        kh, kw = jax.random.split(jax.random.fold_in(key, i))
        h = jax.random.normal(kh, (m, n), jnp.float32).astype(jnp.bfloat16)
        w = jax.random.normal(kw, (n, k_mlp), jnp.float32) / math.sqrt(n)
        if fp8:
            down = jax_swiglu.quantize_down(w)
            h_q, h_scale = jax_swiglu.quantize_tokens(h)
            sets.append((h_q, h_scale, down))
            if i == 0:
                # fp32 at HIGHEST behind a barrier: at default precision the GPU's dot of
                # fp32 operands may run in TF32 (or XLA may fold the dequantization back into
                # an fp8 GEMM), and the spec would be the inexact side.
                operands = jax.lax.optimization_barrier(
                    (h_q.astype(jnp.float32) * h_scale[:, None], jax_swiglu.dequantize_down(down)))
                spec = jnp.matmul(*operands, precision=jax.lax.Precision.HIGHEST)
        else:
            w = w.astype(jnp.bfloat16)
            sets.append((h, None, w))
            if i == 0:
                spec = jnp.matmul(h.astype(jnp.float32), w.astype(jnp.float32),
                                  precision=jax.lax.Precision.HIGHEST)
    return sets, np.asarray(spec)


def _variants(m, fp8):
    """{name: f(h, scale, w) -> [M, K] bf16}: XLA's dot(s) and every gemv launch."""
    if fp8:
        def xla(precision):
            def f(h_q, h_scale, down):
                product = jax.lax.dot_general(h_q, down.data, (((1,), (1,)), ((), ())),
                                              precision=precision,
                                              preferred_element_type=jnp.float32)
                return (product * h_scale[:, None] * down.scales).astype(jnp.bfloat16)
            return f
        variants = {"xla_fp8": xla(None), "xla_fp8_promoted": xla(jax.lax.Precision.HIGHEST)}
    else:
        variants = {"xla": lambda h, _, w: jnp.matmul(h, w)}
    operands = "e4m3" if fp8 else "16bit"
    for row in sorted(_native.kernel_configs().values(), key=lambda r: r.id):
        if row.family != "gemv" or row.operands != operands or m > row.max_m:
            continue
        for splits in (1, 2, 4):
            variants[f"gemv:{row.id}" + (f",s{splits}" if splits > 1 else "")] = (
                lambda h, s, w, c=row.id, sp=splits: gemv_projection(h, w, config=c, splits=sp,
                                                                     x_scale=s))
    return variants


def _off(y, spec) -> int:
    y = np.asarray(y, np.float32)
    return int(np.sum(~(np.abs(y - spec) <= 0.01 * np.abs(spec) + 1e-3)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama-3-8b"])
    parser.add_argument("--m", nargs="+", type=int, default=[1, 8, 16])
    parser.add_argument("--fp8", action="store_true",
                        help="e4m3 weights and h quantized per row; XLA's scaled fp8 dot")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=float("inf"),
                        help="start no new row after this many seconds")
    parser.add_argument("--out", default="down_projection.json")
    args = parser.parse_args(argv)
    rows, lines = [], []
    start = time.monotonic()
    for model in args.models:
        k_mlp, n = mlp_shape(model)
        for m in args.m:
            if time.monotonic() - start > args.budget_s:
                print(f"budget reached: {model} M={m} and later rows not run", flush=True)
                break
            sets, spec = _sets(jax.random.key(m), m, k_mlp, n, args.fp8)
            fns, off = {}, {}
            for name, f in _variants(m, args.fp8).items():
                h, s, w = sets[0]
                try:
                    off[name] = _off(jax.jit(f)(h, s, w), spec)
                except ValueError as error:  # a split K does not allow
                    print(f"  {name}: {error}", flush=True)
                    continue
                fns[name] = jax.jit(lambda sets, f=f: [f(*one) for one in sets])
            gpu, _ = measure_side_by_side(fns, (sets,), args.iterations, args.rounds, wall=False)
            us = {name: 1e3 * t / len(sets) for name, t in gpu.items()}
            baseline = "xla_fp8" if args.fp8 else "xla"
            best = min((name for name in us if name.startswith("gemv")), key=us.get)
            weight_mb = n * k_mlp * (1 if args.fp8 else 2) / 1e6
            row = {"model": model, "k": n, "n": k_mlp, "m": m, "weight_mb": weight_mb,
                   "us": us, "off": off, "best_gemv": best}
            rows.append(row)
            line = (f"| {model} | {m} | {n} x {k_mlp} | "
                    + " | ".join(f"{name} {t:.1f}" for name, t in sorted(us.items()))
                    + f" | {best}: {us[baseline] / us[best]:.3f}x {baseline}, "
                    f"{weight_mb / us[best]:.2f} TB/s | "
                    + ", ".join(f"{name} {count}" for name, count in sorted(off.items())
                                if count or name == best) + " |")
            lines.append(line)
            print(line, flush=True)
            with open(args.out, "w") as f:
                command = sys.argv[1:] if argv is None else argv
                json.dump({"command": command, "rows": rows}, f, indent=1)
    with open(args.out.removesuffix(".json") + ".md", "w") as f:
        f.write("# Down projection at decode sizes: gemv rows beside XLA's dot (us per call, "
                "CUPTI)\n\n| model | M | K x N | launches | best gemv | elements off |\n"
                "|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")
    return rows


if __name__ == "__main__":
    main()
