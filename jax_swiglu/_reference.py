"""The specification: what every kernel computes, written in plain XLA.

``swiglu_reference`` is the spec the tests, the benchmarks and the non-CUDA lowering all
use: the two products accumulated in fp32 (bf16/fp16 products are exact in fp32), SiLU
and the product in fp32, and a single rounding to the input dtype at the end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import _layout


def _dot_f32(x, w):
    # Inputs stay in their dtype (a bf16 GEMM with fp32 accumulation on GPU); float32
    # inputs are computed at full fp32 precision rather than TF32.
    return jnp.matmul(x, w, preferred_element_type=jnp.float32,
                      precision=jax.lax.Precision.HIGHEST)


def silu_times(gate_f32, up_f32):
    """``SiLU(g) * u`` in fp32 (the fused epilogue's math)."""
    return jax.nn.silu(gate_f32) * up_f32


def swiglu_reference(x, w_gate, w_up):
    """``SiLU(x @ w_gate) * (x @ w_up)``: fp32 accumulation and math, rounded once.

    Args:
      x: ``[..., K]``.
      w_gate, w_up: ``[K, N]``.

    Returns:
      ``[..., N]`` in ``x.dtype``.
    """
    return silu_times(_dot_f32(x, w_gate), _dot_f32(x, w_up)).astype(x.dtype)


def swiglu_reference_packed(x, packed_data, n: int):
    """The reference on packed weights: one ``[.., K] x [K, 2N]`` product, then the split.

    This is what the primitive lowers to off CUDA (and for ``kernel="xla"``).
    """
    gate, up = _layout.split_gate_up(_dot_f32(x, packed_data), n)
    return silu_times(gate, up).astype(x.dtype)
