"""The kernel suite's one pass criterion, and how a case runs (shared by every file here).

A case draws fresh random inputs, poisons the output buffer with NaN (it is written into a
donated NaN array, so an element the kernel skips stays NaN), runs one forced launch (or a
family's pick, or the selection's), and compares with the spec computed in fp32 from the
same inputs: ``act(x @ Wg) * (x @ Wu)`` for 16-bit operands, ``swiglu_reference_quantized``
(the dequantized inputs) for e4m3 ones. It passes with relative Frobenius error < 1e-2 and
no element with |y - r| > 0.01 |r| + 1e-3 (NaN counts as off).

One allowance, for a limit of the hardware rather than the kernel: SM90's fp8 tensor cores
add the products of a k tile at less than fp32 precision before each promotion to the fp32
accumulators (CUTLASS's default fp8 mainloop; DeepSeek-V3 describes the same limit). Its rare
outliers land past the line at about one output in a million (tests/results/INDEX.md points
at the run), so an e4m3 case may have up to FEW_OFF_PER_MILLION per million of its outputs
off, and at least one, within the Frobenius bound.

Fast accumulation (a fast-accumulation row, or promotion 0) adds all of K in the tensor
cores, so its outliers grow with K: a case that runs it may have FAST_OFF_PER_MILLION of its
outputs off (cuBLASLt's fast accumulation, XLA's default fp8 path, puts as many past the
line on the same inputs: benchmarks/bench_fp8.py's mismatch column), within the Frobenius
bound, which a wrong pairing, scale or store still breaks.

Set JAX_SWIGLU_GPU_REPORT=path.jsonl to record every case's numbers.
"""

import functools
import json
import math
import os

import jax
import jax.numpy as jnp

import jax_swiglu
from jax_swiglu import _launch, pack_weights, quantize_weights, swiglu

FEW_OFF_PER_MILLION = 3.0
FAST_OFF_PER_MILLION = 20000.0


def rows(**fields):
    """The compiled rows whose fields match ``fields`` (e.g. operands="e4m3"); dense rows
    unless ``grouped=True`` is given."""
    fields.setdefault("grouped", False)
    return [row for row in jax_swiglu.kernel_configs().values()
            if all(getattr(row, name) == value for name, value in fields.items())]


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5, 6))
def inputs(key, m, k, n, dtype, operands="16bit", scale="per_channel"):
    """Fresh random x [m, k] (``dtype``) and weights: PackedWeights of ``dtype`` for 16-bit
    operands, QuantizedWeights (e4m3, ``scale``) for e4m3 ones; unit-scale products."""
    kx, kg, ku = jax.random.split(key, 3)
    x = jax.random.normal(kx, (m, k), jnp.float32).astype(dtype)
    w_gate = jax.random.normal(kg, (k, n), jnp.float32) / math.sqrt(k)
    w_up = jax.random.normal(ku, (k, n), jnp.float32) / math.sqrt(k)
    if operands == "e4m3":
        return x, quantize_weights(w_gate, w_up, scale=scale)
    return x, pack_weights(w_gate.astype(dtype), w_up.astype(dtype))


@functools.cache
def fused(launch=None, kernel="auto", activation="silu", accumulation="promoted"):
    """``swiglu`` with ``launch`` (or ``kernel``) forced, writing into a donated NaN buffer.
    keep_unused: an unused argument would otherwise be pruned, donation and all."""
    return jax.jit(lambda poison, x, w: swiglu(x, w, kernel=kernel, launch=launch,
                                               activation=activation,
                                               accumulation=accumulation),
                   donate_argnums=0, keep_unused=True)


@functools.partial(jax.jit, static_argnums=3)
def errors(y, x, weights, activation):
    """Elements off, relative Frobenius error and max |error| against the fp32 spec."""
    if isinstance(weights, jax_swiglu.QuantizedWeights):
        r = jax_swiglu.swiglu_reference_quantized(x, weights, activation=activation)
        r = r.astype(jnp.float32)
    else:
        f32 = functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)
        w_gate, w_up = jax_swiglu.unpack_weights(weights)
        xf = x.astype(jnp.float32)
        act = jax_swiglu.ACTIVATIONS[activation]
        r = act(f32(xf, w_gate.astype(jnp.float32))) * f32(xf, w_up.astype(jnp.float32))
    y = y.astype(jnp.float32)
    diff = jnp.abs(y - r)
    ok = diff <= 0.01 * jnp.abs(r) + 1e-3  # False for NaN: unwritten elements count
    rel_fro = jnp.linalg.norm(jnp.nan_to_num(y - r, nan=jnp.inf)) / jnp.linalg.norm(r)
    return jnp.sum(~ok), rel_fro, jnp.max(jnp.where(jnp.isnan(diff), jnp.inf, diff))


def record(**row):
    path = os.environ.get("JAX_SWIGLU_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def check(m, k, n, key, *, launch=None, kernel="auto", dtype=jnp.bfloat16, operands="16bit",
          activation="silu", scale="per_channel", x=None, weights=None, off_per_million=None,
          accumulation=None):
    """Runs one case (fresh inputs unless ``x`` and ``weights`` are given) and asserts the
    criterion of the module docstring (an e4m3 case may pass its own ``off_per_million``;
    ``accumulation`` is the call's, by default "fast" where the forced launch is);
    returns the output."""
    if x is None:
        x, weights = inputs(key, m, k, n, jnp.dtype(dtype), operands, scale)
    out_dtype = jnp.bfloat16 if jnp.dtype(x.dtype).itemsize == 1 else x.dtype
    # A forced launch that accumulates fast runs as accumulation="fast" asks for it.
    if accumulation is None:
        fast = (launch is not None and operands == "e4m3"
                and _launch.parse(launch).fast_accumulation)
        accumulation = "fast" if fast else "promoted"
    fast = accumulation == "fast"
    y = fused(launch, kernel, activation, accumulation)(jnp.full((m, n), jnp.nan, out_dtype), x,
                                                        weights)
    off, rel_fro, max_abs = (float(v) for v in errors(y, x, weights, activation))
    explained = jax_swiglu.explain(x, weights, kernel=kernel, launch=launch,
                                   activation=activation, accumulation=accumulation)
    record(launch=str(launch), kernel=kernel, m=m, k=k, n=n, dtype=jnp.dtype(dtype).name,
           operands=operands, activation=activation, scale=scale, mismatches=int(off),
           rel_fro=rel_fro, max_abs_err=max_abs, choice=explained)
    if off_per_million is None:
        off_per_million = (0 if operands == "16bit" else
                           FAST_OFF_PER_MILLION if fast else FEW_OFF_PER_MILLION)
    allowed = 0 if operands == "16bit" else max(1.0, off_per_million * m * n / 1e6)
    assert off <= allowed, f"{int(off)} elements off (rel_fro={rel_fro:.3g}); {explained}"
    assert rel_fro < 1e-2, explained
    return y


# --- grouped (mixture-of-experts) calls ------------------------------------------------------

@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5))
def grouped_inputs(key, t, k, n, experts, dtype):
    """Fresh random x [t, k] and every expert's gate and up weights [experts, k, n] (unit-scale
    products), packed."""
    kx, kg, ku = jax.random.split(key, 3)
    x = jax.random.normal(kx, (t, k), jnp.float32).astype(dtype)
    w_gate = (jax.random.normal(kg, (experts, k, n), jnp.float32) / math.sqrt(k)).astype(dtype)
    w_up = (jax.random.normal(ku, (experts, k, n), jnp.float32) / math.sqrt(k)).astype(dtype)
    return x, jax_swiglu.pack_expert_weights(w_gate, w_up)


@functools.cache
def grouped_fused(launch=None, kernel="auto", activation="silu"):
    """``grouped_swiglu`` with ``launch`` (or ``kernel``) forced, into a donated NaN buffer."""
    return jax.jit(lambda poison, x, w, sizes: jax_swiglu.grouped_swiglu(
        x, w, sizes, kernel=kernel, launch=launch, activation=activation),
        donate_argnums=0, keep_unused=True)


@functools.partial(jax.jit, static_argnums=4)
def grouped_errors(y, x, experts, sizes, activation):
    """As ``errors``, against the grouped spec on the unpacked weights in fp32."""
    w_gate, w_up = jax_swiglu.unpack_expert_weights(experts)
    f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
    with jax.default_matmul_precision("highest"):
        r = jax_swiglu.grouped_swiglu_reference(f32(x), f32(w_gate), f32(w_up), sizes,
                                                activation=activation)
    y = y.astype(jnp.float32)
    diff = jnp.abs(y - r)
    ok = diff <= 0.01 * jnp.abs(r) + 1e-3
    rel_fro = (jnp.linalg.norm(jnp.nan_to_num(y - r, nan=jnp.inf))
               / jnp.maximum(jnp.linalg.norm(r), 1e-30))
    return jnp.sum(~ok), rel_fro, jnp.max(jnp.where(jnp.isnan(diff), jnp.inf, diff))


def check_grouped(t, k, n, sizes, key, *, launch=None, kernel="auto", dtype=jnp.bfloat16,
                  activation="silu"):
    """One grouped case with the given ``sizes`` (a list, any values: negative, summing under
    or over t); the criterion of the module docstring, 16-bit (no element off). Returns the
    output."""
    sizes = jnp.asarray(sizes, jnp.int32)
    x, experts = grouped_inputs(key, t, k, n, int(sizes.shape[0]), jnp.dtype(dtype))
    y = grouped_fused(launch, kernel, activation)(jnp.full((t, n), jnp.nan, x.dtype), x,
                                                  experts, sizes)
    off, rel_fro, max_abs = (float(v) for v in grouped_errors(y, x, experts, sizes, activation))
    explained = jax_swiglu.explain_grouped(x, experts, sizes, kernel=kernel, launch=launch,
                                           activation=activation)
    record(launch=str(launch), kernel=kernel, m=t, k=k, n=n, experts=int(sizes.shape[0]),
           sizes=[int(s) for s in sizes], dtype=jnp.dtype(dtype).name, operands="16bit",
           activation=activation, mismatches=int(off), rel_fro=rel_fro, max_abs_err=max_abs,
           choice=explained)
    assert off == 0, f"{int(off)} elements off (rel_fro={rel_fro:.3g}); {explained}"
    assert rel_fro < 1e-2, explained
    return y
