"""FP8 weights and tokens: quantized once at load time (weights) or per call (tokens).

:func:`quantize_weights` turns gate and up ``[K, N]`` into :class:`QuantizedWeights`: the
packed gate/up columns of ``jax_swiglu/_layout.py`` (the same order, so a kernel pairs gate
and up exactly as the bf16 kernels do), stored **K-major** as ``[2 * N_pad, K]`` (row ``p`` is
packed column ``p``: SM90's fp8 wgmma reads both operands K-major), in ``float8_e4m3fn`` (or
``float8_e5m2``), with fp32 scales, one per packed column (``"per_channel"``) or one for the
matrix (``"per_tensor"``). A weight is ``data[p, k] * scales[p]``.

:func:`quantize_down` does the same for the down projection ``[N, K_out]``
(:class:`QuantizedDown`: ``[K_out, N]``, K-major for the GEMM that consumes the gated
activations, a scale per output channel), so :func:`jax_swiglu.fused_mlp` can run the whole
block in fp8, the activations quantized per row on the way in.

Tokens are quantized per row (:func:`quantize_tokens`): ``x[m, k] = x_q[m, k] * x_scale[m]``,
the scale the smallest power of two that brings the row's largest magnitude within the
format's largest finite value (as the OCP MX formats' shared scales are powers of two). A
power of two and its inverse are exact in fp32, and so is ``x * inverse``: the one rounding
is the cast to fp8, so every backend (XLA's fusions on any device, the extension's kernel)
gets the same bits, which a scale of ``amax / 448`` does not give (XLA's GPU compiler turns
the division into a product with a reciprocal). The relative precision of fp8 is the same in
every binade, so this costs at most one binade of the subnormal range.

Zero rows and columns get scale 1 (their data is all zeros), and so do token rows whose
largest magnitude is not finite (an infinity saturates, a NaN stays NaN); values are clipped
to the format's finite range before the cast, since e4m3fn has no infinity and would turn an
overflow into NaN.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _layout

FP8_DTYPES = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2))
SCALE_MODES = ("per_channel", "per_tensor")
LAYOUT = f"k_major_{_layout.LAYOUT}"


def check_fp8_dtype(dtype, what: str) -> jnp.dtype:
    dtype = jnp.dtype(dtype)
    if dtype not in FP8_DTYPES:
        raise TypeError(f"{what} must be float8_e4m3fn or float8_e5m2, got {dtype}")
    return dtype


def _scales(amax, dtype):
    """(scale, its inverse): amax / the format's largest finite value and back; 1 where amax
    is 0 (all-zero data). Values are quantized by multiplying with the inverse, one rounding
    that XLA keeps as written in every compilation (a division it may turn into a multiply
    by a reciprocal, two roundings, so eager and jitted calls could differ by an fp8 step)."""
    largest = float(jnp.finfo(dtype).max)
    amax = amax.astype(jnp.float32)
    positive = amax > 0
    safe = jnp.where(positive, amax, 1.0)
    return (jnp.where(positive, safe / largest, 1.0), jnp.where(positive, largest / safe, 1.0))


def _token_scales(amax, dtype):
    """(scale, its inverse) for token rows: the smallest power of two ``2^e`` with
    ``amax / 2^e <= largest`` (the format's largest finite value) and ``2^-e``, from the
    fp32 bits alone: with ``amax = 1.a * 2^A`` and ``largest = 1.l * 2^L`` (normal floats),
    ``e = A - L`` where ``a <= l``, else ``A - L + 1``; clamped to ``[-126, 127]`` so both
    are normal floats (a subnormal amax, below ``2^-126``, takes ``e = -126``); 1 where
    amax is 0, infinite or NaN. ffi/kernels/quantize_rows.cuh computes the same integers."""
    largest_bits = int(np.float32(jnp.finfo(dtype).max).view(np.int32))
    amax = amax.astype(jnp.float32)
    bits = jax.lax.bitcast_convert_type(amax, jnp.int32)
    mantissa = 0x7FFFFF
    exponent = ((bits >> 23) - (largest_bits >> 23)
                + ((bits & mantissa) > (largest_bits & mantissa)).astype(jnp.int32))
    exponent = jnp.clip(exponent, -126, 127)
    exponent = jnp.where((amax > 0) & (amax < jnp.inf), exponent, 0)
    as_float = lambda e: jax.lax.bitcast_convert_type((e + 127) << 23, jnp.float32)
    return as_float(exponent), as_float(-exponent)


def _cast(values_f32, dtype):
    largest = float(jnp.finfo(dtype).max)
    return jnp.clip(values_f32, -largest, largest).astype(dtype)


def _check_scales(what: str, scales, scale_mode: str, channels: int) -> None:
    """fp32 scales, one per channel (``"per_channel"``) or one for all (``"per_tensor"``)."""
    if jnp.dtype(scales.dtype) != jnp.dtype(jnp.float32):
        raise TypeError(f"{what} scales must be float32, got {scales.dtype}")
    expected = (channels,) if scale_mode == "per_channel" else ()
    if tuple(scales.shape) != expected:
        raise ValueError(f"{what} scales ({scale_mode}) must have shape {expected}, got "
                         f"{tuple(scales.shape)}")


@jax.tree_util.register_pytree_node_class
class QuantizedWeights:
    """Gate and up weights in fp8, packed K-major, with fp32 scales (see module docstring).

    Build it with :func:`quantize_weights`. A pytree with leaves ``data``
    (``[2 * N_pad, K]`` fp8) and ``scales`` (``[2 * N_pad]`` or ``[]`` fp32); ``n`` (stored
    when padded, as in :class:`~jax_swiglu.PackedWeights`), the scale mode and the layout
    are static. As with :class:`~jax_swiglu.PackedWeights` there is no public constructor
    from arrays (an fp8 ``[2N, K]`` matrix of another checkpoint, such as vLLM's fp8
    ``gate_up_proj``, has this shape in another column order): fp8 data this package
    quantized before is wrapped with :meth:`from_packed_data`.
    """

    __slots__ = ("data", "scales", "_n", "scale_mode", "layout")

    def __init__(self, *args, **kwargs):
        raise TypeError(
            "QuantizedWeights is not built from arrays directly, since fp8 data of this shape "
            "need not be in jax_swiglu's packed order. Quantize gate and up with "
            "jax_swiglu.quantize_weights(w_gate, w_up), or wrap fp8 data that quantize_weights "
            "made before with QuantizedWeights.from_packed_data(data, scales, n, scale_mode)")

    @classmethod
    def _wrap(cls, data: Any, scales: Any, n: int | None, scale_mode: str,
              layout: str) -> QuantizedWeights:
        """The object around the arrays, unchecked (this module and the pytree rebuild)."""
        if n is not None and n % _layout.GATE_UP_BLOCK == 0:
            shape = getattr(data, "shape", None)
            if shape is None or shape[:1] == (2 * n,):
                n = None  # the data says it
        weights = object.__new__(cls)
        for name, value in (("data", data), ("scales", scales), ("_n", n),
                            ("scale_mode", scale_mode), ("layout", layout)):
            object.__setattr__(weights, name, value)
        return weights

    @classmethod
    def from_packed_data(cls, data: Any, scales: Any, n: int, scale_mode: str = "per_channel",
                         *, layout: str = LAYOUT) -> QuantizedWeights:
        """Wraps fp8 ``data`` (``[2 * N_pad, K]``) and its fp32 ``scales`` that
        :func:`quantize_weights` made, e.g. saved and loaded again; ``n`` is N before the
        padding, ``layout`` the tag saved with them. Raises if they do not fit together."""
        if isinstance(n, bool) or not hasattr(n, "__index__"):
            raise TypeError(f"n must be an int (N, the gate and up columns), got {n!r}")
        n = int(n)
        for name, value in (("data", data), ("scales", scales)):
            if not (hasattr(value, "shape") and hasattr(value, "dtype")):
                raise TypeError(f"{name} must be an array, got {type(value).__name__}")
        weights = cls._wrap(data, scales, n, scale_mode, layout)
        weights.validate()
        return weights

    def __setattr__(self, name, value):
        raise AttributeError(f"QuantizedWeights is immutable; cannot set {name!r}")

    def __repr__(self):
        n = "" if self._n is None else f", n={self._n}"
        return (f"QuantizedWeights(data={self.data!r}, scales={self.scales!r}{n}, "
                f"scale_mode={self.scale_mode!r})")

    def tree_flatten(self):
        return (self.data, self.scales), (self._n, self.scale_mode, self.layout)

    def __reduce__(self):
        return _rebuild_quantized, (self.data, self.scales, self._n, self.scale_mode, self.layout)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls._wrap(*children, *aux)

    @property
    def n(self) -> int:
        return self.data.shape[0] // 2 if self._n is None else self._n

    @property
    def k(self) -> int:
        return self.data.shape[1]

    @property
    def n_padded(self) -> int:
        return self.data.shape[0] // 2

    @property
    def dtype(self):
        return self.data.dtype

    def validate(self) -> None:
        """Raises TypeError/ValueError if the arrays do not match the metadata and layout."""
        if self.layout != LAYOUT:
            raise ValueError(f"QuantizedWeights uses layout {self.layout!r}, but this version "
                             f"reads {LAYOUT!r}; quantize the weights again")
        if self.scale_mode not in SCALE_MODES:
            raise ValueError(f"scale_mode must be one of {SCALE_MODES}, got {self.scale_mode!r}")
        check_fp8_dtype(self.data.dtype, "QuantizedWeights data")
        shape = tuple(self.data.shape)
        pair = 2 * _layout.GATE_UP_BLOCK
        if len(shape) != 2 or shape[0] == 0 or shape[0] % pair:
            raise ValueError(f"QuantizedWeights data has shape {shape}, but it is [2 * N_pad, K] "
                             f"with whole gate/up pairs of {pair} rows; build it with "
                             "jax_swiglu.quantize_weights")
        if self._n is not None and (self._n <= 0 or shape[0] != 2 * _layout.padded_n(self._n)):
            raise ValueError(f"QuantizedWeights data has shape {shape}, but n={self._n} needs "
                             f"{2 * _layout.padded_n(max(self._n, 1))} rows")
        _check_scales("QuantizedWeights", self.scales, self.scale_mode, shape[0])


def _rebuild_quantized(data, scales, n, scale_mode, layout) -> QuantizedWeights:
    return QuantizedWeights._wrap(data, scales, n, scale_mode, layout)


def quantize_weights(w_gate, w_up, *, dtype=jnp.float8_e4m3fn,
                     scale: str = "per_channel") -> QuantizedWeights:
    """Quantizes gate and up ``[K, N]`` weights to fp8 once, at load time.

    Args:
      w_gate, w_up: ``[K, N]`` floating-point weights (any float dtype; quantized from fp32).
      dtype: ``jnp.float8_e4m3fn`` (the default: more mantissa, the inference format) or
        ``jnp.float8_e5m2``.
      scale: ``"per_channel"``: one fp32 scale per output column of gate and of up (the
        column's largest magnitude maps onto the format's largest value); ``"per_tensor"``:
        one scale for both matrices.

    Returns:
      :class:`QuantizedWeights`, which :func:`jax_swiglu.swiglu` and
      :func:`jax_swiglu.fused_mlp` take in place of :class:`~jax_swiglu.PackedWeights`.
    """
    dtype = check_fp8_dtype(dtype, "dtype")
    if scale not in SCALE_MODES:
        raise ValueError(f"scale must be one of {SCALE_MODES}, got {scale!r}")
    for name, w in (("w_gate", w_gate), ("w_up", w_up)):
        if not hasattr(w, "shape") or w.ndim != 2:
            raise ValueError(f"{name} must be a [K, N] array, got "
                             f"{tuple(getattr(w, 'shape', ())) or type(w).__name__}")
        if not jnp.issubdtype(w.dtype, jnp.floating) or jnp.dtype(w.dtype) in FP8_DTYPES:
            raise TypeError(f"{name} must be a bf16/f16/f32 array to quantize, got {w.dtype}")
    if w_gate.shape != w_up.shape:
        raise ValueError(f"w_gate {tuple(w_gate.shape)} and w_up {tuple(w_up.shape)} must have "
                         "the same shape")
    k, n = w_gate.shape
    _layout.check_alignment(k, n)
    pad = [(0, 0), (0, _layout.padded_n(n) - n)]
    packed = _layout.interleave_gate_up(jnp.pad(jnp.asarray(w_gate, jnp.float32), pad),
                                        jnp.pad(jnp.asarray(w_up, jnp.float32), pad))
    amax = jnp.max(jnp.abs(packed), axis=0 if scale == "per_channel" else None)
    scales, inverse = _scales(amax, dtype)
    data = _cast(packed * inverse, dtype).T  # [2 N_pad, K]: K-major
    return QuantizedWeights._wrap(data, scales, n, scale, LAYOUT)


@jax.tree_util.register_pytree_node_class
class QuantizedDown:
    """The down projection ``w_down [N, K_out]`` in fp8 with fp32 scales, stored K-major for
    the GEMM that consumes ``h [M, N]``: ``data [K_out, N]`` (row ``o`` holds output channel
    ``o``'s weights over the N features, the contraction contiguous, as fp8 GEMMs read it) and
    ``scales [K_out]`` (``"per_channel"``: one per output channel) or ``[]``
    (``"per_tensor"``). ``w_down[j, o] = data[o, j] * scales[o]``. Build it with
    :func:`quantize_down`; a pytree with leaves ``data`` and ``scales``, the scale mode
    static."""

    __slots__ = ("data", "scales", "scale_mode")

    def __init__(self, data: Any, scales: Any, scale_mode: str = "per_channel"):
        for name, value in (("data", data), ("scales", scales)):
            if not (hasattr(value, "shape") and hasattr(value, "dtype")):
                raise TypeError(f"{name} must be an array, got {type(value).__name__}")
        for name, value in (("data", data), ("scales", scales), ("scale_mode", scale_mode)):
            object.__setattr__(self, name, value)
        self.validate()

    @classmethod
    def _wrap(cls, data, scales, scale_mode) -> QuantizedDown:
        down = object.__new__(cls)
        for name, value in (("data", data), ("scales", scales), ("scale_mode", scale_mode)):
            object.__setattr__(down, name, value)
        return down

    def __setattr__(self, name, value):
        raise AttributeError(f"QuantizedDown is immutable; cannot set {name!r}")

    def __repr__(self):
        return (f"QuantizedDown(data={self.data!r}, scales={self.scales!r}, "
                f"scale_mode={self.scale_mode!r})")

    def tree_flatten(self):
        return (self.data, self.scales), (self.scale_mode,)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls._wrap(*children, *aux)

    def __reduce__(self):
        return QuantizedDown._wrap, (self.data, self.scales, self.scale_mode)

    @property
    def n(self) -> int:
        """N, the features the projection contracts (the gate/up output columns)."""
        return self.data.shape[1]

    @property
    def k_out(self) -> int:
        return self.data.shape[0]

    @property
    def dtype(self):
        return self.data.dtype

    def validate(self) -> None:
        """Raises TypeError/ValueError if the arrays do not match the scale mode."""
        if self.scale_mode not in SCALE_MODES:
            raise ValueError(f"scale_mode must be one of {SCALE_MODES}, got {self.scale_mode!r}")
        check_fp8_dtype(self.data.dtype, "QuantizedDown data")
        shape = tuple(self.data.shape)
        if len(shape) != 2 or 0 in shape:
            raise ValueError(f"QuantizedDown data must be [K_out, N], got shape {shape}")
        _check_scales("QuantizedDown", self.scales, self.scale_mode, shape[0])


def quantize_down(w_down, *, dtype=jnp.float8_e4m3fn, scale: str = "per_channel") -> QuantizedDown:
    """Quantizes the down projection ``w_down [N, K_out]`` to fp8 once, at load time, for
    :func:`jax_swiglu.fused_mlp` (``dtype`` and ``scale`` as in :func:`quantize_weights`,
    per output channel by default)."""
    dtype = check_fp8_dtype(dtype, "dtype")
    if scale not in SCALE_MODES:
        raise ValueError(f"scale must be one of {SCALE_MODES}, got {scale!r}")
    if not hasattr(w_down, "shape") or w_down.ndim != 2:
        raise ValueError(f"w_down must be a [N, K_out] array, got "
                         f"{tuple(getattr(w_down, 'shape', ())) or type(w_down).__name__}")
    if not jnp.issubdtype(w_down.dtype, jnp.floating) or jnp.dtype(w_down.dtype) in FP8_DTYPES:
        raise TypeError(f"w_down must be a bf16/f16/f32 array to quantize, got {w_down.dtype}")
    if 0 in w_down.shape:
        raise ValueError(f"w_down must be a non-empty [N, K_out] array, got shape "
                         f"{tuple(w_down.shape)}")
    w = jnp.asarray(w_down, jnp.float32)
    amax = jnp.max(jnp.abs(w), axis=0 if scale == "per_channel" else None)
    scales, inverse = _scales(amax, dtype)
    return QuantizedDown._wrap(_cast(w * inverse, dtype).T, scales, scale)  # [K_out, N]


def dequantize_down(down: QuantizedDown):
    """``w_down [N, K_out]`` fp32: the values the quantized down projection stands for."""
    if not isinstance(down, QuantizedDown):
        raise TypeError(f"down must be QuantizedDown from jax_swiglu.quantize_down, got "
                        f"{type(down).__name__}")
    down.validate()
    scales = down.scales[:, None] if down.scales.ndim else down.scales
    return (down.data.astype(jnp.float32) * scales).T


def dequantize_weights(weights: QuantizedWeights):
    """``(w_gate, w_up)``, each ``[K, N]`` fp32: the values the quantized weights stand for."""
    weights = as_quantized(weights, "weights")
    packed = weights.data.astype(jnp.float32).T * weights.scales
    return _layout.split_gate_up(packed, weights.n)


def quantize_tokens(x, dtype=jnp.float8_e4m3fn):
    """``(x_q, x_scale)``: ``x [..., K]`` per row in fp8, and its fp32 scales ``[...]``:
    powers of two, each the smallest that brings its row's largest magnitude within the
    format's largest finite value (1 for a row of zeros or with an infinity or NaN), so
    ``x_q = fp8(x / x_scale)`` is exact up to the one rounding of the cast, on every
    backend (see the module docstring)."""
    dtype = check_fp8_dtype(dtype, "dtype")
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(f"x must be an array [..., K], got {type(x).__name__}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x must be a floating-point array to quantize, got {x.dtype}")
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must be [..., K] with K > 0, got shape {tuple(x.shape)}")
    x = jnp.asarray(x, jnp.float32)
    # A NaN anywhere in the row makes its amax NaN (XLA's max on the CPU may drop NaNs).
    amax = jnp.where(jnp.isnan(x).any(axis=-1), jnp.nan, jnp.max(jnp.abs(x), axis=-1))
    scale, inverse = _token_scales(amax, dtype)
    return _cast(x * inverse[..., None], dtype), scale


def as_quantized(weights, argname: str) -> QuantizedWeights:
    if not isinstance(weights, QuantizedWeights):
        raise TypeError(f"{argname} must be QuantizedWeights from jax_swiglu.quantize_weights, "
                        f"got {type(weights).__name__}")
    weights.validate()
    return weights
