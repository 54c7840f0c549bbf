"""Mixture-of-experts: the gated MLP of every expert over tokens grouped by expert.

    experts = jax_swiglu.pack_expert_weights(w_gate, w_up)     # [E, K, F] each, once
    y = jax_swiglu.grouped_swiglu(x, experts, group_sizes)      # x [T, K] sorted by expert

The ``jax.lax.ragged_dot`` convention: ``x``'s rows are sorted by expert, ``group_sizes[e]``
rows for expert ``e`` in expert order; rows past the sum are not any expert's and give
zeros. Each expert's gate and up weights are packed in the dense kernels' layout
(jax_swiglu/_layout.py, the one definition), stacked along a leading expert axis.

On an SM90 GPU, bfloat16 and float16 calls run the grouped fused kernel: one persistent
grid over every expert's tiles, walked from the group sizes on the device (no host sync; the
shapes XLA sees stay static), with the dense kernels' pairing epilogue, so the ``[T, 2F]``
gate/up product never reaches HBM. Elsewhere (and for other dtypes, callable activations or
``kernel="xla"``) the spec runs in plain XLA: one ``ragged_dot`` over the packed weights
with fp32 accumulation, the split, ``act(g) * u`` in fp32 and one rounding.
``explain_grouped`` says what runs.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from . import _launch, _layout, _native, _primitive, _reference, selection
from ._reference import defined_group_sizes  # noqa: F401  (public here since wave 3)


@jax.tree_util.register_pytree_node_class
class PackedExperts:
    """Every expert's gate and up weights in the packed layout: ``data`` ``[E, K, 2 F_pad]``.

    Built by :func:`pack_expert_weights`; like :class:`PackedWeights` a pytree whose only
    leaf is ``data``, with no public constructor from an array (a packed expert matrix and a
    concatenation have the same shape). :meth:`from_packed_data` wraps data packed before.
    """

    __slots__ = ("data", "n", "layout")

    def __init__(self, *args, **kwargs):
        raise TypeError(
            "PackedExperts is not built from an array directly: use "
            "jax_swiglu.pack_expert_weights(w_gate, w_up) for [E, K, F] gate and up weights, or "
            "PackedExperts.from_packed_data(data, n) for data already packed (a saved "
            "experts.data)")

    @classmethod
    def _wrap(cls, data: Any, n: int, layout: str) -> PackedExperts:
        experts = object.__new__(cls)
        object.__setattr__(experts, "data", data)
        object.__setattr__(experts, "n", n)
        object.__setattr__(experts, "layout", layout)
        return experts

    @classmethod
    def from_packed_data(cls, data: Any, n: int, *,
                         layout: str = _layout.LAYOUT) -> PackedExperts:
        """Wraps ``data`` ``[E, K, 2 F_pad]`` that is **already** in the packed layout."""
        if not (hasattr(data, "shape") and hasattr(data, "dtype")):
            raise TypeError(f"data must be an array [E, K, 2 * F_pad], got {type(data).__name__}")
        if isinstance(n, bool) or not hasattr(n, "__index__"):
            raise TypeError(f"n must be an int (F, each expert's gate and up columns), got {n!r}")
        experts = cls._wrap(data, int(n), layout)
        experts.validate()
        return experts

    def __setattr__(self, name, value):
        raise AttributeError(f"PackedExperts is immutable; cannot set {name!r}")

    def __repr__(self):
        return f"PackedExperts(data={self.data!r}, n={self.n}, layout={self.layout!r})"

    def tree_flatten(self):
        return (self.data,), (self.n, self.layout)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls._wrap(children[0], *aux)

    @property
    def experts(self) -> int:
        return self.data.shape[0]

    @property
    def k(self) -> int:
        return self.data.shape[1]

    @property
    def dtype(self):
        return self.data.dtype

    def validate(self) -> None:
        shape = tuple(self.data.shape)
        if self.layout != _layout.LAYOUT:
            raise ValueError(f"PackedExperts uses layout {self.layout!r}, but this version of "
                             f"jax_swiglu reads {_layout.LAYOUT!r}; pack the weights again")
        if not jnp.issubdtype(self.data.dtype, jnp.floating):
            raise TypeError(f"PackedExperts data must be floating point, got {self.data.dtype}")
        if (len(shape) != 3 or shape[0] == 0 or self.n <= 0
                or shape[2] != 2 * _layout.padded_n(self.n)):
            raise ValueError(
                f"PackedExperts data has shape {shape}, but n={self.n} needs "
                f"[E, K, {2 * _layout.padded_n(max(self.n, 1))}] with E >= 1; it was not built "
                "by jax_swiglu.pack_expert_weights (or was modified since)")


def pack_expert_weights(w_gate, w_up=None, *, layout: str | None = None,
                        dtype=None) -> PackedExperts:
    """Packs every expert's gate and up weights for :func:`grouped_swiglu`.

    The same source layouts as :func:`jax_swiglu.pack_weights`, with a leading expert axis:
    ``pack_expert_weights(w_gate, w_up)`` with ``[E, K, F]`` each; one ``[E, K, 2, F]``
    array (stacked); ``layout="concatenated"`` for one ``[E, K, 2F]`` array
    ``[gate | up]``. Kernels are ``[in, out]`` (``x @ w``). The arguments are not modified;
    :func:`unpack_expert_weights` gives them back exactly.
    """
    if w_up is None:
        if not (hasattr(w_gate, "shape") and hasattr(w_gate, "dtype")):
            raise TypeError(f"pack_expert_weights takes arrays, got {type(w_gate).__name__}")
        shape = tuple(w_gate.shape)
        if layout == "concatenated" and len(shape) == 3 and shape[2] % 2 == 0:
            w_gate, w_up = w_gate[..., :shape[2] // 2], w_gate[..., shape[2] // 2:]
        elif layout in (None, "stacked") and len(shape) == 4 and shape[2] == 2:
            w_gate, w_up = w_gate[:, :, 0], w_gate[:, :, 1]
        else:
            raise ValueError(
                "pack_expert_weights takes w_gate and w_up [E, K, F] each, one stacked "
                "[E, K, 2, F] array, or with layout='concatenated' one [E, K, 2F] array "
                f"[gate | up]; got one array of shape {shape} (layout={layout!r})")
    elif layout not in (None, "separate"):
        raise ValueError(f"layout={layout!r} is one array: pass it alone; two arrays are "
                         "layout='separate'")
    for name, w in (("w_gate", w_gate), ("w_up", w_up)):
        if not (hasattr(w, "shape") and hasattr(w, "dtype")) or w.ndim != 3:
            raise ValueError(f"{name} must be [E, K, F], got "
                             f"{tuple(getattr(w, 'shape', ())) or type(w).__name__}")
        if not jnp.issubdtype(w.dtype, jnp.floating):
            raise TypeError(f"{name} must be a floating-point array, got dtype {w.dtype}")
    if w_gate.shape != w_up.shape:
        raise ValueError(f"w_gate {tuple(w_gate.shape)} and w_up {tuple(w_up.shape)} must have "
                         "the same shape")
    if w_gate.dtype != w_up.dtype and dtype is None:
        raise TypeError(f"w_gate ({w_gate.dtype}) and w_up ({w_up.dtype}) have different "
                        "dtypes; pass dtype= to cast both")
    experts, k, n = w_gate.shape
    if experts == 0:
        raise ValueError("pack_expert_weights needs at least one expert (E >= 1)")
    _layout.check_alignment(k, n)
    if dtype is not None:
        w_gate, w_up = w_gate.astype(dtype), w_up.astype(dtype)
    pad = [(0, 0), (0, 0), (0, _layout.padded_n(n) - n)]
    data = _layout.interleave_gate_up(jnp.pad(w_gate, pad), jnp.pad(w_up, pad))
    return PackedExperts._wrap(data, n, _layout.LAYOUT)


def unpack_expert_weights(experts: PackedExperts):
    """Inverse of :func:`pack_expert_weights`, exact: ``(w_gate, w_up)``, ``[E, K, F]`` each."""
    experts = _as_experts(experts)
    return _layout.split_gate_up(experts.data, experts.n)


def _as_experts(experts) -> PackedExperts:
    if not isinstance(experts, PackedExperts):
        raise TypeError(f"experts must be PackedExperts (jax_swiglu.pack_expert_weights), got "
                        f"{type(experts).__name__}")
    experts.validate()
    return experts


def _check_grouped_call(x, experts: PackedExperts, group_sizes) -> None:
    if not (hasattr(x, "shape") and hasattr(x, "dtype")) or x.ndim != 2:
        raise ValueError(f"x must be [T, K] (tokens sorted by expert), got "
                         f"{tuple(getattr(x, 'shape', ())) or type(x).__name__}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x must be a floating-point array, got {x.dtype}")
    if x.dtype != experts.dtype:
        raise TypeError(f"x is {x.dtype} but the expert weights are {experts.dtype}; they must "
                        "match")
    if x.shape[1] != experts.k:
        raise ValueError(f"x has K={x.shape[1]} (shape {tuple(x.shape)}) but the expert weights "
                         f"have K={experts.k}")
    if not (hasattr(group_sizes, "shape") and hasattr(group_sizes, "dtype")):
        raise TypeError(f"group_sizes must be an int32 array [E], got "
                        f"{type(group_sizes).__name__}")
    if jnp.dtype(group_sizes.dtype) != jnp.dtype(jnp.int32):
        raise TypeError(f"group_sizes must be int32 (as jax.lax.ragged_dot takes them), got "
                        f"{group_sizes.dtype}")
    if tuple(group_sizes.shape) != (experts.experts,):
        raise ValueError(f"group_sizes must have one size per expert, shape "
                         f"({experts.experts},), got {tuple(group_sizes.shape)}")


GROUPED_KERNELS = ("auto", "interleaved", "xla")


def _requested(kernel: str, launch, x, experts: PackedExperts, activation):
    """The kernel (``JAX_SWIGLU_KERNEL`` resolved as for dense calls), the forced launch as
    a ``Launch`` checked where no M is needed, and why only the XLA path can run the call
    (None if the kernel may)."""
    kernel = selection.requested_kernel(kernel)
    if kernel not in GROUPED_KERNELS:
        raise ValueError(f"kernel={kernel!r}: grouped calls run kernel='auto', 'interleaved' "
                         "(the grouped fused kernel) or 'xla'")
    why = None
    if jnp.dtype(x.dtype) not in _layout.KERNEL_DTYPES:
        why = f"the grouped kernel takes bfloat16 or float16, x is {jnp.dtype(x.dtype)}"
    elif not isinstance(activation, str):
        why = (f"the activation {_reference.activation_label(activation)} is a callable; the "
               f"kernels compile {', '.join(_reference.ACTIVATIONS)}")
    if why and (launch is not None or kernel == "interleaved"):
        asked = f"launch={launch}" if launch is not None else f"kernel={kernel!r}"
        raise ValueError(f"{asked} cannot run this call: {why}. kernel='auto' or 'xla' runs "
                         "it on the XLA path")
    if launch is None:
        return kernel, None, why
    launch = _launch.parse(launch)
    if kernel == "xla":
        raise ValueError(f"launch={launch} and kernel='xla' ask for two different paths")
    if _native.kernels_available():
        problem = selection.GroupedProblem(max(1, x.shape[0]), experts.n, experts.k,
                                           experts.experts, jnp.dtype(x.dtype).name)
        selection.check_forced_grouped_launch(launch, problem)
    return kernel, launch, why


def grouped_swiglu(x, experts, group_sizes, *, kernel: str = "auto", launch=None,
                   activation="silu"):
    """``act(x @ W_gate[e]) * (x @ W_up[e])`` for every row's expert ``e``.

    Args:
      x: ``[T, K]``, rows sorted by expert (``jax.lax.ragged_dot``'s convention).
      experts: :class:`PackedExperts` from :func:`pack_expert_weights`, ``x``'s dtype.
      group_sizes: ``[E]`` int32, rows per expert in order; rows past their sum give zeros.
        Negative sizes count as 0 and a sum over T ends the groups at T
        (:func:`defined_group_sizes`), so a size computed on the device never gives an
        undefined result.
      kernel: ``"auto"`` (the grouped fused kernel on an SM90 GPU, else XLA),
        ``"interleaved"`` (the grouped kernel, an error where it cannot run) or ``"xla"``.
      launch: one grouped row to run (a row of :func:`jax_swiglu.kernel_configs` whose
        ``grouped`` is true, or its id), instead of the selection's.
      activation: as in :func:`jax_swiglu.swiglu` (names, aliases, callables).

    Returns:
      ``[T, F]`` in ``x``'s dtype: fp32 accumulation and math, rounded once. The fused
      kernel is inference-only (no gradient); :func:`grouped_swiglu_reference` is the same
      math in plain XLA, and float32/float64 calls run that path.
    """
    activation = _reference.resolve_activation(activation)
    experts = _as_experts(experts)
    _check_grouped_call(x, experts, group_sizes)
    kernel, launch, why = _requested(kernel, launch, x, experts, activation)
    if why:
        return _reference.grouped_swiglu_reference_packed(x, experts.data, group_sizes,
                                                          experts.n, activation)
    return _primitive.grouped_swiglu_p.bind(
        x, experts.data, group_sizes, n=experts.n, kernel=kernel, launch=launch,
        activation=activation, out_dtype=jnp.dtype(x.dtype).name)


def grouped_fused_mlp(x, experts, w_down, group_sizes, *, kernel: str = "auto", launch=None,
                      activation="silu"):
    """Every row's expert MLP block: ``grouped_swiglu(...) @ W_down[e]``.

    ``w_down`` is ``[E, F, K_out]`` in ``x``'s dtype; the down projection is a
    ``ragged_dot`` over the same groups (fp32 accumulation, one rounding); ``kernel``,
    ``launch`` and ``activation`` are :func:`grouped_swiglu`'s.
    """
    experts = _as_experts(experts)
    if (not hasattr(w_down, "shape") or w_down.ndim != 3
            or tuple(w_down.shape[:2]) != (experts.experts, experts.n)):
        raise ValueError(f"w_down must be [E, F, K_out] with E={experts.experts}, F={experts.n}, "
                         f"got {tuple(getattr(w_down, 'shape', ())) or type(w_down).__name__}")
    _check_grouped_call(x, experts, group_sizes)
    if w_down.dtype != x.dtype:
        raise TypeError(f"w_down is {w_down.dtype} but x is {x.dtype}; they must match")
    y = grouped_swiglu(x, experts, group_sizes, kernel=kernel, launch=launch,
                       activation=activation)
    out = jax.lax.ragged_dot(y, w_down, defined_group_sizes(group_sizes, x.shape[0]),
                             preferred_element_type=jnp.promote_types(x.dtype, jnp.float32),
                             precision=_reference.dot_precision(x.dtype))
    return out.astype(x.dtype)


def grouped_swiglu_reference(x, w_gate, w_up, group_sizes, *, activation="silu"):
    """The spec of :func:`grouped_swiglu` on unpacked ``[E, K, F]`` weights: per row, its
    expert's gate and up products in fp32 (two ``ragged_dot``), ``act(g) * u`` in fp32, one
    rounding. Plain XLA, differentiable."""
    sizes = defined_group_sizes(group_sizes, x.shape[0])
    accumulate = jnp.promote_types(x.dtype, jnp.float32)
    gate, up = (jax.lax.ragged_dot(x, w, sizes, preferred_element_type=accumulate,
                                   precision=_reference.dot_precision(x.dtype))
                for w in (w_gate, w_up))
    return _reference.gated(gate, up, activation).astype(x.dtype)


def explain_grouped(x, experts, group_sizes, *, kernel: str = "auto", launch=None,
                    activation="silu", platform: str | None = None) -> str:
    """What a grouped call with these shapes runs, and why (no call is made). ``x`` may be an
    array or a ``jax.ShapeDtypeStruct``; ``platform`` defaults to the default backend."""
    activation = _reference.resolve_activation(activation)
    experts = _as_experts(experts)
    _check_grouped_call(x, experts, group_sizes)
    kernel, launch, why = _requested(kernel, launch, x, experts, activation)
    platform = platform or jax.default_backend()
    platform = "cuda" if platform == "gpu" else platform
    header = (f"T={x.shape[0]} E={experts.experts} F={experts.n} K={experts.k} {x.dtype} "
              f"{_reference.activation_label(activation)} on {platform}: ")
    xla = ("runs plain XLA (one ragged_dot over the packed expert weights, then act(g) * u "
           "in fp32)")
    if why:
        return header + f"{xla}, since {why}\n  details: xla (the XLA reference)"
    problem = selection.GroupedProblem(x.shape[0], experts.n, experts.k, experts.experts,
                                       jnp.dtype(x.dtype).name, activation)
    choice = selection.choose_grouped(problem, kernel=kernel, launch=launch, platform=platform)
    if choice.launch is None:
        return header + f"{xla}, since {choice.reason}\n  details: " + choice.describe(problem)
    return (header + f"runs the grouped fused kernel config {choice.launch.config} "
            f"({choice.launch.row.in_words()}), {choice.reason.split(' (', 1)[0]}\n  details: "
            + choice.describe(problem))
