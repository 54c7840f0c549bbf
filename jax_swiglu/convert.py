"""Pack gate/up weights from the layouts real model code stores them in, and back, exactly.

Every adapter here does one thing: it reads the source layout's gate and up matrices as
``[K, N]`` (K = embed / hidden size, N = mlp / intermediate size) and hands them to
:func:`jax_swiglu.pack_weights`; the export goes through :func:`jax_swiglu.unpack_weights`.
The packed layout itself lives only in ``jax_swiglu/_layout.py``. Round trips are bit-exact,
and no dtype changes unless ``dtype=`` is given.

* MaxText ``MlpBlock`` with ``fused_mlp=True``: ``wi`` ``[embed, 2, mlp]``, gate ``wi[:, 0]``:
  :func:`pack_maxtext_wi` / :func:`maxtext_wi`.
* Gemma ``FeedForward``: ``gating_einsum`` ``[2, embed, mlp]`` (``[2, mlp, embed]`` with
  ``transpose_gating_einsum``), gate ``w[0]``: :func:`pack_gemma_gating` / :func:`gemma_gating`.
* ``nnx.Linear`` layers ``gate_proj`` / ``up_proj`` / ``down_proj`` (google-tunix Llama 3,
  Qwen 3), kernels ``[in, out]``, or ``gate_up_proj`` (gate and up concatenated, Phi-3) and
  ``down_proj``: :func:`pack_linears` / :func:`linear_kernels`, :func:`set_linear_kernels`.
* Hugging Face ``gate_proj.weight`` / ``up_proj.weight`` ``[N, K]`` (``[out, in]``):
  :func:`pack_hf` / :func:`hf_gate_up`; whole blocks as the Flax modules' param dict:
  :func:`fuse_hf_weights` / :func:`fused_to_hf_weights`.

The down projection needs no adapter in MaxText (``wo``) and Gemma (``linear``): both store
it ``[mlp, embed]``, which is already :func:`jax_swiglu.fused_mlp`'s ``w_down``.

These functions only move weights; the activation is the call's: SiLU (``swiglu``'s default)
for Llama, Qwen and MaxText's ``("silu", "linear")``, ``activation="gelu_tanh"`` for Gemma
(flax's ``nn.gelu`` is the tanh form).

Only :func:`fuse_hf_weights` and :func:`fused_to_hf_weights` need flax (they are
``jax_swiglu.nn``'s). :func:`pack_linears` reads any object whose ``gate_proj``, ``up_proj``
and ``down_proj`` have a ``kernel`` (an ``nnx.Param`` or a plain array).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _layout
from ._layout import PackedWeights

__all__ = [
    "fuse_hf_weights",
    "fused_to_hf_weights",
    "gemma_gating",
    "hf_gate_up",
    "linear_kernels",
    "maxtext_wi",
    "pack_gemma_gating",
    "pack_hf",
    "pack_linears",
    "pack_maxtext_wi",
    "set_linear_kernels",
]

MAXTEXT_WI = "MaxText wi [embed, 2, mlp]"
GEMMA_GATING = "Gemma gating_einsum [2, embed, mlp]"
GEMMA_GATING_TRANSPOSED = "Gemma gating_einsum [2, mlp, embed] (transpose_gating_einsum=True)"
HF_GATE_UP = "Hugging Face gate_proj.weight / up_proj.weight [N, K] ([out, in])"
LINEARS = "gate_proj / up_proj / down_proj linear kernels ([in, out])"


def _float_array(w, what: str, layout: str):
    """``w`` as a jax array, or a TypeError that names the layout expected."""
    if not (hasattr(w, "shape") and hasattr(w, "dtype")):
        raise TypeError(f"{what} must be an array in the {layout} layout, got {type(w).__name__}")
    if not jnp.issubdtype(w.dtype, jnp.floating):
        raise TypeError(
            f"{what} must be a floating-point array ({layout}), got dtype {w.dtype}")
    return jnp.asarray(w)


def _pack(gate, up, dtype, layout: str) -> PackedWeights:
    """``pack_weights(gate, up)``, its errors prefixed with the layout the caller passed."""
    # pack_weights owns the checks (alignment, shape match, sharding); the prefix only says
    # which source layout the [K, N] matrices it names came from.
    try:
        return _layout.pack_weights(gate, up, dtype=dtype)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{layout}: {error}") from error


# --- MaxText ---------------------------------------------------------------------------------

def pack_maxtext_wi(wi, *, dtype=None) -> PackedWeights:
    """Packs MaxText's fused MLP input kernel ``wi`` (``MlpBlock`` with ``fused_mlp=True``).

    ``wi`` is ``[embed, 2, mlp]`` (logical axes ``("embed", "num_activations", "mlp")``).
    MaxText computes ``h = einsum("...d,dkf->...kf", x, wi)`` and applies
    ``mlp_activations[k]`` to ``h[..., k, :]``; with ``("silu", "linear")``, index 0 is the
    gate (the activation's input, what the unfused block names ``wi_0``) and index 1 the up
    projection (``wi_1``). Unfused ``wi_0`` / ``wi_1`` kernels (``[embed, mlp]`` each) pack
    directly as ``pack_weights(wi_0, wi_1)``. The down kernel ``wo`` (``[mlp, embed]``) is
    ``fused_mlp``'s ``w_down`` as it is.

    Pass one layer's kernel: with ``scan_layers`` the stacked ``[embed, layers, 2, mlp]``
    kernel (``param_scan_axis=1``) packs layer by layer, ``wi[:, layer]``.
    """
    wi = _float_array(wi, "wi", MAXTEXT_WI)
    if wi.ndim != 3 or wi.shape[1] != 2:
        hint = (f"; this looks like scanned layers [embed, layers, 2, mlp]: pack each layer's "
                f"wi[:, layer]" if wi.ndim == 4 and wi.shape[2] == 2 else "")
        raise ValueError(f"expected {MAXTEXT_WI}, got shape {tuple(wi.shape)}{hint}")
    return _pack(wi[:, 0], wi[:, 1], dtype, MAXTEXT_WI)


def maxtext_wi(packed: PackedWeights):
    """Inverse of :func:`pack_maxtext_wi`: MaxText's ``wi`` ``[embed, 2, mlp]`` (gate at 0)."""
    gate, up = _layout.unpack_weights(packed)
    return jnp.stack([gate, up], axis=1)


# --- Gemma -----------------------------------------------------------------------------------

def _gemma_layout(transpose_gating_einsum: bool) -> str:
    return GEMMA_GATING_TRANSPOSED if transpose_gating_einsum else GEMMA_GATING


def pack_gemma_gating(w, *, transpose_gating_einsum: bool = False, dtype=None) -> PackedWeights:
    """Packs Gemma's ``FeedForward`` ``gating_einsum`` weight.

    Pass the model config's own ``transpose_gating_einsum``:

    * ``False``: ``w`` is ``[2, embed, mlp]``, applied as ``einsum("...F,NFH->...NH", x, w)``;
    * ``True``: ``w`` is ``[2, mlp, embed]``, applied as ``einsum("...F,NHF->...NH", x, w)``.

    Either way index 0 along the leading axis is the gate (``gelu(h[..., 0, :])``, the tanh
    form: run the block with ``activation="gelu_tanh"``) and index 1 the up projection it
    multiplies. The down weight ``linear`` (``[mlp, embed]``) is
    ``fused_mlp``'s ``w_down`` as it is. A wrong ``transpose_gating_einsum`` packs the
    transposes; ``swiglu`` then refuses ``x`` for its K (unless embed == mlp).
    """
    layout = _gemma_layout(transpose_gating_einsum)
    w = _float_array(w, "gating_einsum", layout)
    if w.ndim != 3 or w.shape[0] != 2:
        raise ValueError(f"expected {layout}, got shape {tuple(w.shape)}")
    gate, up = (w[0].T, w[1].T) if transpose_gating_einsum else (w[0], w[1])
    return _pack(gate, up, dtype, layout)


def gemma_gating(packed: PackedWeights, *, transpose_gating_einsum: bool = False):
    """Inverse of :func:`pack_gemma_gating`: ``gating_einsum`` ``[2, embed, mlp]``, or
    ``[2, mlp, embed]`` with ``transpose_gating_einsum=True`` (gate at index 0)."""
    gate, up = _layout.unpack_weights(packed)
    if transpose_gating_einsum:
        gate, up = gate.T, up.T
    return jnp.stack([gate, up])


# --- Hugging Face ----------------------------------------------------------------------------

def pack_hf(gate_weight, up_weight, *, dtype=None) -> PackedWeights:
    """Packs Hugging Face ``mlp.gate_proj.weight`` and ``mlp.up_proj.weight`` (``[N, K]``).

    PyTorch ``nn.Linear`` stores ``[out, in]`` and computes ``x @ weight.T``
    (``einsum("...k,nk->...n")``); Llama, Qwen and Mistral then apply
    ``act(gate_proj(x)) * up_proj(x)``. The down weight (``[K, N]``) becomes ``w_down`` as
    ``down_proj.weight.T``. For a whole block in the Flax modules' param dict see
    :func:`fuse_hf_weights`.
    """
    gate = _float_array(gate_weight, "gate_proj.weight", HF_GATE_UP)
    up = _float_array(up_weight, "up_proj.weight", HF_GATE_UP)
    if gate.ndim != 2 or up.ndim != 2 or gate.shape != up.shape:
        raise ValueError(
            f"expected {HF_GATE_UP}, both the same shape; got {tuple(gate.shape)} and "
            f"{tuple(up.shape)}")
    return _pack(gate.T, up.T, dtype, HF_GATE_UP)


def hf_gate_up(packed: PackedWeights):
    """Inverse of :func:`pack_hf`: ``(gate_proj.weight, up_proj.weight)``, each ``[N, K]``."""
    gate, up = _layout.unpack_weights(packed)
    return gate.T, up.T


def fuse_hf_weights(weights, *, dtype=None) -> dict:
    """Hugging Face MLP tensors (``[out, in]``) -> the Flax modules' fused param dict.

    The same function as :func:`jax_swiglu.nn.fuse_hf_weights`, which this calls (so it
    needs flax); :func:`pack_hf` is the flax-free form for gate and up alone.
    """
    from .nn import _common  # jax_swiglu.nn imports flax

    return _common.fuse_hf_weights(weights, dtype=dtype)


def fused_to_hf_weights(params) -> dict:
    """Inverse of :func:`fuse_hf_weights` (:func:`jax_swiglu.nn.fused_to_hf_weights`)."""
    from .nn import _common

    return _common.fused_to_hf_weights(params)


# --- nnx.Linear modules ----------------------------------------------------------------------

_LINEAR_NAMES = ("gate_proj", "up_proj", "down_proj")
_CONCATENATED_LINEAR_NAMES = ("gate_up_proj", "down_proj")
CONCATENATED_LINEARS = ("gate_up_proj / down_proj linear kernels ([in, out], gate_up_proj the "
                        "concatenation [gate | up])")


def _kernel_of(linear, name: str):
    kernel = getattr(linear, "kernel", None)
    if kernel is None:
        raise TypeError(
            f"{name} must be a linear layer with a .kernel ([in, out], as nnx.Linear), "
            f"got {type(linear).__name__}")
    if getattr(linear, "bias", None) is not None:
        raise ValueError(
            f"{name} has a bias; the fused SwiGLU block has none (use_bias=False, as Llama "
            "and Qwen MLPs are built)")
    if not isinstance(kernel, (jax.Array, np.ndarray)):
        # An nnx.Variable: get_value() where flax has it (.value is deprecated there).
        kernel = kernel.get_value() if hasattr(kernel, "get_value") else kernel.value
    return _float_array(kernel, f"{name}.kernel", LINEARS)


def linear_names(mlp) -> tuple[str, ...]:
    """The names of ``mlp``'s linear layers: gate_proj/up_proj/down_proj, or, for a block
    that keeps gate and up concatenated (Phi-3), gate_up_proj/down_proj."""
    if not hasattr(mlp, "gate_proj") and hasattr(mlp, "gate_up_proj"):
        names = _CONCATENATED_LINEAR_NAMES
    else:
        names = _LINEAR_NAMES
    missing = [n for n in names if not hasattr(mlp, n)]
    if missing:
        raise TypeError(
            f"expected an MLP with {list(_LINEAR_NAMES)} linear layers (or "
            f"{list(_CONCATENATED_LINEAR_NAMES)}), or the three layers; "
            f"{type(mlp).__name__} has no {missing}")
    return names


def _linears(mlp_or_gate_proj, up_proj, down_proj) -> dict:
    if up_proj is None and down_proj is None:
        return {n: getattr(mlp_or_gate_proj, n) for n in linear_names(mlp_or_gate_proj)}
    if up_proj is None or down_proj is None:
        raise TypeError("pass the MLP, or all three of gate_proj, up_proj and down_proj")
    return dict(zip(_LINEAR_NAMES, (mlp_or_gate_proj, up_proj, down_proj)))


def pack_linears(mlp_or_gate_proj, up_proj=None, down_proj=None, *, dtype=None):
    """Packs an MLP built from ``nnx.Linear`` layers: returns ``(packed, w_down)``.

    Pass the MLP module (any object with ``gate_proj``, ``up_proj`` and ``down_proj``, as in
    google-tunix's Llama 3 and Qwen 3 ``MLP``) or the three layers. Their kernels are
    ``[in, out]`` (``x @ kernel``, ``einsum("...k,kn->...n")``): gate and up ``[K, N]``, down
    ``[N, K]``, for ``silu(gate_proj(x)) * up_proj(x)`` then ``down_proj``. A block with
    ``gate_up_proj`` and ``down_proj`` instead (Phi-3's layout) holds gate and up
    concatenated, ``[K, 2N]`` ``[gate | up]``, and is read so. A kernel may be an
    ``nnx.Param`` or a plain array; layers with a bias are refused. ``dtype`` casts all.
    """
    linears = _linears(mlp_or_gate_proj, up_proj, down_proj)
    kernels = {name: _kernel_of(linear, name) for name, linear in linears.items()}
    if "gate_up_proj" in kernels:
        layout = CONCATENATED_LINEARS
        gate_up = kernels["gate_up_proj"]
        try:
            packed = _layout.pack_weights(gate_up, layout="concatenated", dtype=dtype)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{layout}: {error}") from error
    else:
        layout = LINEARS
        packed = _pack(kernels["gate_proj"], kernels["up_proj"], dtype, layout)
    down = kernels["down_proj"]
    if down.shape != (packed.n, packed.k):
        raise ValueError(
            f"down_proj.kernel must be [N, K] = [{packed.n}, {packed.k}] for gate/up kernels "
            f"[{packed.k}, {packed.n}] ({layout}), got {tuple(down.shape)}")
    return packed, down if dtype is None else down.astype(dtype)


def linear_kernels(packed: PackedWeights, w_down):
    """Inverse of :func:`pack_linears`: ``(gate_kernel, up_kernel, down_kernel)``, ``[in, out]``."""
    gate, up = _layout.unpack_weights(packed)
    down = _float_array(w_down, "w_down", LINEARS)
    if down.shape != (packed.n, packed.k):
        raise ValueError(
            f"w_down must be [N, K] = [{packed.n}, {packed.k}] for these packed weights, got "
            f"{tuple(down.shape)}")
    return gate, up, down


def set_linear_kernels(mlp, packed: PackedWeights, w_down) -> None:
    """Writes :func:`linear_kernels` into ``mlp.gate_proj``/``up_proj``/``down_proj`` in place
    (into ``gate_up_proj``, concatenated, and ``down_proj`` for a Phi-3 style block).

    For export through the model's own code: each kernel must already have the shape it
    gets, and afterwards holds exactly the unpacked array (its dtype is the packed one). An
    ``nnx.Param`` keeps its identity (and metadata) and gets the new value; a plain array
    attribute is replaced.
    """
    linears = _linears(mlp, None, None)
    gate, up, down = linear_kernels(packed, w_down)
    if "gate_up_proj" in linears:
        layout, new = CONCATENATED_LINEARS, {"gate_up_proj": jnp.concatenate([gate, up], axis=1),
                                             "down_proj": down}
    else:
        layout, new = LINEARS, {"gate_proj": gate, "up_proj": up, "down_proj": down}
    for name, linear in linears.items():
        old = _kernel_of(linear, name)
        if old.shape != new[name].shape:
            raise ValueError(
                f"{name}.kernel is {tuple(old.shape)} but these weights give "
                f"{tuple(new[name].shape)} ({layout})")
    for name, linear in linears.items():
        current = linear.kernel
        if isinstance(current, (jax.Array, np.ndarray)):
            linear.kernel = new[name]
        elif hasattr(current, "set_value"):
            current.set_value(new[name])
        else:  # a Variable of a flax without set_value
            current.value = new[name]
