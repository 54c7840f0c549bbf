"""``flax.linen`` modules for the gated MLP block ``down(act(gate(x)) * up(x))`` (SwiGLU or
GeGLU, the ``activation`` attribute).

The same blocks as :mod:`jax_swiglu.nn.nnx`, in linen's style: the hidden size K comes
from the input at ``init``, as with ``nn.Dense``, and ``dtype=None`` computes in the promoted
dtype of the input and the params. Param trees are the ones :func:`jax_swiglu.nn.fuse_params`
and friends convert; ``init`` returns them boxed with logical axis names (``kernel_axes``, or
those of a ``kernel_init`` wrapped in ``nn.with_logical_partitioning``; ``nn.get_partition_spec``
reads them, ``nn.unbox`` strips them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.core import meta

from .. import _experts, _layout, selection
from . import _common

Initializer = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]

default_kernel_init = nn.initializers.lecun_normal()


class Projection(nn.Module):
    """One weight matrix as param ``kernel`` (``nn.Dense``'s layout), its axes named by the
    box ``init_fn`` returns. Calling it returns the matrix."""

    init_fn: Callable[[jax.Array], Any]

    @nn.compact
    def __call__(self) -> jax.Array:
        return self.param("kernel", self.init_fn)


def _draw(kernel_init: Initializer, key, shape, dtype):
    """(kernel, the box kernel_init put it in, or None): ``nn.with_logical_partitioning``
    and ``nn.with_partitioning`` wrap the array in a box that names its axes."""
    value = kernel_init(key, shape, dtype)
    if isinstance(value, meta.AxisMetadata):
        return value.unbox(), value
    return value, None


def _boxed(value, names, box):
    """``value`` in ``box``'s kind of box (logical or mesh axis names), named ``names``."""
    if box is None:
        return nn.LogicallyPartitioned(value, names)
    if isinstance(box, meta.Partitioned):
        return box.replace(value=value, names=names)
    return box.replace_boxed(value)


def _box_names(box):
    return getattr(box, "names", None) if box is not None else None


class SwiGLUMLP(nn.Module):
    """The unfused reference block: ``down_proj(act(gate_proj(x)) * up_proj(x))``, plain XLA.

    Computes exactly :func:`jax_swiglu.swiglu_reference`, then the down dot in the computation
    dtype. Params, 3*K*N in all: ``gate_proj.kernel`` and ``up_proj.kernel`` [K, N]
    ``('embed', 'mlp')``, ``down_proj.kernel`` [N, K] ``('mlp', 'embed')``.

    Attributes:
      intermediate_size: N.
      dtype: the computation and output dtype (``None``: the promoted dtype of the input and
        the params). param_dtype: the stored dtype.
      activation: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU).
      kernel_init: initializer of the three kernels; wrapped in
        ``nn.with_logical_partitioning(init, names)`` its names are gate's and up's ([in,
        out]), which down takes the other way round.
      kernel_axes: the gate/up kernel's logical axis names, ``(embed, mlp)`` or MaxText's
        ``('embed', 'num_activations', 'mlp')``; default kernel_init's, else
        ``('embed', 'mlp')``.
    """

    intermediate_size: int
    dtype: Any = jnp.bfloat16
    param_dtype: Any = jnp.bfloat16
    activation: str = "silu"
    kernel_init: Initializer = default_kernel_init
    kernel_axes: tuple | None = None

    def _kernel(self, name: str, shape: tuple[int, int], down: bool) -> jax.Array:
        def init(key):
            value, box = _draw(self.kernel_init, key, shape, self.param_dtype)
            gate_up_axes, down_axes = _common.logical_axes(self.kernel_axes, _box_names(box))
            return _boxed(value, down_axes if down else gate_up_axes, box)
        return Projection(init, name=name)()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """``[..., K] -> [..., K]`` in the computation dtype."""
        _common.check_activation(self.activation)
        x = jnp.asarray(x)
        k, n = x.shape[-1], self.intermediate_size
        gate = self._kernel("gate_proj", (k, n), down=False)
        up = self._kernel("up_proj", (k, n), down=False)
        down = self._kernel("down_proj", (n, k), down=True)
        return _common.reference_forward(
            x, gate, up, down, dtype=_common.compute_dtype(self.dtype, x, gate, up, down),
            activation=self.activation)


class FusedSwiGLUMLP(nn.Module):
    """Drop-in for :class:`SwiGLUMLP` through :func:`jax_swiglu.fused_mlp`.

    ``init`` packs gate and up once; ``apply`` uses the packed weights as stored. Params,
    2*K*N_pad + N*K in all (N_pad = N rounded up to 32): ``gate_up_packed.kernel``
    [K, 2*N_pad] ``('embed', 'mlp')`` (gate/up interleaved in 32-column blocks) and
    ``down_proj.kernel`` [N, K] ``('mlp', 'embed')``. Use :func:`jax_swiglu.nn.fuse_params`
    to turn :class:`SwiGLUMLP` params, a ``gate_up_proj`` concatenation ``[gate | up]`` or a
    checkpoint's into these; params of another layout are refused, never read as packed.

    Attributes:
      intermediate_size: N (K and N multiples of 8).
      dtype: bfloat16 or float16, the computation and output dtype; ``None``: the promoted
        dtype of the input and the params, which must then be one of those two.
      param_dtype: the stored dtype; if it differs from ``dtype`` every call casts all the
        weights (about 4x the weight traffic for float32 storage), so store ``dtype``.
      kernel: ``"auto"``, ``"interleaved"`` or ``"xla"``, as in :func:`jax_swiglu.swiglu`.
      activation: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU).
      kernel_init: initializer of gate, up and down, named or not as in :class:`SwiGLUMLP`.
      kernel_axes: as in :class:`SwiGLUMLP`; the packed matrix takes the gate/up names.
    """

    intermediate_size: int
    dtype: Any = jnp.bfloat16
    param_dtype: Any = jnp.bfloat16
    kernel: str = "auto"
    activation: str = "silu"
    kernel_init: Initializer = default_kernel_init
    kernel_axes: tuple | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """``[..., K] -> [..., K]`` in the computation dtype."""
        if self.dtype is not None:
            _common.check_kernel_dtype(self.dtype)
        selection.check_kernel_name(self.kernel)
        _common.check_activation(self.activation)
        if not self.is_initializing():
            _common.check_fused_keys(self.variables.get("params", {}))
        x = jnp.asarray(x)
        k, n = x.shape[-1], self.intermediate_size

        def init_gate_up(key):
            key_gate, key_up = jax.random.split(key)
            gate, box = _draw(self.kernel_init, key_gate, (k, n), self.param_dtype)
            up, _ = _draw(self.kernel_init, key_up, (k, n), self.param_dtype)
            gate_up_axes, _ = _common.logical_axes(self.kernel_axes, _box_names(box))
            return _boxed(_layout.pack_weights(gate, up).data, gate_up_axes, box)

        def init_down(key):
            down, box = _draw(self.kernel_init, key, (n, k), self.param_dtype)
            _, down_axes = _common.logical_axes(self.kernel_axes, _box_names(box))
            return _boxed(down, down_axes, box)

        gate_up = Projection(init_gate_up, name="gate_up_packed")()
        down = Projection(init_down, name="down_proj")()
        dtype = _common.compute_dtype(self.dtype, x, gate_up, down)
        _common.check_fused_compute_dtype(dtype, x.dtype, jnp.result_type(gate_up, down))
        return _common.fused_forward(x, gate_up, down, n, dtype=dtype, kernel=self.kernel,
                                     activation=self.activation)


default_expert_kernel_init = nn.initializers.lecun_normal(batch_axis=(0,))


class FusedExpertsMLP(nn.Module):
    """The expert MLPs of a mixture-of-experts layer, as :class:`jax_swiglu.nn.FusedExpertsMLP`
    (nnx) in linen's style: a call takes ``x`` ``[T, K]`` sorted by expert and
    ``group_sizes`` ``[E]`` int32 and returns ``[T, K]``; the router stays in the model.

    Params: ``gate_up_packed.kernel`` ``[E, K, 2 F_pad]`` ``('expert', 'embed', 'mlp')`` and
    ``down_proj.kernel`` ``[E, F, K]`` ``('expert', 'mlp', 'embed')``, boxed with those names.

    Attributes:
      intermediate_size, num_experts: F (K comes from the input) and E.
      dtype: the computation and output dtype (any float); param_dtype: the stored one.
      activation: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU), the names the kernels compile.
      kernel_init: draws gate, up, down ``[E, in, out]``; LeCun normal over ``in`` by default.
      expert_axis: a mesh axis the experts are split over (expert parallelism: each device
        runs its own experts' rows; :func:`jax_swiglu.grouped_fused_mlp`), or None.
    """

    intermediate_size: int
    num_experts: int
    dtype: Any = jnp.bfloat16
    param_dtype: Any = jnp.bfloat16
    activation: str = "silu"
    kernel_init: Initializer = default_expert_kernel_init
    expert_axis: str | None = None

    @nn.compact
    def __call__(self, x: jax.Array, group_sizes: jax.Array) -> jax.Array:
        _common.check_activation(self.activation)
        x = jnp.asarray(x)
        k, n, e = x.shape[-1], self.intermediate_size, self.num_experts

        def init_gate_up(key):
            key_gate, key_up = jax.random.split(key)
            gate = self.kernel_init(key_gate, (e, k, n), self.param_dtype)
            up = self.kernel_init(key_up, (e, k, n), self.param_dtype)
            return nn.LogicallyPartitioned(_layout.pack_expert_weights(gate, up).data,
                                           _common.EXPERT_GATE_UP_AXES)

        def init_down(key):
            return nn.LogicallyPartitioned(self.kernel_init(key, (e, n, k), self.param_dtype),
                                           _common.EXPERT_DOWN_AXES)

        gate_up = Projection(init_gate_up, name="gate_up_packed")()
        down = Projection(init_down, name="down_proj")()
        experts = _layout.PackedExperts.from_packed_data(gate_up.astype(self.dtype), n)
        return _experts.grouped_fused_mlp(x.astype(self.dtype), experts, down.astype(self.dtype),
                                          group_sizes, activation=self.activation,
                                          expert_axis=self.expert_axis)
