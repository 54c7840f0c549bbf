"""``flax.linen`` modules for the gated MLP block ``down(act(gate(x)) * up(x))`` (SwiGLU or
GeGLU, the ``activation`` attribute).

The same blocks as :mod:`jax_swiglu.nn.nnx`, in linen's style: the hidden size K comes
from the input at ``init``, as with ``nn.Dense``. Param trees are the ones
:func:`jax_swiglu.nn.fuse_params` and friends convert; ``init`` returns them boxed with
logical axis names (``nn.get_partition_spec`` reads them, ``nn.unbox`` strips them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from .. import _layout, selection
from . import _common

Initializer = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]

default_kernel_init = nn.initializers.lecun_normal()


class Projection(nn.Module):
    """One weight matrix as param ``kernel`` (``nn.Dense``'s layout), logically named.

    Calling it returns the matrix.
    """

    init_fn: Callable[[jax.Array], jax.Array]
    axes: tuple[str, str]

    @nn.compact
    def __call__(self) -> jax.Array:
        return self.param("kernel", nn.with_logical_partitioning(self.init_fn, self.axes))


class SwiGLUMLP(nn.Module):
    """The unfused reference block: ``down_proj(act(gate_proj(x)) * up_proj(x))``, plain XLA.

    Computes exactly :func:`jax_swiglu.swiglu_reference`, then the down dot in ``dtype``.
    Params, 3*K*N in all: ``gate_proj.kernel`` and ``up_proj.kernel`` [K, N]
    ``('embed', 'mlp')``, ``down_proj.kernel`` [N, K] ``('mlp', 'embed')``.

    Attributes:
      intermediate_size: N.
      dtype: the computation and output dtype. param_dtype: the stored dtype.
      activation: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU).
      kernel_init: initializer of the three kernels.
    """

    intermediate_size: int
    dtype: Any = jnp.bfloat16
    param_dtype: Any = jnp.bfloat16
    activation: str = "silu"
    kernel_init: Initializer = default_kernel_init

    def _kernel(self, name: str, shape: tuple[int, int], axes: tuple[str, str]) -> jax.Array:
        def init(key):
            return self.kernel_init(key, shape, self.param_dtype)
        return Projection(init, axes, name=name)()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """``[..., K] -> [..., K]`` in ``dtype``."""
        k, n = x.shape[-1], self.intermediate_size
        gate = self._kernel("gate_proj", (k, n), _common.GATE_UP_AXES)
        up = self._kernel("up_proj", (k, n), _common.GATE_UP_AXES)
        down = self._kernel("down_proj", (n, k), _common.DOWN_AXES)
        return _common.reference_forward(x, gate, up, down, dtype=self.dtype,
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
      dtype: bfloat16 or float16, the computation and output dtype.
      param_dtype: the stored dtype; if it differs from ``dtype`` every call casts all the
        weights (about 4x the weight traffic for float32 storage), so store ``dtype``.
      kernel: ``"auto"``, ``"interleaved"`` or ``"xla"``, as in :func:`jax_swiglu.swiglu`.
      activation: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU).
      kernel_init: initializer of gate, up and down.
    """

    intermediate_size: int
    dtype: Any = jnp.bfloat16
    param_dtype: Any = jnp.bfloat16
    kernel: str = "auto"
    activation: str = "silu"
    kernel_init: Initializer = default_kernel_init

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """``[..., K] -> [..., K]`` in ``dtype``."""
        _common.check_kernel_dtype(self.dtype)
        selection.check_kernel_name(self.kernel)
        _common.check_activation(self.activation)
        if not self.is_initializing():
            _common.check_fused_keys(self.variables.get("params", {}))
        k, n = x.shape[-1], self.intermediate_size

        def init_gate_up(key):
            key_gate, key_up = jax.random.split(key)
            return _layout.pack_weights(self.kernel_init(key_gate, (k, n), self.param_dtype),
                                        self.kernel_init(key_up, (k, n), self.param_dtype)).data

        def init_down(key):
            return self.kernel_init(key, (n, k), self.param_dtype)

        gate_up = Projection(init_gate_up, _common.GATE_UP_AXES, name="gate_up_packed")()
        down = Projection(init_down, _common.DOWN_AXES, name="down_proj")()
        return _common.fused_forward(x, gate_up, down, n, dtype=self.dtype, kernel=self.kernel,
                                     activation=self.activation)
