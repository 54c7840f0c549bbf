"""The ``jax_swiglu`` inference primitive: every rule of it in one place.

``swiglu_p.bind(x, packed_data, n=..., kernel=..., activation=...)`` computes ``[M, n]``
``= act(x @ W_gate) * (x @ W_up)`` from ``x [M, K]`` and the packed ``[K, 2 * N_pad]``
matrix (``activation`` names act: _reference.ACTIVATIONS). Rules:

* abstract eval: shape, dtype and sharding rules (the public wrappers in ``_api.py`` give
  friendlier messages first; these guard direct binds),
* partitioning: under SPMD (``jax.jit`` with sharded operands) every device computes its
  own block of the result; M may be sharded (data parallel), N over whole gate/up pairs
  (column parallel); K is gathered first, since SiLU follows the contraction and partial
  sums could not be added up afterwards,
* lowering: ``swiglu_p`` lowers through ``custom_partitioning`` to ``swiglu_shard_p``,
  the computation on one device's shapes: on CUDA, the FFI custom call the selection
  picks for the local shapes (or the XLA path); everywhere else the reference
  (``_reference.py``),
* impl: eager calls run the jitted primitive,
* batching: vmap folds batch dimensions of ``x`` into M,
* differentiation: refused with a clear error (inference only, no ``custom_vjp``).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax._src import dispatch
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.sharding import NamedSharding, PartitionSpec as P

from . import _layout, _native, _reference, selection

# What jaxprs hold: the op on global shapes, partitioned by XLA's SPMD partitioner.
swiglu_p = Primitive("jax_swiglu")
# One device's share of it, on local shapes: what each device runs (and what a single
# device or a jax.shard_map body runs directly). Exists only during lowering.
swiglu_shard_p = Primitive("jax_swiglu_shard")


# --- abstract evaluation ------------------------------------------------------------------

def _check_operands(x, packed_data, *, n: int, kernel: str, activation: str):
    selection.check_kernel_name(kernel)
    _reference.check_activation(activation)
    if x.ndim != 2 or packed_data.ndim != 2:
        raise ValueError(
            f"jax_swiglu primitive takes x [M, K] and packed [K, 2N'], got {x.shape} and "
            f"{packed_data.shape}")
    if x.dtype not in _layout.KERNEL_DTYPES:
        raise TypeError(f"jax_swiglu supports bfloat16 and float16, got {x.dtype}")
    if packed_data.dtype != x.dtype:
        raise TypeError(f"x is {x.dtype} but the packed weights are {packed_data.dtype}")
    k = x.shape[1]
    if packed_data.shape != (k, 2 * _layout.padded_n(n)):
        raise ValueError(
            f"packed weights {packed_data.shape} do not match K={k}, N={n} "
            f"(expected {(k, 2 * _layout.padded_n(n))})")
    _layout.check_alignment(k, n)


def _abstract_eval(x, packed_data, *, n: int, kernel: str, activation: str):
    _check_operands(x, packed_data, n=n, kernel=kernel, activation=activation)
    # Explicit mesh axes are part of the types: the result's follow the split rule. (With
    # automatic axes the specs are empty and the partitioner decides, by the same rule.)
    mesh = next((a.sharding.mesh for a in (x, packed_data) if not a.sharding.mesh.empty),
                x.sharding.mesh)
    plan = split(x.sharding.spec, packed_data.sharding.spec, mesh.shape, n)
    return jax.core.ShapedArray((x.shape[0], n), x.dtype,
                                sharding=NamedSharding(mesh, plan.result_spec()))


def _shard_abstract_eval(x, packed_data, *, n: int, kernel: str, activation: str):
    _check_operands(x, packed_data, n=n, kernel=kernel, activation=activation)
    return jax.core.ShapedArray((x.shape[0], n), x.dtype)


swiglu_p.def_abstract_eval(_abstract_eval)
swiglu_shard_p.def_abstract_eval(_shard_abstract_eval)


# --- impl ---------------------------------------------------------------------------------

@functools.cache
def _jitted(n: int, kernel: str, activation: str):
    return jax.jit(functools.partial(swiglu_p.bind, n=n, kernel=kernel, activation=activation))


def _impl(x, packed_data, *, n: int, kernel: str, activation: str):
    return _jitted(n, kernel, activation)(x, packed_data)


swiglu_p.def_impl(_impl)


# --- partitioning -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Split:
    """How one call is split over a mesh: the axes sharding M and N, and N per shard."""

    m_axes: tuple[str, ...]
    n_axes: tuple[str, ...]
    local_n: int

    def result_spec(self) -> P:
        return P(self.m_axes or None, self.n_axes or None)

    def operand_specs(self) -> tuple[P, P]:
        """x ``[M, K]`` and packed ``[K, 2 * N_pad]``: K replicated in both."""
        return P(self.m_axes or None, None), P(None, self.n_axes or None)


def _axes(entry) -> tuple[str, ...]:
    """Mesh axes of one PartitionSpec entry (None, a name or a tuple of names)."""
    if entry is None or entry is P.UNCONSTRAINED:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def split(x_spec, packed_spec, axis_sizes, n: int) -> Split:
    """The split of a call whose operands arrive with these PartitionSpecs.

    N follows the packed weights (raising if their shards are not whole gate/up pairs);
    M follows x. An axis can shard only one dimension of the result: if both claim it,
    the weights keep it (moving them costs more) and x is gathered along it. Any K
    sharding is dropped: the partitioner all-gathers x (and the weights) along K.
    """
    x_spec, packed_spec = (tuple(spec) + (None,) * (2 - len(spec))
                           for spec in (x_spec, packed_spec))
    n_axes = _axes(packed_spec[1])
    m_axes = tuple(axis for axis in _axes(x_spec[0]) if axis not in n_axes)
    shards = math.prod(axis_sizes[axis] for axis in n_axes)
    return Split(m_axes, n_axes, _layout.shard_n(n, shards))


def _spec(operand) -> P:
    # GSPMD propagation leaves operands it has no sharding for at None: replicated.
    return P() if operand.sharding is None else operand.sharding.spec


def _partition(n, kernel, activation, mesh, arg_shapes, result_shape):
    """custom_partitioning's partition: operand and result shardings, and the per-device
    function (the shard primitive on local shapes, so the kernel is chosen by local M)."""
    del result_shape  # the result's sharding follows from the operands'
    x, packed = arg_shapes
    plan = split(_spec(x), _spec(packed), mesh.shape, n)

    def per_device(x, packed_data):
        return swiglu_shard_p.bind(x, packed_data, n=plan.local_n, kernel=kernel,
                                   activation=activation)

    x_spec, packed_spec = plan.operand_specs()
    return (mesh, per_device, NamedSharding(mesh, plan.result_spec()),
            (NamedSharding(mesh, x_spec), NamedSharding(mesh, packed_spec)))


def _infer_sharding(n, kernel, activation, mesh, arg_shapes, result_shape):
    """The result's sharding from the operands' (GSPMD propagation)."""
    del kernel, activation, result_shape
    x, packed = arg_shapes
    try:
        return NamedSharding(mesh, split(_spec(x), _spec(packed), mesh.shape, n).result_spec())
    except ValueError:
        # An impossible N split: GSPMD aborts the process on an error here, so leave
        # the report to _partition.
        return NamedSharding(mesh, P())


def _sharding_rule(n, kernel, activation, mesh, operand_types, result_types):
    """The Shardy rule: M passes through; K must be replicated; N is a run of whole
    gate/up pairs (``pairs``), 64 packed columns each in the weights and 32 in the
    result, so a sharding of the weights along N carries over to the result and back.

    x's K and the weights' K are separate factors so that a K sharding of one is not
    propagated to the other: both are gathered anyway. N is tied to the weights only
    where every mesh axis divides the number of pairs: otherwise Shardy would split an
    axis into sub-axes, which custom_partitioning cannot express; left untied, a bad
    split of the weights reaches ``split`` intact, which says what is wrong.
    """
    del kernel, activation, operand_types, result_types
    block = _layout.GATE_UP_BLOCK
    pairs, padded = divmod(n, block)
    if padded or any(pairs % size for size in mesh.shape.values()):
        return "m x_k, w_k packed -> m n", {"need_replication_factors": ("x_k", "w_k", "n")}
    return ("m x_k, w_k (pairs packed_pair) -> m (pairs block)",
            {"need_replication_factors": ("x_k", "w_k", "packed_pair", "block"),
             "pairs": pairs, "packed_pair": 2 * block, "block": block})


def _per_device(x, packed_data, n, kernel, activation):
    # On one device (no mesh, or inside a jax.shard_map body) custom_partitioning lowers
    # this directly; under SPMD, _partition supplies the per-device function instead.
    return swiglu_shard_p.bind(x, packed_data, n=n, kernel=kernel, activation=activation)


_partitioned = custom_partitioning(_per_device, static_argnums=(2, 3, 4))
_partitioned.def_partition(
    partition=_partition,
    infer_sharding_from_operands=_infer_sharding,
    sharding_rule=_sharding_rule,
)


# --- lowering -----------------------------------------------------------------------------

def _reference_lowering(ctx, x, packed_data, *, n: int, kernel: str, activation: str):
    del kernel
    return mlir.lower_fun(
        functools.partial(_reference.swiglu_reference_packed, n=n, activation=activation),
        multiple_results=False)(ctx, x, packed_data)


def _cuda_lowering(ctx, x, packed_data, *, n: int, kernel: str, activation: str):
    x_aval, packed_aval = ctx.avals_in
    m, k = x_aval.shape  # local shapes: the kernel is chosen per device
    choice = selection.choose(m, n, k, x_aval.dtype, kernel=kernel, platform="cuda",
                              activation=activation)
    if choice.target is None:
        return _reference_lowering(ctx, x, packed_data, n=n, kernel=kernel,
                                   activation=activation)
    attributes = choice.ffi_attributes()
    workspace = _native.workspace_bytes(
        choice.kernel, jnp.dtype(x_aval.dtype).name, choice.config.id, m=m, n=n,
        activation=activation,
        n_packed=packed_aval.shape[1] // 2, k=k, swizzle=int(attributes["swizzle"]),
        raster=int(attributes["raster"]), splits=int(attributes["splits"]))
    if not workspace:
        return jax.ffi.ffi_lowering(choice.target)(ctx, x, packed_data, **attributes)
    # A second result is the kernel's scratch (stream-K partial sums): XLA allocates it
    # with the call's other buffers, so the handler never allocates; only out is used.
    scratch = jax.core.ShapedArray((workspace,), jnp.dtype(jnp.uint8))
    out, _ = jax.ffi.ffi_lowering(choice.target)(
        ctx.replace(avals_out=[*ctx.avals_out, scratch]), x, packed_data, **attributes)
    return [out]


mlir.register_lowering(swiglu_p, mlir.lower_fun(_partitioned, multiple_results=False))
# custom_partitioning needs the device assignment when it lowers (to build its mesh).
dispatch.prim_requires_devices_during_lowering.add(swiglu_p)
mlir.register_lowering(swiglu_shard_p, _reference_lowering)
mlir.register_lowering(swiglu_shard_p, _cuda_lowering, platform="cuda")


# --- batching -----------------------------------------------------------------------------

def _batch(args, dims, *, n: int, kernel: str, activation: str):
    x, packed_data = args
    x_dim, packed_dim = dims
    if packed_dim is None:  # (None: not mapped)
        # Weights shared across the batch: fold the batch into M, one kernel call.
        x = jnp.moveaxis(x, x_dim, 0)
        batch, m, k = x.shape
        y = swiglu_p.bind(x.reshape(batch * m, k), packed_data, n=n, kernel=kernel,
                          activation=activation)
        return y.reshape(batch, m, n), 0
    # Weights differ per batch element: one call per element.
    size = packed_data.shape[packed_dim]
    packed_data = jnp.moveaxis(packed_data, packed_dim, 0)
    if x_dim is not None:
        x = jnp.moveaxis(x, x_dim, 0)
    outs = [
        swiglu_p.bind(x[i] if x_dim is not None else x, packed_data[i],
                      n=n, kernel=kernel, activation=activation)
        for i in range(size)
    ]
    return jnp.stack(outs), 0


batching.primitive_batchers[swiglu_p] = _batch


# --- differentiation ----------------------------------------------------------------------

INFERENCE_ONLY = (
    "jax_swiglu is inference-only: its fused kernels have no gradient. Train with the "
    "reference, jax_swiglu.swiglu_reference(x, w_gate, w_up) (same math), or pass its "
    "inputs through jax.lax.stop_gradient if no gradient is needed through it.")


def _no_jvp(primals, tangents, **params):
    del primals, tangents, params
    raise NotImplementedError(INFERENCE_ONLY)


ad.primitive_jvps[swiglu_p] = _no_jvp
