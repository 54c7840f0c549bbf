"""The reference path's dots: exact fp32 accumulation without HIGHEST for bf16/f16."""

import jax
import jax.numpy as jnp
import pytest

from jax_swiglu import pack_weights, swiglu, swiglu_reference

from helpers import random_weights


def _lowered(fn, *args, platform):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("m", [1, 8, 300])
def test_xla_path_has_no_highest_dot_for_16_bit_inputs(platform, dtype, m):
    # bf16 x bf16 products are exact in fp32: HIGHEST buys nothing and, at M = 1, makes XLA
    # emit a transpose-and-reduce fusion instead of a GEMM.
    packed = pack_weights(*random_weights(jax.random.key(0), 64, 96, dtype))
    x = jax.ShapeDtypeStruct((m, 64), dtype)
    hlo = _lowered(lambda x, p: swiglu(x, p, kernel="xla"), x, packed, platform=platform)
    assert "stablehlo.dot_general" in hlo
    assert "HIGHEST" not in hlo
    assert f"tensor<{m}x192xf32>" in hlo  # the dot's result: fp32 accumulation


def test_float32_reference_keeps_full_precision():
    w_gate, w_up = random_weights(jax.random.key(0), 64, 96, jnp.float32)
    x = jax.ShapeDtypeStruct((4, 64), jnp.float32)
    hlo = _lowered(swiglu_reference, x, w_gate, w_up, platform="cpu")
    assert hlo.count("HIGHEST") >= 2  # fp32 inputs: full fp32, not TF32
