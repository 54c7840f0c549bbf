"""What the nnx and linen modules share: the two param layouts, conversion, the forward math.

The block is ``down(act(gate(x)) * up(x))`` with ``act`` SiLU (SwiGLU) or GELU's tanh form
(GeGLU, Gemma), the modules' ``activation`` (see :data:`jax_swiglu.ACTIVATIONS`).

Param layouts (plain nested dicts of arrays, as ``nnx.to_pure_dict(nnx.state(m, nnx.Param))``
and linen's ``variables["params"]`` give them; K = hidden size, N = intermediate size)::

    unfused  {"gate_proj": {"kernel": [K, N]}, "up_proj": {"kernel": [K, N]},
              "down_proj": {"kernel": [N, K]}}                        3*K*N parameters
    fused    {"gate_up_proj": {"kernel": [K, 2*N_pad]},               (packed, see _layout)
              "down_proj": {"kernel": [N, K]}}                 2*K*N_pad + N*K parameters

``N_pad`` is N rounded up to 32; the pad columns are zeros. Kernels are [in, out], as in
``nnx.Linear`` and ``linen.Dense``; Hugging Face checkpoints store [out, in].
"""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp

from .. import _layout
from .._api import fused_mlp
from .._reference import check_activation, swiglu_reference

# Logical axis names of the parameters, for flax's logical sharding rules.
EMBED = "embed"  # hidden size K
MLP = "mlp"  # intermediate size N (packed gate/up pairs stay together along it)
GATE_UP_AXES = (EMBED, MLP)  # gate_proj, up_proj and the packed gate_up_proj
DOWN_AXES = (MLP, EMBED)

UNFUSED_KEYS = ("gate_proj", "up_proj", "down_proj")
FUSED_KEYS = ("gate_up_proj", "down_proj")
HF_KEYS = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")


def check_kernel_dtype(dtype) -> None:
    """The fused modules compute in bfloat16 or float16, the kernels' dtypes."""
    if jnp.dtype(dtype) not in _layout.KERNEL_DTYPES:
        raise TypeError(
            f"the fused modules compute in bfloat16 or float16, got dtype={jnp.dtype(dtype)}; "
            "keep param_dtype as you like (it is cast at call time)")


# --- forward passes -------------------------------------------------------------------------

def fused_forward(x, gate_up, down, n: int, *, dtype, kernel: str, activation: str = "silu"):
    """``down(act(gate(x)) * up(x))`` through :func:`jax_swiglu.fused_mlp`, in ``dtype``.

    The casts are no-ops when the weights are stored in ``dtype``; otherwise each call
    converts the whole packed and down matrices (reads and writes every weight once more).
    """
    packed = _layout.PackedWeights.from_packed_data(gate_up.astype(dtype), n)
    return fused_mlp(jnp.asarray(x).astype(dtype), packed, down.astype(dtype), kernel=kernel,
                     activation=activation)


def reference_forward(x, gate, up, down, *, dtype, activation: str = "silu"):
    """The same block in plain XLA: :func:`jax_swiglu.swiglu_reference`, then the down dot."""
    x = jnp.asarray(x).astype(dtype)
    hidden = swiglu_reference(x, gate.astype(dtype), up.astype(dtype), activation=activation)
    return jnp.matmul(hidden, down.astype(dtype))


# --- conversion between the layouts ---------------------------------------------------------

def kernel_of(params: Mapping, name: str, layout: str):
    entry = params.get(name) if isinstance(params, Mapping) else None
    if not isinstance(entry, Mapping) or "kernel" not in entry:
        got = sorted(map(str, params)) if isinstance(params, Mapping) else type(params).__name__
        raise ValueError(
            f"expected {layout} MLP params with {name!r}: {{'kernel': array}}; got {got}")
    kernel = entry["kernel"]
    if not hasattr(kernel, "shape"):
        raise TypeError(
            f"{name}.kernel is a {type(kernel).__name__}, not an array; pass plain arrays "
            "(flax.linen.unbox(params), or nnx.to_pure_dict(nnx.state(model, nnx.Param)))")
    return kernel


def _cast(array, dtype):
    array = jnp.asarray(array)
    return array if dtype is None else array.astype(dtype)


def fuse_params(params: Mapping, *, dtype=None) -> dict:
    """Unfused params (``gate_proj``/``up_proj``/``down_proj`` kernels, [in, out]) -> fused.

    Packs gate and up once (:func:`jax_swiglu.pack_weights`); ``down_proj`` is kept as is.
    ``dtype`` optionally casts all three; without it the round trip through
    :func:`unfuse_params` is exact.
    """
    gate = kernel_of(params, "gate_proj", "unfused")
    up = kernel_of(params, "up_proj", "unfused")
    down = _cast(kernel_of(params, "down_proj", "unfused"), dtype)
    packed = _layout.pack_weights(gate, up, dtype=dtype)
    if down.shape != (packed.n, packed.k):
        raise ValueError(
            f"down_proj kernel must be [N, K] = [{packed.n}, {packed.k}] for gate/up kernels "
            f"[{packed.k}, {packed.n}], got {tuple(down.shape)}")
    return {"gate_up_proj": {"kernel": packed.data}, "down_proj": {"kernel": down}}


def unfuse_params(params: Mapping) -> dict:
    """Fused params -> unfused (``gate_proj``/``up_proj``/``down_proj`` kernels, [in, out]).

    The exact inverse of :func:`fuse_params` (no dtype change); N comes from ``down_proj``.
    """
    gate_up = jnp.asarray(kernel_of(params, "gate_up_proj", "fused"))
    down = jnp.asarray(kernel_of(params, "down_proj", "fused"))
    if down.ndim != 2 or gate_up.ndim != 2 or down.shape[1] != gate_up.shape[0]:
        raise ValueError(
            f"fused kernels do not fit together: gate_up_proj {tuple(gate_up.shape)} must be "
            f"[K, 2*N_pad] and down_proj {tuple(down.shape)} must be [N, K]")
    gate, up = _layout.unpack_weights(_layout.PackedWeights.from_packed_data(gate_up, down.shape[0]))
    return {"gate_proj": {"kernel": gate}, "up_proj": {"kernel": up},
            "down_proj": {"kernel": down}}


def fuse_hf_weights(weights: Mapping, *, dtype=None) -> dict:
    """Hugging Face MLP tensors ([out, in]) -> fused params.

    ``weights`` holds ``"gate_proj.weight"`` [N, K], ``"up_proj.weight"`` [N, K] and
    ``"down_proj.weight"`` [K, N] as numpy or JAX arrays: one layer's ``...mlp.`` entries
    of a Qwen2.5/Llama state dict with that prefix removed.
    """
    missing = [key for key in HF_KEYS if key not in weights]
    if missing:
        raise ValueError(f"Hugging Face MLP weights lack {missing}; got keys {sorted(weights)}")
    gate, up, down = (jnp.asarray(weights[key]).T for key in HF_KEYS)
    return fuse_params({"gate_proj": {"kernel": gate}, "up_proj": {"kernel": up},
                        "down_proj": {"kernel": down}}, dtype=dtype)


def fused_to_hf_weights(params: Mapping) -> dict:
    """Fused params -> Hugging Face MLP tensors ([out, in]); inverse of :func:`fuse_hf_weights`."""
    unfused = unfuse_params(params)
    return {f"{name}.weight": unfused[name]["kernel"].T for name in UNFUSED_KEYS}


# --- whole param trees ----------------------------------------------------------------------

def _is_block(node, keys) -> bool:
    return isinstance(node, Mapping) and all(
        isinstance(node.get(key), Mapping) and "kernel" in node[key] for key in keys)


def _swap_blocks(tree, keys, convert, what: str):
    found = 0

    def walk(node):
        nonlocal found
        if not isinstance(node, Mapping):
            return node
        if _is_block(node, keys):
            found += 1
            # Other entries of the block (a norm, say) stay; only the MLP kernels change.
            rest = {name: walk(child) for name, child in node.items() if name not in keys}
            return {**rest, **convert({key: node[key] for key in keys})}
        return {name: walk(child) for name, child in node.items()}

    swapped = walk(tree)
    if not found:
        raise ValueError(f"found no {what} MLP block (a dict holding {list(keys)}) in the tree")
    return swapped


def fuse_mlp_blocks(tree: Mapping, *, dtype=None) -> dict:
    """Swaps every unfused MLP block in a nested param dict for the fused layout.

    A block is any dict holding ``gate_proj``, ``up_proj`` and ``down_proj`` dicts with a
    ``kernel``; its other entries are kept. Returns a new tree of plain dicts; raises
    ValueError if no block matched (a different naming, say).
    """
    return _swap_blocks(tree, UNFUSED_KEYS, lambda block: fuse_params(block, dtype=dtype),
                        "unfused")


def unfuse_mlp_blocks(tree: Mapping) -> dict:
    """Inverse of :func:`fuse_mlp_blocks`: every fused block back to gate/up/down, for export."""
    return _swap_blocks(tree, FUSED_KEYS, unfuse_params, "fused")
