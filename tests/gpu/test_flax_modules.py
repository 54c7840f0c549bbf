"""The Flax modules with the fused kernels on an SM90 GPU, against the reference modules."""

import jax
import numpy as np
import pytest

pytest.importorskip("flax", reason="jax_swiglu.nn needs flax: pip install jax_swiglu[flax]")
import flax.linen as nn  # noqa: E402
from flax import nnx  # noqa: E402

import jax_swiglu  # noqa: E402
from jax_swiglu import nn as swiglu_nn  # noqa: E402
from jax_swiglu.nn import linen as swiglu_linen  # noqa: E402

from helpers import random_x  # noqa: E402


def _rel_frobenius(y, r):
    y, r = np.asarray(y, np.float32), np.asarray(r, np.float32)
    return np.linalg.norm(y - r) / np.linalg.norm(r)


@pytest.mark.parametrize("kernel", ["interleaved", "gate_then_up"])
@pytest.mark.parametrize("lead", [(8, 1), (1, 2048)])
def test_gpu_fused_module_matches_reference(key, kernel, lead):
    k, n = 896, 4864  # Qwen2.5-0.5B's MLP
    reference = swiglu_nn.SwiGLUMLP(k, n, rngs=nnx.Rngs(0))
    fused = swiglu_nn.FusedSwiGLUMLP.from_unfused(reference, kernel=kernel)
    x = random_x(key, (*lead, k))
    forward = jax.jit(lambda m, x: m(x))
    assert f"jax_swiglu_{kernel}_silu_bf16" in forward.lower(fused, x).as_text()
    assert _rel_frobenius(forward(fused, x), forward(reference, x)) < 1e-2


def test_gpu_linen_fused_module_matches_reference(key):
    x = random_x(key, (4, 16, 896))
    reference = swiglu_linen.SwiGLUMLP(4864)
    variables = reference.init(jax.random.key(0), x)
    fused_params = swiglu_nn.fuse_params(nn.unbox(variables)["params"])
    y = jax.jit(swiglu_linen.FusedSwiGLUMLP(4864).apply)({"params": fused_params}, x)
    assert _rel_frobenius(y, jax.jit(reference.apply)(variables, x)) < 1e-2
