"""What the nnx and linen modules share: the param layouts, their names, the forward math.

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

import jax
import jax.numpy as jnp

from .. import _layout, _reference
from .._api import fused_mlp
from .._reference import check_activation, swiglu_reference  # noqa: F401 (the modules use it)
# The param-tree conversions are flax-free and live in convert; the modules use them from here.
from ..convert import (  # noqa: F401
    CONCATENATED_IS_NOT_PACKED, CONCATENATED_KEYS, FUSED_KEYS, HF_CONCATENATED_KEYS, HF_KEYS,
    UNFUSED_KEYS, check_fused_keys, fuse_hf_weights, fuse_mlp_blocks, fuse_params,
    fused_to_hf_weights, kernel_of, unfuse_mlp_blocks, unfuse_params)

# Logical axis names of the parameters, for flax's logical sharding rules.
EMBED = "embed"  # hidden size K
MLP = "mlp"  # intermediate size N (packed gate/up pairs stay together along it)
GATE_UP_AXES = (EMBED, MLP)  # gate_proj, up_proj and the packed gate_up_packed
DOWN_AXES = (MLP, EMBED)
# The expert blocks' kernels, [E, in, out]: one more leading axis.
EXPERT = "expert"
EXPERT_GATE_UP_AXES = (EXPERT,) + GATE_UP_AXES
EXPERT_DOWN_AXES = (EXPERT,) + DOWN_AXES



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


# Attributes in which MLP implementations (ours included) name their activation; what their
# names and functions are called here is _reference.activation_name's.
ACTIVATION_ATTRIBUTES = ("activation", "act_fn", "activation_fn", "hidden_act",
                         "hidden_activation")


def stated_activation(block):
    """(attribute, our name or None if unknown) of an activation the block states, else None."""
    for attribute in ACTIVATION_ATTRIBUTES:
        value = getattr(block, attribute, None)
        if value is None:
            continue
        if isinstance(value, str):  # model configs spell them in any case
            return attribute, _reference.activation_name(value.lower())
        if callable(value):
            return attribute, _reference.activation_name(value)
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
