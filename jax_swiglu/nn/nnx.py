"""``flax.nnx`` modules for the gated MLP block ``down(act(gate(x)) * up(x))``: SwiGLU
(``activation="silu"``: Llama, Qwen, Mistral) or GeGLU (``"gelu_tanh"``: Gemma).

:class:`FusedSwiGLUMLP` runs the block through :func:`jax_swiglu.fused_mlp`;
:class:`SwiGLUMLP` is the same block in plain XLA (the reference, and the layout that
checkpoints and other Flax models use). Both have no biases and work under ``nnx.jit`` and
``jax.jit``. They follow ``nnx.Linear``'s conventions: ``dtype=None`` computes in the
promoted dtype of the input and the params, ``param_dtype`` is the stored dtype,
``kernel_init`` may carry logical axis names (``nnx.with_partitioning``), and an abstract
module (``nnx.eval_shape``) takes its weights with ``nnx.update``. Convert with
:meth:`FusedSwiGLUMLP.from_unfused` (any block of gate/up/down linear layers) /
:meth:`~FusedSwiGLUMLP.to_unfused`, or on param dicts with the functions in
:mod:`jax_swiglu.nn`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .. import _api, _experts, _layout, _primitive, _reference, convert, selection
from . import _common

Initializer = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]

default_kernel_init = nnx.initializers.lecun_normal()

# Where a Variable's metadata keeps its logical axis names: out_sharding in flax 0.12,
# sharding_names and sharding in earlier versions.
_SHARDING_METADATA = ("out_sharding", "sharding_names", "sharding")
_SAME = object()  # from_unfused's "keep the block's own" default


class Projection(nnx.Module):
    """One weight matrix stored as ``kernel`` (``nnx.Linear``'s layout) with logical axis names.

    ``metadata`` is what else the initializer attached (``nnx.with_partitioning``'s mesh, say).
    """

    def __init__(self, kernel: jax.Array, axes: tuple, metadata: Mapping | None = None):
        metadata = dict(metadata or {})
        # Flax places a Variable on its mesh at creation when eager sharding is on, which needs
        # a mesh; with none in context (or given) the axis names are metadata that
        # nnx.get_partition_spec reads.
        has_mesh = (metadata.get("mesh") is not None
                    or not jax.sharding.get_abstract_mesh().empty)
        eager = metadata.pop("eager_sharding", nnx.using_eager_sharding() and has_mesh)
        self.kernel = nnx.Param(kernel, out_sharding=axes, eager_sharding=eager, **metadata)


def _draw(kernel_init: Initializer, key, shape, dtype):
    """(kernel, its axis names or None, other metadata) from one call of ``kernel_init``,
    which returns an array, or one in ``nnx.VariableMetadata`` (``nnx.with_partitioning``)."""
    value = kernel_init(key, shape, dtype)
    if not isinstance(value, nnx.VariableMetadata):
        return value, None, {}
    metadata = dict(value.metadata)
    names = None
    for name in _SHARDING_METADATA:
        names = metadata.pop(name, names)
    return value.raw_value, names, metadata


def _variable_names(kernel):
    """The logical axis names an existing kernel Variable carries, or None."""
    metadata = kernel.get_metadata() if isinstance(kernel, nnx.Variable) else {}
    for name in _SHARDING_METADATA:
        if metadata.get(name) is not None:
            return metadata[name]
    return None


def _weights(params: Mapping | None, rngs: nnx.Rngs | None, draw: Callable[[nnx.Rngs], dict],
             shapes: Mapping[str, tuple[int, int]], param_dtype,
             layout: str) -> dict[str, jax.Array]:
    """``{name: kernel}`` from ``params`` (checked, cast) or drawn from ``rngs``."""
    if (params is None) == (rngs is None):
        raise TypeError("pass exactly one of rngs= (random weights) and params= (given weights)")
    if params is None:
        params = draw(rngs)
    elif layout == "fused":
        _common.check_fused_keys(params)
    kernels = {}
    for name, shape in shapes.items():
        kernel = jnp.asarray(_common.kernel_of(params, name, layout))
        if kernel.shape != shape:
            raise ValueError(f"{name} kernel must have shape {shape}, got {tuple(kernel.shape)}")
        if not jnp.issubdtype(kernel.dtype, jnp.floating):
            raise TypeError(f"{name} kernel must be floating-point, got {kernel.dtype}")
        kernels[name] = kernel.astype(param_dtype)
    return kernels


def _drawn_unfused(kernel_init, rngs, k, n, param_dtype):
    """(gate/up/down params, the axis names kernel_init gave the gate kernel, metadata)."""
    gate, names, metadata = _draw(kernel_init, rngs.params(), (k, n), param_dtype)
    up, _, _ = _draw(kernel_init, rngs.params(), (k, n), param_dtype)
    # The same initializer names down [N, K] as it names gate and up [K, N]; its names
    # come from gate's, reversed (logical_axes).
    down, _, _ = _draw(kernel_init, rngs.params(), (n, k), param_dtype)
    params = {"gate_proj": {"kernel": gate}, "up_proj": {"kernel": up},
              "down_proj": {"kernel": down}}
    return params, names, metadata


class SwiGLUMLP(nnx.Module):
    """The unfused reference block: ``down_proj(act(gate_proj(x)) * up_proj(x))``, plain XLA.

    Computes exactly :func:`jax_swiglu.swiglu_reference` (fp32 products and activation,
    rounded once to the computation dtype) followed by the down dot in it.

    Params, 3*K*N in all (K = ``hidden_size``, N = ``intermediate_size``), [in, out] as in
    ``nnx.Linear``, with logical axis names (``kernel_axes``, by default these):

    * ``gate_proj.kernel`` [K, N], ``('embed', 'mlp')``
    * ``up_proj.kernel``   [K, N], ``('embed', 'mlp')``
    * ``down_proj.kernel`` [N, K], ``('mlp', 'embed')``

    Args:
      hidden_size, intermediate_size: K and N.
      dtype: the computation dtype; inputs and weights are cast to it, outputs are in it.
        ``None``: the promoted dtype of the input and the params, as ``nnx.Linear``.
      param_dtype: the stored dtype of the weights.
      activation: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU).
      kernel_init: initializer of the three kernels (drawn gate, up, down in that order). It
        may name the axes, ``nnx.with_partitioning(init, ('embed', 'mlp'))``: the names of
        gate and up ([in, out]), which down takes the other way round.
      kernel_axes: the gate/up kernel's logical axis names, ``(embed, mlp)``, or MaxText's
        ``('embed', 'num_activations', 'mlp')`` (its middle axis, gate vs up, has no axis of
        its own here). Default: kernel_init's names, else ``('embed', 'mlp')``.
      rngs: draws random weights; or
      params: given weights, ``{"gate_proj": {"kernel": ...}, "up_proj": ..., "down_proj": ...}``.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, *, dtype=jnp.bfloat16,
                 param_dtype=jnp.bfloat16, activation: str = "silu",
                 kernel_init: Initializer = default_kernel_init, kernel_axes=None,
                 rngs: nnx.Rngs | None = None, params: Mapping | None = None):
        _common.check_activation(activation)
        k, n = hidden_size, intermediate_size
        drawn = {}

        def draw(rngs):
            params, drawn["names"], drawn["metadata"] = _drawn_unfused(kernel_init, rngs, k, n,
                                                                       param_dtype)
            return params

        kernels = _weights(params, rngs, draw,
                           {"gate_proj": (k, n), "up_proj": (k, n), "down_proj": (n, k)},
                           param_dtype, "unfused")
        gate_up_axes, down_axes = _common.logical_axes(kernel_axes, drawn.get("names"))
        metadata = drawn.get("metadata")
        self.gate_proj = Projection(kernels["gate_proj"], gate_up_axes, metadata)
        self.up_proj = Projection(kernels["up_proj"], gate_up_axes, metadata)
        self.down_proj = Projection(kernels["down_proj"], down_axes, metadata)
        self.hidden_size = k
        self.intermediate_size = n
        self.dtype = None if dtype is None else jnp.dtype(dtype)
        self.param_dtype = jnp.dtype(param_dtype)
        self.activation = activation
        self.kernel_axes = gate_up_axes

    @classmethod
    def from_params(cls, params: Mapping, *, dtype=jnp.bfloat16, param_dtype=None,
                    activation: str = "silu", kernel_axes=None) -> SwiGLUMLP:
        """From unfused params; ``param_dtype`` defaults to the kernels' own dtype."""
        down = jnp.asarray(_common.kernel_of(params, "down_proj", "unfused"))
        n, k = down.shape
        param_dtype = down.dtype if param_dtype is None else param_dtype
        return cls(k, n, dtype=dtype, param_dtype=param_dtype, activation=activation,
                   kernel_axes=kernel_axes, params=params)

    def __call__(self, x: jax.Array) -> jax.Array:
        """``[..., K] -> [..., K]`` in the computation dtype."""
        x = jnp.asarray(x)
        gate, up, down = (getattr(self, name).kernel[...] for name in _common.UNFUSED_KEYS)
        return _common.reference_forward(
            x, gate, up, down, dtype=_common.compute_dtype(self.dtype, x, gate, up, down),
            activation=self.activation)


class FusedSwiGLUMLP(nnx.Module):
    """Drop-in for :class:`SwiGLUMLP` (and Llama/Qwen MLPs) through :func:`jax_swiglu.fused_mlp`.

    Gate and up are stored packed (:func:`jax_swiglu.pack_weights`), built once at
    construction or conversion, never per call. On an SM90 GPU the gated part runs as one
    fused kernel, elsewhere as the XLA reference; the down projection is an XLA dot.

    Params, 2*K*N_pad + N*K in all (N_pad = N rounded up to 32; 3*K*N when N is a multiple
    of 32, as for every Qwen2.5 size), with logical axis names (``kernel_axes``):

    * ``gate_up_packed.kernel`` [K, 2*N_pad], ``('embed', 'mlp')``: gate and up interleaved
      in 32-column blocks, so a shard of the ``mlp`` axis in multiples of 64 columns keeps
      each gate column beside its up column. (Not ``gate_up_proj``: that name means the
      plain concatenation ``[gate | up]``, which :meth:`from_unfused` and
      :func:`jax_swiglu.nn.fuse_params` convert.)
    * ``down_proj.kernel``    [N, K], ``('mlp', 'embed')``.

    Build it with random weights (``rngs=``), from fused params (``params=``,
    :meth:`from_params`), from :class:`~jax_swiglu.PackedWeights` (:meth:`from_packed`), from
    any unfused block (:meth:`from_unfused`), or abstractly with ``nnx.eval_shape`` and then
    ``nnx.update(module, state)`` with a checkpoint's fused state.

    Args:
      hidden_size, intermediate_size: K and N, multiples of 8.
      dtype: the computation dtype, bfloat16 or float16; outputs are in it. ``None``: the
        promoted dtype of the input and the params, as ``nnx.Linear(dtype=None)``; it must be
        bfloat16 or float16 at call time (a clear error says so otherwise).
      param_dtype: the stored dtype. If it differs from ``dtype``, every call casts all the
        weights first: float32 storage reads 4 and writes 2 bytes per weight before the block
        reads its 2, about 4x the weight traffic of storing ``dtype`` (which dominates at
        decode sizes). Store the weights in ``dtype`` for inference.
      kernel: ``"auto"``, ``"interleaved"`` or ``"xla"``, as in :func:`jax_swiglu.swiglu`.
      activation: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU), as in
        :func:`jax_swiglu.swiglu`.
      kernel_init: initializer, drawn gate, up, down in that order as :class:`SwiGLUMLP`
        does, so the same ``rngs`` give both modules the same weights. It may name the axes
        (``nnx.with_partitioning``), as in :class:`SwiGLUMLP`.
      kernel_axes: the logical axis names, as in :class:`SwiGLUMLP`; the packed matrix takes
        the gate/up kernel's.
      rngs: draws random weights; or
      params: given fused weights, ``{"gate_up_packed": {"kernel": ...}, "down_proj": ...}``
        (:func:`jax_swiglu.nn.fuse_params` makes them from any unfused layout).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, *, dtype=jnp.bfloat16,
                 param_dtype=jnp.bfloat16, kernel: str = "auto", activation: str = "silu",
                 kernel_init: Initializer = default_kernel_init, kernel_axes=None,
                 rngs: nnx.Rngs | None = None, params: Mapping | None = None):
        if dtype is not None:
            _common.check_kernel_dtype(dtype)
        selection.check_kernel_name(kernel)
        _common.check_activation(activation)
        k, n = hidden_size, intermediate_size
        _layout.check_alignment(k, n)
        drawn = {}

        def draw(rngs):
            unfused, drawn["names"], drawn["metadata"] = _drawn_unfused(kernel_init, rngs, k, n,
                                                                        param_dtype)
            return _common.fuse_params(unfused)

        kernels = _weights(params, rngs, draw,
                           {"gate_up_packed": (k, 2 * _layout.padded_n(n)), "down_proj": (n, k)},
                           param_dtype, "fused")
        gate_up_axes, down_axes = _common.logical_axes(kernel_axes, drawn.get("names"))
        metadata = drawn.get("metadata")
        self.gate_up_packed = Projection(kernels["gate_up_packed"], gate_up_axes, metadata)
        self.down_proj = Projection(kernels["down_proj"], down_axes, metadata)
        self.hidden_size = k
        self.intermediate_size = n
        self.dtype = None if dtype is None else jnp.dtype(dtype)
        self.param_dtype = jnp.dtype(param_dtype)
        self.kernel = kernel
        self.activation = activation
        self.kernel_axes = gate_up_axes

    @classmethod
    def from_params(cls, params: Mapping, *, dtype=jnp.bfloat16, param_dtype=None,
                    kernel: str = "auto", activation: str = "silu",
                    kernel_axes=None) -> FusedSwiGLUMLP:
        """From fused params (see :func:`jax_swiglu.nn.fuse_params`, ``fuse_hf_weights``);
        ``param_dtype`` defaults to the kernels' own dtype."""
        _common.check_fused_keys(params)
        down = jnp.asarray(_common.kernel_of(params, "down_proj", "fused"))
        if down.ndim != 2:
            raise ValueError(f"down_proj kernel must be [N, K], got shape {tuple(down.shape)}")
        n, k = down.shape
        param_dtype = down.dtype if param_dtype is None else param_dtype
        return cls(k, n, dtype=dtype, param_dtype=param_dtype, kernel=kernel,
                   activation=activation, kernel_axes=kernel_axes, params=params)

    @classmethod
    def from_packed(cls, packed: _layout.PackedWeights, w_down, *, dtype=jnp.bfloat16,
                    param_dtype=None, kernel: str = "auto", activation: str = "silu",
                    kernel_axes=None) -> FusedSwiGLUMLP:
        """From :class:`~jax_swiglu.PackedWeights` and ``w_down`` ``[N, K]``, as
        :func:`jax_swiglu.convert.pack_hf_checkpoint` and the other adapters return them;
        ``param_dtype`` defaults to the packed weights' dtype."""
        packed = _layout.as_packed(packed, "packed")
        w_down = jnp.asarray(w_down)
        if w_down.shape != (packed.n, packed.k):
            raise ValueError(f"w_down must be [N, K] = [{packed.n}, {packed.k}] for these packed "
                             f"weights, got {tuple(w_down.shape)}")
        param_dtype = packed.dtype if param_dtype is None else param_dtype
        return cls(packed.k, packed.n, dtype=dtype, param_dtype=param_dtype, kernel=kernel,
                   activation=activation, kernel_axes=kernel_axes,
                   params={"gate_up_packed": {"kernel": packed.data},
                           "down_proj": {"kernel": w_down}})

    @classmethod
    def from_unfused(cls, mlp, *, kernel: str = "auto", activation: str | None = None,
                     dtype=_SAME, param_dtype=None, kernel_axes=None) -> FusedSwiGLUMLP:
        """The same block, gate and up packed once, from any module of linear layers.

        ``mlp`` is a :class:`SwiGLUMLP` or any block (your own ``LlamaMLP``, tunix's ``MLP``)
        whose ``gate_proj``, ``up_proj`` and ``down_proj`` are bias-free linear layers with a
        ``.kernel`` ``[in, out]`` (``nnx.Linear(..., use_bias=False)``), or whose
        ``gate_up_proj`` holds gate and up concatenated, ``[gate | up]`` (Phi-3), beside
        ``down_proj``. A block that holds more (a bias, LoRA factors, a custom
        ``dot_general``) is refused: the fused block would drop it. ``mlp`` is not modified.

        Args:
          mlp: the block.
          kernel: as in :func:`jax_swiglu.swiglu`.
          activation: what the block applies to the gate; by default the one it states (an
            ``activation``, ``act_fn`` or ``hidden_act`` attribute, as a name or a function),
            else ``"silu"``. The block's code cannot be read: name ``"gelu_tanh"`` for a
            Gemma block that does not state it.
          dtype: by default the block's (its ``dtype``, else its layers'; ``None`` for
            ``nnx.Linear``'s default, which computes in the input's and params' dtype).
          param_dtype: by default the kernels' own dtype (they are stored as they are).
          kernel_axes: by default the block's (its ``kernel_axes``, else the names its gate
            kernel carries), else ``('embed', 'mlp')``.
        """
        names = convert.linear_names(mlp)
        packed, w_down = convert.pack_linears(mlp)  # refuses biases, by name
        _check_convertible(mlp, names)
        layers = [getattr(mlp, name) for name in names]
        if dtype is _SAME:
            dtype = getattr(mlp, "dtype", getattr(layers[0], "dtype", None))
        if kernel_axes is None:
            kernel_axes = getattr(mlp, "kernel_axes", None) or _variable_names(layers[0].kernel)
        return cls.from_packed(packed, w_down, dtype=dtype, param_dtype=param_dtype,
                               kernel=kernel, activation=_block_activation(mlp, activation),
                               kernel_axes=kernel_axes)

    def to_unfused(self) -> SwiGLUMLP:
        """The same block as :class:`SwiGLUMLP` (exact weights), e.g. for export."""
        params = _common.unfuse_params(nnx.to_pure_dict(nnx.state(self, nnx.Param)))
        return SwiGLUMLP(self.hidden_size, self.intermediate_size, dtype=self.dtype,
                         param_dtype=self.param_dtype, activation=self.activation,
                         kernel_axes=self.kernel_axes, params=params)

    def packed_weights(self) -> _layout.PackedWeights:
        """The stored gate/up weights as :class:`jax_swiglu.PackedWeights` (in ``param_dtype``)."""
        return _layout.PackedWeights.from_packed_data(self._stored_kernels()[0],
                                                      self.intermediate_size)

    def explain(self, x, *, platform: str | None = None) -> str:
        """Which kernel a call on ``x`` (an array or ``jax.ShapeDtypeStruct``) would run.

        As :func:`jax_swiglu.explain`; ``platform`` (e.g. ``"cuda"``) defaults to the
        default backend.
        """
        dtype = self._compute_dtype(x)
        x = jax.ShapeDtypeStruct(x.shape, dtype)
        data = jax.ShapeDtypeStruct(self.gate_up_packed.kernel.shape, dtype)
        return _api.explain(x, _layout.PackedWeights.from_packed_data(data, self.intermediate_size),
                            kernel=self.kernel, activation=self.activation, platform=platform)

    def _compute_dtype(self, x) -> jnp.dtype:
        gate_up, down = self.gate_up_packed.kernel, self.down_proj.kernel
        dtype = _common.compute_dtype(self.dtype, x, gate_up, down)
        _common.check_fused_compute_dtype(dtype, x.dtype, jnp.result_type(gate_up.dtype,
                                                                           down.dtype))
        return dtype

    def _stored_kernels(self) -> tuple[jax.Array, jax.Array]:
        """(gate_up_packed, down_proj) kernels, checked: state loaded with ``nnx.update`` may
        have left them abstract or given them other shapes."""
        k, n = self.hidden_size, self.intermediate_size
        expected = {"gate_up_packed": (k, 2 * _layout.padded_n(n)), "down_proj": (n, k)}
        kernels = []
        for name, shape in expected.items():
            kernel = getattr(self, name).kernel.get_value()
            if isinstance(kernel, jax.ShapeDtypeStruct):
                raise ValueError(
                    f"{name}.kernel holds no weights, only their shape (a module built under "
                    "nnx.eval_shape): load them first, nnx.update(module, state)")
            if tuple(kernel.shape) != shape:
                raise ValueError(
                    f"{name}.kernel has shape {tuple(kernel.shape)}, but this block (K={k}, "
                    f"N={n}) stores {shape}; load params made for it (jax_swiglu.nn.fuse_params)")
            kernels.append(kernel)
        return tuple(kernels)

    def __call__(self, x: jax.Array) -> jax.Array:
        """``[..., K] -> [..., K]`` in the computation dtype."""
        x = jnp.asarray(x)
        gate_up, down = self._stored_kernels()
        return _common.fused_forward(x, gate_up, down, self.intermediate_size,
                                     dtype=self._compute_dtype(x), kernel=self.kernel,
                                     activation=self.activation)


def _check_convertible(mlp, names) -> None:
    """Refuses a block whose state or computation the fused block would drop."""
    where = type(mlp).__name__
    for name in names:
        dot = getattr(getattr(mlp, name), "dot_general", jax.lax.dot_general)
        if dot is not jax.lax.dot_general:
            raise ValueError(f"{where}.{name} computes with a custom dot_general (quantized?), "
                             "which FusedSwiGLUMLP would drop")
    if isinstance(mlp, nnx.Module):
        extra = sorted(".".join(map(str, keys)) for keys, _ in nnx.to_flat_state(nnx.state(mlp))
                       if not (len(keys) == 2 and keys[0] in names and keys[1] == "kernel"))
        if extra:
            raise ValueError(f"{where} holds state besides the {', '.join(names)} kernels "
                             f"({', '.join(extra)}), which the fused block would drop")


def _block_activation(mlp, activation: str | None) -> str:
    """``activation``, or the one ``mlp`` states, checked against each other."""
    stated = _common.stated_activation(mlp)
    if activation is not None:
        _common.check_activation(activation)
    if stated is None:
        return activation or "silu"
    attribute, name = stated
    value = getattr(mlp, attribute)
    if name is None:
        raise ValueError(
            f"{type(mlp).__name__}.{attribute} is {value!r}, an activation FusedSwiGLUMLP does "
            f"not have (it has {', '.join(_reference.ACTIVATIONS)})")
    if activation is not None and activation != name:
        raise ValueError(f"{type(mlp).__name__}.{attribute} is {value!r}, i.e. {name!r}, but "
                         f"activation={activation!r} was asked for")
    return name


class QuantizedParam(nnx.Variable):
    """A quantized weight (fp8 data or its fp32 scales): state, but not an ``nnx.Param``, so
    optimizers and ``nnx.Param`` filters leave it alone (it has no gradient)."""


class Fp8SwiGLUMLP(nnx.Module):
    """The gated MLP block with gate and up in fp8 (:func:`jax_swiglu.quantize_weights`),
    through :func:`jax_swiglu.fused_mlp`: on an SM90 GPU the fused fp8 kernel (x quantized per
    row first), elsewhere the XLA path (:func:`jax_swiglu.swiglu` says which).
    The down projection stays in ``dtype``, or with ``down`` a
    :class:`jax_swiglu.QuantizedDown` (:meth:`quantize` with ``down=True``) runs in fp8 too:
    the whole block in fp8. :func:`swap_mlp_blocks` with ``fp8=True`` swaps a model's blocks
    for these.

    Build it from a bf16 block with :meth:`quantize`. State:

    * ``gate_up_data``   [2*N_pad, K] fp8 (:class:`QuantizedParam`): the packed order,
      K-major;
    * ``gate_up_scales`` [2*N_pad] or [] fp32 (:class:`QuantizedParam`);
    * ``down_proj.kernel`` [N, K] in ``dtype``, ``('mlp', 'embed')``; or, the down projection
      in fp8, ``down_data`` [K, N] fp8 and ``down_scales`` [K] or [] fp32
      (:class:`QuantizedParam`).

    Outputs match :func:`jax_swiglu.swiglu_reference_quantized` (the fp8 spec) followed by the
    down dot (in fp8: :func:`jax_swiglu.fused_mlp`'s), not the bf16 block: fp8 weights and
    tokens carry a few percent of error each. ``accumulation`` is :func:`jax_swiglu.swiglu`'s
    (``"promoted"`` or ``"fast"``), the fp8 down projection's too.
    """

    def __init__(self, weights, down, *, dtype=jnp.bfloat16, kernel: str = "auto",
                 activation: str = "silu", accumulation: str = "promoted"):
        from .. import _quantize
        weights = _quantize.as_quantized(weights, "weights")
        _primitive.check_accumulation(accumulation, fp8=True)
        _common.check_kernel_dtype(dtype)
        selection.check_kernel_name(kernel)
        _common.check_activation(activation)
        self.gate_up_data = QuantizedParam(weights.data)
        self.gate_up_scales = QuantizedParam(weights.scales)
        if isinstance(down, _quantize.QuantizedDown):
            down.validate()
            if (down.n, down.k_out) != (weights.n, weights.k):
                raise ValueError(f"the quantized down projection is [N={down.n}, "
                                 f"K={down.k_out}], but the block needs "
                                 f"{(weights.n, weights.k)}")
            self.down_data = QuantizedParam(down.data)
            self.down_scales = QuantizedParam(down.scales)
            self.down_scale_mode = down.scale_mode
        else:
            down = jnp.asarray(down)
            if down.shape != (weights.n, weights.k):
                raise ValueError(f"down must have shape {(weights.n, weights.k)}, got "
                                 f"{tuple(down.shape)}")
            self.down_proj = Projection(down.astype(dtype), _common.DOWN_AXES)
            self.down_scale_mode = None
        self.hidden_size = weights.k
        self.intermediate_size = weights.n
        self.scale_mode = weights.scale_mode
        self.dtype = jnp.dtype(dtype)
        self.kernel = kernel
        self.activation = activation
        self.accumulation = accumulation

    @classmethod
    def quantize(cls, mlp: SwiGLUMLP | FusedSwiGLUMLP, *, dtype=jnp.float8_e4m3fn,
                 scale: str = "per_channel", kernel: str = "auto",
                 accumulation: str = "promoted", down: bool = False) -> Fp8SwiGLUMLP:
        """``mlp``'s block with gate and up quantized once (``dtype`` and ``scale`` as in
        :func:`jax_swiglu.quantize_weights`), and with ``down`` the down projection too
        (:func:`jax_swiglu.quantize_down`, a scale per output channel or one as ``scale``
        says); keeps its computation dtype and activation."""
        from .. import _quantize
        if isinstance(mlp, FusedSwiGLUMLP):
            mlp = mlp.to_unfused()
        if not isinstance(mlp, SwiGLUMLP):
            raise TypeError(f"mlp must be a SwiGLUMLP or FusedSwiGLUMLP, got "
                            f"{type(mlp).__name__}")
        weights = _quantize.quantize_weights(mlp.gate_proj.kernel[...], mlp.up_proj.kernel[...],
                                             dtype=dtype, scale=scale)
        if not isinstance(down, bool):
            raise TypeError(f"down must be True or False, got {down!r}")
        down_weights = mlp.down_proj.kernel[...]
        if down:
            down_weights = _quantize.quantize_down(down_weights, dtype=dtype, scale=scale)
        return cls(weights, down_weights, dtype=mlp.dtype, kernel=kernel,
                   activation=mlp.activation, accumulation=accumulation)

    def _stored(self, variable, name: str):
        """A variable's value, refused where it holds only a shape (a module built under
        ``nnx.eval_shape`` whose state was never loaded)."""
        value = variable.get_value()
        if isinstance(value, jax.ShapeDtypeStruct):
            raise ValueError(
                f"{name} holds no weights, only their shape (a module built under "
                "nnx.eval_shape): load them first, nnx.update(module, state)")
        return value

    def quantized_weights(self):
        """The stored gate/up weights as :class:`jax_swiglu.QuantizedWeights`."""
        from .. import _quantize
        return _quantize.QuantizedWeights.from_packed_data(
            self._stored(self.gate_up_data, "gate_up_data"),
            self._stored(self.gate_up_scales, "gate_up_scales"), self.intermediate_size,
            self.scale_mode)

    def explain(self, x, *, platform: str | None = None) -> str:
        """Which kernel a call on ``x`` would run, as :func:`jax_swiglu.explain` (from the
        stored weights' shapes: a module built under ``nnx.eval_shape`` explains too)."""
        from .. import _quantize
        x = jax.ShapeDtypeStruct(x.shape, self.dtype)
        data, scales = (jax.ShapeDtypeStruct(v.get_value().shape, v.get_value().dtype)
                        for v in (self.gate_up_data, self.gate_up_scales))
        weights = _quantize.QuantizedWeights._wrap(data, scales, self.intermediate_size,
                                                   self.scale_mode, _quantize.LAYOUT)
        return _api.explain(x, weights, kernel=self.kernel, activation=self.activation,
                            platform=platform, accumulation=self.accumulation)

    def down_weights(self):
        """The stored down projection: a :class:`jax_swiglu.QuantizedDown`, or ``[N, K]`` in
        ``dtype``."""
        from .. import _quantize
        if self.down_scale_mode is None:
            return self._stored(self.down_proj.kernel, "down_proj.kernel")
        return _quantize.QuantizedDown(self._stored(self.down_data, "down_data"),
                                       self._stored(self.down_scales, "down_scales"),
                                       self.down_scale_mode)

    def __call__(self, x: jax.Array) -> jax.Array:
        """``[..., K] -> [..., K]`` in ``dtype``."""
        return _api.fused_mlp(jnp.asarray(x).astype(self.dtype), self.quantized_weights(),
                              self.down_weights(), kernel=self.kernel,
                              activation=self.activation, accumulation=self.accumulation)


# Experts' kernels are [E, in, out]: the fan-in is `in` alone, the expert axis a batch axis.
default_expert_kernel_init = nnx.initializers.lecun_normal(batch_axis=(0,))


class FusedExpertsMLP(nnx.Module):
    """The expert MLPs of a mixture-of-experts layer, ``down_e(act(gate_e(x)) * up_e(x))``
    for every token's expert ``e``, through :func:`jax_swiglu.grouped_fused_mlp`.

    The router, the sort of tokens by expert and the weighted combine stay in the model: a
    call takes ``x`` ``[T, K]`` sorted by expert and ``group_sizes`` ``[E]`` int32 (the
    ``jax.lax.ragged_dot`` convention) and returns ``[T, K]``, rows past the groups zero.
    The gate/up step runs the grouped fused kernel where it can (:meth:`explain` says what
    runs), the down projection a ``ragged_dot``.

    Params, with logical axis names:

    * ``gate_up_packed.kernel`` ``[E, K, 2 F_pad]``, ``('expert', 'embed', 'mlp')``: every
      expert's gate and up in the packed layout (:func:`jax_swiglu.pack_expert_weights`).
    * ``down_proj.kernel`` ``[E, F, K]``, ``('expert', 'mlp', 'embed')``.

    Args:
      hidden_size, intermediate_size, num_experts: K, F (multiples of 8) and E.
      dtype: the computation dtype (any float; outputs are in it); param_dtype: the stored one.
      activation: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU), the names the kernels compile.
      kernel_init: draws gate, up, down ``[E, in, out]`` in that order; by default LeCun
        normal over ``in`` with the expert axis a batch axis.
      rngs: draws random weights; or params: ``{"gate_up_packed": {"kernel": ...},
        "down_proj": {"kernel": ...}}`` (:meth:`from_experts` builds them).
      expert_axis: a mesh axis the experts are split over (expert parallelism: each device
        runs its own experts' rows; :func:`jax_swiglu.grouped_fused_mlp`), or None.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, *,
                 dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, activation: str = "silu",
                 kernel_init: Initializer = default_expert_kernel_init,
                 rngs: nnx.Rngs | None = None, params: Mapping | None = None,
                 expert_axis: str | None = None):
        if not jnp.issubdtype(jnp.dtype(dtype), jnp.floating):
            raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
        _common.check_activation(activation)
        k, n, e = hidden_size, intermediate_size, num_experts
        _layout.check_alignment(k, n)
        if isinstance(e, (bool, np.bool_)) or not isinstance(e, (int, np.integer)) or e < 1:
            raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
        e = int(e)

        def draw(rngs):
            gate, up, down = (_draw(kernel_init, rngs.params(), shape, param_dtype)[0]
                              for shape in ((e, k, n), (e, k, n), (e, n, k)))
            return {"gate_up_packed": {"kernel": _layout.pack_expert_weights(gate, up).data},
                    "down_proj": {"kernel": down}}

        kernels = _weights(params, rngs, draw,
                           {"gate_up_packed": (e, k, 2 * _layout.padded_n(n)),
                            "down_proj": (e, n, k)}, param_dtype, "fused")
        self.gate_up_packed = Projection(kernels["gate_up_packed"],
                                         _common.EXPERT_GATE_UP_AXES)
        self.down_proj = Projection(kernels["down_proj"], _common.EXPERT_DOWN_AXES)
        self.hidden_size, self.intermediate_size, self.num_experts = k, n, e
        self.dtype = jnp.dtype(dtype)
        self.param_dtype = jnp.dtype(param_dtype)
        self.activation = activation
        self.expert_axis = expert_axis

    @classmethod
    def from_experts(cls, experts: _layout.PackedExperts, w_down, *, dtype=None,
                     activation: str = "silu", expert_axis: str | None = None
                     ) -> FusedExpertsMLP:
        """From :class:`~jax_swiglu.PackedExperts` and ``w_down`` ``[E, F, K]``, as
        :func:`jax_swiglu.convert.pack_hf_experts_checkpoint` returns them; ``dtype``
        defaults to theirs."""
        experts = _layout._as_experts(experts)
        w_down = jnp.asarray(w_down)
        if w_down.shape != (experts.experts, experts.n, experts.k):
            raise ValueError(f"w_down must be [E, F, K] = {(experts.experts, experts.n, experts.k)}"
                             f" for these experts, got {tuple(w_down.shape)}")
        return cls(experts.k, experts.n, experts.experts,
                   dtype=experts.dtype if dtype is None else dtype, param_dtype=experts.dtype,
                   activation=activation, expert_axis=expert_axis,
                   params={"gate_up_packed": {"kernel": experts.data},
                           "down_proj": {"kernel": w_down}})

    def packed_experts(self) -> _layout.PackedExperts:
        """The stored gate/up weights as :class:`jax_swiglu.PackedExperts`."""
        return _layout.PackedExperts.from_packed_data(self.gate_up_packed.kernel.get_value(),
                                                       self.intermediate_size)

    def explain(self, x, group_sizes, *, platform: str | None = None) -> str:
        """What a call on ``x`` and ``group_sizes`` (arrays or ``jax.ShapeDtypeStruct``) runs,
        as :func:`jax_swiglu.explain_grouped`; ``platform`` defaults to the default backend."""
        data = jax.ShapeDtypeStruct(self.gate_up_packed.kernel.shape, self.dtype)
        return _experts.explain_grouped(
            jax.ShapeDtypeStruct(x.shape, self.dtype),
            _layout.PackedExperts._wrap(data, self.intermediate_size, _layout.LAYOUT),
            group_sizes, activation=self.activation, platform=platform)

    def __call__(self, x: jax.Array, group_sizes: jax.Array) -> jax.Array:
        """``[T, K]`` sorted by expert, ``[E]`` int32 group sizes -> ``[T, K]``."""
        gate_up = self.gate_up_packed.kernel.get_value()
        down = self.down_proj.kernel.get_value()
        if isinstance(gate_up, jax.ShapeDtypeStruct) or isinstance(down, jax.ShapeDtypeStruct):
            raise ValueError("the expert kernels hold no weights, only their shape (a module "
                             "built under nnx.eval_shape): load them first, nnx.update(module, "
                             "state)")
        experts = _layout.PackedExperts.from_packed_data(gate_up.astype(self.dtype),
                                                          self.intermediate_size)
        return _experts.grouped_fused_mlp(jnp.asarray(x).astype(self.dtype), experts,
                                          down.astype(self.dtype), group_sizes,
                                          activation=self.activation,
                                          expert_axis=self.expert_axis)


class FusedMoE(nnx.Module):
    """A mixture-of-experts MLP layer: the model's router, top-k softmax routing, and
    :class:`FusedExpertsMLP` for the experts (what :func:`jax_swiglu.nn.swap_moe_blocks` puts
    in place of a model's MoE layer).

    A call on ``x`` ``[..., K]``: router logits in float32, ``softmax`` over the experts,
    the ``top_k`` largest (renormalized to sum to 1 with ``normalize_top_k``: Qwen3-MoE,
    Mixtral, tunix; not Qwen1.5/2-MoE, OLMoE), the weights rounded to the computation dtype;
    each token's rows sorted by expert (stably), the experts run as one grouped call, the rows
    unsorted, and the weighted sum over the ``top_k`` in float32, rounded once.

    Args:
      router: the model's router, called on ``x`` ``[T, K]`` for ``[T, E]`` logits (an
        ``nnx.Linear`` without bias); kept as it is.
      experts: the experts (:class:`FusedExpertsMLP`, E of them).
      top_k: experts per token.
      normalize_top_k: renormalize the chosen experts' probabilities.
    """

    def __init__(self, router: nnx.Module, experts: FusedExpertsMLP, top_k: int, *,
                 normalize_top_k: bool = True):
        if not isinstance(experts, FusedExpertsMLP):
            raise TypeError(f"experts must be a FusedExpertsMLP, got {type(experts).__name__}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not \
                1 <= top_k <= experts.num_experts:
            raise ValueError(f"top_k must be an int in [1, {experts.num_experts}] (the experts), "
                             f"got {top_k!r}")
        self.router = router
        self.experts = experts
        self.top_k = top_k
        self.normalize_top_k = bool(normalize_top_k)

    def route(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``x`` ``[T, K]`` -> (weights ``[T, top_k]`` in the computation dtype, chosen
        experts ``[T, top_k]`` int32)."""
        scores = self.router(x).astype(jnp.float32)
        if scores.shape[-1] != self.experts.num_experts:
            raise ValueError(f"the router gives {scores.shape[-1]} logits per token, but there "
                             f"are {self.experts.num_experts} experts")
        weights, chosen = jax.lax.top_k(jax.nn.softmax(scores, axis=-1), self.top_k)
        if self.normalize_top_k:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
        return weights.astype(self.experts.dtype), chosen.astype(jnp.int32)

    def __call__(self, x: jax.Array) -> jax.Array:
        """``[..., K]`` -> ``[..., K]`` in the experts' computation dtype."""
        x = jnp.asarray(x)
        k = self.experts.hidden_size
        if x.ndim < 1 or x.shape[-1] != k:
            raise ValueError(f"x must be [..., {k}] (the experts' hidden size), got "
                             f"{tuple(x.shape)}")
        tokens = x.reshape(-1, k)
        weights, chosen = self.route(tokens)
        flat = chosen.reshape(-1)
        order = jnp.argsort(flat, stable=True)
        sizes = jnp.bincount(flat, length=self.experts.num_experts).astype(jnp.int32)
        rows = jnp.repeat(tokens, self.top_k, axis=0, total_repeat_length=flat.shape[0])
        y = self.experts(rows[order], sizes)
        y = y[jnp.argsort(order)].reshape(tokens.shape[0], self.top_k, k)
        out = jnp.einsum("tk,tkd->td", weights, y, preferred_element_type=jnp.float32)
        return out.astype(self.experts.dtype).reshape(x.shape)
