"""The specification: what every kernel computes, written in plain XLA.

``swiglu_reference`` is the spec the tests, the benchmarks and the non-CUDA lowering all
use: the two products accumulated in fp32 (bf16/fp16 products are exact in fp32), the
gate's activation and the product in fp32, and a single rounding to the input dtype at
the end. ``ACTIVATIONS`` names the gated activations: ``"silu"`` (SwiGLU: Llama, Qwen,
Mistral, ...) and ``"gelu_tanh"`` (GeGLU with GELU's tanh approximation: Gemma); the
kernels compile the same list under the same names (ffi/kernel_configs.h).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import _layout, _quantize


def dot_precision(dtype):
    """The dot precision that gives exact fp32 accumulation for inputs of ``dtype``.

    bf16/f16 products are exact in fp32, so the default precision already accumulates them in
    fp32 (one cuBLAS GEMM); asking for HIGHEST there makes XLA treat the dot as an fp32 one
    and, for a one-row ``x``, emit a transpose-and-reduce fusion instead of a GEMM. Only
    float32 inputs need HIGHEST, to be computed in full fp32 rather than TF32.
    """
    return (jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.dtype(jnp.float32)
            else jax.lax.Precision.DEFAULT)


def _dot_f32(x, w):
    # Inputs stay in their dtype (a bf16 GEMM with fp32 accumulation on GPU); float64 inputs
    # accumulate in float64.
    dtype = jnp.result_type(x, w)
    return jnp.matmul(x, w, preferred_element_type=jnp.promote_types(dtype, jnp.float32),
                      precision=dot_precision(dtype))


def _gelu_tanh(gate):
    return jax.nn.gelu(gate, approximate=True)


# name -> act(g); the gated product is act(x @ W_gate) * (x @ W_up).
ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": _gelu_tanh}
# Other names models give the same two (Hugging Face's hidden_act values). Hugging Face's
# "gelu" is the exact, erf-based GELU, which no kernel computes: it is not an alias (pass
# ``functools.partial(jax.nn.gelu, approximate=False)`` as a callable).
ACTIVATION_ALIASES = {"swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}


def activation_name(activation) -> str | None:
    """The kernels' name for ``activation`` (a name, an alias, or one of the functions they
    compute: ``jax.nn.silu``, ``jax.nn.gelu``, whose default is the tanh approximation), else
    None."""
    if isinstance(activation, str):
        name = ACTIVATION_ALIASES.get(activation, activation)
        return name if name in ACTIVATIONS else None
    if activation is jax.nn.gelu:
        return "gelu_tanh"
    return next((name for name, fn in ACTIVATIONS.items() if activation is fn), None)


def resolve_activation(activation):
    """``activation`` as the calls take it: the kernels' name where it has one, else the
    callable itself (which only the XLA path runs); anything else is an error."""
    name = activation_name(activation)
    if name is not None:
        return name
    if callable(activation) and not isinstance(activation, str):
        return activation
    raise ValueError(
        f"activation must be one of {tuple(ACTIVATIONS)} (SiLU for SwiGLU, GELU's tanh "
        f"approximation for Gemma's GeGLU), an alias of them ({', '.join(ACTIVATION_ALIASES)}) "
        f"or a callable act(g) (run on the XLA path), got {activation!r}")


def activation_label(activation) -> str:
    """How explain and errors name an activation (a name, or a callable's own name)."""
    if isinstance(activation, str):
        return activation
    return getattr(activation, "__name__", None) or type(activation).__name__


def check_activation(activation) -> None:
    """The kernels compile these names only (the primitive's ``activation``)."""
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"activation must be one of {tuple(ACTIVATIONS)} (SiLU for SwiGLU, GELU's tanh "
            f"approximation for Gemma's GeGLU), got {activation!r}")


def gated(gate_f32, up_f32, activation="silu"):
    """``act(g) * u`` in fp32 (the fused epilogue's math); ``activation`` a name, an alias
    or a callable."""
    act = resolve_activation(activation)
    return (ACTIVATIONS[act] if isinstance(act, str) else act)(gate_f32) * up_f32


def swiglu_reference(x, w_gate, w_up=None, *, activation="silu", x_scale=None):
    """``act(x @ w_gate) * (x @ w_up)``: fp32 accumulation and math, rounded once.

    Takes the weights as they are, ``swiglu_reference(x, w_gate, w_up)``, or as
    :func:`jax_swiglu.swiglu` takes them, ``swiglu_reference(x, packed)``: so code that
    trains (the fused call is inference only) switches by this one name. This path is
    plain XLA, differentiable, and runs any float dtype.

    Args:
      x: ``[..., K]``.
      w_gate, w_up: ``[K, N]``; or ``w_gate`` alone, a :class:`~jax_swiglu.PackedWeights`
        (or fp8 :class:`~jax_swiglu.QuantizedWeights`, which gives
        :func:`swiglu_reference_quantized`).
      activation: ``"silu"`` (SwiGLU, the default) or ``"gelu_tanh"`` (GeGLU,
        ``jax.nn.gelu(g, approximate=True)``), an alias (:data:`ACTIVATION_ALIASES`), or any
        callable ``act(g)`` (applied to the fp32 gate).
      x_scale: with fp8 weights and an fp8 ``x`` only, as in :func:`jax_swiglu.swiglu`.

    Returns:
      ``[..., N]`` in ``x.dtype``.
    """
    if w_up is None:
        return _reference_on_swiglu_arguments(x, w_gate, activation, x_scale)
    if x_scale is not None:
        raise ValueError("x_scale is for fp8 weights (QuantizedWeights) only")
    return gated(_dot_f32(x, w_gate), _dot_f32(x, w_up), activation).astype(x.dtype)


def _reference_on_swiglu_arguments(x, weights, activation, x_scale):
    """:func:`swiglu_reference` on ``swiglu``'s ``(x, packed)``, checked as ``swiglu`` checks."""
    activation = resolve_activation(activation)
    if isinstance(weights, _quantize.QuantizedWeights):
        return swiglu_reference_quantized(x, weights, x_scale=x_scale, activation=activation)
    if x_scale is not None:
        raise ValueError("x_scale is for fp8 weights (QuantizedWeights); these are "
                         f"{type(weights).__name__}")
    if not isinstance(weights, _layout.PackedWeights) and hasattr(weights, "shape"):
        raise TypeError(
            "swiglu_reference takes (x, w_gate, w_up) or, as swiglu, (x, packed); got one "
            f"array of shape {tuple(weights.shape)} for the weights. Pass w_up too, or pack "
            "them (jax_swiglu.pack_weights)")
    packed = _layout.as_packed(weights, "packed")
    if not (hasattr(x, "shape") and hasattr(x, "dtype")) or x.ndim < 1:
        raise TypeError(f"x must be an array [..., K], got {type(x).__name__}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x must be a floating-point array, got {x.dtype}")
    if x.shape[-1] != packed.k:
        raise ValueError(
            f"x has K={x.shape[-1]} (shape {tuple(x.shape)}) but the weights have K={packed.k}")
    return swiglu_reference_packed(x, packed.data, packed.n, activation)


def swiglu_reference_packed(x, packed_data, n: int, activation="silu"):
    """The reference on packed weights: one ``[.., K] x [K, 2N]`` product, then the split.

    This is what the primitive lowers to off CUDA (and for ``kernel="xla"``).
    """
    gate, up = _layout.split_gate_up(_dot_f32(x, packed_data), n)
    return gated(gate, up, activation).astype(x.dtype)


# --- grouped (expert) calls (jax_swiglu/_experts.py) -------------------------------------------

def defined_group_sizes(group_sizes, tokens: int):
    """The group sizes a grouped call runs: negative sizes count as 0, and the groups end at
    the last row (a sum over ``tokens`` gives the later experts fewer rows, or none). Within
    those bounds the sizes are used as given; this makes any device-computed value defined.
    The grouped kernel's scheduler reads the sizes the same way
    (ffi/kernels/schedulers/expert_groups.cuh)."""
    sizes = jnp.clip(group_sizes, 0, tokens).astype(jnp.int32)
    # The running sum stops at the last row at every step (no partial sum exceeds twice the
    # rows), so sizes near the int32 range cannot wrap it.
    ends = jax.lax.associative_scan(lambda a, b: jnp.minimum(a + b, tokens), sizes)
    return jnp.diff(ends, prepend=jnp.zeros((1,), ends.dtype))


def ragged_product(x, w, sizes):
    """``jax.lax.ragged_dot(x, w, sizes)`` accumulated in fp32 (float64 for float64 ``x``) at
    :func:`dot_precision`. Under a mesh with explicit axes, for which jax infers no output
    sharding of a ragged_dot, the product keeps ``x``'s row sharding."""
    out_sharding = None
    for operand in (x, w, sizes):
        sharding = getattr(jax.typeof(operand), "sharding", None)
        mesh = getattr(sharding, "mesh", None)
        if (mesh is not None and not mesh.empty
                and jax.sharding.AxisType.Explicit in mesh.axis_types):
            rows = jax.typeof(x).sharding.spec if operand is x else ()
            out_sharding = jax.sharding.NamedSharding(
                mesh, jax.sharding.PartitionSpec(rows[0] if len(rows) else None, None))
            break
    return jax.lax.ragged_dot(x, w, sizes,
                              preferred_element_type=jnp.promote_types(x.dtype, jnp.float32),
                              precision=dot_precision(x.dtype), out_sharding=out_sharding)


def grouped_swiglu_reference_packed(x, experts_data, group_sizes, n: int, activation="silu"):
    """The grouped spec on packed expert weights ``[E, K, 2 N_pad]``: one ``ragged_dot`` over
    the defined group sizes with fp32 accumulation (float64 for float64 x), the split,
    ``act(g) * u`` in fp32, one rounding; rows past the groups are zeros. What the grouped
    primitive lowers to off CUDA (and for ``kernel="xla"``)."""
    sizes = defined_group_sizes(group_sizes, x.shape[0])
    product = ragged_product(x, experts_data, sizes)
    gate, up = _layout.split_gate_up(product, n)
    return gated(gate, up, activation).astype(x.dtype)


# --- fp8 weights (jax_swiglu/_quantize.py) ----------------------------------------------------

def fp8_output_dtype(x_dtype):
    """A call returns x's dtype, and bfloat16 for fp8 x (on fp8 weights)."""
    return jnp.dtype(jnp.bfloat16) if jnp.dtype(x_dtype) in _quantize.FP8_DTYPES else jnp.dtype(
        x_dtype)


def quantized_tokens(x, x_scale, weights_dtype):
    """(x_q, x_scale): fp8 x as given, 16-bit x quantized per row to the weights' format."""
    if x_scale is None:
        return _quantize.quantize_tokens(x, weights_dtype)
    return x, x_scale


def swiglu_reference_quantized(x, weights, *, x_scale=None, activation: str = "silu"):
    """The fp8 spec: ``act(x @ W_gate) * (x @ W_up)`` in fp32 math on the dequantized inputs.

    ``weights`` is :class:`~jax_swiglu.QuantizedWeights`; ``x`` is fp8 with its per-row
    ``x_scale``, or 16-bit and quantized per row first (:func:`jax_swiglu.quantize_tokens`, as every
    fp8 path does). The dequantized values (fp8 times scale) are multiplied in
    fp32 at full precision; the result is rounded once to :func:`fp8_output_dtype`.
    """
    weights = _quantize.as_quantized(weights, "weights")
    x_q, x_scale = quantized_tokens(x, x_scale, weights.dtype)
    return swiglu_reference_quantized_operands(
        x_q, x_scale, weights.data, weights.scales, n=weights.n, activation=activation,
        out_dtype=fp8_output_dtype(x.dtype))


def swiglu_reference_quantized_operands(x_q, x_scale, data, scales, *, n: int, activation: str,
                                        out_dtype):
    """:func:`swiglu_reference_quantized` on operands already quantized (``x_q [..., K]`` fp8
    with ``x_scale [...]``, a :class:`~jax_swiglu.QuantizedWeights`' ``data`` and ``scales``).

    Optimization barriers keep the math as written. Around the fp8 operands: XLA may drop a
    rounding it can see undone (``convert(convert(x, fp8), f32)`` on freshly quantized x, by
    its excess-precision rule), which would skip x's quantization. Around the dequantized
    values: XLA's GPU compiler recognizes ``dot(convert(fp8) * scale, ...)`` and rewrites it
    into its own fp8 GEMM, whose accumulation is not fp32's."""
    x_q, data = jax.lax.optimization_barrier((x_q, data))
    w_gate, w_up = _layout.split_gate_up(data.astype(jnp.float32).T * scales, n)
    x_f32 = x_q.astype(jnp.float32) * x_scale[..., None]
    x_f32, w_gate, w_up = jax.lax.optimization_barrier((x_f32, w_gate, w_up))
    highest = jax.lax.Precision.HIGHEST
    gate = jnp.matmul(x_f32, w_gate, precision=highest)
    up = jnp.matmul(x_f32, w_up, precision=highest)
    return gated(gate, up, activation).astype(out_dtype)


def fp8_dot_precision(accumulation: str):
    """The precision of an XLA fp8 dot that adds as ``accumulation`` says: HIGHEST, for which
    XLA asks cuBLASLt for promoted sums, or DEFAULT, fast accumulation. DEFAULT is named:
    None would take jax's default_matmul_precision, which may be HIGHEST."""
    return (jax.lax.Precision.HIGHEST if accumulation == "promoted"
            else jax.lax.Precision.DEFAULT)


def down_projection_quantized(h, down, *, reduce_dtype, accumulation: str = "promoted",
                              out_sharding=None):
    """The down projection of a block in fp8 (:func:`jax_swiglu.fused_mlp` with
    :class:`~jax_swiglu.QuantizedDown`): ``h [..., N]`` (the gated activations, in the call's
    dtype) quantized per row as x is (:func:`jax_swiglu.quantize_tokens`), one scaled fp8 dot
    with ``down.data [K_out, N]`` into fp32 (XLA's fp8 GEMM on Hopper, both operands K-major:
    at default precision it asks for fast accumulation, at ``Precision.HIGHEST`` for promoted
    sums, as ``accumulation`` says), both scales applied in fp32, the result in
    ``reduce_dtype``."""
    h_q, h_scale = _quantize.quantize_tokens(h, down.dtype)
    precision = fp8_dot_precision(accumulation)
    product = jax.lax.dot_general(h_q, down.data, (((h_q.ndim - 1,), (1,)), ((), ())),
                                  precision=precision, preferred_element_type=jnp.float32,
                                  out_sharding=out_sharding)
    return (product * h_scale[..., None] * down.scales).astype(reduce_dtype)


def fused_mlp_reference_quantized(x, weights, down, *, activation: str = "silu"):
    """The spec of a whole fp8 block: :func:`swiglu_reference_quantized`, its result (rounded
    to the call's dtype, as the fused kernel stores it) quantized per row, and the down
    projection in fp32 math on the dequantized values, rounded once."""
    h = swiglu_reference_quantized(x, weights, activation=activation)
    return down_projection_reference_quantized(h, down, out_dtype=fp8_output_dtype(x.dtype))


def down_projection_reference_quantized(h, down, *, out_dtype):
    """The spec of the down projection in fp8, given the gated activations ``h [..., N]``: h
    quantized per row, the product in fp32 math on the dequantized values, rounded once.
    Testing a block against it with the h the block computed separates the two halves: h
    near an fp8 rounding boundary turns a one-step difference in h into a whole fp8 step."""
    h_q, h_scale = _quantize.quantize_tokens(h, down.dtype)
    h_f32 = h_q.astype(jnp.float32) * h_scale[..., None]
    w_down = _quantize.dequantize_down(down)
    h_f32, w_down = jax.lax.optimization_barrier((h_f32, w_down))
    out = jnp.matmul(h_f32, w_down, precision=jax.lax.Precision.HIGHEST)
    return out.astype(out_dtype)


def swiglu_xla_quantized(x, weights, *, x_scale=None, activation: str = "silu",
                         accumulation: str = "fast"):
    """What a user would write in plain XLA for fp8 weights, the benchmarks' baseline: one
    scaled fp8 dot ``x_q [M, K] x data^T`` asking for an fp32 result (cuBLASLt's fp8 GEMM on
    Hopper), the two scales applied to the product, then the split, the activation in fp32
    and one rounding. Not the spec: :func:`swiglu_reference_quantized` is.

    ``accumulation="fast"`` is the dot at default precision, for which XLA asks cuBLASLt for
    fast accumulation (the tensor cores add all of K); ``"promoted"`` the dot at
    ``Precision.HIGHEST``, which XLA runs without it."""
    weights = _quantize.as_quantized(weights, "weights")
    x_q, x_scale = quantized_tokens(x, x_scale, weights.dtype)
    return swiglu_xla_quantized_operands(x_q, x_scale, weights.data, weights.scales,
                                         n=weights.n, activation=activation,
                                         out_dtype=fp8_output_dtype(x.dtype),
                                         accumulation=accumulation)


def swiglu_xla_quantized_operands(x_q, x_scale, data, scales, *, n: int, activation: str,
                                  out_dtype, accumulation: str):
    """:func:`swiglu_xla_quantized` on operands already quantized (as
    :func:`swiglu_reference_quantized_operands` takes them)."""
    if accumulation not in ("promoted", "fast"):
        raise ValueError(f"accumulation must be 'promoted' or 'fast', got {accumulation!r}")
    precision = fp8_dot_precision(accumulation)
    product = jax.lax.dot_general(x_q, data, (((x_q.ndim - 1,), (1,)), ((), ())),
                                  precision=precision, preferred_element_type=jnp.float32)
    product = product * x_scale[..., None] * scales
    gate, up = _layout.split_gate_up(product, n)
    return gated(gate, up, activation).astype(out_dtype)
