"""Swap the gated MLP blocks of an existing ``flax.nnx`` model for :class:`FusedSwiGLUMLP`,
and its mixture-of-experts layers for :class:`FusedMoE`.

nnx models of the Llama family (tunix's Llama 3, Qwen 2/3 and Gemma 1/3/4, and this
package's :class:`~jax_swiglu.nn.SwiGLUMLP`) keep each MLP as a module holding three
bias-free linear layers, ``gate_proj`` and ``up_proj`` ([in, out] kernels ``[K, N]``) and
``down_proj`` (``[N, K]``), and compute ``down_proj(act(gate_proj(x)) * up_proj(x))``.
:func:`swap_mlp_blocks` replaces every such block, in place, by a :class:`FusedSwiGLUMLP`
holding the same weights, gate and up packed once (or, with ``fp8=True``, by an
:class:`Fp8SwiGLUMLP` with gate and up quantized once to e4m3). Its ``__call__(x)`` is the
block's.

The activation is in the block's code, which the helper cannot read: the caller names it
(``"silu"`` for Llama and Qwen, ``"gelu_tanh"`` for Gemma's ``nnx.gelu``). A block that
states its activation in an attribute (``activation``, ``act_fn``, ...) is checked against it.

A mixture-of-experts layer (tunix's Qwen3 ``MoELayer``) holds a ``router`` layer and the
experts' weights as bare params, ``gate_proj`` and ``up_proj`` ``[E, K, F]`` and ``down_proj``
``[E, F, K]``, and routes each token to its top-k experts by the router's softmax.
:func:`swap_moe_blocks` replaces every such layer by a :class:`FusedMoE` with the same router
and weights; the routing is in the layer's code too, so the caller states whether the chosen
experts' probabilities are renormalized (``normalize_top_k``).
"""

from __future__ import annotations

from collections.abc import MutableMapping, MutableSequence

import jax
import jax.numpy as jnp
from flax import nnx

from .. import _layout, _primitive, _quantize, _reference, selection
from . import _common
from .nnx import Fp8SwiGLUMLP, FusedExpertsMLP, FusedMoE, FusedSwiGLUMLP

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")

class _Block:
    """One gated MLP found in the model: where it is referenced, and what it converts to."""

    def __init__(self, module: nnx.Module, path: str):
        self.module = module
        self.path = path
        self.references: list[tuple[object, object]] = []  # (parent, key)
        self.dtype = None
        self.top_k = None  # a mixture-of-experts layer's experts per token


def _path(keys) -> str:
    return ".".join(map(str, keys)) or "<the model itself>"


def _is_gated_mlp(node) -> bool:
    # Projections that are layers; a mixture of experts keeps bare [E, K, N] params under
    # these names instead, which are not this block.
    return isinstance(node, nnx.Module) and all(
        isinstance(getattr(node, name, None), nnx.Module) for name in PROJECTIONS)


def _find_blocks(model, is_block=None, kind: str = "gated MLP block") -> list[_Block]:
    """Every block (by default, gated MLP) in ``model``'s graph, once each, with every
    reference to it."""
    is_block = is_block or _is_gated_mlp
    blocks: dict[int, _Block] = {}
    walked: set[int] = set()

    def walk(node, keys):
        if id(node) in walked:
            return
        walked.add(id(node))
        for key, child in nnx.iter_children(node):
            if is_block(child):
                block = blocks.setdefault(id(child), _Block(child, _path((*keys, key))))
                block.references.append((node, key))
            elif isinstance(child, nnx.Module):
                walk(child, (*keys, key))

    if is_block(model):
        raise ValueError(f"the model itself is a {kind}, which cannot be swapped in place: "
                         "build the fused module from its weights instead")
    walk(model, ())
    return list(blocks.values())


def _check(block: _Block, activation: str, dtype) -> None:
    """Raises ValueError, naming the block, unless it converts exactly; sets its dtype."""
    module, where = block.module, block.path
    projections = {name: getattr(module, name) for name in PROJECTIONS}
    kernels = {}
    for name, layer in projections.items():
        kernel = getattr(layer, "kernel", None)
        if not isinstance(kernel, nnx.Variable) or getattr(kernel, "ndim", None) != 2:
            raise ValueError(f"{where}.{name} is a {type(layer).__name__} without a 2-D "
                             "kernel param; only linear layers ([in, out] kernel) convert")
        if getattr(layer, "bias", None) is not None:
            raise ValueError(f"{where}.{name} has a bias; FusedSwiGLUMLP has none, so the "
                             "block cannot be swapped without changing its output")
        if getattr(layer, "dot_general", jax.lax.dot_general) is not jax.lax.dot_general:
            raise ValueError(f"{where}.{name} computes with a custom dot_general (quantized?), "
                             "which FusedSwiGLUMLP would drop")
        kernels[name] = kernel
    # Anything else the block holds (a norm, LoRA factors, statistics) would be lost.
    extra = sorted(_path(keys) for keys, _ in nnx.to_flat_state(nnx.state(module))
                   if not (len(keys) == 2 and keys[0] in PROJECTIONS and keys[1] == "kernel"))
    if extra:
        raise ValueError(f"{where} holds state besides the three kernels ({', '.join(extra)}), "
                         "which the fused block would drop")
    stated = _common.stated_activation(module)
    if stated is not None and stated[1] != activation:
        attribute, name = stated
        value = getattr(module, attribute)
        raise ValueError(
            f"{where}.{attribute} is {value!r}, " + (
                f"i.e. {name!r}, but activation={activation!r} was asked for" if name else
                "an activation FusedSwiGLUMLP does not have (it has "
                f"{', '.join(_reference.ACTIVATIONS)})"))

    k, n = kernels["gate_proj"].shape
    expected = {"gate_proj": (k, n), "up_proj": (k, n), "down_proj": (n, k)}
    shapes = {name: tuple(kernel.shape) for name, kernel in kernels.items()}
    if shapes != expected:
        raise ValueError(f"{where}: kernels {shapes} are not gate/up [K, N] and down [N, K]")
    try:
        _layout.check_alignment(k, n)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    dtypes = {jnp.dtype(kernel.dtype) for kernel in kernels.values()}
    if len(dtypes) != 1:
        raise ValueError(f"{where}: the three kernels have different dtypes "
                         f"{sorted(map(str, dtypes))}")
    # nnx.Linear(dtype=None) computes in its inputs' and kernel's promoted dtype; the
    # model's activations are the kernels' dtype when it runs in bfloat16 or float16.
    compute = dtype if dtype is not None else (
        getattr(projections["gate_proj"], "dtype", None) or dtypes.pop())
    try:
        _common.check_kernel_dtype(compute)
    except TypeError:
        raise ValueError(
            f"{where} computes in {jnp.dtype(compute)}; FusedSwiGLUMLP computes in bfloat16 "
            "or float16: cast the model's params (nnx.state / nnx.update) or pass "
            "dtype=jnp.bfloat16") from None
    block.dtype = jnp.dtype(compute)


def _convert(block: _Block, kernel: str, activation: str, fp8_scale: str | None,
             accumulation: str, fp8_down: bool = False) -> FusedSwiGLUMLP | Fp8SwiGLUMLP:
    gate, up, down = (getattr(block.module, name).kernel[...] for name in PROJECTIONS)
    if fp8_scale is not None:
        weights = _quantize.quantize_weights(gate, up, scale=fp8_scale)
        if fp8_down:
            down = _quantize.quantize_down(down, scale=fp8_scale)
        return Fp8SwiGLUMLP(weights, down, dtype=block.dtype, kernel=kernel,
                            activation=activation, accumulation=accumulation)
    unfused = {name: {"kernel": w} for name, w in zip(PROJECTIONS, (gate, up, down))}
    return FusedSwiGLUMLP.from_params(_common.fuse_params(unfused), dtype=block.dtype,
                                      kernel=kernel, activation=activation)


def _replace(parent, key, new) -> None:
    if isinstance(parent, (MutableSequence, MutableMapping)):  # nnx.List, nnx.Dict
        parent[key] = new
    else:
        setattr(parent, key, new)


def swap_mlp_blocks(model: nnx.Module, *, kernel: str = "auto", activation: str = "silu",
                    dtype=None, fp8: bool = False, fp8_scale: str = "per_channel",
                    accumulation: str = "promoted", fp8_down: bool = False) -> int:
    """Replaces, in place, every gated MLP block of ``model`` by a :class:`FusedSwiGLUMLP`
    (or, with ``fp8``, an :class:`Fp8SwiGLUMLP`).

    A block is a submodule with ``gate_proj``, ``up_proj`` and ``down_proj`` layers, each a
    bias-free linear layer with a 2-D ``kernel`` param ([in, out], as ``nnx.Linear``). Each
    is converted with the same weights (:func:`fuse_params`, then
    :meth:`FusedSwiGLUMLP.from_params`), stored in the kernels' own dtype, with this
    package's logical axis names (``embed``, ``mlp``) on the new params. Every reference
    to a shared block gets the same new one. All blocks are checked before any is replaced,
    so a refusal leaves the model as it was.

    The new block is ``__call__(x)`` like the old, without what the old one's code did
    around the three layers: a sharding constraint on the activations, or ``nnx.remat``
    (tunix's ``RematConfig.BLOCK``; wrap the fused call yourself to train that way).

    Args:
      model: an ``nnx.Module``; it is modified.
      kernel: ``"auto"``, ``"interleaved"`` or ``"xla"``, as in :func:`jax_swiglu.swiglu`.
      activation: what the blocks' code applies to the gate: ``"silu"`` (Llama, Qwen) or
        ``"gelu_tanh"`` (Gemma's ``nnx.gelu``, tanh approximation). The helper cannot see
        the code, so a wrong name here swaps the math silently, except where a block states
        its activation in an attribute, which must agree.
      dtype: the computation dtype (bfloat16 or float16); by default the layers' ``dtype``,
        else their kernels' dtype, as ``nnx.Linear(dtype=None)`` computes for inputs of that
        dtype.
      fp8: quantize each block's gate and up once to ``float8_e4m3fn``
        (:func:`jax_swiglu.quantize_weights`) and swap in an :class:`Fp8SwiGLUMLP`: the fused
        fp8 kernel on an SM90 GPU, x quantized per row on each call; the down projection
        stays in ``dtype`` unless ``fp8_down``. The model then matches the fp8 spec, not the
        original: fp8 weights and tokens carry a few percent of error each.
      fp8_scale: with ``fp8``, ``"per_channel"`` (a scale per gate/up column and per down
        output channel) or ``"per_tensor"``, as in :func:`jax_swiglu.quantize_weights`.
      accumulation: with ``fp8``, ``"promoted"`` or ``"fast"``, as in
        :func:`jax_swiglu.swiglu`.
      fp8_down: with ``fp8``, the down projection in fp8 too (:func:`jax_swiglu.quantize_down`:
        the gated activations quantized per row, XLA's scaled fp8 dot): the whole block.

    Returns:
      The number of blocks replaced.

    Raises:
      ValueError: naming the block's path, if one cannot be converted exactly (a bias,
        other state in the block, shapes not multiples of 8, a custom dot, a float32
        computation, an activation that disagrees), or if no block was found.
    """
    _reference.check_activation(activation)
    selection.check_kernel_name(kernel)
    if dtype is not None:
        _common.check_kernel_dtype(dtype)
    if not isinstance(fp8, bool):
        raise TypeError(f"fp8 must be True or False, got {fp8!r}")
    if fp8 and fp8_scale not in _quantize.SCALE_MODES:
        raise ValueError(f"fp8_scale must be one of {_quantize.SCALE_MODES}, got {fp8_scale!r}")
    if not isinstance(fp8_down, bool):
        raise TypeError(f"fp8_down must be True or False, got {fp8_down!r}")
    if fp8_down and not fp8:
        raise ValueError("fp8_down=True quantizes the down projection of fp8 blocks: pass "
                         "fp8=True too")
    _primitive.check_accumulation(accumulation, fp8)
    if not isinstance(model, nnx.Module):
        raise TypeError(f"swap_mlp_blocks takes an nnx.Module, got {type(model).__name__}")
    blocks = _find_blocks(model)
    if not blocks:
        raise ValueError(
            f"found no gated MLP block in the {type(model).__name__}: no submodule with "
            f"{', '.join(PROJECTIONS)} layers (another naming, a fused or MoE MLP?)")
    for block in blocks:
        _check(block, activation, dtype)
    # One at a time, so the old block's weights can go before the next is packed.
    for block in blocks:
        fused = _convert(block, kernel, activation, fp8_scale if fp8 else None, accumulation,
                         fp8_down)
        for parent, key in block.references:
            _replace(parent, key, fused)
        block.module = None
    return len(blocks)


# --- mixture-of-experts layers -----------------------------------------------------------------

TOP_K_ATTRIBUTES = ("experts_per_tok", "num_experts_per_tok", "top_k")


def _is_moe_layer(node) -> bool:
    # A router layer beside the experts' bare [E, ., .] params (not layers: that is a dense MLP).
    return (isinstance(node, nnx.Module) and isinstance(getattr(node, "router", None), nnx.Module)
            and all(isinstance(getattr(node, name, None), nnx.Variable)
                    and getattr(getattr(node, name), "ndim", None) == 3 for name in PROJECTIONS))


def _check_moe(block: _Block, top_k, activation: str, dtype) -> None:
    """Raises ValueError, naming the layer, unless it converts exactly; sets its dtype and
    top_k."""
    module, where = block.module, block.path
    router = module.router
    kernel = getattr(router, "kernel", None)
    if not isinstance(kernel, nnx.Variable) or getattr(kernel, "ndim", None) != 2:
        raise ValueError(f"{where}.router is a {type(router).__name__} without a 2-D kernel "
                         "param; only a linear router ([in, experts] kernel) converts")
    if getattr(router, "bias", None) is not None:
        raise ValueError(f"{where}.router has a bias, which FusedMoE's routing does not add")
    extra = sorted(_path(keys) for keys, _ in nnx.to_flat_state(nnx.state(module))
                   if tuple(keys) not in {(name,) for name in PROJECTIONS} | {("router", "kernel")})
    if extra:
        raise ValueError(f"{where} holds state besides the router and expert weights "
                         f"({', '.join(extra)}), which FusedMoE would drop")
    if top_k is None:
        found = [getattr(module, name) for name in TOP_K_ATTRIBUTES
                 if isinstance(getattr(module, name, None), int)]
        if not found:
            raise ValueError(f"{where} states no experts per token (none of "
                             f"{', '.join(TOP_K_ATTRIBUTES)}): pass top_k=")
        top_k = found[0]
    stated = _common.stated_activation(module)
    if stated is not None and stated[1] != activation:
        raise ValueError(f"{where}.{stated[0]} is {getattr(module, stated[0])!r}, but "
                         f"activation={activation!r} was asked for")
    gate, up, down = (getattr(module, name) for name in PROJECTIONS)
    e, k, f = gate.shape
    shapes = {name: tuple(getattr(module, name).shape) for name in PROJECTIONS}
    if shapes != {"gate_proj": (e, k, f), "up_proj": (e, k, f), "down_proj": (e, f, k)} \
            or tuple(kernel.shape) != (k, e):
        raise ValueError(f"{where}: weights {shapes} and router {tuple(kernel.shape)} are not "
                         "gate/up [E, K, F], down [E, F, K] and router [K, E]")
    if not 1 <= top_k <= e:
        raise ValueError(f"{where}: top_k={top_k} but the layer has {e} experts")
    try:
        _layout.check_alignment(k, f)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    dtypes = {jnp.dtype(w.dtype) for w in (gate, up, down)}
    if len(dtypes) != 1:
        raise ValueError(f"{where}: the expert weights have different dtypes "
                         f"{sorted(map(str, dtypes))}")
    compute = dtype if dtype is not None else (getattr(module, "dtype", None) or dtypes.pop())
    try:
        _common.check_kernel_dtype(compute)
    except TypeError:
        raise ValueError(
            f"{where} computes in {jnp.dtype(compute)}; FusedMoE computes in bfloat16 or "
            "float16: pass dtype=jnp.bfloat16") from None
    block.dtype = jnp.dtype(compute)
    block.top_k = top_k


def _convert_moe(block: _Block, activation: str, normalize_top_k: bool,
                 expert_axis) -> FusedMoE:
    module = block.module
    gate, up, down = (getattr(module, name)[...] for name in PROJECTIONS)
    experts = FusedExpertsMLP.from_experts(_layout.pack_expert_weights(gate, up), down,
                                           dtype=block.dtype, activation=activation,
                                           expert_axis=expert_axis)
    return FusedMoE(module.router, experts, block.top_k, normalize_top_k=normalize_top_k)


def swap_moe_blocks(model: nnx.Module, *, normalize_top_k: bool = True, top_k: int | None = None,
                    activation: str = "silu", dtype=None, expert_axis: str | None = None) -> int:
    """Replaces, in place, every mixture-of-experts layer of ``model`` by a :class:`FusedMoE`.

    A layer is a submodule with a ``router`` linear layer (``[K, E]`` kernel, no bias) and the
    experts' weights as params ``gate_proj`` and ``up_proj`` ``[E, K, F]`` and ``down_proj``
    ``[E, F, K]`` (tunix's Qwen3 ``MoELayer``). The new layer keeps the router and computes
    the same routing: softmax of the router's logits in float32, the top ``top_k``
    (renormalized with ``normalize_top_k``), the experts as one grouped call
    (:func:`jax_swiglu.grouped_fused_mlp`) and their weighted sum. All layers are checked
    before any is replaced. What the old layer's code did besides (sharding constraints, a
    TPU kernel path) is not carried over; ``expert_axis`` splits the experts over a mesh axis.

    Args:
      model: an ``nnx.Module``; it is modified.
      normalize_top_k: whether the layers renormalize the chosen experts' probabilities to sum
        to 1 (Qwen3-MoE, Mixtral and tunix do; Qwen1.5/2-MoE and OLMoE do not). The helper
        cannot read the layers' code: a wrong value changes the outputs silently.
      top_k: experts per token; by default the layer's ``experts_per_tok`` (tunix),
        ``num_experts_per_tok`` or ``top_k`` attribute.
      activation: what the experts apply to the gate (``"silu"`` for every model here).
      dtype: the computation dtype (bfloat16 or float16); by default the layer's ``dtype``
        attribute, else its weights' dtype.
      expert_axis: as in :func:`jax_swiglu.grouped_fused_mlp`.

    Returns:
      The number of layers replaced.

    Raises:
      ValueError: naming the layer's path, if one cannot be converted exactly, or if none was
        found.
    """
    _reference.check_activation(activation)
    if dtype is not None:
        _common.check_kernel_dtype(dtype)
    if not isinstance(model, nnx.Module):
        raise TypeError(f"swap_moe_blocks takes an nnx.Module, got {type(model).__name__}")
    blocks = _find_blocks(model, _is_moe_layer, "mixture-of-experts layer")
    if not blocks:
        raise ValueError(
            f"found no mixture-of-experts layer in the {type(model).__name__}: no submodule with "
            f"a router layer and {', '.join(PROJECTIONS)} params [E, ., .]")
    for block in blocks:
        _check_moe(block, top_k, activation, dtype)
    for block in blocks:
        fused = _convert_moe(block, activation, normalize_top_k, expert_axis)
        for parent, key in block.references:
            _replace(parent, key, fused)
        block.module = None
    return len(blocks)
