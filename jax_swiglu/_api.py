"""Public entry points: ``swiglu``, ``fused_mlp`` and ``explain``."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from . import _layout, _reference, selection
from ._primitive import swiglu_p


def _check_x(x, packed: _layout.PackedWeights):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"x must be an array, got {type(x).__name__}")
    if x.ndim < 1:
        raise ValueError("x must have shape [..., K] (at least one dimension), got a scalar")
    if x.dtype not in _layout.KERNEL_DTYPES:
        raise TypeError(
            f"x must be bfloat16 or float16, got {x.dtype}; cast it (and pack the weights "
            "with the same dtype, pack_weights(..., dtype=...))")
    if packed.dtype != x.dtype:
        raise TypeError(
            f"x is {x.dtype} but the packed weights are {packed.dtype}; they must match")
    if x.shape[-1] != packed.k:
        raise ValueError(
            f"x has K={x.shape[-1]} (shape {tuple(x.shape)}) but the weights have K={packed.k}")


def swiglu(x, packed, *, kernel: str = "auto", activation: str = "silu"):
    """``act(x @ W_gate) * (x @ W_up)`` as one fused kernel (inference only): SwiGLU with
    ``activation="silu"`` (the default), GeGLU with ``"gelu_tanh"``.

    Args:
      x: ``[..., K]`` bfloat16 or float16; leading dimensions are folded into M. A rank-1
        ``x`` is one token (``[K] -> [N]``), as with ``x @ W``.
      packed: :class:`PackedWeights` from :func:`pack_weights`, same dtype as ``x``.
      kernel: ``"auto"`` (the selection: autotune cache, tuning data, heuristic; see
        :func:`explain`), ``"interleaved"``, ``"pingpong"`` or ``"xla"`` (the plain XLA
        path). ``JAX_SWIGLU_KERNEL`` sets the same globally.
      activation: the gate's activation ``act``: ``"silu"`` (Llama, Qwen, Mistral, ...) or
        ``"gelu_tanh"`` (Gemma: ``jax.nn.gelu(g, approximate=True)``).

    Returns:
      ``[..., N]`` in ``x.dtype``: products accumulated in fp32, activation and product in
      fp32, rounded once.

    Sharded operands (``jax.jit`` with shardings, or the local blocks inside
    ``jax.shard_map``): each device runs the kernel on its own block. Tokens may be sharded,
    and N in whole gate/up pairs (``packed.data`` along its last axis); a sharded K is
    all-gathered first.
    """
    packed = _layout.as_packed(packed, "packed")
    _check_x(x, packed)
    selection.check_kernel_name(kernel)
    _reference.check_activation(activation)
    lead = x.shape[:-1]
    m = math.prod(lead)
    if m == 0:
        return jnp.zeros((*lead, packed.n), x.dtype)
    y = swiglu_p.bind(x.reshape(m, packed.k), packed.data, n=packed.n, kernel=kernel,
                      activation=activation)
    return y.reshape(*lead, packed.n)


def fused_mlp(x, packed, w_down, *, kernel: str = "auto", activation: str = "silu",
              reduce_dtype=None):
    """A whole gated MLP block: ``(act(x @ W_gate) * (x @ W_up)) @ W_down``.

    The gated part is :func:`swiglu`; the down projection is a plain XLA dot. With the
    Megatron layout (packed weights sharded along N, ``w_down`` along its rows, the same
    mesh axis) the only communication is one all-reduce of the ``[..., K_out]`` result.

    Args:
      x: ``[..., K]``.
      packed: :class:`PackedWeights` (``K -> N``).
      w_down: ``[N, K_out]``, same dtype as ``x``.
      kernel, activation: as in :func:`swiglu`.
      reduce_dtype: ``None`` (x's dtype) or ``jnp.float32``: the dtype of the down
        projection's result before the cast to x's dtype, so under row parallelism the
        dtype of the partial sums that the all-reduce adds. x's dtype, as a plain XLA model
        does it, rounds each shard's partial sum, and where partial sums cancel an element
        can move by a few percent of its value; float32 gives the one-device result up to
        the order of summation, for twice the all-reduce's bytes and a cast after it
        (benchmarks/tensor_parallel.py measures both). On one device the two agree.
    """
    packed = _layout.as_packed(packed, "packed")
    if not hasattr(w_down, "shape") or w_down.ndim != 2 or w_down.shape[0] != packed.n:
        raise ValueError(
            f"w_down must be [N, K_out] with N={packed.n}, got "
            f"{tuple(getattr(w_down, 'shape', ())) or type(w_down).__name__}")
    if w_down.dtype != x.dtype:
        raise TypeError(f"w_down is {w_down.dtype} but x is {x.dtype}; they must match")
    reduce_dtype = jnp.dtype(x.dtype if reduce_dtype is None else reduce_dtype)
    if reduce_dtype not in (jnp.dtype(jnp.float32), jnp.dtype(x.dtype)):
        raise TypeError(f"reduce_dtype must be None (x's dtype, {x.dtype}) or float32, got "
                        f"{reduce_dtype}")
    y = swiglu(x, packed, kernel=kernel, activation=activation)
    out = jnp.matmul(y, w_down, preferred_element_type=reduce_dtype,
                     out_sharding=_down_projection_sharding(y, w_down))
    return out.astype(x.dtype)


def _down_projection_sharding(y, w_down):
    """The down projection's result sharding where explicit mesh axes must be told it.

    Row parallel (N sharded in both ``y`` and ``w_down``): every shard holds a partial
    product, summed by one all-reduce; the result keeps ``y``'s token sharding and
    ``w_down``'s output sharding. None (the default rule) in every other case.
    """
    y_sharding, w_sharding = jax.typeof(y).sharding, jax.typeof(w_down).sharding
    y_spec, w_spec = _padded_spec(y_sharding, y.ndim), _padded_spec(w_sharding, 2)
    if y_spec[-1] is None or w_spec[0] is None:
        return None
    return jax.sharding.NamedSharding(
        y_sharding.mesh, jax.sharding.PartitionSpec(*y_spec[:-1], w_spec[1]))


def _padded_spec(sharding, ndim: int) -> tuple:
    spec = tuple(sharding.spec)
    return spec + (None,) * (ndim - len(spec))


def explain(x, packed, *, kernel: str = "auto", activation: str = "silu",
            platform: str | None = None) -> str:
    """Which kernel a call with these shapes would run, and why, without running it.

    ``x`` may be an array or a ``jax.ShapeDtypeStruct``; ``platform`` defaults to the
    default backend. Under sharding each device chooses from its own block: pass the
    per-device ``x`` (and packed weights) to see its choice.
    """
    packed = _layout.as_packed(packed, "packed")
    _check_x(x, packed)
    _reference.check_activation(activation)
    platform = platform or jax.default_backend()
    platform = "cuda" if platform == "gpu" else platform
    m = math.prod(x.shape[:-1])
    choice = selection.choose(m, packed.n, packed.k, x.dtype, kernel=kernel, platform=platform,
                              activation=activation)
    return (f"M={m} N={packed.n} K={packed.k} {x.dtype} {activation} on {platform}: "
            f"{choice.describe()}")
