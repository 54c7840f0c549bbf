"""The specification: what every kernel computes, written in plain XLA.

``swiglu_reference`` is the spec the tests, the benchmarks and the non-CUDA lowering all
use: the two products accumulated in fp32 (bf16/fp16 products are exact in fp32), SiLU
and the product in fp32, and a single rounding to the input dtype at the end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import _layout


def dot_precision(dtype):
    """The dot precision that gives exact fp32 accumulation for inputs of ``dtype``.

    bf16/f16 products are exact in fp32, so the default precision already accumulates them in
    fp32 (one cuBLAS GEMM); asking for HIGHEST there makes XLA treat the dot as an fp32 one
    and, for a one-row ``x``, emit a transpose-and-reduce fusion instead of a GEMM. Only
    float32 inputs need HIGHEST, to be computed in full fp32 rather than TF32.
    """
    return (jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.dtype(jnp.float32)
            else jax.lax.Precision.DEFAULT)


def _dot_f32(x, w):
    # Inputs stay in their dtype (a bf16 GEMM with fp32 accumulation on GPU).
    return jnp.matmul(x, w, preferred_element_type=jnp.float32,
                      precision=dot_precision(jnp.result_type(x, w)))


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
