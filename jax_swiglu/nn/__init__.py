"""Flax modules for the SwiGLU MLP block ``down(SiLU(gate(x)) * up(x))`` (Llama, Qwen).

Needs flax (``pip install 'jax_swiglu[flax]'``); ``import jax_swiglu`` does not.

* :class:`FusedSwiGLUMLP` / :class:`SwiGLUMLP`: ``flax.nnx`` modules, fused and the plain
  XLA reference (also as :mod:`jax_swiglu.nn.nnx`); :mod:`jax_swiglu.nn.linen` has both
  for ``flax.linen``.
* :class:`Fp8SwiGLUMLP`: the block with gate/up in fp8 (``Fp8SwiGLUMLP.quantize(mlp)``).
* Mixture of experts: :class:`FusedExpertsMLP` (the experts, router left to the model; also
  in linen) and :class:`FusedMoE` (router, top-k routing and the experts);
  :func:`swap_mlp_blocks` / :func:`swap_moe_blocks` swap a model's blocks in place.
* Param conversion, exact both ways: :func:`fuse_params` / :func:`unfuse_params`
  (gate_proj/up_proj/down_proj kernels, [in, out]), :func:`fuse_hf_weights` /
  :func:`fused_to_hf_weights` (Hugging Face tensors, [out, in]), and
  :func:`fuse_mlp_blocks` / :func:`unfuse_mlp_blocks` for every block of a whole param tree.

Logical axis names: ``EMBED`` ("embed", hidden K) and ``MLP`` ("mlp", intermediate N).
"""

try:
    import flax  # noqa: F401
except ImportError as error:  # flax is an optional dependency of jax_swiglu
    raise ImportError(
        "jax_swiglu.nn needs flax: pip install 'jax_swiglu[flax]' (or flax>=0.12)") from error

from . import linen, nnx
from ._common import (
    EMBED,
    MLP,
    fuse_hf_weights,
    fuse_mlp_blocks,
    fuse_params,
    fused_to_hf_weights,
    unfuse_mlp_blocks,
    unfuse_params,
)
from .nnx import (Fp8SwiGLUMLP, FusedExpertsMLP, FusedMoE, FusedSwiGLUMLP, QuantizedParam,
                  SwiGLUMLP)
from .swap import swap_mlp_blocks, swap_moe_blocks

__all__ = [
    "EMBED",
    "MLP",
    "Fp8SwiGLUMLP",
    "FusedExpertsMLP",
    "FusedMoE",
    "FusedSwiGLUMLP",
    "QuantizedParam",
    "SwiGLUMLP",
    "fuse_hf_weights",
    "fuse_mlp_blocks",
    "fuse_params",
    "fused_to_hf_weights",
    "linen",
    "nnx",
    "swap_mlp_blocks",
    "swap_moe_blocks",
    "unfuse_mlp_blocks",
    "unfuse_params",
]
