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
  :func:`pack_hf` / :func:`hf_gate_up` (Phi-3's concatenated ``gate_up_proj.weight``:
  :func:`pack_hf_concatenated` / :func:`hf_concatenated`); whole blocks as the Flax modules'
  param dict: :func:`fuse_hf_weights` / :func:`fused_to_hf_weights`; every MLP of a whole
  checkpoint, a state dict or ``.safetensors`` files, with the tensors' name patterns as
  parameters: :func:`pack_hf_checkpoint` / :func:`hf_checkpoint`, :func:`save_hf_checkpoint`;
  every expert MLP (Qwen-MoE, DeepSeek, Mixtral): :func:`pack_hf_experts_checkpoint` /
  :func:`hf_experts_checkpoint`.
* A ``[K, 2N]`` concatenation ``[gate | up]`` as an ``[in, out]`` kernel:
  ``jax_swiglu.pack_weights(w, layout="concatenated")`` /
  ``jax_swiglu.unpack_weights(packed, layout="concatenated")``.

The down projection needs no adapter in MaxText (``wo``) and Gemma (``linear``): both store
it ``[mlp, embed]``, which is already :func:`jax_swiglu.fused_mlp`'s ``w_down``.
Expert weights need none either where they are stored ``[experts, embed, mlp]``: MaxText's
routed MoE ``wi_0`` / ``wi_1`` and tunix's Qwen3 ``MoELayer`` ``gate_proj`` / ``up_proj`` pack
as ``jax_swiglu.pack_expert_weights(gate, up)``, and their ``wo`` / ``down_proj``
``[experts, mlp, embed]`` is :func:`jax_swiglu.grouped_fused_mlp`'s ``w_down`` as it is.

These functions only move weights; the activation is the call's: SiLU (``swiglu``'s default)
for Llama, Qwen and MaxText's ``("silu", "linear")``, ``activation="gelu_tanh"`` for Gemma
(flax's ``nn.gelu`` is the tanh form).

The Flax modules' param trees (:func:`fuse_params`, :func:`fuse_hf_weights`,
:func:`fuse_mlp_blocks` and their inverses, which ``jax_swiglu.nn`` re-exports) are plain
dicts here, so nothing needs flax; only the ``.safetensors`` files need the ``safetensors`` package
(``pip install 'jax_swiglu[hf]'``). :func:`pack_linears` reads any object whose ``gate_proj``,
``up_proj`` and ``down_proj`` have a ``kernel`` (an ``nnx.Param`` or a plain array). Nothing
here modifies what it is given.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from . import _layout
from ._layout import PackedWeights

__all__ = [
    "HF_DOWN",
    "HF_EXPERT_DOWN",
    "HF_EXPERT_GATE",
    "HF_EXPERT_UP",
    "MIXTRAL_EXPERT_DOWN",
    "MIXTRAL_EXPERT_GATE",
    "MIXTRAL_EXPERT_UP",
    "HF_GATE",
    "HF_GATE_UP",
    "HF_UP",
    "fuse_hf_weights",
    "fused_to_hf_weights",
    "gemma_gating",
    "hf_checkpoint",
    "hf_concatenated",
    "hf_experts_checkpoint",
    "hf_gate_up",
    "linear_kernels",
    "linear_names",
    "maxtext_wi",
    "pack_gemma_gating",
    "pack_hf",
    "pack_hf_checkpoint",
    "pack_hf_concatenated",
    "pack_hf_experts_checkpoint",
    "pack_linears",
    "pack_maxtext_wi",
    "save_hf_checkpoint",
    "set_linear_kernels",
]

MAXTEXT_WI = "MaxText wi [embed, 2, mlp]"
GEMMA_GATING = "Gemma gating_einsum [2, embed, mlp]"
GEMMA_GATING_TRANSPOSED = "Gemma gating_einsum [2, mlp, embed] (transpose_gating_einsum=True)"
HF_GATE_UP_LAYOUT = "Hugging Face gate_proj.weight / up_proj.weight [N, K] ([out, in])"
HF_CONCATENATED = "Hugging Face gate_up_proj.weight [2N, K] ([out, in], gate rows first)"
HF_DOWN_LAYOUT = "Hugging Face down_proj.weight [K, N] ([out, in])"
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

def pack_hf(gate_weight, up_weight=None, *, dtype=None) -> PackedWeights:
    """Packs Hugging Face ``mlp.gate_proj.weight`` and ``mlp.up_proj.weight`` (``[N, K]``).

    PyTorch ``nn.Linear`` stores ``[out, in]`` and computes ``x @ weight.T``
    (``einsum("...k,nk->...n")``); Llama, Qwen and Mistral then apply
    ``act(gate_proj(x)) * up_proj(x)``. The down weight (``[K, N]``) becomes ``w_down`` as
    ``down_proj.weight.T``.

    ``pack_hf(weights)`` takes one layer's tensors by name instead: a mapping holding
    ``gate_proj.weight`` and ``up_proj.weight``, or Phi-3's ``gate_up_proj.weight``, bare or
    under any prefix (``mlp.gate_proj.weight``, ``model.layers.3.mlp.gate_proj.weight``),
    one of each. A whole checkpoint, every layer at once, is :func:`pack_hf_checkpoint`;
    a whole block in the Flax modules' param dict :func:`fuse_hf_weights`.
    """
    if up_weight is None and isinstance(gate_weight, Mapping):
        tensors = _hf_layer_tensors(gate_weight)
        if "gate_up_proj.weight" in tensors:
            return pack_hf_concatenated(tensors["gate_up_proj.weight"], dtype=dtype)
        gate_weight, up_weight = tensors["gate_proj.weight"], tensors["up_proj.weight"]
    elif up_weight is None:
        raise TypeError("pack_hf takes gate_proj.weight and up_proj.weight, or one mapping of a "
                        "layer's tensors by name; for Phi-3's concatenated gate_up_proj.weight "
                        "use pack_hf_concatenated")
    gate = _float_array(gate_weight, "gate_proj.weight", HF_GATE_UP_LAYOUT)
    up = _float_array(up_weight, "up_proj.weight", HF_GATE_UP_LAYOUT)
    if gate.ndim != 2 or up.ndim != 2 or gate.shape != up.shape:
        raise ValueError(
            f"expected {HF_GATE_UP_LAYOUT}, both the same shape; got {tuple(gate.shape)} and "
            f"{tuple(up.shape)}")
    return _pack(gate.T, up.T, dtype, HF_GATE_UP_LAYOUT)


def hf_gate_up(packed: PackedWeights):
    """Inverse of :func:`pack_hf`: ``(gate_proj.weight, up_proj.weight)``, each ``[N, K]``."""
    gate, up = _layout.unpack_weights(packed)
    return gate.T, up.T


def pack_hf_concatenated(gate_up_weight, *, dtype=None) -> PackedWeights:
    """Packs Phi-3's ``mlp.gate_up_proj.weight``, ``[2N, K]``: the gate rows, then the up rows.

    Phi-3 computes ``gate, up = gate_up_proj(x).chunk(2, dim=-1)``, then ``act(gate) * up``;
    vLLM's merged ``gate_up_proj`` is the same concatenation.
    """
    weight = _float_array(gate_up_weight, "gate_up_proj.weight", HF_CONCATENATED)
    if weight.ndim != 2:
        raise ValueError(f"expected {HF_CONCATENATED}, got shape {tuple(weight.shape)}")
    try:
        return _layout.pack_weights(weight.T, layout="concatenated", dtype=dtype)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{HF_CONCATENATED}: {error}") from error


def hf_concatenated(packed: PackedWeights):
    """Inverse of :func:`pack_hf_concatenated`: ``gate_up_proj.weight``, ``[2N, K]``."""
    return _layout.unpack_weights(packed, layout="concatenated").T


_HF_SEPARATE_NAMES = ("gate_proj.weight", "up_proj.weight")
_HF_CONCATENATED_NAMES = ("gate_up_proj.weight",)


def _hf_layer_tensors(weights: Mapping, with_down: bool = False) -> dict:
    """One layer's MLP tensors, ``{bare name: tensor}``, from ``weights`` whose keys are the
    bare names or the names under one prefix (``mlp.``, ``model.layers.3.mlp.``)."""
    concatenated = any(isinstance(key, str) and (key == "gate_up_proj.weight"
                                                 or key.endswith(".gate_up_proj.weight"))
                       for key in weights)
    names = _HF_CONCATENATED_NAMES if concatenated else _HF_SEPARATE_NAMES
    names += ("down_proj.weight",) if with_down else ()
    found, prefixes, missing = {}, set(), []
    for name in names:
        keys = [key for key in weights if isinstance(key, str)
                and (key == name or key.endswith("." + name))]
        if not keys:
            missing.append(name)
        elif len(keys) > 1:
            raise ValueError(
                f"{len(keys)} tensors are named ...{name} ({keys[0]!r}, {keys[1]!r}, ...): these "
                "are several layers' MLPs. Pass one layer's tensors, or convert the whole "
                "checkpoint with jax_swiglu.convert.pack_hf_checkpoint")
        else:
            found[name] = weights[keys[0]]
            prefixes.add(keys[0][:-len(name)])
    if missing:
        raise ValueError(f"Hugging Face MLP weights lack {missing} (bare or under a prefix such as "
                         f"'mlp.'); got keys {sorted(map(str, weights))[:8]}")
    if len(prefixes) > 1:
        raise ValueError(f"the MLP tensors sit under different prefixes {sorted(prefixes)}; pass "
                         "one layer's tensors")
    return found


# --- the Flax modules' param trees (jax_swiglu.nn re-exports these) -------------------------
#
# Plain nested dicts of arrays, kernels [in, out]: the layouts are described in
# jax_swiglu/nn/_common.py. Nothing here needs flax.

UNFUSED_KEYS = ("gate_proj", "up_proj", "down_proj")
CONCATENATED_KEYS = ("gate_up_proj", "down_proj")
FUSED_KEYS = ("gate_up_packed", "down_proj")
HF_KEYS = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
HF_CONCATENATED_KEYS = ("gate_up_proj.weight", "down_proj.weight")

CONCATENATED_IS_NOT_PACKED = (
    "gate_up_proj names the concatenation [gate | up] ([K, 2N], gate first: Phi-3's and "
    "vLLM's gate_up_proj), an unfused layout; the fused params hold the packed matrix as "
    "gate_up_packed. Convert a concatenation with jax_swiglu.nn.fuse_params(params) (or "
    "FusedSwiGLUMLP.from_unfused on the module). Params saved by jax_swiglu 0.2, whose fused "
    "modules named their packed matrix gate_up_proj, load after renaming that key to "
    "gate_up_packed")


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


def check_fused_keys(params: Mapping) -> None:
    """Refuses, with what to do, params of another layout where fused ones are expected."""
    if not isinstance(params, Mapping) or "gate_up_packed" in params:
        return
    if "gate_up_proj" in params:
        raise ValueError(f"expected fused MLP params (gate_up_packed, down_proj): "
                         f"{CONCATENATED_IS_NOT_PACKED}")
    if "gate_proj" in params or "up_proj" in params:
        raise ValueError("expected fused MLP params (gate_up_packed, down_proj), got unfused "
                         "ones (gate_proj, up_proj): convert them with jax_swiglu.nn.fuse_params")


def fuse_params(params: Mapping, *, dtype=None) -> dict:
    """Unfused params (kernels [in, out]) -> fused.

    ``params`` holds ``gate_proj``, ``up_proj`` and ``down_proj`` kernels, or ``gate_up_proj``
    (the concatenation ``[gate | up]``, ``[K, 2N]``, as Phi-3 and vLLM store it) and
    ``down_proj``. Gate and up are packed once (:func:`jax_swiglu.pack_weights`) into
    ``gate_up_packed``; ``down_proj`` is kept as is. ``dtype`` optionally casts all of them;
    without it the round trip through :func:`unfuse_params` is exact.
    """
    if isinstance(params, Mapping) and "gate_up_packed" in params:
        raise ValueError("these params are fused already (they hold gate_up_packed); "
                         "fuse_params takes gate_proj/up_proj/down_proj or gate_up_proj/down_proj")
    if isinstance(params, Mapping) and "gate_up_proj" in params:
        if "gate_proj" in params or "up_proj" in params:
            raise ValueError("params hold both gate_up_proj and gate_proj/up_proj; which is "
                             "the block's? Pass one layout")
        gate_up = kernel_of(params, "gate_up_proj", "concatenated")
        try:
            packed = _layout.pack_weights(gate_up, layout="concatenated", dtype=dtype)
        except ValueError as error:
            raise ValueError(f"gate_up_proj kernel: {error}") from None
        layout = "concatenated"
    else:
        gate = kernel_of(params, "gate_proj", "unfused")
        up = kernel_of(params, "up_proj", "unfused")
        packed = _layout.pack_weights(gate, up, dtype=dtype)
        layout = "unfused"
    down = _cast(kernel_of(params, "down_proj", layout), dtype)
    if down.shape != (packed.n, packed.k):
        raise ValueError(
            f"down_proj kernel must be [N, K] = [{packed.n}, {packed.k}] for gate/up kernels "
            f"[{packed.k}, {packed.n}], got {tuple(down.shape)}")
    return {"gate_up_packed": {"kernel": packed.data}, "down_proj": {"kernel": down}}


def unfuse_params(params: Mapping, *, layout: str = "separate") -> dict:
    """Fused params -> unfused, kernels [in, out]: the exact inverse of :func:`fuse_params`.

    ``layout="separate"`` (the default) gives ``gate_proj``/``up_proj``/``down_proj``;
    ``"concatenated"`` gives ``gate_up_proj`` (``[gate | up]``, ``[K, 2N]``) and
    ``down_proj``. No dtype changes; N comes from ``down_proj``.
    """
    if layout not in ("separate", "concatenated"):
        raise ValueError(f"layout must be 'separate' or 'concatenated', got {layout!r}")
    check_fused_keys(params)
    gate_up = jnp.asarray(kernel_of(params, "gate_up_packed", "fused"))
    down = jnp.asarray(kernel_of(params, "down_proj", "fused"))
    if down.ndim != 2 or gate_up.ndim != 2 or down.shape[1] != gate_up.shape[0]:
        raise ValueError(
            f"fused kernels do not fit together: gate_up_packed {tuple(gate_up.shape)} must be "
            f"[K, 2*N_pad] and down_proj {tuple(down.shape)} must be [N, K]")
    packed = _layout.PackedWeights.from_packed_data(gate_up, down.shape[0])
    if layout == "concatenated":
        return {"gate_up_proj": {"kernel": _layout.unpack_weights(packed, layout=layout)},
                "down_proj": {"kernel": down}}
    gate, up = _layout.unpack_weights(packed)
    return {"gate_proj": {"kernel": gate}, "up_proj": {"kernel": up},
            "down_proj": {"kernel": down}}


def fuse_hf_weights(weights: Mapping, *, dtype=None) -> dict:
    """Hugging Face MLP tensors ([out, in]) -> fused params.

    ``weights`` holds ``"gate_proj.weight"`` [N, K], ``"up_proj.weight"`` [N, K] and
    ``"down_proj.weight"`` [K, N] as numpy or JAX arrays, or Phi-3's
    ``"gate_up_proj.weight"`` [2N, K] (gate rows first) instead of the first two: one
    layer's entries of a Qwen2.5/Llama/Phi-3 state dict, bare or under their prefix
    (``mlp.``, ``model.layers.3.mlp.``). Every layer at once:
    :func:`jax_swiglu.convert.pack_hf_checkpoint`.
    """
    tensors = _hf_layer_tensors(weights, with_down=True)
    if "gate_up_proj.weight" in tensors:
        keys, unfused_keys = HF_CONCATENATED_KEYS, CONCATENATED_KEYS
    else:
        keys, unfused_keys = HF_KEYS, UNFUSED_KEYS
    return fuse_params({name: {"kernel": jnp.asarray(tensors[key]).T}
                        for name, key in zip(unfused_keys, keys)}, dtype=dtype)


def fused_to_hf_weights(params: Mapping, *, layout: str = "separate") -> dict:
    """Fused params -> Hugging Face MLP tensors ([out, in]); inverse of :func:`fuse_hf_weights`
    (``layout="concatenated"`` gives Phi-3's ``gate_up_proj.weight``)."""
    unfused = unfuse_params(params, layout=layout)
    return {f"{name}.weight": kernel["kernel"].T for name, kernel in unfused.items()}


def _is_block(node, keys) -> bool:
    return isinstance(node, Mapping) and all(
        isinstance(node.get(key), Mapping) and "kernel" in node[key] for key in keys)


def _holds_block(node, keys) -> bool:
    return isinstance(node, Mapping) and (
        _is_block(node, keys) or any(_holds_block(child, keys) for child in node.values()))


def _swap_blocks(tree, layouts, convert, what: str, hint: str = ""):
    found = 0

    def walk(node):
        nonlocal found
        if not isinstance(node, Mapping):
            return node
        for keys in layouts:
            if _is_block(node, keys):
                found += 1
                # Other entries of the block (a norm, say) stay; only the MLP kernels change.
                rest = {name: walk(child) for name, child in node.items() if name not in keys}
                return {**rest, **convert({key: node[key] for key in keys})}
        return {name: walk(child) for name, child in node.items()}

    swapped = walk(tree)
    if not found:
        blocks = " or ".join(str(list(keys)) for keys in layouts)
        raise ValueError(f"found no {what} MLP block (a dict holding {blocks}) in the tree{hint}")
    return swapped


def fuse_mlp_blocks(tree: Mapping, *, dtype=None) -> dict:
    """Swaps every unfused MLP block in a nested param dict for the fused layout.

    A block is any dict holding ``gate_proj``, ``up_proj`` and ``down_proj`` dicts with a
    ``kernel``, or ``gate_up_proj`` (the concatenation ``[gate | up]``) and ``down_proj``;
    its other entries are kept. Returns a new tree of plain dicts; raises ValueError if no
    block matched (a different naming, say).
    """
    return _swap_blocks(tree, (UNFUSED_KEYS, CONCATENATED_KEYS),
                        lambda block: fuse_params(block, dtype=dtype), "unfused")


def unfuse_mlp_blocks(tree: Mapping, *, layout: str = "separate") -> dict:
    """Inverse of :func:`fuse_mlp_blocks`: every fused block back to gate/up/down (or, with
    ``layout="concatenated"``, to gate_up_proj/down_proj), for export."""
    hint = (f"; it holds gate_up_proj blocks: {CONCATENATED_IS_NOT_PACKED}"
            if _holds_block(tree, CONCATENATED_KEYS) else "")
    return _swap_blocks(tree, (FUSED_KEYS,), lambda block: unfuse_params(block, layout=layout),
                        "fused", hint)


# --- whole Hugging Face checkpoints ----------------------------------------------------------

HF_GATE = "model.layers.{i}.mlp.gate_proj.weight"
HF_UP = "model.layers.{i}.mlp.up_proj.weight"
HF_DOWN = "model.layers.{i}.mlp.down_proj.weight"
HF_GATE_UP = "model.layers.{i}.mlp.gate_up_proj.weight"  # Phi-3: gate rows, then up rows


def _patterns(gate, up, down, gate_up) -> dict[str, str]:
    """{role: name pattern} for a checkpoint's MLP tensors, each pattern checked."""
    if gate_up is not None and (gate is not None or up is not None):
        raise ValueError("pass gate= and up= patterns (separate tensors) or gate_up= (one "
                         "concatenated tensor, as Phi-3's), not both")
    roles = ({"gate_up": gate_up} if gate_up is not None
             else {"gate": HF_GATE if gate is None else gate, "up": HF_UP if up is None else up})
    roles["down"] = down
    for role, pattern in roles.items():
        if not isinstance(pattern, str) or pattern.count("{i}") != 1 or (
                pattern.replace("{i}", "").count("{") + pattern.replace("{i}", "").count("}")):
            raise ValueError(f"{role}= must be a tensor name with {{i}} once for the layer index, "
                             f"e.g. {HF_GATE!r}; got {pattern!r}")
    return roles


def _layer_regex(pattern: str) -> re.Pattern:
    before, after = pattern.split("{i}")
    return re.compile(re.escape(before) + r"(\d+)" + re.escape(after))


class _Checkpoint:
    """The tensors of a state dict, or of ``.safetensors`` files opened lazily: names and
    shapes without reading the data, each tensor read when it is packed."""

    def __init__(self, checkpoint, stack: contextlib.ExitStack):
        if isinstance(checkpoint, Mapping):
            self.names = [key for key in checkpoint if isinstance(key, str)]
            self._shape = lambda name: tuple(checkpoint[name].shape)
            self._load = lambda name: checkpoint[name]
            return
        files = _safetensors_files(checkpoint)
        safe_open = _safetensors().safe_open
        owner = {}
        for path in files:
            handle = stack.enter_context(safe_open(str(path), framework="numpy"))
            for name in handle.keys():
                if name in owner:
                    raise ValueError(f"tensor {name!r} is in both {owner[name][0]} and {path}")
                owner[name] = (path, handle)
        self.names = list(owner)
        self._shape = lambda name: tuple(owner[name][1].get_slice(name).get_shape())
        self._load = lambda name: owner[name][1].get_tensor(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shape(name)

    def load(self, name: str):
        return self._load(name)


def _safetensors():
    try:
        import safetensors
        import safetensors.numpy  # noqa: F401
    except ImportError as error:
        raise ImportError("reading and writing .safetensors files needs the safetensors "
                          "package: pip install 'jax_swiglu[hf]' (or safetensors)") from error
    return safetensors


def _safetensors_files(checkpoint) -> list[pathlib.Path]:
    """The files of a checkpoint given as a path (file or directory) or a list of paths."""
    if isinstance(checkpoint, (str, os.PathLike)):
        path = pathlib.Path(checkpoint)
        if path.is_dir():
            files = sorted(path.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no .safetensors file in the directory {path}")
            return files
        checkpoint = [path]
    if not isinstance(checkpoint, (list, tuple)) or not checkpoint:
        raise TypeError("checkpoint must be a state dict (a mapping of names to arrays), a "
                        ".safetensors file, a directory of them, or a list of files; got "
                        f"{type(checkpoint).__name__}")
    files = [pathlib.Path(p) for p in checkpoint]
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(f"no such checkpoint file: {path}")
        if path.suffix != ".safetensors":
            raise ValueError(f"{path} is not a .safetensors file (PyTorch .bin files: load them "
                             "with torch and save them with safetensors first)")
    return files


def pack_hf_checkpoint(checkpoint, *, gate: str | None = None, up: str | None = None,
                       down: str = HF_DOWN, gate_up: str | None = None,
                       dtype=None) -> list[tuple[PackedWeights, jax.Array]]:
    """Packs every MLP of a Hugging Face checkpoint: ``[(packed, w_down), ...]`` by layer.

    Reads the tensors named by the patterns, ``{i}`` standing for the layer index, for every
    layer from 0 on, and nothing else of the checkpoint; ``w_down`` is
    ``down_proj.weight.T`` (``[N, K]``), ready for :func:`jax_swiglu.fused_mlp` and
    :meth:`jax_swiglu.nn.FusedSwiGLUMLP.from_packed`. No dtype changes unless ``dtype=``
    is given; :func:`hf_checkpoint` and :func:`save_hf_checkpoint` export back bit-exactly.

    Args:
      checkpoint: a state dict (a mapping of names to numpy or JAX arrays, as
        ``safetensors.numpy.load_file`` returns), or ``.safetensors`` files: a path, a list
        of paths (a sharded checkpoint) or a directory of them (needs the ``safetensors``
        package, ``pip install 'jax_swiglu[hf]'``; only the MLP tensors are read). Torch
        tensors: save them with safetensors and pass the file.
      gate, up, down: the tensors' name patterns, by default Llama's, Qwen's and Mistral's
        ``model.layers.{i}.mlp.gate_proj.weight``, ``...up_proj.weight``,
        ``...down_proj.weight`` (``[out, in]``: gate and up ``[N, K]``, down ``[K, N]``).
      gate_up: instead of ``gate`` and ``up``, the pattern of one concatenated tensor
        ``[2N, K]``, gate rows first: :data:`HF_GATE_UP` for Phi-3.
      dtype: optional dtype for all of them (the kernels run bfloat16 and float16).

    Raises:
      ValueError: a pattern without ``{i}`` or matching no tensor (the message shows some of
        the checkpoint's names), a layer missing a tensor, or shapes that do not fit.
    """
    roles = _patterns(gate, up, down, gate_up)
    with contextlib.ExitStack() as stack:
        source = _Checkpoint(checkpoint, stack)
        layers = _layer_names(source, roles)
        for index, names in enumerate(layers):
            _check_layer_shapes(source, index, names)
        return [_pack_layer(source, names, dtype) for names in layers]


def _layer_names(source: _Checkpoint, roles: dict[str, str]) -> list[dict[str, str]]:
    """Per layer 0 .. L-1, {role: tensor name}; raises on patterns that find nothing and on
    layers that lack a tensor."""
    indices = {}
    for role, pattern in roles.items():
        regex = _layer_regex(pattern)
        indices[role] = {int(m.group(1)) for m in map(regex.fullmatch, source.names) if m}
        if not indices[role]:
            examples = [n for n in source.names if "mlp" in n or "proj" in n][:4] or \
                source.names[:4]
            hint = ""
            if role in ("gate", "up") and any(n.endswith("gate_up_proj.weight")
                                              for n in source.names):
                hint = (" It holds gate_up_proj tensors (gate and up concatenated, as Phi-3's): "
                        f"pass gate_up={HF_GATE_UP!r}.")
            raise ValueError(
                f"no tensor of the checkpoint is named like {role}={pattern!r}; its names look "
                f"like {examples}. Pass the patterns its MLP tensors follow, with {{i}} for the "
                f"layer index.{hint}")
    count = max(max(found) for found in indices.values()) + 1
    missing = [roles[role].format(i=i) for i in range(count) for role in roles
               if i not in indices[role]]
    if missing:
        raise ValueError(f"the checkpoint's MLPs are layers 0 .. {count - 1}, but it lacks "
                         f"{len(missing)} of their tensors: {missing[:4]}")
    return [{role: pattern.format(i=i) for role, pattern in roles.items()}
            for i in range(count)]


def _check_layer_shapes(source: _Checkpoint, index: int, names: dict[str, str]) -> None:
    shapes = {role: source.shape(name) for role, name in names.items()}
    down = shapes["down"]
    if "gate_up" in shapes:
        gate_up = shapes["gate_up"]
        fits = len(gate_up) == 2 and gate_up[0] % 2 == 0 and down == (gate_up[1], gate_up[0] // 2)
        expected = "gate_up [2N, K] and down [K, N]"
    else:
        gate, up = shapes["gate"], shapes["up"]
        fits = len(gate) == 2 and gate == up and down == gate[::-1]
        expected = "gate and up [N, K], down [K, N]"
    if not fits:
        got = ", ".join(f"{names[role]} {shape}" for role, shape in shapes.items())
        raise ValueError(f"layer {index}: the MLP tensors must be {expected} ([out, in]); got {got}")


def _pack_layer(source: _Checkpoint, names: dict[str, str], dtype):
    try:
        if "gate_up" in names:
            packed = pack_hf_concatenated(source.load(names["gate_up"]), dtype=dtype)
        else:
            packed = pack_hf(source.load(names["gate"]), source.load(names["up"]), dtype=dtype)
        down = _float_array(source.load(names["down"]), names["down"], HF_DOWN_LAYOUT).T
    except (TypeError, ValueError) as error:
        raise type(error)(f"{names['down'].rsplit('.', 2)[0]}: {error}") from error
    return packed, down if dtype is None else down.astype(dtype)


def hf_checkpoint(layers, *, gate: str | None = None, up: str | None = None,
                  down: str = HF_DOWN, gate_up: str | None = None) -> dict:
    """Inverse of :func:`pack_hf_checkpoint`: the MLP tensors of a Hugging Face state dict.

    ``layers`` is ``[(packed, w_down), ...]`` by layer; the result maps each pattern's name
    to a numpy array ``[out, in]`` (contiguous, as safetensors writes it), bit for bit what
    was packed. The patterns are :func:`pack_hf_checkpoint`'s.
    """
    roles = _patterns(gate, up, down, gate_up)
    tensors = {}
    for i, layer in enumerate(layers):
        if not (isinstance(layer, (tuple, list)) and len(layer) == 2):
            raise TypeError(f"layers[{i}] must be (packed, w_down), as pack_hf_checkpoint "
                            f"returns; got {type(layer).__name__}")
        packed, w_down = layer
        gate_t, up_t, down_t = linear_kernels(packed, w_down)  # [in, out]
        exported = ({"gate_up": jnp.concatenate([gate_t, up_t], axis=1), "down": down_t}
                    if "gate_up" in roles else {"gate": gate_t, "up": up_t, "down": down_t})
        for role, kernel in exported.items():
            tensors[roles[role].format(i=i)] = np.ascontiguousarray(np.asarray(kernel).T)
    return tensors


def save_hf_checkpoint(path, layers, *, tensors: Mapping | None = None,
                       gate: str | None = None, up: str | None = None, down: str = HF_DOWN,
                       gate_up: str | None = None, metadata: Mapping | None = None) -> None:
    """Writes :func:`hf_checkpoint` of ``layers`` to a ``.safetensors`` file at ``path``.

    ``tensors`` are the model's other tensors (embeddings, attention, norms) to write beside
    them; where one has the name of an exported MLP tensor, the exported one is written.
    ``metadata`` defaults to ``{"format": "pt"}``, which transformers' loader asks for.
    Needs the ``safetensors`` package (``pip install 'jax_swiglu[hf]'``).
    """
    safetensors = _safetensors()
    mlp = hf_checkpoint(layers, gate=gate, up=up, down=down, gate_up=gate_up)
    others = {name: np.ascontiguousarray(np.asarray(value))
              for name, value in (tensors or {}).items() if name not in mlp}
    safetensors.numpy.save_file({**others, **mlp}, str(path),
                                metadata=dict(metadata) if metadata is not None
                                else {"format": "pt"})


# --- expert MLPs of a checkpoint ---------------------------------------------------------------

# {i} the layer, {j} the expert. Qwen2/3-MoE and DeepSeek name expert tensors as dense MLPs
# under experts.{j}; Mixtral calls gate, up and down w1, w3 and w2.
HF_EXPERT_GATE = "model.layers.{i}.mlp.experts.{j}.gate_proj.weight"
HF_EXPERT_UP = "model.layers.{i}.mlp.experts.{j}.up_proj.weight"
HF_EXPERT_DOWN = "model.layers.{i}.mlp.experts.{j}.down_proj.weight"
MIXTRAL_EXPERT_GATE = "model.layers.{i}.block_sparse_moe.experts.{j}.w1.weight"
MIXTRAL_EXPERT_UP = "model.layers.{i}.block_sparse_moe.experts.{j}.w3.weight"
MIXTRAL_EXPERT_DOWN = "model.layers.{i}.block_sparse_moe.experts.{j}.w2.weight"


def _expert_patterns(gate, up, down) -> dict[str, str]:
    roles = {"gate": gate, "up": up, "down": down}
    for role, pattern in roles.items():
        rest = pattern.replace("{i}", "").replace("{j}", "") if isinstance(pattern, str) else "{"
        if ("{" in rest or "}" in rest or pattern.count("{i}") != 1
                or pattern.count("{j}") != 1):
            raise ValueError(f"{role}= must be a tensor name with {{i}} once for the layer and "
                             f"{{j}} once for the expert, e.g. {HF_EXPERT_GATE!r}; got {pattern!r}")
    return roles


def _expert_regex(pattern: str) -> tuple[re.Pattern, bool]:
    """The pattern as a regex, and whether {i} comes before {j} in it."""
    text = re.escape(pattern).replace(r"\{i\}", r"(\d+)").replace(r"\{j\}", r"(\d+)")
    return re.compile(text), pattern.index("{i}") < pattern.index("{j}")


def pack_hf_experts_checkpoint(checkpoint, *, gate: str = HF_EXPERT_GATE, up: str = HF_EXPERT_UP,
                               down: str = HF_EXPERT_DOWN,
                               dtype=None) -> dict[int, tuple[_layout.PackedExperts, jax.Array]]:
    """Packs every layer's expert MLPs: ``{layer: (experts, w_down)}``.

    For :func:`jax_swiglu.grouped_fused_mlp`: ``experts`` holds every expert's gate and up
    (``[E, K, 2 F_pad]``), ``w_down`` is ``[E, F, K]`` (each expert's ``down.weight.T``). Only
    the layers with expert tensors are returned (DeepSeek's first layers are dense: those
    are :func:`pack_hf_checkpoint`'s), each with experts 0 .. E-1 all present; routers and
    shared experts are left to the model. No dtype changes unless ``dtype=`` is given;
    :func:`hf_experts_checkpoint` exports back bit-exactly.

    Args:
      checkpoint: a state dict or ``.safetensors`` files, as for :func:`pack_hf_checkpoint`.
      gate, up, down: name patterns with ``{i}`` (layer) and ``{j}`` (expert), by default
        Qwen-MoE's and DeepSeek's :data:`HF_EXPERT_GATE` etc.; Mixtral's are
        :data:`MIXTRAL_EXPERT_GATE`, :data:`MIXTRAL_EXPERT_UP`, :data:`MIXTRAL_EXPERT_DOWN`.
      dtype: optional dtype for all of them.
    """
    roles = _expert_patterns(gate, up, down)
    with contextlib.ExitStack() as stack:
        source = _Checkpoint(checkpoint, stack)
        found: dict[int, dict[str, dict[int, str]]] = {}
        for role, pattern in roles.items():
            regex, layer_first = _expert_regex(pattern)
            for name in source.names:
                match = regex.fullmatch(name)
                if match:
                    a, b = int(match.group(1)), int(match.group(2))
                    layer, expert = (a, b) if layer_first else (b, a)
                    found.setdefault(layer, {}).setdefault(role, {})[expert] = name
        if not found:
            examples = [n for n in source.names if "expert" in n][:4] or source.names[:4]
            raise ValueError(f"no tensor of the checkpoint is named like gate={gate!r}; its names "
                             f"look like {examples}. Pass the patterns its expert tensors follow "
                             "(Mixtral's: MIXTRAL_EXPERT_GATE, MIXTRAL_EXPERT_UP, "
                             "MIXTRAL_EXPERT_DOWN)")
        return {layer: _pack_experts(source, layer, found[layer], roles, dtype)
                for layer in sorted(found)}


def _pack_experts(source: _Checkpoint, layer: int, names: dict[str, dict[int, str]],
                  roles: dict[str, str], dtype):
    count = max(max(by_expert) for by_expert in names.values()) + 1
    missing = [roles[role].format(i=layer, j=j) for role in roles for j in range(count)
               if j not in names.get(role, {})]
    if missing:
        raise ValueError(f"layer {layer} has experts 0 .. {count - 1}, but lacks {len(missing)} "
                         f"of their tensors: {missing[:4]}")
    shapes = {role: {source.shape(names[role][j]) for j in range(count)} for role in roles}
    gate_shape = next(iter(shapes["gate"]))
    if (any(len(found) != 1 for found in shapes.values()) or len(gate_shape) != 2
            or shapes["up"] != {gate_shape} or shapes["down"] != {gate_shape[::-1]}):
        raise ValueError(f"layer {layer}: every expert's gate and up must be [F, K] and down "
                         f"[K, F] ([out, in]), the same for all experts; got {shapes}")

    def stacked(role):
        return jnp.stack([jnp.asarray(_float_array(source.load(names[role][j]), names[role][j],
                                                   HF_GATE_UP_LAYOUT)).T for j in range(count)])
    experts = _layout.pack_expert_weights(stacked("gate"), stacked("up"), dtype=dtype)
    w_down = stacked("down")
    return experts, w_down if dtype is None else w_down.astype(dtype)


def hf_experts_checkpoint(layers: Mapping, *, gate: str = HF_EXPERT_GATE, up: str = HF_EXPERT_UP,
                          down: str = HF_EXPERT_DOWN) -> dict:
    """Inverse of :func:`pack_hf_experts_checkpoint`: the expert tensors of a state dict
    (numpy ``[out, in]``, bit for bit what was packed), from ``{layer: (experts, w_down)}``."""
    roles = _expert_patterns(gate, up, down)
    tensors = {}
    for layer, pair in layers.items():
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise TypeError(f"layers[{layer}] must be (experts, w_down), as "
                            f"pack_hf_experts_checkpoint returns; got {type(pair).__name__}")
        experts, w_down = pair
        gate_t, up_t = _layout.unpack_expert_weights(experts)  # [E, K, F]
        e, k, f = gate_t.shape
        if tuple(getattr(w_down, "shape", ())) != (e, f, k):
            raise ValueError(f"layers[{layer}]: w_down must be [E, F, K] = {(e, f, k)} for "
                             f"these experts (as pack_hf_experts_checkpoint returns it), got "
                             f"{tuple(getattr(w_down, 'shape', ())) or type(w_down).__name__}")
        for role, stack in (("gate", gate_t), ("up", up_t), ("down", w_down)):
            for j in range(stack.shape[0]):
                tensors[roles[role].format(i=layer, j=j)] = np.ascontiguousarray(
                    np.asarray(stack[j]).T)
    return tensors


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
