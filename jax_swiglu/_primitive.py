"""The ``jax_swiglu`` inference primitive, for every weights format: every rule of it in one place.

``swiglu_p.bind(*operands, n=..., weights=..., kernel=..., launch=..., activation=...,
out_dtype=..., accumulation=...)`` computes ``[M, n] = act(x @ W_gate) * (x @ W_up)``, rounded
once to ``out_dtype``. ``accumulation`` is "promoted" (fp32 sums; for fp8 weights the tensor
cores' partial sums are promoted to fp32 after every k tile) or, for fp8 weights only, "fast"
(the tensor cores add all of K, promoted once at the end: the chosen launch's promotion 0).
The operands follow the weights format (``_layout.py`` defines both layouts):

* ``weights="packed"``: ``x [M, K]`` and the packed ``[K, 2 N_pad]`` matrix, both bfloat16
  or float16 (the output's dtype);
* ``weights="fp8"``: ``x_q [M, K]`` fp8 with its per-row fp32 ``x_scale [M]``, and the
  K-major fp8 ``data [2 N_pad, K]`` with its fp32 ``scales`` (``[2 N_pad]`` or ``[]``); or
  16-bit ``x [M, K]`` (the output's dtype) with ``data`` and ``scales``, x quantized per row
  inside the call (``quantize_tokens``' values; on CUDA by the extension's kernel where
  QUANTIZE_KERNEL is on).

``kernel`` names a family ("auto", "interleaved", "gate_then_up", "gemv", "xla") and
``launch`` forces one launch (a ``_launch.Launch``, or None). Both are static parameters, so
they are part of the traced program and of JAX's cache key. Rules:

* abstract eval: shape, dtype and sharding rules (the public wrappers in ``_api.py`` give
  friendlier messages first; these guard direct binds),
* partitioning: under SPMD (``jax.jit`` with sharded operands) every device computes its
  own block of the result; M may be sharded (data parallel), N over whole gate/up pairs
  (column parallel); K is gathered first, since the activation follows the contraction and
  partial sums could not be added up afterwards,
* the choice: the per-device function (``_per_device``, called with each device's local
  shapes, or the whole shapes on one device) asks the selection which launch runs and binds
  ``swiglu_shard_p`` with it, a static ``Launch`` (or None for the XLA path),
* lowering: ``swiglu_shard_p`` only emits what it is given: on CUDA the FFI custom call of its
  launch (or the reference for None); everywhere else the reference (``_reference.py``),
* impl: eager calls run the jitted primitive,
* batching: vmap folds batch dimensions of the tokens into M,
* differentiation: refused with a clear error (inference only, no ``custom_vjp``).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax._src import dispatch, sharding_impls
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.sharding import NamedSharding, PartitionSpec as P

from . import _launch, _layout, _native, _projection, _quantize, _reference, selection

# What jaxprs hold: the op on global shapes, partitioned by XLA's SPMD partitioner.
swiglu_p = Primitive("jax_swiglu")
# One device's share of it, on local shapes, with the launch chosen for them: what each
# device runs (and what a single device or a jax.shard_map body runs directly). Exists only
# during lowering.
swiglu_shard_p = Primitive("jax_swiglu_shard")

WEIGHTS = ("packed", "fp8")
ACCUMULATIONS = ("promoted", "fast")
OUTPUT_DTYPES = tuple(jnp.dtype(d).name for d in _layout.KERNEL_DTYPES)


def operands_of(weights: str, weights_dtype) -> str:
    """The selection's operand class of a call: "16bit", or the fp8 format's name."""
    if weights == "packed":
        return "16bit"
    return "e4m3" if jnp.dtype(weights_dtype) == jnp.dtype(jnp.float8_e4m3fn) else "e5m2"


def check_accumulation(accumulation, fp8: bool, launch=None) -> None:
    """``accumulation`` is "promoted" or, on fp8 weights, "fast"; a forced launch's own
    promotion interval would contradict "fast"."""
    if accumulation not in ACCUMULATIONS:
        raise ValueError(f"accumulation must be one of {ACCUMULATIONS}, got {accumulation!r}")
    if accumulation == "fast":
        if not fp8:
            raise ValueError("accumulation='fast' is for fp8 weights (QuantizedWeights): 16-bit "
                             "weights always accumulate in fp32")
        forced = _launch.parse(launch) if launch is not None else None
        if forced is not None and forced.promotion not in (None, _launch.FAST_ACCUMULATION):
            raise ValueError(f"launch={forced} promotes every {forced.promotion} wgmma, which "
                             "accumulation='fast' contradicts: drop one of the two")
    elif launch is not None and fp8:
        forced = _launch.parse(launch)
        if forced.row.fast_accumulation:
            raise ValueError(f"launch={forced}: config {forced.config} accumulates in the tensor "
                             "cores (fast accumulation); pass accumulation='fast' to run it")


# --- abstract evaluation ------------------------------------------------------------------

def _check_operands(operands, *, n, weights, kernel, launch, activation, out_dtype,
                    accumulation="promoted"):
    selection.canonical_kernel(kernel)
    check_accumulation(accumulation, weights == "fp8", launch)
    _reference.check_activation(activation)
    if weights not in WEIGHTS:
        raise ValueError(f"jax_swiglu: weights must be one of {WEIGHTS}, got {weights!r}")
    if launch is not None and not isinstance(launch, _launch.Launch):
        raise TypeError(f"jax_swiglu: launch must be a Launch or None, got {launch!r}")
    if out_dtype not in OUTPUT_DTYPES:
        raise TypeError(f"jax_swiglu: out_dtype must be one of {OUTPUT_DTYPES}, got "
                        f"{out_dtype!r}")
    if weights == "packed":
        x, packed_data = operands
        if x.ndim != 2 or packed_data.ndim != 2:
            raise ValueError(f"jax_swiglu primitive takes x [M, K] and packed [K, 2N'], got "
                             f"{x.shape} and {packed_data.shape}")
        if x.dtype not in _layout.KERNEL_DTYPES or jnp.dtype(x.dtype).name != out_dtype:
            raise TypeError(f"jax_swiglu supports bfloat16 and float16 x of the output's dtype "
                            f"({out_dtype}), got {x.dtype}")
        if packed_data.dtype != x.dtype:
            raise TypeError(f"x is {x.dtype} but the packed weights are {packed_data.dtype}")
        k = x.shape[1]
        if packed_data.shape != (k, 2 * _layout.padded_n(n)):
            raise ValueError(f"packed weights {packed_data.shape} do not match K={k}, N={n} "
                             f"(expected {(k, 2 * _layout.padded_n(n))})")
        _layout.check_alignment(k, n)
        return x.shape[0]
    if len(operands) == 3:  # 16-bit x, quantized in the call
        x, data, scales = operands
        if x.dtype not in _layout.KERNEL_DTYPES or jnp.dtype(x.dtype).name != out_dtype:
            raise TypeError(f"jax_swiglu fp8 takes fp8 x_q with x_scale, or bfloat16 or float16 "
                            f"x of the output's dtype ({out_dtype}); got {x.dtype}")
        x_q = jax.core.ShapedArray(x.shape, data.dtype)
        x_scale = jax.core.ShapedArray(x.shape[:1], jnp.float32)
    else:
        x_q, x_scale, data, scales = operands
    if x_q.ndim != 2 or data.ndim != 2:
        raise ValueError(f"jax_swiglu fp8 takes x_q [M, K] and data [2 N_pad, K], got "
                         f"{x_q.shape} and {data.shape}")
    _quantize.check_fp8_dtype(x_q.dtype, "x_q")
    if x_q.dtype != data.dtype:
        raise TypeError(f"x_q is {x_q.dtype} but the weights are {data.dtype}")
    m, k = x_q.shape
    if data.shape != (2 * _layout.padded_n(n), k):
        raise ValueError(f"fp8 weights {data.shape} do not match K={k}, N={n} (expected "
                         f"{(2 * _layout.padded_n(n), k)})")
    if x_scale.dtype != jnp.float32 or x_scale.shape != (m,):
        raise ValueError(f"x_scale must be float32 [{m}], got {x_scale.dtype} {x_scale.shape}")
    if scales.dtype != jnp.float32 or scales.shape not in ((), (data.shape[0],)):
        raise ValueError(f"scales must be float32 [] or [{data.shape[0]}], got {scales.dtype} "
                         f"{scales.shape}")
    return m


def _abstract_eval(*operands, n, weights, kernel, launch, activation, out_dtype, accumulation):
    m = _check_operands(operands, n=n, weights=weights, kernel=kernel, launch=launch,
                        activation=activation, out_dtype=out_dtype, accumulation=accumulation)
    # Explicit mesh axes are part of the types: the result's follow the split rule. (With
    # automatic axes the specs are empty and the partitioner decides, by the same rule.)
    x, w = operands[0], operands[-2] if weights == "fp8" else operands[1]
    mesh = next((a.sharding.mesh for a in (x, w) if not a.sharding.mesh.empty), x.sharding.mesh)
    plan = split(weights, [a.sharding.spec for a in operands], mesh.shape, n,
                 scalar_scales=weights == "fp8" and operands[-1].ndim == 0)
    return jax.core.ShapedArray((m, n), jnp.dtype(out_dtype),
                                sharding=NamedSharding(mesh, plan.result_spec()))


def _shard_abstract_eval(*operands, n, weights, launch, activation, out_dtype):
    # The launch is the one chosen for the call: it accumulates as the call asked.
    fast = launch is not None and launch.fast_accumulation
    m = _check_operands(operands, n=n, weights=weights, kernel="auto", launch=launch,
                        activation=activation, out_dtype=out_dtype,
                        accumulation="fast" if fast else "promoted")
    return jax.core.ShapedArray((m, n), jnp.dtype(out_dtype))


swiglu_p.def_abstract_eval(_abstract_eval)
swiglu_shard_p.def_abstract_eval(_shard_abstract_eval)


# --- impl ---------------------------------------------------------------------------------

@functools.cache
def _jitted(**params):
    return jax.jit(functools.partial(swiglu_p.bind, **params))


def _impl(*operands, **params):
    return _jitted(**params)(*operands)


swiglu_p.def_impl(_impl)


# --- partitioning -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Split:
    """How one call is split over a mesh: the axes sharding M and N, and N per shard."""

    weights: str
    m_axes: tuple[str, ...]
    n_axes: tuple[str, ...]
    local_n: int
    scalar_scales: bool = False
    quantizes_x: bool = False  # fp8 weights with 16-bit x (no x_scale operand)

    def result_spec(self) -> P:
        return P(self.m_axes or None, self.n_axes or None)

    def operand_specs(self) -> tuple[P, ...]:
        """Each operand's spec, K replicated in all: x [M, K] and packed [K, 2 N_pad]; or x_q
        [M, K], x_scale [M] (or 16-bit x [M, K]), data [2 N_pad, K] and scales [2 N_pad] (or
        [])."""
        m, n = self.m_axes or None, self.n_axes or None
        if self.weights == "packed":
            return P(m, None), P(None, n)
        tokens = (P(m, None),) if self.quantizes_x else (P(m, None), P(m))
        return *tokens, P(n, None), P() if self.scalar_scales else P(n)


def _axes(entry) -> tuple[str, ...]:
    """Mesh axes of one PartitionSpec entry (None, a name or a tuple of names)."""
    if entry is None or entry is P.UNCONSTRAINED:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def _padded(spec, rank: int) -> tuple:
    return tuple(spec) + (None,) * (rank - len(spec))


def split(weights: str, specs, axis_sizes, n: int, scalar_scales: bool = False) -> Split:
    """The split of a call whose operands arrive with these PartitionSpecs.

    N follows the weights (raising if their shards are not whole gate/up pairs); M follows
    x. An axis can shard only one dimension of the result: if both claim it, the weights keep
    it (moving them costs more) and x is gathered along it. Any K sharding is dropped: the
    partitioner all-gathers x (and the weights) along K.
    """
    x_spec = _padded(specs[0], 2)
    if weights == "packed":
        n_axes = _axes(_padded(specs[1], 2)[1])
    else:
        n_axes = _axes(_padded(specs[-2], 2)[0])
    m_axes = tuple(axis for axis in _axes(x_spec[0]) if axis not in n_axes)
    shards = math.prod(axis_sizes[axis] for axis in n_axes)
    return Split(weights, m_axes, n_axes, _layout.shard_n(n, shards),
                 weights == "fp8" and scalar_scales, weights == "fp8" and len(specs) == 3)


def _spec(operand) -> P:
    # GSPMD propagation leaves operands it has no sharding for at None: replicated.
    return P() if operand.sharding is None else operand.sharding.spec


def _is_scalar(shape) -> bool:
    return len(shape.shape) == 0


def choose(operands, *, n, weights, kernel, launch, activation, out_dtype, platform,
           accumulation="promoted") -> selection.Choice:
    """The selection's choice for one device's operands (their avals: local shapes). A fast
    accumulation call chooses among the fast-accumulation rows and the promoted ones, which
    run it with promotion 0."""
    x, w = operands[0], operands[1] if weights == "packed" else operands[-2]
    m, k = x.shape
    problem = selection.Problem(m, n, k, out_dtype, operands_of(weights, w.dtype), activation,
                                accumulation)
    return with_accumulation(
        selection.choose(problem, kernel=kernel, launch=launch, platform=platform), accumulation)


def with_accumulation(choice: selection.Choice, accumulation: str) -> selection.Choice:
    """``choice`` as it runs under ``accumulation``: under fast accumulation a promoted fp8
    row's launch with promotion 0 (a fast-accumulation row's launch as it is)."""
    if (accumulation != "fast" or choice.launch is None
            or choice.launch.row.fast_accumulation):
        return choice
    return dataclasses.replace(choice, launch=dataclasses.replace(
        choice.launch, promotion=_launch.FAST_ACCUMULATION))


def _bind_shard(operands, *, n, weights, kernel, launch, activation, out_dtype, accumulation,
                platform):
    avals = [jax.typeof(o) for o in operands]
    choice = choose(avals, n=n, weights=weights, kernel=kernel, launch=launch,
                    activation=activation, out_dtype=out_dtype, platform=platform,
                    accumulation=accumulation)
    if choice.launch is None and weights == "fp8" and selection.xla_runs_fp8_gemm(
            operands_of(weights, avals[-2].dtype), avals[0].shape[1], platform):
        return xla_fp8_gemm(operands, n=n, activation=activation, out_dtype=out_dtype,
                            accumulation=accumulation)
    return swiglu_shard_p.bind(*operands, n=n, weights=weights, launch=choice.launch,
                               activation=activation, out_dtype=out_dtype)


def xla_fp8_gemm(operands, *, n, activation, out_dtype, accumulation):
    """An fp8 call on XLA's own fp8 GEMM (selection.xla_runs_fp8_gemm), operands as the
    primitive takes them (x [..., K] or x_q and x_scale, then data and scales): 16-bit x
    quantized per row by XLA first."""
    if len(operands) == 3:
        x, data, scales = operands
        x_q, x_scale = _quantize.quantize_tokens(x, data.dtype)
    else:
        x_q, x_scale, data, scales = operands
    # Keeps x's fp8 rounding where XLA widens the GEMM's operands: its excess-precision rule
    # would fold convert(convert(x, fp8), wider) away.
    x_q = jax.lax.optimization_barrier(x_q)
    return _reference.swiglu_xla_quantized_operands(
        x_q, x_scale, data, scales, n=n, activation=activation, out_dtype=jnp.dtype(out_dtype),
        accumulation=accumulation)


def _partition(n, weights, kernel, launch, activation, out_dtype, accumulation, platform, mesh,
               arg_shapes, result_shape):
    """custom_partitioning's partition: operand and result shardings, and the per-device
    function (the launch chosen for the local shapes)."""
    del result_shape  # the result's sharding follows from the operands'
    plan = split(weights, [_spec(a) for a in arg_shapes], mesh.shape, n,
                 scalar_scales=weights == "fp8" and _is_scalar(arg_shapes[-1]))

    def per_device(*operands):
        return _bind_shard(operands, n=plan.local_n, weights=weights, kernel=kernel,
                           launch=launch, activation=activation, out_dtype=out_dtype,
                           accumulation=accumulation, platform=platform)

    return (mesh, per_device, NamedSharding(mesh, plan.result_spec()),
            tuple(NamedSharding(mesh, spec) for spec in plan.operand_specs()))


def _infer_sharding(n, weights, kernel, launch, activation, out_dtype, accumulation, platform,
                    mesh, arg_shapes, result_shape):
    """The result's sharding from the operands' (GSPMD propagation)."""
    del kernel, launch, activation, out_dtype, accumulation, platform, result_shape
    try:
        plan = split(weights, [_spec(a) for a in arg_shapes], mesh.shape, n)
        return NamedSharding(mesh, plan.result_spec())
    except ValueError:
        # An impossible N split: GSPMD aborts the process on an error here, so leave
        # the report to _partition.
        return NamedSharding(mesh, P())


def _sharding_rule(n, weights, kernel, launch, activation, out_dtype, accumulation, platform,
                   mesh, operand_types, result_types):
    """The Shardy rule: M passes through; K must be replicated; N is a run of whole
    gate/up pairs (``pairs``), 64 packed columns each in the weights (and their scales) and
    32 in the result, so a sharding of the weights along N carries over to the result and
    back.

    x's K and the weights' K are separate factors so that a K sharding of one is not
    propagated to the other: both are gathered anyway. N is tied to the weights only
    where every mesh axis divides the number of pairs: otherwise Shardy would split an
    axis into sub-axes, which custom_partitioning cannot express; left untied, a bad
    split of the weights reaches ``split`` intact, which says what is wrong.
    """
    del kernel, launch, activation, out_dtype, accumulation, platform, result_types
    block = _layout.GATE_UP_BLOCK
    pairs, padded = divmod(n, block)
    tied = not padded and not any(pairs % size for size in mesh.shape.values())
    w_n = "(pairs packed_pair)" if tied else "packed"
    out_n = "(pairs block)" if tied else "n"
    if weights == "packed":
        rule = f"m x_k, w_k {w_n} -> m {out_n}"
    else:
        scales = "" if len(operand_types[-1].shape) == 0 else w_n
        tokens = "m x_k," if len(operand_types) == 3 else "m x_k, m,"
        rule = f"{tokens} {w_n} w_k, {scales} -> m {out_n}"
    replicated = ("x_k", "w_k", "packed_pair", "block") if tied else ("x_k", "w_k", "n")
    # Shardy wants the special factors in the order the rule first names them.
    names = rule.replace("(", " ").replace(")", " ").replace(",", " ").split()
    replicated = tuple(sorted(replicated, key=names.index))
    sizes = {"pairs": pairs, "packed_pair": 2 * block, "block": block} if tied else {}
    return rule, {"need_replication_factors": replicated, **sizes}


def _partitioned_call(operand_count: int):
    """custom_partitioning over a function of ``operand_count`` operands and the eight static
    parameters (n, weights, kernel, launch, activation, out_dtype, accumulation, platform)."""
    statics = tuple(range(operand_count, operand_count + 8))

    def per_device(*args):
        # On one device (no mesh, or inside a jax.shard_map body) custom_partitioning lowers
        # this directly; under SPMD, _partition supplies the per-device function instead.
        operands, static = args[:operand_count], args[operand_count:]
        names = ("n", "weights", "kernel", "launch", "activation", "out_dtype", "accumulation",
                 "platform")
        return _bind_shard(operands, **dict(zip(names, static)))

    call = custom_partitioning(per_device, static_argnums=statics)
    call.def_partition(partition=_partition, infer_sharding_from_operands=_infer_sharding,
                       sharding_rule=_sharding_rule)
    return call


# By (weights, operand count): fp8 weights take x_q and x_scale, or a 16-bit x.
_PARTITIONED = {("packed", 2): _partitioned_call(2), ("fp8", 4): _partitioned_call(4),
                ("fp8", 3): _partitioned_call(3)}


def _lowering(platform: str | None):
    """swiglu_p's lowering for ``platform`` (None: the module's own), through the partitioned
    call, which hands the platform on to the choice."""
    def lower(ctx, *operands, n, weights, kernel, launch, activation, out_dtype, accumulation):
        call = _PARTITIONED[weights, len(operands)]
        target = platform or ctx.module_context.platforms[0]
        fn = lambda *ops: call(*ops, n, weights, kernel, launch, activation, out_dtype,  # noqa: E731
                               accumulation, target)
        return mlir.lower_fun(fn, multiple_results=False)(ctx, *operands)
    return lower


# --- lowering of one device's call ----------------------------------------------------------

def _reference_lowering(ctx, *operands, n, weights, launch, activation, out_dtype):
    del launch
    if weights == "packed":
        fn = functools.partial(_reference.swiglu_reference_packed, n=n, activation=activation)
    else:
        quantized = functools.partial(_reference.swiglu_reference_quantized_operands, n=n,
                                      activation=activation, out_dtype=jnp.dtype(out_dtype))
        if len(operands) == 4:
            fn = quantized
        else:
            def fn(x, data, scales):
                return quantized(*_quantize.quantize_tokens(x, data.dtype), data, scales)
    return mlir.lower_fun(fn, multiple_results=False)(ctx, *operands)


# Whether an fp8 call's 16-bit x is quantized by the extension's kernel (quantize_rows.cuh)
# rather than by XLA's fusions of quantize_tokens (the same bits: the scales are powers of two,
# so the cast is the one rounding on both). Off, XLA's fusions run it (a switch for tests and
# probes; tests/kernels/test_fp8.py call the kernel directly either way).
QUANTIZE_KERNEL = True


def quantize_rows_on_cuda(x, weights_dtype):
    """16-bit x [M, K] quantized per row on CUDA (quantize_tokens' values): (x_q, x_scale),
    by one kernel with QUANTIZE_KERNEL, else by XLA's fusions."""
    if not QUANTIZE_KERNEL:
        return _quantize.quantize_tokens(x, weights_dtype)
    m, k = x.shape
    return jax.ffi.ffi_call(_native.quantize_target(x.dtype),
                            (jax.ShapeDtypeStruct((m, k), weights_dtype),
                             jax.ShapeDtypeStruct((m,), jnp.float32)))(x)


def _quantize_lowering(ctx, x, weights_dtype):
    """quantize_rows_on_cuda lowered: (x_q, x_scale) and their avals."""
    m, k = ctx.avals_in[0].shape
    avals = [jax.core.ShapedArray((m, k), weights_dtype),
             jax.core.ShapedArray((m,), jnp.dtype(jnp.float32))]
    results = mlir.lower_fun(lambda x: quantize_rows_on_cuda(x, weights_dtype),
                             multiple_results=True)(
        ctx.replace(avals_in=[ctx.avals_in[0]], avals_out=avals), x)
    return [r[0] if isinstance(r, (list, tuple)) else r for r in results], avals


def _cuda_lowering(ctx, *operands, n, weights, launch, activation, out_dtype):
    if launch is None:
        return _reference_lowering(ctx, *operands, n=n, weights=weights, launch=launch,
                                   activation=activation, out_dtype=out_dtype)
    m, k = ctx.avals_in[0].shape
    if weights == "fp8" and len(operands) == 3:
        x, data, scales = operands
        tokens, avals = _quantize_lowering(ctx, x, ctx.avals_in[1].dtype)
        operands = (*tokens, data, scales)
        ctx = ctx.replace(avals_in=[*avals, *ctx.avals_in[1:]])
    attributes = launch.ffi_attributes()
    target = launch.target(activation, out_dtype)
    workspace = _native.workspace_bytes(
        launch.config, out_dtype, m=m, n=n, k=k, swizzle=launch.swizzle,
        raster=int(attributes["raster"]), splits=launch.splits,
        promotion=launch.promotion_interval, activation=activation)
    if not workspace:
        return jax.ffi.ffi_lowering(target)(ctx, *operands, **attributes)
    # A second result is the kernel's scratch (stream-K partial sums): XLA allocates it
    # with the call's other buffers, so the handler never allocates; only out is used.
    scratch = jax.core.ShapedArray((workspace,), jnp.dtype(jnp.uint8))
    out, _ = jax.ffi.ffi_lowering(target)(
        ctx.replace(avals_out=[*ctx.avals_out, scratch]), *operands, **attributes)
    return [out]


mlir.register_lowering(swiglu_p, _lowering(None))
mlir.register_lowering(swiglu_p, _lowering("cuda"), platform="cuda")
# custom_partitioning needs the device assignment when it lowers (to build its mesh).
dispatch.prim_requires_devices_during_lowering.add(swiglu_p)
mlir.register_lowering(swiglu_shard_p, _reference_lowering)
mlir.register_lowering(swiglu_shard_p, _cuda_lowering, platform="cuda")


# --- batching -----------------------------------------------------------------------------

def _batch(args, dims, **params):
    # x (and an fp8 call's x_scale) carry the tokens; the weights are the last two.
    tokens = 1 if params["weights"] == "packed" else len(args) - 2
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    if all(d is None for d in dims[tokens:]):
        # Weights shared across the batch: fold the batch into M, one kernel call.
        moved = [batching.bdim_at_front(a, d, size) for a, d in zip(args[:tokens], dims)]
        batch, m = moved[0].shape[:2]
        folded = [a.reshape(batch * m, *a.shape[2:]) for a in moved]
        y = swiglu_p.bind(*folded, *args[tokens:], **params)
        return y.reshape(batch, m, y.shape[-1]), 0
    # Weights differ per batch element: one call per element.
    args = [batching.bdim_at_front(a, d, size) for a, d in zip(args, dims)]
    return jnp.stack([swiglu_p.bind(*(a[i] for a in args), **params) for i in range(size)]), 0


batching.primitive_batchers[swiglu_p] = _batch


# --- differentiation ----------------------------------------------------------------------

INFERENCE_ONLY = (
    "jax_swiglu is inference-only: its fused kernels have no gradient. Train with the "
    "reference, jax_swiglu.swiglu_reference(x, packed) (same math), or pass its "
    "inputs through jax.lax.stop_gradient if no gradient is needed through it.")


def _no_jvp(primals, tangents, **params):
    del primals, tangents, params
    raise NotImplementedError(INFERENCE_ONLY)


ad.primitive_jvps[swiglu_p] = _no_jvp


# --- grouped (mixture-of-experts) calls -----------------------------------------------------
#
# grouped_swiglu_p.bind(x, experts_data, group_sizes, n=..., kernel=..., launch=...,
# activation=..., out_dtype=...): x [T, K] sorted by expert, the packed experts
# [E, K, 2 N_pad] (x's dtype) and group_sizes [E] int32 give [T, n]. The routing lives on the
# device, so the choice depends on the static shapes only and is made when the call is
# lowered: on CUDA the grouped kernel's custom call (selection.choose_grouped), elsewhere the
# spec (_reference.grouped_swiglu_reference_packed). Sharded operands are gathered by XLA (no
# partitioning rule); expert parallelism runs the call per device in jax.shard_map.

grouped_swiglu_p = Primitive("jax_swiglu_grouped")


def _grouped_abstract_eval(x, experts_data, group_sizes, *, n, kernel, launch, activation,
                           out_dtype):
    selection.canonical_kernel(kernel)
    _reference.check_activation(activation)
    if launch is not None and not isinstance(launch, _launch.Launch):
        raise TypeError(f"jax_swiglu grouped: launch must be a Launch or None, got {launch!r}")
    if x.ndim != 2 or experts_data.ndim != 3 or group_sizes.ndim != 1:
        raise ValueError(f"jax_swiglu grouped takes x [T, K], experts [E, K, 2N'] and "
                         f"group_sizes [E], got {x.shape}, {experts_data.shape} and "
                         f"{group_sizes.shape}")
    if x.dtype not in _layout.KERNEL_DTYPES or jnp.dtype(x.dtype).name != out_dtype:
        raise TypeError(f"jax_swiglu grouped supports bfloat16 and float16 x of the output's "
                        f"dtype ({out_dtype}), got {x.dtype}")
    if experts_data.dtype != x.dtype:
        raise TypeError(f"x is {x.dtype} but the expert weights are {experts_data.dtype}")
    experts, k = experts_data.shape[0], x.shape[1]
    if experts_data.shape[1:] != (k, 2 * _layout.padded_n(n)) or experts == 0:
        raise ValueError(f"expert weights {experts_data.shape} do not match K={k}, N={n} "
                         f"(expected [E >= 1, {k}, {2 * _layout.padded_n(n)}])")
    if group_sizes.dtype != jnp.int32 or group_sizes.shape != (experts,):
        raise TypeError(f"group_sizes must be int32 [{experts}], got {group_sizes.dtype} "
                        f"{group_sizes.shape}")
    return jax.core.ShapedArray((x.shape[0], n), jnp.dtype(out_dtype))


grouped_swiglu_p.def_abstract_eval(_grouped_abstract_eval)


@functools.cache
def _grouped_jitted(**params):
    return jax.jit(functools.partial(grouped_swiglu_p.bind, **params))


grouped_swiglu_p.def_impl(lambda *operands, **params: _grouped_jitted(**params)(*operands))


def grouped_problem(x_aval, experts_aval, *, n, activation, out_dtype) -> selection.GroupedProblem:
    return selection.GroupedProblem(x_aval.shape[0], n, x_aval.shape[1], experts_aval.shape[0],
                                    out_dtype, activation)


def _grouped_reference_lowering(ctx, x, experts_data, group_sizes, *, n, kernel, launch,
                                activation, out_dtype):
    del kernel, launch, out_dtype
    fn = functools.partial(_reference.grouped_swiglu_reference_packed, n=n,
                           activation=activation)
    return mlir.lower_fun(fn, multiple_results=False)(ctx, x, experts_data, group_sizes)


def _grouped_cuda_lowering(ctx, x, experts_data, group_sizes, *, n, kernel, launch, activation,
                           out_dtype):
    problem = grouped_problem(ctx.avals_in[0], ctx.avals_in[1], n=n, activation=activation,
                              out_dtype=out_dtype)
    choice = selection.choose_grouped(problem, kernel=kernel, launch=launch, platform="cuda")
    if choice.launch is None or problem.m == 0:
        return _grouped_reference_lowering(ctx, x, experts_data, group_sizes, n=n,
                                           kernel=kernel, launch=launch, activation=activation,
                                           out_dtype=out_dtype)
    target = choice.launch.target(activation, out_dtype)
    return jax.ffi.ffi_lowering(target)(ctx, x, experts_data, group_sizes,
                                        **choice.launch.ffi_attributes())


mlir.register_lowering(grouped_swiglu_p, _grouped_reference_lowering)
mlir.register_lowering(grouped_swiglu_p, _grouped_cuda_lowering, platform="cuda")


def _grouped_batch(args, dims, **params):
    # Every batch element has its own routing: one call each.
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    args = [batching.bdim_at_front(a, d, size) for a, d in zip(args, dims)]
    if size == 0:  # no call: an empty batch of the one call's result
        one = jax.eval_shape(lambda *a: grouped_swiglu_p.bind(*a, **params),
                             *(jax.ShapeDtypeStruct(a.shape[1:], a.dtype) for a in args))
        return jnp.zeros((0, *one.shape), one.dtype), 0
    return jnp.stack([grouped_swiglu_p.bind(*(a[i] for a in args), **params)
                      for i in range(size)]), 0


batching.primitive_batchers[grouped_swiglu_p] = _grouped_batch

GROUPED_INFERENCE_ONLY = (
    "jax_swiglu's grouped kernel is inference-only: it has no gradient. Train with "
    "jax_swiglu.grouped_swiglu_reference (same math, plain XLA), or pass the inputs through "
    "jax.lax.stop_gradient if no gradient is needed through it.")


def _grouped_no_jvp(primals, tangents, **params):
    del primals, tangents, params
    raise NotImplementedError(GROUPED_INFERENCE_ONLY)


ad.primitive_jvps[grouped_swiglu_p] = _grouped_no_jvp


# --- the fp8 down projection of a block (fused_mlp with QuantizedDown) ----------------------
#
# down_projection_p.bind(h, data, scales, accumulation=..., reduce_dtype=...): the gated
# activations h [M, N] (16-bit) quantized per row, times the K-major fp8 down weights
# data [K_out, N] with their scales ([K_out] or []), in reduce_dtype [M, K_out]: the values of
# _reference.down_projection_quantized. On CUDA, in a program on one device, at the token
# counts selection.choose_projection gives the decode form (the quantize kernel, then a gemv
# row's plain projection); everywhere else, and in a program partitioned over devices (where
# XLA's dot takes part in the partitioning: a row-parallel down projection's all-reduce),
# XLA's scaled fp8 dot. fused_mlp binds it only where no mesh axes are explicit.

down_projection_p = Primitive("jax_swiglu_down_projection")


def _down_abstract_eval(h, data, scales, *, accumulation, reduce_dtype):
    check_accumulation(accumulation, fp8=True)
    if h.ndim != 2 or data.ndim != 2 or h.shape[1] != data.shape[1]:
        raise ValueError(f"jax_swiglu down projection takes h [M, N] and data [K_out, N], got "
                         f"{h.shape} and {data.shape}")
    if h.dtype not in _layout.KERNEL_DTYPES:
        raise TypeError(f"jax_swiglu down projection takes bfloat16 or float16 h, got {h.dtype}")
    _quantize.check_fp8_dtype(data.dtype, "the down projection's data")
    if scales.dtype != jnp.float32 or scales.shape not in ((), (data.shape[0],)):
        raise ValueError(f"scales must be float32 [] or [{data.shape[0]}], got {scales.dtype} "
                         f"{scales.shape}")
    if reduce_dtype not in (jnp.dtype(h.dtype).name, "float32"):
        raise TypeError(f"reduce_dtype must be h's dtype or float32, got {reduce_dtype}")
    return jax.core.ShapedArray((h.shape[0], data.shape[0]), jnp.dtype(reduce_dtype))


down_projection_p.def_abstract_eval(_down_abstract_eval)


@functools.cache
def _down_jitted(**params):
    return jax.jit(functools.partial(down_projection_p.bind, **params))


down_projection_p.def_impl(lambda *operands, **params: _down_jitted(**params)(*operands))


def _down_weights(data, scales) -> _quantize.QuantizedDown:
    return _quantize.QuantizedDown._wrap(data, scales,
                                         "per_tensor" if scales.ndim == 0 else "per_channel")


def _down_reference(h, data, scales, *, accumulation, reduce_dtype):
    down = _down_weights(data, scales)
    return _reference.down_projection_quantized(h, down, reduce_dtype=jnp.dtype(reduce_dtype),
                                                accumulation=accumulation)


def _down_reference_lowering(ctx, h, data, scales, *, accumulation, reduce_dtype):
    fn = functools.partial(_down_reference, accumulation=accumulation, reduce_dtype=reduce_dtype)
    return mlir.lower_fun(fn, multiple_results=False)(ctx, h, data, scales)


def _one_device(ctx) -> bool:
    """Whether the module runs on one device unpartitioned (or is one device's body of a
    shard_map, on local shapes): a custom call there needs no partitioning rule."""
    axis_context = ctx.module_context.axis_context
    if isinstance(axis_context, sharding_impls.ShardingContext):
        return axis_context.num_devices == 1
    if isinstance(axis_context, sharding_impls.SPMDAxisContext):
        return set(axis_context.manual_axes) == set(axis_context.mesh.axis_names)
    return False


def down_projection_choice(h_aval, data_aval, *, accumulation, platform="cuda"):
    """The choice (selection.choose_projection) for one device's operands."""
    m, n = h_aval.shape
    return selection.choose_projection(m, data_aval.shape[0], n, jnp.dtype(h_aval.dtype).name,
                                       accumulation=accumulation, platform=platform)


def _down_cuda_lowering(ctx, h, data, scales, *, accumulation, reduce_dtype):
    h_aval, data_aval = ctx.avals_in[0], ctx.avals_in[1]
    choice = (down_projection_choice(h_aval, data_aval, accumulation=accumulation)
              if _one_device(ctx) and data_aval.dtype == jnp.float8_e4m3fn else None)
    if choice is None or choice.launch is None:
        return _down_reference_lowering(ctx, h, data, scales, accumulation=accumulation,
                                        reduce_dtype=reduce_dtype)
    launch = choice.launch

    def fn(h, data, scales):
        h_q, h_scale = quantize_rows_on_cuda(h, data.dtype)
        out = _projection.gemv_projection(
            h_q, _down_weights(data, scales), config=launch.config, splits=launch.splits,
            x_scale=h_scale, promotion=launch.promotion_interval, out_dtype=h.dtype)
        return out.astype(reduce_dtype)

    return mlir.lower_fun(fn, multiple_results=False)(ctx, h, data, scales)


mlir.register_lowering(down_projection_p, _down_reference_lowering)
mlir.register_lowering(down_projection_p, _down_cuda_lowering, platform="cuda")


def _down_batch(args, dims, **params):
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    if all(d is None for d in dims[1:]):
        # Shared weights: the batch folds into M, one call.
        h = batching.bdim_at_front(args[0], dims[0], size)
        batch, m = h.shape[:2]
        out = down_projection_p.bind(h.reshape(batch * m, h.shape[2]), *args[1:], **params)
        return out.reshape(batch, m, out.shape[-1]), 0
    args = [batching.bdim_at_front(a, d, size) for a, d in zip(args, dims)]
    return jnp.stack([down_projection_p.bind(*(a[i] for a in args), **params)
                      for i in range(size)]), 0


batching.primitive_batchers[down_projection_p] = _down_batch
ad.primitive_jvps[down_projection_p] = _no_jvp
