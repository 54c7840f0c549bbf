"""The ``jax_swiglu`` inference primitive: every rule of it in one place.

``swiglu_p.bind(x, packed_data, n=..., kernel=...)`` computes ``[M, n]`` from
``x [M, K]`` and the packed ``[K, 2 * N_pad]`` matrix. Rules:

* abstract eval: shape and dtype rules (the public wrappers in ``_api.py`` give friendlier
  messages first; these guard direct binds),
* lowering: on CUDA, the FFI custom call the selection table picks for the static M (or
  the XLA path); everywhere else the reference (``_reference.py``),
* impl: eager calls run the jitted primitive,
* batching: vmap folds batch dimensions of ``x`` into M,
* differentiation: refused with a clear error (inference only, no ``custom_vjp``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from . import _layout, _reference, _selection

swiglu_p = Primitive("jax_swiglu")


# --- abstract evaluation ------------------------------------------------------------------

def _abstract_eval(x, packed_data, *, n: int, kernel: str):
    _selection.check_kernel_name(kernel)
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
    return jax.core.ShapedArray((x.shape[0], n), x.dtype)


swiglu_p.def_abstract_eval(_abstract_eval)


# --- impl ---------------------------------------------------------------------------------

@functools.cache
def _jitted(n: int, kernel: str):
    return jax.jit(functools.partial(swiglu_p.bind, n=n, kernel=kernel))


def _impl(x, packed_data, *, n: int, kernel: str):
    return _jitted(n, kernel)(x, packed_data)


swiglu_p.def_impl(_impl)


# --- lowering -----------------------------------------------------------------------------

def _reference_lowering(ctx, x, packed_data, *, n: int, kernel: str):
    del kernel
    return mlir.lower_fun(
        functools.partial(_reference.swiglu_reference_packed, n=n),
        multiple_results=False)(ctx, x, packed_data)


def _cuda_lowering(ctx, x, packed_data, *, n: int, kernel: str):
    x_aval, packed_aval = ctx.avals_in
    m, k = x_aval.shape
    choice = _selection.choose(m, n, k, x_aval.dtype, kernel=kernel, platform="cuda")
    if choice.target is None:
        return _reference_lowering(ctx, x, packed_data, n=n, kernel=kernel)
    return jax.ffi.ffi_lowering(choice.target)(
        ctx, x, packed_data, config=np.int64(choice.config.id))


mlir.register_lowering(swiglu_p, _reference_lowering)
mlir.register_lowering(swiglu_p, _cuda_lowering, platform="cuda")


# --- batching -----------------------------------------------------------------------------

def _batch(args, dims, *, n: int, kernel: str):
    x, packed_data = args
    x_dim, packed_dim = dims
    if packed_dim is None:  # (None: not mapped)
        # Weights shared across the batch: fold the batch into M, one kernel call.
        x = jnp.moveaxis(x, x_dim, 0)
        batch, m, k = x.shape
        y = swiglu_p.bind(x.reshape(batch * m, k), packed_data, n=n, kernel=kernel)
        return y.reshape(batch, m, n), 0
    # Weights differ per batch element: one call per element.
    size = packed_data.shape[packed_dim]
    packed_data = jnp.moveaxis(packed_data, packed_dim, 0)
    if x_dim is not None:
        x = jnp.moveaxis(x, x_dim, 0)
    outs = [
        swiglu_p.bind(x[i] if x_dim is not None else x, packed_data[i],
                      n=n, kernel=kernel)
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
