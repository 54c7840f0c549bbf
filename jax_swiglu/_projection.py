"""The decode form's plain projection: ``out = x @ W`` on a gemv row (a gated MLP's down
projection at a few tokens), called through its FFI target.

The gemv rows stream a weight matrix once with K split over a thread-block cluster and no
workspace (ffi/kernels/gemv/); the same stream with each column's sum stored as an output
(no gate/up pairing, no activation) is a down projection on the decode form. Its inputs are
checked here, at trace time, with the words of the launch's own check (CannotRunProjection).
``fused_mlp``'s fp8 down projection runs the e4m3 one at a few tokens
(``_primitive.down_projection_p``); benchmarks/research/down_projection.py times both forms
beside XLA's dot.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _native, _quantize


def gemv_projection(x, w, *, config: int, splits: int = 1, x_scale=None,
                    promotion: int = 4, out_dtype=None):
    """``x @ W`` on gemv row ``config`` (CUDA, SM90), K split over ``splits`` CTAs.

    Args:
      x: ``[M, K]`` bfloat16 or float16 (W 16-bit), or float8_e4m3fn with ``x_scale [M]``
        (W a :class:`~jax_swiglu.QuantizedDown`).
      w: ``[K, N]`` of x's dtype, or a :class:`~jax_swiglu.QuantizedDown` (``data [N, K]``).
      config: a compiled gemv row of the operands' kind (16-bit or e4m3), M at most its tokens.
      promotion: e4m3 only, as in :func:`jax_swiglu.swiglu`'s promoted accumulation.
      out_dtype: e4m3 only, bfloat16 (default) or float16.

    Returns ``[M, N]`` in x's dtype (16-bit) or ``out_dtype``: fp32 sums rounded once.
    """
    fp8 = isinstance(w, _quantize.QuantizedDown)
    m, k = x.shape
    if fp8:
        if x.dtype != w.dtype or x_scale is None or x_scale.shape != (m,):
            raise TypeError(f"an e4m3 projection takes x of {w.dtype} with x_scale [M]; got x "
                            f"{x.dtype}{list(x.shape)}, x_scale "
                            f"{None if x_scale is None else list(x_scale.shape)}")
        n, w_k = w.data.shape
        out_dtype = jnp.dtype(jnp.bfloat16 if out_dtype is None else out_dtype)
        operands = (x, x_scale.astype(jnp.float32), w.data,
                    jnp.reshape(w.scales, (-1,)).astype(jnp.float32))
        attributes = dict(promotion=promotion)
    else:
        if x.dtype not in (jnp.bfloat16, jnp.float16) or w.dtype != x.dtype or w.ndim != 2:
            raise TypeError(f"a 16-bit projection takes x and w [K, N] of one dtype, bfloat16 "
                            f"or float16; got x {x.dtype}, w {w.dtype}{list(w.shape)}")
        w_k, n = w.shape
        out_dtype = x.dtype
        operands = (x, w)
        attributes = {}
    if w_k != k:
        raise ValueError(f"x [M, K] = {list(x.shape)} and w contract K={w_k}")
    row = _native.all_configs().get(config)
    wanted = "e4m3" if fp8 else "16bit"
    if row is None or row.family != "gemv" or row.operands != wanted:
        raise ValueError(f"config {config} is not a gemv row of {wanted} operands")
    reason = _native.can_implement_projection(config, m=m, n=n, k=k, splits=splits,
                                              promotion=promotion if fp8 else 4)
    if reason:
        raise ValueError(f"jax_swiglu: {reason}")
    attributes = {name: np.int64(value) for name, value in
                  dict(config=config, splits=splits, **attributes).items()}
    call = jax.ffi.ffi_call(_native.projection_target(wanted, out_dtype),
                            jax.ShapeDtypeStruct((m, n), out_dtype))
    return call(*operands, **attributes)
