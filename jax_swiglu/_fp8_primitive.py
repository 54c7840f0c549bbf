"""The fp8 inference primitive: ``swiglu_fp8_p`` on quantized operands.

``swiglu_fp8_p.bind(x_q, x_scale, data, scales, n=..., kernel=..., activation=...,
out_dtype=...)`` computes ``[M, n] = act(x @ W_gate) * (x @ W_up)`` from ``x_q [M, K]`` fp8
with its per-row ``x_scale [M]`` and the :class:`~jax_swiglu.QuantizedWeights` leaves
``data [2 N_pad, K]`` and ``scales`` (``[2 N_pad]`` or ``[]``), rounded once to ``out_dtype``
(``"bfloat16"`` or ``"float16"``). Rules:

* abstract eval: shapes and dtypes (the public ``swiglu`` checks first, with friendlier words),
* lowering: on CUDA, the fp8 kernel's FFI custom call where ``selection.choose_fp8`` picks
  it; else, and on every other platform, the XLA path: the spec itself, fp32 math on the
  dequantized operands (``_reference.swiglu_reference_quantized_operands``),
* impl: eager calls run the jitted primitive,
* batching: vmap folds batch dimensions of ``x_q`` and ``x_scale`` into M,
* differentiation: refused (inference only).

Under SPMD the custom call has no partitioning rule of its own: XLA gathers its operands to
every device. Inside ``jax.shard_map`` each device runs it on its local block.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from . import _layout, _native, _quantize, _reference, selection
from ._primitive import INFERENCE_ONLY
from .selection import _fp8

swiglu_fp8_p = Primitive("jax_swiglu_fp8")
OUTPUT_DTYPES = tuple(jnp.dtype(d).name for d in _layout.KERNEL_DTYPES)


def _abstract_eval(x_q, x_scale, data, scales, *, n: int, kernel: str, activation: str,
                   out_dtype: str):
    selection.check_kernel_name(kernel)
    _reference.check_activation(activation)
    if out_dtype not in OUTPUT_DTYPES:
        raise TypeError(f"jax_swiglu fp8: out_dtype must be one of {OUTPUT_DTYPES}, got "
                        f"{out_dtype!r}")
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
    return jax.core.ShapedArray((m, n), jnp.dtype(out_dtype))


swiglu_fp8_p.def_abstract_eval(_abstract_eval)


@functools.cache
def _jitted(n: int, kernel: str, activation: str, out_dtype: str):
    return jax.jit(functools.partial(swiglu_fp8_p.bind, n=n, kernel=kernel,
                                     activation=activation, out_dtype=out_dtype))


swiglu_fp8_p.def_impl(lambda *args, n, kernel, activation, out_dtype:
                      _jitted(n, kernel, activation, out_dtype)(*args))


def _xla_lowering(ctx, x_q, x_scale, data, scales, *, n, kernel, activation, out_dtype):
    del kernel
    return mlir.lower_fun(
        functools.partial(_reference.swiglu_reference_quantized_operands, n=n,
                          activation=activation, out_dtype=jnp.dtype(out_dtype)),
        multiple_results=False)(ctx, x_q, x_scale, data, scales)


def _cuda_lowering(ctx, x_q, x_scale, data, scales, *, n, kernel, activation, out_dtype):
    x_aval, _, data_aval, _ = ctx.avals_in
    m, k = x_aval.shape
    choice = _fp8.choose_fp8(m, n, k, out_dtype, kernel=kernel, platform="cuda",
                             activation=activation, weights_dtype=data_aval.dtype)
    if choice.target is None:
        return _xla_lowering(ctx, x_q, x_scale, data, scales, n=n, kernel=kernel,
                             activation=activation, out_dtype=out_dtype)
    attributes = choice.ffi_attributes()
    workspace = _native.workspace_bytes(
        "fp8", out_dtype, choice.config.id, m=m, n=n, n_packed=data_aval.shape[0] // 2, k=k,
        swizzle=1, raster=0, splits=choice.splits, activation=activation)
    call = jax.ffi.ffi_lowering(choice.target)
    if not workspace:
        return call(ctx, x_q, x_scale, data, scales, **attributes)
    # The stream-K configs' partial sums: a second result that XLA allocates (see
    # _primitive._cuda_lowering).
    scratch = jax.core.ShapedArray((workspace,), jnp.dtype(jnp.uint8))
    out, _ = call(ctx.replace(avals_out=[*ctx.avals_out, scratch]), x_q, x_scale, data, scales,
                  **attributes)
    return [out]


mlir.register_lowering(swiglu_fp8_p, _xla_lowering)
mlir.register_lowering(swiglu_fp8_p, _cuda_lowering, platform="cuda")


def _batch(args, dims, **params):
    x_q, x_scale, data, scales = args
    x_dim, s_dim, d_dim, w_dim = dims
    if d_dim is None and w_dim is None:
        # Weights shared across the batch: fold it into M, one kernel call.
        size = x_q.shape[x_dim] if x_dim is not None else x_scale.shape[s_dim]
        x_q = batching.bdim_at_front(x_q, x_dim, size)
        x_scale = batching.bdim_at_front(x_scale, s_dim, size)
        batch, m, k = x_q.shape
        y = swiglu_fp8_p.bind(x_q.reshape(batch * m, k), x_scale.reshape(batch * m), data,
                              scales, **params)
        return y.reshape(batch, m, y.shape[-1]), 0
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    args = [batching.bdim_at_front(a, d, size) for a, d in zip(args, dims)]
    outs = [swiglu_fp8_p.bind(*(a[i] for a in args), **params) for i in range(size)]
    return jnp.stack(outs), 0


batching.primitive_batchers[swiglu_fp8_p] = _batch


def _no_jvp(primals, tangents, **params):
    del primals, tangents, params
    raise NotImplementedError(INFERENCE_ONLY)


ad.primitive_jvps[swiglu_fp8_p] = _no_jvp
