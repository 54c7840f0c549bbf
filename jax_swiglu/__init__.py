"""jax_swiglu: fused SwiGLU MLP kernels for JAX on NVIDIA Hopper (SM90) GPUs.

    packed = jax_swiglu.pack_weights(w_gate, w_up)      # once, at load time
    y = jax_swiglu.swiglu(x, packed)                    # SiLU(x @ Wg) * (x @ Wu)
    y = jax_swiglu.swiglu(x, packed, activation="gelu_tanh")  # GeGLU (Gemma)
    out = jax_swiglu.fused_mlp(x, packed, w_down)       # ... @ W_down
    q = jax_swiglu.quantize_weights(w_gate, w_up)       # fp8 (e4m3) with fp32 scales
    out = jax_swiglu.fused_mlp(x, q, jax_swiglu.quantize_down(w_down))  # the block in fp8

Works inside ``jax.jit``; on CUDA each call runs the fused CUTLASS launch the selection
picks for the call's shapes (``explain`` says which and why; ``launch=`` forces one),
elsewhere the XLA reference. ``autotune`` measures the candidates for your shapes on your
GPU. Inference only.
"""

from . import convert
from ._api import explain, fused_mlp, swiglu
from ._experts import explain_grouped, grouped_fused_mlp, grouped_swiglu, grouped_swiglu_reference
from ._launch import Launch
from ._layout import (GATE_UP_BLOCK, PackedExperts, PackedWeights, pack_expert_weights,
                      pack_weights, unpack_expert_weights, unpack_weights)
from ._native import kernel_configs, kernels_available, unavailable_reason
from ._quantize import (QuantizedDown, QuantizedWeights, dequantize_down, dequantize_weights,
                        quantize_down, quantize_tokens, quantize_weights)
from ._primitive import swiglu_p
from ._reference import (ACTIVATION_ALIASES, ACTIVATIONS, swiglu_reference,
                         swiglu_reference_quantized)
from .selection import KERNELS
from ._version import __version__
from .tuning.autotune import autotune

__all__ = [
    "ACTIVATION_ALIASES",
    "ACTIVATIONS",
    "GATE_UP_BLOCK",
    "KERNELS",
    "Launch",
    "PackedExperts",
    "PackedWeights",
    "QuantizedDown",
    "QuantizedWeights",
    "autotune",
    "convert",
    "dequantize_down",
    "dequantize_weights",
    "explain",
    "explain_grouped",
    "fused_mlp",
    "grouped_fused_mlp",
    "grouped_swiglu",
    "grouped_swiglu_reference",
    "kernel_configs",
    "kernels_available",
    "pack_expert_weights",
    "pack_weights",
    "quantize_down",
    "quantize_tokens",
    "quantize_weights",
    "swiglu",
    "swiglu_p",
    "swiglu_reference",
    "swiglu_reference_quantized",
    "unavailable_reason",
    "unpack_expert_weights",
    "unpack_weights",
]
