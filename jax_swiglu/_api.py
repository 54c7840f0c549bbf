"""Public entry points: ``swiglu``, ``fused_mlp`` and ``explain``."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from . import _launch, _layout, _native, _primitive, _quantize, _reference, selection
from ._primitive import swiglu_p


def _check_is_array(x) -> None:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"x must be an array, got {type(x).__name__}")


def _check_x(x, packed: _layout.PackedWeights):
    _check_is_array(x)
    if x.ndim < 1:
        raise ValueError("x must have shape [..., K] (at least one dimension), got a scalar")
    if jnp.dtype(x.dtype) in _quantize.FP8_DTYPES:
        raise TypeError(f"x is {x.dtype}: fp8 x runs on fp8 weights (jax_swiglu.quantize_weights)"
                        ", these are PackedWeights")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x must be a floating-point array (bfloat16 or float16 for the fused "
                        f"kernels), got {x.dtype}")
    if packed.dtype != x.dtype:
        raise TypeError(
            f"x is {x.dtype} but the packed weights are {packed.dtype}; they must match")
    if x.shape[-1] != packed.k:
        raise ValueError(
            f"x has K={x.shape[-1]} (shape {tuple(x.shape)}) but the weights have K={packed.k}")


def _check_fp8_call(x, weights: _quantize.QuantizedWeights, x_scale):
    """Trace-time checks of a call on fp8 weights (see :func:`swiglu`)."""
    weights.validate()
    if not hasattr(x, "shape") or not hasattr(x, "dtype") or x.ndim < 1:
        raise TypeError(f"x must be an array [..., K], got {type(x).__name__}")
    if x.shape[-1] != weights.k:
        raise ValueError(f"x has K={x.shape[-1]} (shape {tuple(x.shape)}) but the quantized "
                         f"weights have K={weights.k}")
    x_dtype = jnp.dtype(x.dtype)
    if x_dtype in _quantize.FP8_DTYPES:
        if x_dtype != jnp.dtype(weights.dtype):
            raise TypeError(f"x is {x_dtype} but the weights are {weights.dtype}: one fp8 format "
                            "for both (quantize x with jax_swiglu.quantize_tokens(x, "
                            f"{weights.dtype}))")
        if x_scale is None:
            raise TypeError("x is fp8, so its per-row scales are needed: pass x_scale "
                            f"(float32, shape {tuple(x.shape[:-1])}), as quantize_tokens returns")
        if not hasattr(x_scale, "dtype") or jnp.dtype(x_scale.dtype) != jnp.dtype(jnp.float32):
            raise TypeError(f"x_scale must be float32, got {getattr(x_scale, 'dtype', x_scale)}")
        if tuple(x_scale.shape) != tuple(x.shape[:-1]):
            raise ValueError(f"x_scale must have one scale per row of x, shape "
                             f"{tuple(x.shape[:-1])}, got {tuple(x_scale.shape)}")
    elif x_dtype in _layout.KERNEL_DTYPES:
        if x_scale is not None:
            raise ValueError(f"x_scale is for fp8 x; x is {x_dtype} and is quantized per row "
                             "inside the call")
    else:
        raise TypeError(f"with fp8 weights x must be bfloat16, float16 or fp8 (with x_scale), "
                        f"got {x_dtype}")


def _xla_only_reason(x_dtype, activation) -> str | None:
    """Why a call can only run on the XLA path (a dtype or an activation no kernel has)."""
    if jnp.dtype(x_dtype) not in _layout.KERNEL_DTYPES and (
            jnp.dtype(x_dtype) not in _quantize.FP8_DTYPES):
        return f"the fused kernels take bfloat16 or float16, x is {jnp.dtype(x_dtype)}"
    if not isinstance(activation, str):
        return (f"the activation {_reference.activation_label(activation)} is a callable; the "
                f"kernels compile {', '.join(_reference.ACTIVATIONS)}")
    return None


def _refuse_forced_fused(kernel: str, launch, why: str) -> None:
    """A forced kernel family or launch on a call that only the XLA path runs is an error."""
    if launch is not None or kernel not in ("auto", "xla"):
        asked = f"launch={launch}" if launch is not None else f"kernel={kernel!r}"
        raise ValueError(f"{asked} cannot run this call: {why}. kernel='auto' or 'xla' runs "
                         "it on the XLA path")


def _requested_launch(launch, kernel: str, weights: str, n: int, k: int, weights_dtype):
    """The forced launch as a ``Launch`` (None for none), checked where the check does not
    depend on M (which a sharded call only knows per device): the row is compiled, runs these
    operands and this family, and takes the attributes and K given."""
    if launch is None:
        return None
    launch = _launch.parse(launch)
    if not _native.kernels_available():
        # Like a forced kernel: for CUDA, where lowering says the extension is missing;
        # elsewhere the reference runs.
        return launch
    row = launch.row
    operands = _primitive.operands_of(weights, weights_dtype)
    if kernel == "xla":
        raise ValueError(f"launch={launch} and kernel='xla' ask for two different paths")
    # An M the row runs: the M-dependent checks run per device, when the call is lowered.
    problem = selection.Problem(row.m_multiple, n, k, "bfloat16", operands)
    selection.check_forced_launch(launch, problem, kernel)
    return launch


def swiglu(x, packed, *, kernel: str = "auto", launch=None, activation="silu",
           x_scale=None, accumulation: str = "promoted"):
    """``act(x @ W_gate) * (x @ W_up)`` as one fused kernel (inference only): SwiGLU with
    ``activation="silu"`` (the default), GeGLU with ``"gelu_tanh"``.

    Args:
      x: ``[..., K]`` bfloat16 or float16; leading dimensions are folded into M. A rank-1
        ``x`` is one token (``[K] -> [N]``), as with ``x @ W``. Other float dtypes (float32,
        float64) run the same math on the XLA path (:func:`swiglu_reference`).
      packed: :class:`PackedWeights` from :func:`pack_weights`, same dtype as ``x``; or fp8
        :class:`QuantizedWeights` from :func:`quantize_weights` (see ``x_scale``).
      kernel: ``"auto"`` (the selection: autotune cache, tuning data, heuristic; see
        :func:`explain`), a kernel family (``"interleaved"``, ``"gate_then_up"`` (also
        ``"pingpong"``), ``"gemv"``: its best launch for the call) or ``"xla"`` (the plain
        XLA path). ``JAX_SWIGLU_KERNEL`` sets the same globally; it is read when the call is
        traced.
      launch: one launch to run instead of the selection's: a row of
        :func:`kernel_configs` (or its id), or the text form :func:`explain` prints, e.g.
        ``"interleaved:18,splits=2"`` (options ``splits``, ``swizzle``, ``raster``,
        ``promotion``). A launch that cannot run the call is a ValueError.
      activation: the gate's activation ``act``: ``"silu"`` (Llama, Qwen, Mistral, ...) or
        ``"gelu_tanh"`` (Gemma: ``jax.nn.gelu(g, approximate=True)``), also by the names in
        ``ACTIVATION_ALIASES`` (``"swish"``, ``"gelu_pytorch_tanh"``, ...) or as
        ``jax.nn.silu`` / ``jax.nn.gelu``; any other callable ``act(g)`` runs on the XLA
        path (:func:`explain` says so).
      x_scale: with fp8 weights (:class:`QuantizedWeights` from :func:`quantize_weights`) and
        an fp8 ``x`` only: ``x``'s float32 per-row scales, shape ``x.shape[:-1]``. A 16-bit
        ``x`` is quantized per row first (:func:`quantize_tokens`' values, inside the
        call). fp8 calls run the fused fp8 kernel on an SM90 GPU (e4m3 weights, K a
        multiple of 16), else the XLA path: for e4m3 weights on a GPU with fp8 tensor cores
        XLA's own scaled fp8 dot (at ``Precision.HIGHEST`` for promoted sums, at default
        precision for fast ones), otherwise the dequantized values in fp32 math
        (:func:`swiglu_reference_quantized`, the spec). They return x's dtype for 16-bit
        ``x``, bfloat16 for fp8 ``x``.
      accumulation: with fp8 weights, how the fused kernel adds the products: ``"promoted"``
        (the default: the tensor cores' partial sums, which they add at less than fp32
        precision, are promoted to fp32 after every k tile of 128) or ``"fast"`` (the tensor
        cores add all of K and promote once, as cuBLASLt's fast accumulation and XLA's fp8
        dot at default precision do: faster, and further from the fp32 sums on long K; an
        XLA path on XLA's fp8 GEMM asks it for the same). 16-bit weights always accumulate
        in fp32.

    Returns:
      ``[..., N]``: products accumulated in fp32, activation and product in fp32, rounded
      once.

    Sharded operands (``jax.jit`` with shardings, or the local blocks inside
    ``jax.shard_map``): each device runs the kernel on its own block. Tokens may be sharded,
    and N in whole gate/up pairs (the weights' N axis); a sharded K is all-gathered first.
    """
    activation = _reference.resolve_activation(activation)
    kernel = selection.requested_kernel(kernel)
    _primitive.check_accumulation(accumulation, isinstance(packed, _quantize.QuantizedWeights),
                                  launch)
    if isinstance(packed, _quantize.QuantizedWeights):
        _check_fp8_call(x, packed, x_scale)
        why = _xla_only_reason(x.dtype, activation)
        if why:
            _refuse_forced_fused(kernel, launch, why)
            return _fp8_on_xla(x, packed, x_scale, activation, accumulation)
        forced = _requested_launch(launch, kernel, "fp8", packed.n, packed.k, packed.dtype)
        return _swiglu_fp8(x, packed, kernel=kernel, launch=forced, activation=activation,
                           x_scale=x_scale, accumulation=accumulation)
    if x_scale is not None:
        raise ValueError("x_scale is for fp8 weights (QuantizedWeights); these are "
                         f"{type(packed).__name__}")
    packed = _layout.as_packed(packed, "packed")
    _check_x(x, packed)
    why = _xla_only_reason(x.dtype, activation)
    if why:
        # The spec in plain XLA (differentiable, unlike the fused primitive).
        _refuse_forced_fused(kernel, launch, why)
        return _reference.swiglu_reference_packed(x, packed.data, packed.n, activation)
    forced = _requested_launch(launch, kernel, "packed", packed.n, packed.k, packed.dtype)
    lead = x.shape[:-1]
    m = math.prod(lead)
    if m == 0:
        return jnp.zeros((*lead, packed.n), x.dtype)
    y = swiglu_p.bind(x.reshape(m, packed.k), packed.data, n=packed.n, weights="packed",
                      kernel=kernel, launch=forced, activation=activation,
                      out_dtype=jnp.dtype(x.dtype).name, accumulation="promoted")
    return y.reshape(*lead, packed.n)


def _xla_fp8_gemm_runs(weights: _quantize.QuantizedWeights) -> bool:
    """Whether a CUDA lowering of an fp8 call XLA runs whole is XLA's fp8 GEMM, not the spec."""
    return selection.xla_runs_fp8_gemm(_primitive.operands_of("fp8", weights.dtype), weights.k,
                                       "cuda")


def _fp8_on_xla(x, weights: _quantize.QuantizedWeights, x_scale, activation, accumulation):
    """An fp8 call no kernel can run (_xla_only_reason): on CUDA XLA's fp8 GEMM where the GPU
    has one, as the primitive's XLA path; elsewhere the spec."""
    def spec(x, weights, x_scale):
        return _reference.swiglu_reference_quantized(x, weights, x_scale=x_scale,
                                                     activation=activation)
    if not _xla_fp8_gemm_runs(weights):
        return spec(x, weights, x_scale)

    def gemm(x, weights, x_scale):
        tokens = (x,) if x_scale is None else (x, x_scale)
        return _primitive.xla_fp8_gemm((*tokens, weights.data, weights.scales), n=weights.n,
                                       activation=activation,
                                       out_dtype=_reference.fp8_output_dtype(x.dtype),
                                       accumulation=accumulation)
    return jax.lax.platform_dependent(x, weights, x_scale, default=spec, cuda=gemm)


def _swiglu_fp8(x, weights: _quantize.QuantizedWeights, *, kernel, launch, activation, x_scale,
                accumulation):
    out_dtype = _reference.fp8_output_dtype(x.dtype)
    lead = x.shape[:-1]
    m = math.prod(lead)
    if m == 0:
        return jnp.zeros((*lead, weights.n), out_dtype)
    # 16-bit x is quantized per row inside the call (_primitive's lowering); fp8 x comes
    # with its scales.
    tokens = ((x.reshape(m, weights.k),) if x_scale is None
              else (x.reshape(m, weights.k), x_scale.reshape(m)))
    y = swiglu_p.bind(*tokens, weights.data, weights.scales, n=weights.n, weights="fp8",
                      kernel=kernel, launch=launch, activation=activation,
                      out_dtype=out_dtype.name, accumulation=accumulation)
    return y.reshape(*lead, weights.n)


def fused_mlp(x, packed, w_down, *, kernel: str = "auto", launch=None,
              activation="silu", reduce_dtype=None, x_scale=None,
              accumulation: str = "promoted"):
    """A whole gated MLP block: ``(act(x @ W_gate) * (x @ W_up)) @ W_down``.

    The gated part is :func:`swiglu`; the down projection is a plain XLA dot. With the
    Megatron layout (packed weights sharded along N, ``w_down`` along its rows, the same
    mesh axis) the only communication is one all-reduce of the ``[..., K_out]`` result.

    Args:
      x: ``[..., K]``.
      packed: :class:`PackedWeights` (``K -> N``).
      w_down: ``[N, K_out]``, same dtype as ``x``; or :class:`QuantizedDown`
        (:func:`quantize_down`): the gated activations are then quantized per row and the
        down projection is XLA's scaled fp8 dot (fast accumulation where ``accumulation``
        is ``"fast"``), or on one SM90 GPU at a few tokens the decode form's projection
        (a gemv row, the same values), the whole block in fp8 with fp8 ``packed``.
      kernel, launch, activation, x_scale, accumulation: as in :func:`swiglu` (``packed``
        may be fp8 :class:`QuantizedWeights`; a plain ``w_down`` is then in the call's output
        dtype).
      reduce_dtype: ``None`` (x's dtype) or ``jnp.float32``: the dtype of the down
        projection's result before the cast to x's dtype, so under row parallelism the
        dtype of the partial sums that the all-reduce adds. x's dtype, as a plain XLA model
        does it, rounds each shard's partial sum, and where partial sums cancel an element
        can move by a few percent of its value; float32 gives the one-device result up to
        the order of summation, for twice the all-reduce's bytes and a cast after it
        (benchmarks/tensor_parallel.py measures both). On one device the two agree.
    """
    _check_is_array(x)
    if not isinstance(packed, _quantize.QuantizedWeights):
        packed = _layout.as_packed(packed, "packed")
    out_dtype = _reference.fp8_output_dtype(x.dtype)
    reduce_dtype = jnp.dtype(out_dtype if reduce_dtype is None else reduce_dtype)
    if reduce_dtype not in (jnp.dtype(jnp.float32), out_dtype):
        raise TypeError(f"reduce_dtype must be None (x's dtype, {out_dtype}) or float32, got "
                        f"{reduce_dtype}")
    if isinstance(w_down, _quantize.QuantizedDown):
        return _fp8_down_block(x, packed, w_down, out_dtype, reduce_dtype, kernel=kernel,
                               launch=launch, activation=activation, x_scale=x_scale,
                               accumulation=accumulation)
    if not hasattr(w_down, "shape") or w_down.ndim != 2 or w_down.shape[0] != packed.n:
        raise ValueError(
            f"w_down must be [N, K_out] with N={packed.n}, got "
            f"{tuple(getattr(w_down, 'shape', ())) or type(w_down).__name__}")
    if w_down.dtype != out_dtype:
        raise TypeError(f"w_down is {w_down.dtype} but the block computes in {out_dtype} (x is "
                        f"{x.dtype}); they must match")
    y = swiglu(x, packed, kernel=kernel, launch=launch, activation=activation, x_scale=x_scale,
               accumulation=accumulation)
    out = jnp.matmul(y, w_down, preferred_element_type=reduce_dtype,
                     out_sharding=_down_projection_sharding(y, w_down))
    return out.astype(out_dtype)


def _fp8_down_block(x, packed, down, out_dtype, reduce_dtype, *, accumulation, **swiglu_args):
    """:func:`fused_mlp` with the down projection in fp8 (:class:`QuantizedDown`)."""
    down.validate()
    if down.n != packed.n:
        raise ValueError(f"the quantized down projection contracts N={down.n} features, but the "
                         f"gate/up weights give N={packed.n}")
    y = swiglu(x, packed, accumulation=accumulation, **swiglu_args)
    # 16-bit gate/up weights accumulate in fp32: their down projection promotes too.
    fp8_gate_up = isinstance(packed, _quantize.QuantizedWeights)
    down_accumulation = accumulation if fp8_gate_up else "promoted"
    if _explicit_axes(y, down.data):
        # The result's sharding is part of its type: XLA's dot, told it.
        out = _reference.down_projection_quantized(
            y, down, reduce_dtype=reduce_dtype, accumulation=down_accumulation,
            out_sharding=_down_projection_sharding(y, down.data.T))
    elif jnp.dtype(y.dtype) not in _layout.KERNEL_DTYPES:
        # A float32 (or float64) block ran gate/up on XLA's path; its down projection too.
        out = _reference.down_projection_quantized(
            y, down, reduce_dtype=reduce_dtype, accumulation=down_accumulation)
    else:
        # One primitive: the decode form on one device at a few tokens, else XLA's dot.
        lead = y.shape[:-1]
        out = _primitive.down_projection_p.bind(
            y.reshape(-1, y.shape[-1]), down.data, down.scales, accumulation=down_accumulation,
            reduce_dtype=reduce_dtype.name).reshape(*lead, down.k_out)
    return out.astype(out_dtype)


def _explicit_axes(*arrays) -> bool:
    """Whether any of ``arrays`` is typed with explicit mesh axes."""
    explicit = jax.sharding.AxisType.Explicit
    return any(explicit in tuple(jax.typeof(a).sharding.mesh.axis_types) for a in arrays)


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


def explain(x, packed, *, kernel: str = "auto", launch=None, activation="silu",
            platform: str | None = None, accumulation: str = "promoted") -> str:
    """Which kernel a call with these shapes would run, and why, without running it.

    The first line says it in plain words; the second (``details:``) names the launch as
    ``launch=`` takes it, the FFI target, the selection step that decided and its numbers
    (the terms are docs/design.md's).

    ``x`` may be an array or a ``jax.ShapeDtypeStruct``; ``platform`` defaults to the
    default backend. Under sharding each device chooses from its own block: pass the
    per-device ``x`` (and weights) to see its choice.
    """
    _check_is_array(x)
    activation = _reference.resolve_activation(activation)
    kernel = selection.requested_kernel(kernel)
    _primitive.check_accumulation(accumulation, isinstance(packed, _quantize.QuantizedWeights),
                                  launch)
    platform = platform or jax.default_backend()
    platform = "cuda" if platform == "gpu" else platform
    m = math.prod(x.shape[:-1])
    if isinstance(packed, _quantize.QuantizedWeights):
        fp8_x = jnp.dtype(x.dtype) in _quantize.FP8_DTYPES
        _check_fp8_call(x, packed, jax.ShapeDtypeStruct(x.shape[:-1], jnp.float32) if fp8_x
                        else None)
        weights, what = "fp8", f"{x.dtype} x {packed.dtype} weights ({packed.scale_mode})"
        out_dtype = _reference.fp8_output_dtype(x.dtype).name
    else:
        packed = _layout.as_packed(packed, "packed")
        _check_x(x, packed)
        weights, what, out_dtype = "packed", f"{x.dtype}", jnp.dtype(x.dtype).name
    header = (f"M={m} N={packed.n} K={packed.k} {what} {_reference.activation_label(activation)}"
              f" on {platform}: ")
    why = _xla_only_reason(x.dtype, activation)
    if why:
        _refuse_forced_fused(kernel, launch, why)
    forced = None if why else _requested_launch(launch, kernel, weights, packed.n, packed.k,
                                                packed.dtype)
    if m == 0:
        return header + "nothing runs (no tokens: the result is an empty array)"
    if why:
        what = "the XLA reference"
        if weights == "fp8" and platform == "cuda" and _xla_fp8_gemm_runs(packed):
            what = f"XLA's fp8 GEMM, {accumulation} sums"
        return header + f"runs plain XLA, since {why}\n  details: xla ({what})"
    problem = selection.Problem(m, packed.n, packed.k, out_dtype,
                                _primitive.operands_of(weights, packed.dtype), activation,
                                accumulation)
    choice = _primitive.with_accumulation(
        selection.choose(problem, kernel=kernel, launch=forced, platform=platform), accumulation)
    # First what runs and why in plain words, then the launch, its source and its numbers.
    return header + choice.in_words() + "\n  details: " + choice.describe(problem, platform)
