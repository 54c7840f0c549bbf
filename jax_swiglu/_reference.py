"""The specification: what every kernel computes, written in plain XLA.

``swiglu_reference`` is the spec the tests, the benchmarks and the non-CUDA lowering all
use: the two products accumulated in fp32 (bf16/fp16 products are exact in fp32), the
gate's activation and the product in fp32, and a single rounding to the input dtype at
the end. ``ACTIVATIONS`` names the gated activations: ``"silu"`` (SwiGLU: Llama, Qwen,
Mistral, ...) and ``"gelu_tanh"`` (GeGLU with GELU's tanh approximation: Gemma); the
kernels compile the same list under the same names (ffi/kernel_configs.h).
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


def _gelu_tanh(gate):
    return jax.nn.gelu(gate, approximate=True)


# name -> act(g); the gated product is act(x @ W_gate) * (x @ W_up).
ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": _gelu_tanh}


def check_activation(activation) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"activation must be one of {tuple(ACTIVATIONS)} (SiLU for SwiGLU, GELU's tanh "
            f"approximation for Gemma's GeGLU), got {activation!r}")


def gated(gate_f32, up_f32, activation: str = "silu"):
    """``act(g) * u`` in fp32 (the fused epilogue's math)."""
    check_activation(activation)
    return ACTIVATIONS[activation](gate_f32) * up_f32


def swiglu_reference(x, w_gate, w_up, *, activation: str = "silu"):
    """``act(x @ w_gate) * (x @ w_up)``: fp32 accumulation and math, rounded once.

    Args:
      x: ``[..., K]``.
      w_gate, w_up: ``[K, N]``.
      activation: ``"silu"`` (SwiGLU, the default) or ``"gelu_tanh"`` (GeGLU,
        ``jax.nn.gelu(g, approximate=True)``).

    Returns:
      ``[..., N]`` in ``x.dtype``.
    """
    return gated(_dot_f32(x, w_gate), _dot_f32(x, w_up), activation).astype(x.dtype)


def swiglu_reference_packed(x, packed_data, n: int, activation: str = "silu"):
    """The reference on packed weights: one ``[.., K] x [K, 2N]`` product, then the split.

    This is what the primitive lowers to off CUDA (and for ``kernel="xla"``).
    """
    gate, up = _layout.split_gate_up(_dot_f32(x, packed_data), n)
    return gated(gate, up, activation).astype(x.dtype)
