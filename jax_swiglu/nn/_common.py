"""What the nnx and linen modules share: the param layouts, conversion, the forward math.

The block is ``down(act(gate(x)) * up(x))`` with ``act`` SiLU (SwiGLU) or GELU's tanh form
(GeGLU, Gemma), the modules' ``activation`` (see :data:`jax_swiglu.ACTIVATIONS`).

Param layouts (plain nested dicts of arrays, as ``nnx.to_pure_dict(nnx.state(m, nnx.Param))``
and linen's ``variables["params"]`` give them; K = hidden size, N = intermediate size)::

    unfused       {"gate_proj": {"kernel": [K, N]}, "up_proj": {"kernel": [K, N]},
                   "down_proj": {"kernel": [N, K]}}                      3*K*N parameters
    concatenated  {"gate_up_proj": {"kernel": [K, 2*N]},      (gate in columns :N, then up)
                   "down_proj": {"kernel": [N, K]}}                      3*K*N parameters
    fused         {"gate_up_packed": {"kernel": [K, 2*N_pad]},         (packed, see _layout)
                   "down_proj": {"kernel": [N, K]}}               2*K*N_pad + N*K parameters

The concatenated layout is what Phi-3 and vLLM call ``gate_up_proj`` (as [in, out]); it is an
*input* layout here, read by name. The packed matrix has its own name, ``gate_up_packed``, so
a concatenation is never taken for it (the two have the same shape when N is a multiple of 32).
``N_pad`` is N rounded up to 32; the pad columns are zeros. Kernels are [in, out], as in
``nnx.Linear`` and ``linen.Dense``; Hugging Face checkpoints store [out, in].
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from .. import _layout, _reference, convert
from .._api import fused_mlp
from .._reference import check_activation, swiglu_reference

# Logical axis names of the parameters, for flax's logical sharding rules.
EMBED = "embed"  # hidden size K
MLP = "mlp"  # intermediate size N (packed gate/up pairs stay together along it)
GATE_UP_AXES = (EMBED, MLP)  # gate_proj, up_proj and the packed gate_up_packed
DOWN_AXES = (MLP, EMBED)

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


def check_kernel_dtype(dtype) -> None:
    """The fused modules compute in bfloat16 or float16, the kernels' dtypes. (Those that take
    ``dtype=None`` check the dtype it resolves to at call time instead.)"""
    if dtype is None or jnp.dtype(dtype) not in _layout.KERNEL_DTYPES:
        raise TypeError(
            f"the fused modules compute in bfloat16 or float16, got dtype="
            f"{dtype if dtype is None else jnp.dtype(dtype)}; keep param_dtype as you like (it "
            "is cast at call time)")


def compute_dtype(dtype, x, *kernels) -> jnp.dtype:
    """``dtype``, or for ``dtype=None`` what ``nnx.Linear(dtype=None)`` computes in: the
    promoted dtype of the input and the params."""
    if dtype is not None:
        return jnp.dtype(dtype)
    return jnp.dtype(jnp.result_type(*(jnp.dtype(a.dtype) for a in (x, *kernels))))


def check_fused_compute_dtype(dtype, x_dtype, param_dtype) -> None:
    """A fused module with ``dtype=None`` runs only where its input and params promote to a
    dtype the fused call runs (bfloat16, float16)."""
    if jnp.dtype(dtype) in _layout.KERNEL_DTYPES:
        return
    raise TypeError(
        f"this FusedSwiGLUMLP has dtype=None, so it computes in the promoted dtype of its input "
        f"({jnp.dtype(x_dtype)}) and params ({jnp.dtype(param_dtype)}): {jnp.dtype(dtype)}, "
        "but the fused block runs bfloat16 or float16. Cast the input (and store the params, "
        "param_dtype=) in bfloat16 or float16, or set dtype=jnp.bfloat16 (the params are cast "
        f"per call); SwiGLUMLP is the same block in plain XLA for {jnp.dtype(dtype)}")


def _two_names(names, what: str) -> tuple:
    names = (names,) if isinstance(names, str) else tuple(names)
    if len(names) == 3:
        # MaxText's stacked kernel [embed, num_activations, mlp]: the packed layout keeps each
        # gate/up pair inside the mlp axis, so the middle name has no axis of its own here.
        names = (names[0], names[2])
    if len(names) != 2 or not all(n is None or isinstance(n, (str, tuple)) for n in names):
        raise ValueError(
            f"{what} must name the gate/up kernel's two axes [in, out], e.g. ('embed', 'mlp'), "
            f"or be MaxText's three for its stacked kernel, ('embed', 'num_activations', "
            f"'mlp'); got {names!r}")
    return names


def logical_axes(kernel_axes=None, init_names=None) -> tuple[tuple, tuple]:
    """(gate/up axis names, down axis names) of the modules' params.

    ``kernel_axes`` are the names the caller gave, ``init_names`` those the initializer
    attached (``nnx.with_partitioning``); both name the gate/up kernel, [in, out]. Down,
    [N, K], gets the same names the other way round. Without either: ``('embed', 'mlp')``.
    """
    given = None if kernel_axes is None else _two_names(kernel_axes, "kernel_axes")
    drawn = None if init_names is None else _two_names(init_names, "kernel_init's axis names")
    if given is not None and drawn is not None and given != drawn:
        raise ValueError(f"kernel_axes={tuple(kernel_axes)!r} but kernel_init names the "
                         f"kernels {tuple(init_names)!r}; give the names once")
    names = given or drawn or GATE_UP_AXES
    return names, names[::-1]


# Attributes in which MLP implementations (ours included) name their activation, and what
# those names and functions are called here (jax.nn.gelu and nnx.gelu default to the tanh
# approximation, Hugging Face's "gelu" is the exact one, which no kernel has).
ACTIVATION_ATTRIBUTES = ("activation", "act_fn", "activation_fn", "hidden_act",
                         "hidden_activation")
_KNOWN_ACTIVATIONS = {
    **{name: name for name in _reference.ACTIVATIONS},
    "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
}
_KNOWN_ACTIVATION_FUNCTIONS = (
    *((function, name) for name, function in _reference.ACTIVATIONS.items()),
    (jax.nn.silu, "silu"), (jax.nn.gelu, "gelu_tanh"))


def stated_activation(block):
    """(attribute, our name or None if unknown) of an activation the block states, else None."""
    for attribute in ACTIVATION_ATTRIBUTES:
        value = getattr(block, attribute, None)
        if value is None:
            continue
        if isinstance(value, str):
            return attribute, _KNOWN_ACTIVATIONS.get(value.lower())
        if callable(value):
            for function, name in _KNOWN_ACTIVATION_FUNCTIONS:
                if value is function:
                    return attribute, name
            return attribute, None
    return None


# --- forward passes -------------------------------------------------------------------------

def fused_forward(x, gate_up, down, n: int, *, dtype, kernel: str, activation: str = "silu"):
    """``down(act(gate(x)) * up(x))`` through :func:`jax_swiglu.fused_mlp`, in ``dtype``.

    ``gate_up`` is the modules' own ``gate_up_packed`` kernel, packed when it was stored.
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
    tensors = convert._hf_layer_tensors(weights, with_down=True)
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


# --- whole param trees ----------------------------------------------------------------------

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
