"""Where a decode step's time goes: a stack of gated MLP blocks under one jit (SM90 GPU).

    python -m benchmarks.research.decode_stack --models llama-3-8b qwen2.5-14b --m 1 8 \
        --blocks 8 --out stack.md

Each block is ``h = h + fused_mlp(h, packed, w_down)`` (jax_swiglu) or the same block in
plain XLA (``h + (silu(h @ Wg) * (h @ Wu)) @ W_down``); every block has its own weights, so the
stack streams them from HBM as a model's layers do. Two times per stack:

  kernels  the sum of the GPU kernels' own durations (CUPTI), what the benchmark reports
  span     the stream's time per call with calls queued back to back (wall time of many
           async calls divided by their count): the kernels plus the gaps between them

``span - kernels`` is what launches and dependencies cost between kernels: the part that
programmatic dependent launch can hide, and that no isolated kernel time shows. (Where a
kernel starts before the previous one ends, both durations count the overlap: the kernel
sum then exceeds what the stream spent, and only the span shows the gain.)

Below the table, per model and M, each stack's kernels of one call by name (CUPTI, one call
after a warm-up, medians of 5): how many launches a call makes and their time per block,
so the span's time is split kernel by kernel (the down projection's GEMM apart from the
gate/up kernel, the quantization, the residual add).

``--fp8``: the gate/up weights in e4m3 (the down projection stays bf16), against XLA's fp8
path; jax_swiglu's block quantizes x with its own kernel, which lets the fused kernel start
at once, and is also timed on x quantized by XLA's fusions. ``--fp8 --fp8-down``: the whole
block in fp8 (``quantize_down``), against XLA's fp8 path for both dots.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import jax_swiglu
from jax_swiglu import _reference

from .. import bench_swiglu
from .. import shapes as shapes_lib


def _weights(key, k, n, blocks, fp8: bool, fp8_down: bool = False):
    layers = []
    for i in range(blocks):
        kg, ku, kd = jax.random.split(jax.random.fold_in(key, i), 3)
        w_gate = (jax.random.normal(kg, (k, n), jnp.float32) / math.sqrt(k)).astype(jnp.bfloat16)
        w_up = (jax.random.normal(ku, (k, n), jnp.float32) / math.sqrt(k)).astype(jnp.bfloat16)
        w_down = (jax.random.normal(kd, (n, k), jnp.float32) / math.sqrt(n)).astype(jnp.bfloat16)
        gate_up = (jax_swiglu.quantize_weights(w_gate, w_up) if fp8
                   else jax_swiglu.pack_weights(w_gate, w_up))
        if fp8_down:
            w_down = jax_swiglu.quantize_down(w_down)
        layers.append((w_gate, w_up, w_down, gate_up))
    return layers


def stacks(fp8: bool, fp8_down: bool = False):
    """The stacks to time, by name; "xla" is the baseline. With fp8 gate/up weights (the
    down projection in bf16): jax_swiglu's block, whose x is quantized by its own kernel
    before the fused one ("fused"); the same block on x quantized by XLA's fusions
    ("fused_xla_q"); XLA's fp8 path (its quantization, cuBLASLt's scaled fp8 dot). With the
    down projection in fp8 too (``fp8_down``, a QuantizedDown): jax_swiglu's whole fp8 block
    (``fused_mlp`` quantizes h and runs the decode form's projection where the selection
    picks it) against XLA's fp8 path for both halves."""
    def fused(h, layers):
        for _, _, w_down, gate_up in layers:
            h = h + jax_swiglu.fused_mlp(h, gate_up, w_down)
        return h

    def xla(h, layers):
        for w_gate, w_up, w_down, _ in layers:
            h = h + (jax.nn.silu(h @ w_gate) * (h @ w_up)) @ w_down
        return h

    def fused_xla_q(h, layers):
        for _, _, w_down, gate_up in layers:
            h_q, h_scale = jax_swiglu.quantize_tokens(h)
            h = h + jax_swiglu.fused_mlp(h_q, gate_up, w_down, x_scale=h_scale)
        return h

    def xla_fp8(h, layers):
        for _, _, w_down, gate_up in layers:
            h = h + _reference.swiglu_xla_quantized(h, gate_up, accumulation="promoted") @ w_down
        return h

    def xla_fp8_down(h, layers):
        for _, _, down, gate_up in layers:
            gated = _reference.swiglu_xla_quantized(h, gate_up, accumulation="promoted")
            h = h + _reference.down_projection_quantized(gated, down, reduce_dtype=h.dtype)
        return h

    if fp8_down:
        return {"fused": jax.jit(fused), "xla": jax.jit(xla_fp8_down)}
    if fp8:
        return {"fused": jax.jit(fused), "fused_xla_q": jax.jit(fused_xla_q),
                "xla": jax.jit(xla_fp8)}
    return {"fused": jax.jit(fused), "xla": jax.jit(xla)}


def kernels_by_name(fn, args, iterations: int = 5) -> list[tuple[str, int, float]]:
    """(kernel name, launches per call, median us per call summed over those launches) of
    every kernel a call of ``fn`` runs, in the order of their first launch (CUPTI)."""
    from jax.experimental.mosaic.gpu import profiler
    _, per_call = profiler.measure(fn, aggregate=False, iterations=iterations)(*args)
    if per_call is None:
        raise RuntimeError("CUPTI recorded no GPU kernel for the measured call")
    calls = per_call if iterations > 1 else [per_call]
    order, totals, counts = [], {}, {}
    for call, timings in enumerate(calls):
        for name, ms in timings:
            if name not in totals:
                order.append(name)
                totals[name] = [0.0] * len(calls)
                counts[name] = 0
            totals[name][call] += 1e3 * ms
            counts[name] += call == 0
    return [(name, counts[name], statistics.median(totals[name])) for name in order]


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def span_us(fn, args, calls: int, rounds: int) -> float:
    """Median over rounds of the wall time per call of `calls` calls queued back to back."""
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) * 1e6 / calls)
    return statistics.median(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["llama-3-8b"])
    parser.add_argument("--m", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fp8", action="store_true",
                        help="fp8 (e4m3) gate/up weights; the baseline is XLA's fp8 path")
    parser.add_argument("--fp8-down", action="store_true",
                        help="with --fp8, the down projection in fp8 too (quantize_down)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.fp8_down and not args.fp8:
        parser.error("--fp8-down needs --fp8")
    fns = stacks(args.fp8, args.fp8_down)
    names = list(fns)
    header = ["model", "M", "blocks"]
    for name in names:
        header += [f"{name} kernels", f"{name} span", f"{name} gaps"]
    header += [f"xla span / {name} span" for name in names if name != "xla"]
    lines = ["# Decode stacks: kernel sum and stream span per call (us)", "",
             f"`python -m benchmarks.research.decode_stack "
             f"{' '.join(sys.argv[1:] if argv is None else argv)}`", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    breakdown = []
    for model in args.models:
        k, n = shapes_lib.mlp_shape(model)
        layers = _weights(jax.random.PRNGKey(0), k, n, args.blocks, args.fp8, args.fp8_down)
        for m in args.m:
            h = jax.random.normal(jax.random.PRNGKey(m), (m, k), jnp.float32).astype(jnp.bfloat16)
            kernels, _ = bench_swiglu.measure_side_by_side(fns, (h, layers), 20, 2, wall=False)
            kernels = {name: 1e3 * t for name, t in kernels.items()}
            span = {name: span_us(fn, (h, layers), args.calls, args.rounds)
                    for name, fn in fns.items()}
            cells = [model, str(m), str(args.blocks)]
            for name in names:
                cells += [f"{kernels[name]:.1f}", f"{span[name]:.1f}",
                          f"{span[name] - kernels[name]:.1f}"]
            cells += [f"{span['xla'] / span[name]:.3f}" for name in names if name != "xla"]
            lines.append("| " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
            breakdown += ["", f"### {model}, M = {m}: kernels of one call, per block", "",
                          "| stack | kernel | launches | us per block |", "|---|---|---:|---:|"]
            for name, fn in fns.items():
                for kernel, count, us in kernels_by_name(fn, (h, layers)):
                    breakdown.append(f"| {name} | `{_short(kernel)}` | {count} | "
                                     f"{us / args.blocks:.2f} |")
    lines += breakdown
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
