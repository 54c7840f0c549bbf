"""jax_swiglu: fused SwiGLU MLP kernels for JAX on NVIDIA Hopper (SM90) GPUs.

    packed = jax_swiglu.pack_weights(w_gate, w_up)      # once, at load time
    y = jax_swiglu.swiglu(x, packed)                    # SiLU(x @ Wg) * (x @ Wu)
    out = jax_swiglu.fused_mlp(x, packed, w_down)       # ... @ W_down

Works inside ``jax.jit``; on CUDA the lowering runs a fused CUTLASS kernel chosen by M
(``explain`` says which), elsewhere the XLA reference. Inference only.
"""

from ._api import explain, fused_mlp, swiglu
from ._layout import GATE_UP_BLOCK, PackedWeights, pack_weights, unpack_weights
from ._native import kernel_configs, kernels_available, unavailable_reason
from ._primitive import swiglu_p
from ._reference import swiglu_reference
from ._selection import KERNELS, SELECTION_TABLE
from ._shapes import QWEN25_MLPS

__version__ = "0.1.0"

__all__ = [
    "GATE_UP_BLOCK",
    "KERNELS",
    "PackedWeights",
    "QWEN25_MLPS",
    "SELECTION_TABLE",
    "explain",
    "fused_mlp",
    "kernel_configs",
    "kernels_available",
    "pack_weights",
    "swiglu",
    "swiglu_p",
    "swiglu_reference",
    "unavailable_reason",
    "unpack_weights",
]
