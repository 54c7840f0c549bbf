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

Expert parallelism: with ``expert_axis`` (a mesh axis name), the experts' leading axis is
split over that axis's devices and each device runs its own experts' rows only (module
section "Expert parallelism" below).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from . import _launch, _layout, _native, _primitive, _reference, selection
from ._layout import PackedExperts, _as_experts
from ._reference import defined_group_sizes  # noqa: F401  (public here since wave 3)


def _check_grouped_call(x, experts: PackedExperts, group_sizes, *,
                        total_experts: int | None = None) -> None:
    """``total_experts``: the whole call's expert count where ``experts`` holds one device's
    (inside a manual context over the expert axis)."""
    total_experts = experts.experts if total_experts is None else total_experts
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
    if tuple(group_sizes.shape) != (total_experts,):
        raise ValueError(f"group_sizes must have one size per expert, shape "
                         f"({total_experts},), got {tuple(group_sizes.shape)}")


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
                   activation="silu", expert_axis: str | None = None, mesh=None):
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
      expert_axis: a mesh axis to split the experts over (expert parallelism): each device
        holds ``E / devices`` experts and computes their rows; ``x`` and ``group_sizes`` are
        the whole call's, replicated along that axis, and so is the result (one all-reduce).
        Inside a ``shard_map`` over that axis, ``experts`` is the device's own slice
        (``E / devices`` experts, in order) and ``group_sizes`` stays global ``[E]``.
      mesh: the mesh of ``expert_axis``; by default the current one (``jax.set_mesh``).

    Returns:
      ``[T, F]`` in ``x``'s dtype: fp32 accumulation and math, rounded once. The fused
      kernel is inference-only (no gradient); :func:`grouped_swiglu_reference` is the same
      math in plain XLA, and float32/float64 calls run that path.
    """
    activation = _reference.resolve_activation(activation)
    experts = _as_experts(experts)
    if expert_axis is not None:
        return _over_expert_axis(
            functools.partial(grouped_swiglu, kernel=kernel, launch=launch,
                              activation=activation),
            x, experts, group_sizes, (), expert_axis, mesh)
    _check_grouped_call(x, experts, group_sizes)
    kernel, launch, why = _requested(kernel, launch, x, experts, activation)
    if why:
        return _reference.grouped_swiglu_reference_packed(x, experts.data, group_sizes,
                                                          experts.n, activation)
    return _primitive.grouped_swiglu_p.bind(
        x, experts.data, group_sizes, n=experts.n, kernel=kernel, launch=launch,
        activation=activation, out_dtype=jnp.dtype(x.dtype).name)


def grouped_fused_mlp(x, experts, w_down, group_sizes, *, kernel: str = "auto", launch=None,
                      activation="silu", expert_axis: str | None = None, mesh=None):
    """Every row's expert MLP block: ``grouped_swiglu(...) @ W_down[e]``.

    ``w_down`` is ``[E, F, K_out]`` in ``x``'s dtype; the down projection is a
    ``ragged_dot`` over the same groups (fp32 accumulation, one rounding); ``kernel``,
    ``launch``, ``activation``, ``expert_axis`` and ``mesh`` are :func:`grouped_swiglu`'s
    (with ``expert_axis``, ``w_down`` is split over the experts too, and the one all-reduce
    is of the ``[T, K_out]`` result).
    """
    experts = _as_experts(experts)
    if (not hasattr(w_down, "shape") or w_down.ndim != 3
            or tuple(w_down.shape[:2]) != (experts.experts, experts.n)):
        raise ValueError(f"w_down must be [E, F, K_out] with E={experts.experts}, F={experts.n}, "
                         f"got {tuple(getattr(w_down, 'shape', ())) or type(w_down).__name__}")
    if hasattr(x, "dtype") and w_down.dtype != x.dtype:
        raise TypeError(f"w_down is {w_down.dtype} but x is {x.dtype}; they must match")
    if expert_axis is not None:
        def own_mlp(x, experts, group_sizes, w_down):
            return grouped_fused_mlp(x, experts, w_down, group_sizes, kernel=kernel,
                                     launch=launch, activation=activation)
        return _over_expert_axis(own_mlp, x, experts, group_sizes, (w_down,), expert_axis,
                                 mesh)
    _check_grouped_call(x, experts, group_sizes)
    y = grouped_swiglu(x, experts, group_sizes, kernel=kernel, launch=launch,
                       activation=activation)
    out = _reference.ragged_product(y, w_down, defined_group_sizes(group_sizes, x.shape[0]))
    return out.astype(x.dtype)


# --- Expert parallelism --------------------------------------------------------------------
# Tokens replicated along the expert axis, experts split over it: device d holds experts
# [d*E_d, (d+1)*E_d), whose rows are one contiguous run of x (rows are sorted by expert). The
# device rolls x so that run starts at row 0, runs the grouped call on its own experts' group
# sizes (every other row then lies past their sum: zeros), rolls the result back, and one
# all-reduce adds the devices' disjoint rows. Adding zeros is exact, so the result is the
# single-device call's, bit for bit.

def _mesh_of(axis: str, mesh):
    context = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
    if context is None or context.empty or axis not in context.axis_names:
        raise ValueError(
            f"expert_axis={axis!r} is not an axis of "
            + ("the mesh given" if mesh is not None else "the current mesh (none is set: pass "
               "mesh=, or call under jax.set_mesh(mesh))")
            + (f"; its axes are {tuple(context.axis_names)}"
               if context is not None and not context.empty else ""))
    return context


def _own_experts_call(call, x, experts: PackedExperts, group_sizes, extras, axis: str):
    """Inside a manual context over ``axis``: this device's experts' rows through ``call``,
    every row of the result in place, the devices' results summed."""
    devices = jax.lax.axis_size(axis)
    total = experts.experts * devices
    if hasattr(group_sizes, "shape") and tuple(group_sizes.shape) != (total,):
        raise ValueError(f"group_sizes must have one size per expert of the whole call, shape "
                         f"({total},) ({experts.experts} experts on each of {devices} devices "
                         f"along {axis!r}), got {tuple(group_sizes.shape)}")
    _check_grouped_call(x, experts, group_sizes, total_experts=total)
    sizes = defined_group_sizes(group_sizes, x.shape[0])
    first = jax.lax.axis_index(axis) * experts.experts
    own = jax.lax.dynamic_slice_in_dim(sizes, first, experts.experts)
    offset = jnp.sum(jnp.where(jnp.arange(total) < first, sizes, 0))
    y = jnp.roll(call(jnp.roll(x, -offset, axis=0), experts, own, *extras), offset, axis=0)
    context = jax.sharding.get_abstract_mesh()
    if (set(context.axis_names) - set(context.manual_axes)
            and y.dtype in (jnp.bfloat16, jnp.float16)):
        # A body manual over some axes only: XLA's CPU compiler aborts on a 16-bit all-reduce
        # there. The devices' rows do not overlap, so the sum in fp32 is exact.
        return jax.lax.psum(y.astype(jnp.float32), axis).astype(y.dtype)
    return jax.lax.psum(y, axis)


def _over_expert_axis(call, x, experts: PackedExperts, group_sizes, extras, axis: str, mesh):
    """``call(x, experts, group_sizes, *extras)`` with the experts (and ``extras``, split on
    their leading expert axis too) over mesh axis ``axis``."""
    if not isinstance(axis, str):
        raise TypeError(f"expert_axis must be a mesh axis name (str), got {axis!r}")
    context = _mesh_of(axis, mesh)
    if axis in context.manual_axes:  # already one device's experts (inside shard_map)
        return _own_experts_call(call, x, experts, group_sizes, extras, axis)
    _check_grouped_call(x, experts, group_sizes)
    devices = context.shape[axis]
    if experts.experts % devices:
        raise ValueError(f"{experts.experts} experts do not split evenly over the {devices} "
                         f"devices of mesh axis {axis!r}")
    if devices == 1:  # nothing to split
        return call(x, experts, group_sizes, *extras)

    def per_device(x, data, group_sizes, *extras):
        own = PackedExperts._wrap(data, experts.n, experts.layout)
        return _own_experts_call(call, x, own, group_sizes, extras, axis)

    split = P(axis)
    specs = (P(), split, P()) + (split,) * len(extras)
    args = (x, experts.data, group_sizes, *extras)
    if jax.sharding.AxisType.Explicit in context.axis_types:
        # Explicit axes: shard_map takes the operands as they are laid out; lay them out.
        args = tuple(jax.sharding.reshard(
            a, spec if mesh is None else jax.sharding.NamedSharding(mesh, spec))
            for a, spec in zip(args, specs))
    # Manual over every mesh axis: the tokens are the whole call's on each device.
    return jax.shard_map(per_device, mesh=mesh,
                         in_specs=specs, out_specs=P())(*args)


def grouped_swiglu_reference(x, w_gate, w_up, group_sizes, *, activation="silu"):
    """The spec of :func:`grouped_swiglu` on unpacked ``[E, K, F]`` weights: per row, its
    expert's gate and up products in fp32 (two ``ragged_dot``), ``act(g) * u`` in fp32, one
    rounding. Plain XLA, differentiable."""
    sizes = defined_group_sizes(group_sizes, x.shape[0])
    gate, up = (_reference.ragged_product(x, w, sizes) for w in (w_gate, w_up))
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
    if not why and x.shape[0] == 0:
        why = "T = 0: no rows, nothing to launch (the lowering emits no kernel)"
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
