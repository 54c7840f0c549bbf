"""``flax.nnx`` modules for the gated MLP block ``down(act(gate(x)) * up(x))``: SwiGLU
(``activation="silu"``: Llama, Qwen, Mistral) or GeGLU (``"gelu_tanh"``: Gemma).

:class:`FusedSwiGLUMLP` runs the block through :func:`jax_swiglu.fused_mlp`;
:class:`SwiGLUMLP` is the same block in plain XLA (the reference, and the layout that
checkpoints and other Flax models use). Both have no biases and work under ``nnx.jit`` and
``jax.jit``. Convert with :meth:`FusedSwiGLUMLP.from_unfused` / :meth:`~FusedSwiGLUMLP.to_unfused`,
or on param dicts with the functions in :mod:`jax_swiglu.nn`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from .. import _api, _layout, selection
from . import _common

Initializer = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]

default_kernel_init = nnx.initializers.lecun_normal()


def _eager_sharding() -> bool:
    # Flax places a Variable on its mesh at creation when eager sharding is on, which needs a
    # mesh; with none in context the axis names are metadata (nnx.get_partition_spec reads them).
    return nnx.using_eager_sharding() and not jax.sharding.get_abstract_mesh().empty


class Projection(nnx.Module):
    """One weight matrix stored as ``kernel`` (``nnx.Linear``'s layout) with logical axis names."""

    def __init__(self, kernel: jax.Array, axes: tuple[str, str]):
        self.kernel = nnx.Param(kernel, out_sharding=axes, eager_sharding=_eager_sharding())


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
        kernels[name] = kernel.astype(param_dtype)
    return kernels


class SwiGLUMLP(nnx.Module):
    """The unfused reference block: ``down_proj(act(gate_proj(x)) * up_proj(x))``, plain XLA.

    Computes exactly :func:`jax_swiglu.swiglu_reference` (fp32 products and activation,
    rounded once to ``dtype``) followed by the down dot in ``dtype``.

    Params, 3*K*N in all (K = ``hidden_size``, N = ``intermediate_size``), [in, out] as in
    ``nnx.Linear``, with logical axis names:

    * ``gate_proj.kernel`` [K, N], ``('embed', 'mlp')``
    * ``up_proj.kernel``   [K, N], ``('embed', 'mlp')``
    * ``down_proj.kernel`` [N, K], ``('mlp', 'embed')``

    Args:
      hidden_size, intermediate_size: K and N.
      dtype: the computation dtype; inputs and weights are cast to it, outputs are in it.
      param_dtype: the stored dtype of the weights.
      activation: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU).
      kernel_init: initializer of the three kernels (drawn gate, up, down in that order).
      rngs: draws random weights; or
      params: given weights, ``{"gate_proj": {"kernel": ...}, "up_proj": ..., "down_proj": ...}``.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, *, dtype=jnp.bfloat16,
                 param_dtype=jnp.bfloat16, activation: str = "silu",
                 kernel_init: Initializer = default_kernel_init,
                 rngs: nnx.Rngs | None = None, params: Mapping | None = None):
        _common.check_activation(activation)
        k, n = hidden_size, intermediate_size

        def draw(rngs):
            return {"gate_proj": {"kernel": kernel_init(rngs.params(), (k, n), param_dtype)},
                    "up_proj": {"kernel": kernel_init(rngs.params(), (k, n), param_dtype)},
                    "down_proj": {"kernel": kernel_init(rngs.params(), (n, k), param_dtype)}}

        kernels = _weights(params, rngs, draw,
                           {"gate_proj": (k, n), "up_proj": (k, n), "down_proj": (n, k)},
                           param_dtype, "unfused")
        self.gate_proj = Projection(kernels["gate_proj"], _common.GATE_UP_AXES)
        self.up_proj = Projection(kernels["up_proj"], _common.GATE_UP_AXES)
        self.down_proj = Projection(kernels["down_proj"], _common.DOWN_AXES)
        self.hidden_size = k
        self.intermediate_size = n
        self.dtype = jnp.dtype(dtype)
        self.param_dtype = jnp.dtype(param_dtype)
        self.activation = activation

    @classmethod
    def from_params(cls, params: Mapping, *, dtype=jnp.bfloat16, param_dtype=None,
                    activation: str = "silu") -> SwiGLUMLP:
        """From unfused params; ``param_dtype`` defaults to the kernels' own dtype."""
        down = jnp.asarray(_common.kernel_of(params, "down_proj", "unfused"))
        n, k = down.shape
        param_dtype = down.dtype if param_dtype is None else param_dtype
        return cls(k, n, dtype=dtype, param_dtype=param_dtype, activation=activation,
                   params=params)

    def __call__(self, x: jax.Array) -> jax.Array:
        """``[..., K] -> [..., K]`` in ``dtype``."""
        return _common.reference_forward(
            x, self.gate_proj.kernel[...], self.up_proj.kernel[...], self.down_proj.kernel[...],
            dtype=self.dtype, activation=self.activation)


class FusedSwiGLUMLP(nnx.Module):
    """Drop-in for :class:`SwiGLUMLP` (and Llama/Qwen MLPs) through :func:`jax_swiglu.fused_mlp`.

    Gate and up are stored packed (:func:`jax_swiglu.pack_weights`), built once at
    construction or conversion, never per call. On an SM90 GPU the gated part runs as one
    fused kernel, elsewhere as the XLA reference; the down projection is an XLA dot.

    Params, 2*K*N_pad + N*K in all (N_pad = N rounded up to 32; 3*K*N when N is a multiple
    of 32, as for every Qwen2.5 size), with logical axis names:

    * ``gate_up_packed.kernel`` [K, 2*N_pad], ``('embed', 'mlp')``: gate and up interleaved
      in 32-column blocks, so a shard of the ``mlp`` axis in multiples of 64 columns keeps
      each gate column beside its up column. (Not ``gate_up_proj``: that name means the
      plain concatenation ``[gate | up]``, which :meth:`from_unfused` and
      :func:`jax_swiglu.nn.fuse_params` convert.)
    * ``down_proj.kernel``    [N, K], ``('mlp', 'embed')``.

    Args:
      hidden_size, intermediate_size: K and N, multiples of 8.
      dtype: the computation dtype, bfloat16 or float16; outputs are in it.
      param_dtype: the stored dtype. If it differs from ``dtype``, every call casts all the
        weights first: float32 storage reads 4 and writes 2 bytes per weight before the block
        reads its 2, about 4x the weight traffic of storing ``dtype`` (which dominates at
        decode sizes). Store the weights in ``dtype`` for inference.
      kernel: ``"auto"``, ``"interleaved"`` or ``"xla"``, as in :func:`jax_swiglu.swiglu`.
      activation: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU), as in
        :func:`jax_swiglu.swiglu`.
      kernel_init: initializer, drawn gate, up, down in that order as :class:`SwiGLUMLP`
        does, so the same ``rngs`` give both modules the same weights.
      rngs: draws random weights; or
      params: given fused weights, ``{"gate_up_packed": {"kernel": ...}, "down_proj": ...}``
        (:func:`jax_swiglu.nn.fuse_params` makes them from any unfused layout).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, *, dtype=jnp.bfloat16,
                 param_dtype=jnp.bfloat16, kernel: str = "auto", activation: str = "silu",
                 kernel_init: Initializer = default_kernel_init,
                 rngs: nnx.Rngs | None = None, params: Mapping | None = None):
        _common.check_kernel_dtype(dtype)
        selection.check_kernel_name(kernel)
        _common.check_activation(activation)
        k, n = hidden_size, intermediate_size
        _layout.check_alignment(k, n)

        def draw(rngs):
            gate = kernel_init(rngs.params(), (k, n), param_dtype)
            up = kernel_init(rngs.params(), (k, n), param_dtype)
            down = kernel_init(rngs.params(), (n, k), param_dtype)
            return _common.fuse_params({"gate_proj": {"kernel": gate}, "up_proj": {"kernel": up},
                                        "down_proj": {"kernel": down}})

        kernels = _weights(params, rngs, draw,
                           {"gate_up_packed": (k, 2 * _layout.padded_n(n)), "down_proj": (n, k)},
                           param_dtype, "fused")
        self.gate_up_packed = Projection(kernels["gate_up_packed"], _common.GATE_UP_AXES)
        self.down_proj = Projection(kernels["down_proj"], _common.DOWN_AXES)
        self.hidden_size = k
        self.intermediate_size = n
        self.dtype = jnp.dtype(dtype)
        self.param_dtype = jnp.dtype(param_dtype)
        self.kernel = kernel
        self.activation = activation

    @classmethod
    def from_params(cls, params: Mapping, *, dtype=jnp.bfloat16, param_dtype=None,
                    kernel: str = "auto", activation: str = "silu") -> FusedSwiGLUMLP:
        """From fused params (see :func:`jax_swiglu.nn.fuse_params`, ``fuse_hf_weights``);
        ``param_dtype`` defaults to the kernels' own dtype."""
        down = jnp.asarray(_common.kernel_of(params, "down_proj", "fused"))
        n, k = down.shape
        param_dtype = down.dtype if param_dtype is None else param_dtype
        return cls(k, n, dtype=dtype, param_dtype=param_dtype, kernel=kernel,
                   activation=activation, params=params)

    @classmethod
    def from_unfused(cls, mlp: SwiGLUMLP, *, kernel: str = "auto") -> FusedSwiGLUMLP:
        """The same block, packed once; keeps ``mlp``'s dtype, param_dtype and activation."""
        params = _common.fuse_params(nnx.to_pure_dict(nnx.state(mlp, nnx.Param)))
        return cls(mlp.hidden_size, mlp.intermediate_size, dtype=mlp.dtype,
                   param_dtype=mlp.param_dtype, kernel=kernel, activation=mlp.activation,
                   params=params)

    def to_unfused(self) -> SwiGLUMLP:
        """The same block as :class:`SwiGLUMLP` (exact weights), e.g. for export."""
        params = _common.unfuse_params(nnx.to_pure_dict(nnx.state(self, nnx.Param)))
        return SwiGLUMLP(self.hidden_size, self.intermediate_size, dtype=self.dtype,
                         param_dtype=self.param_dtype, activation=self.activation,
                         params=params)

    def packed_weights(self) -> _layout.PackedWeights:
        """The stored gate/up weights as :class:`jax_swiglu.PackedWeights` (in ``param_dtype``)."""
        return _layout.PackedWeights.from_packed_data(self.gate_up_packed.kernel[...],
                                                      self.intermediate_size)

    def explain(self, x, *, platform: str | None = None) -> str:
        """Which kernel a call on ``x`` (an array or ``jax.ShapeDtypeStruct``) would run.

        As :func:`jax_swiglu.explain`; ``platform`` (e.g. ``"cuda"``) defaults to the
        default backend.
        """
        x = jax.ShapeDtypeStruct(x.shape, self.dtype)
        data = jax.ShapeDtypeStruct(self.gate_up_packed.kernel.shape, self.dtype)
        return _api.explain(x, _layout.PackedWeights.from_packed_data(data, self.intermediate_size),
                            kernel=self.kernel, activation=self.activation, platform=platform)

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
        """``[..., K] -> [..., K]`` in ``dtype``."""
        gate_up, down = self._stored_kernels()
        return _common.fused_forward(x, gate_up, down, self.intermediate_size, dtype=self.dtype,
                                     kernel=self.kernel, activation=self.activation)


class QuantizedParam(nnx.Variable):
    """A quantized weight (fp8 data or its fp32 scales): state, but not an ``nnx.Param``, so
    optimizers and ``nnx.Param`` filters leave it alone (it has no gradient)."""


class Fp8SwiGLUMLP(nnx.Module):
    """The gated MLP block with gate and up in fp8 (:func:`jax_swiglu.quantize_weights`),
    through :func:`jax_swiglu.fused_mlp`: on an SM90 GPU the fused fp8 kernel (x quantized per
    row first), elsewhere XLA's scaled fp8 dot. The down projection stays in ``dtype``.

    Build it from a bf16 block with :meth:`quantize`. State:

    * ``gate_up_data``   [2*N_pad, K] fp8 (:class:`QuantizedParam`): the packed order,
      K-major;
    * ``gate_up_scales`` [2*N_pad] or [] fp32 (:class:`QuantizedParam`);
    * ``down_proj.kernel`` [N, K] in ``dtype``, ``('mlp', 'embed')``.

    Outputs match :func:`jax_swiglu.swiglu_reference_quantized` (the fp8 spec) followed by the
    down dot, not the bf16 block: fp8 weights and tokens carry a few percent of error each.
    """

    def __init__(self, weights, down: jax.Array, *, dtype=jnp.bfloat16, kernel: str = "auto",
                 activation: str = "silu"):
        from .. import _quantize
        weights = _quantize.as_quantized(weights, "weights")
        _common.check_kernel_dtype(dtype)
        selection.check_kernel_name(kernel)
        _common.check_activation(activation)
        down = jnp.asarray(down)
        if down.shape != (weights.n, weights.k):
            raise ValueError(f"down must have shape {(weights.n, weights.k)}, got "
                             f"{tuple(down.shape)}")
        self.gate_up_data = QuantizedParam(weights.data)
        self.gate_up_scales = QuantizedParam(weights.scales)
        self.down_proj = Projection(down.astype(dtype), _common.DOWN_AXES)
        self.hidden_size = weights.k
        self.intermediate_size = weights.n
        self.scale_mode = weights.scale_mode
        self.dtype = jnp.dtype(dtype)
        self.kernel = kernel
        self.activation = activation

    @classmethod
    def quantize(cls, mlp: SwiGLUMLP | FusedSwiGLUMLP, *, dtype=jnp.float8_e4m3fn,
                 scale: str = "per_channel", kernel: str = "auto") -> Fp8SwiGLUMLP:
        """``mlp``'s block with gate and up quantized once (``dtype`` and ``scale`` as in
        :func:`jax_swiglu.quantize_weights`); keeps its computation dtype and activation."""
        from .. import _quantize
        if isinstance(mlp, FusedSwiGLUMLP):
            mlp = mlp.to_unfused()
        if not isinstance(mlp, SwiGLUMLP):
            raise TypeError(f"mlp must be a SwiGLUMLP or FusedSwiGLUMLP, got "
                            f"{type(mlp).__name__}")
        weights = _quantize.quantize_weights(mlp.gate_proj.kernel[...], mlp.up_proj.kernel[...],
                                             dtype=dtype, scale=scale)
        return cls(weights, mlp.down_proj.kernel[...], dtype=mlp.dtype, kernel=kernel,
                   activation=mlp.activation)

    def quantized_weights(self):
        """The stored gate/up weights as :class:`jax_swiglu.QuantizedWeights`."""
        from .. import _quantize
        return _quantize.QuantizedWeights.from_packed_data(self.gate_up_data[...], self.gate_up_scales[...],
                                          self.intermediate_size, self.scale_mode)

    def explain(self, x, *, platform: str | None = None) -> str:
        """Which kernel a call on ``x`` would run, as :func:`jax_swiglu.explain`."""
        x = jax.ShapeDtypeStruct(x.shape, self.dtype)
        return _api.explain(x, self.quantized_weights(), kernel=self.kernel,
                            activation=self.activation, platform=platform)

    def __call__(self, x: jax.Array) -> jax.Array:
        """``[..., K] -> [..., K]`` in ``dtype``."""
        return _api.fused_mlp(jnp.asarray(x).astype(self.dtype), self.quantized_weights(),
                              self.down_proj.kernel[...], kernel=self.kernel,
                              activation=self.activation)
