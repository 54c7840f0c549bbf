"""The reference path: exact fp32 accumulation without HIGHEST for bf16/f16, and the gated
activations' math."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_swiglu
from jax_swiglu import pack_weights, swiglu, swiglu_reference, unpack_weights

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


# --- the gated activations ------------------------------------------------------------------

def _f32_product(x, w):
    return jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST)


@pytest.mark.parametrize("activation, act", [
    ("silu", lambda g: g * jax.nn.sigmoid(g)),
    # Gemma's GeGLU: GELU's tanh approximation, written out.
    ("gelu_tanh", lambda g: 0.5 * g * (1 + jnp.tanh(jnp.sqrt(2 / jnp.pi) * (g + 0.044715 * g**3)))),
])
def test_activations_are_the_models_formulas(activation, act):
    """The reference is act(x @ Wg) * (x @ Wu) in fp32, rounded once, with each activation's
    textbook formula; and the packed path (what swiglu lowers to here) is bitwise the same."""
    key_w, key_x = jax.random.split(jax.random.key(1))
    w_gate, w_up = random_weights(key_w, 128, 96)
    x = jax.random.normal(key_x, (5, 128), jnp.bfloat16)
    expected = (act(_f32_product(x, w_gate)) * _f32_product(x, w_up)).astype(jnp.bfloat16)
    reference = swiglu_reference(x, w_gate, w_up, activation=activation)
    np.testing.assert_allclose(np.asarray(reference, np.float32),
                               np.asarray(expected, np.float32), rtol=1e-2, atol=1e-3)
    fused = swiglu(x, pack_weights(w_gate, w_up), activation=activation)
    np.testing.assert_array_equal(np.asarray(fused).view(np.uint16),
                                  np.asarray(reference).view(np.uint16))


def test_the_activations_differ():
    """GeGLU is not SwiGLU under another name: the two outputs differ on random inputs."""
    w_gate, w_up = random_weights(jax.random.key(2), 64, 64)
    x = jax.random.normal(jax.random.key(3), (4, 64), jnp.bfloat16)
    packed = pack_weights(w_gate, w_up)
    silu, gelu = (np.asarray(swiglu(x, packed, activation=a), np.float32)
                  for a in ("silu", "gelu_tanh"))
    assert np.abs(silu - gelu).max() > 1e-2


@pytest.mark.parametrize("bad", ["gelu", "relu", "SiLU", None])
def test_unknown_activation_is_a_trace_time_error(bad):
    w_gate, w_up = random_weights(jax.random.key(0), 64, 64)
    x = jax.ShapeDtypeStruct((4, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="activation must be one of"):
        jax.jit(lambda x, p: swiglu(x, p, activation=bad)).trace(x, pack_weights(w_gate, w_up))
    with pytest.raises(ValueError, match="activation must be one of"):
        swiglu_reference(jnp.ones((4, 64), jnp.bfloat16), w_gate, w_up, activation=bad)


# --- the reference on swiglu's own arguments ------------------------------------------------

@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_reference_takes_swiglus_arguments(activation):
    """swiglu_reference(x, packed) is swiglu's call under another name: bitwise the reference
    on the separate weights (and the XLA path swiglu lowers to here)."""
    key_w, key_x = jax.random.split(jax.random.key(4))
    w_gate, w_up = random_weights(key_w, 64, 200)  # N = 200: padded when packed
    x = jax.random.normal(key_x, (2, 3, 64), jnp.bfloat16)
    packed = pack_weights(w_gate, w_up)
    expected = swiglu_reference(x, w_gate, w_up, activation=activation)
    got = swiglu_reference(x, packed, activation=activation)
    assert got.shape == (2, 3, 200) and got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16),
                                  np.asarray(expected).view(np.uint16))
    np.testing.assert_array_equal(np.asarray(swiglu(x, packed, activation=activation)),
                                  np.asarray(got))


def test_reference_on_packed_weights_trains():
    """Differentiable in x and in the packed weights, whose gradient is the separate weights'
    gradients packed; float32 runs too (training code keeps fp32 master weights)."""
    key_w, key_x = jax.random.split(jax.random.key(5))
    w_gate, w_up = random_weights(key_w, 32, 64, jnp.float32)
    x = jax.random.normal(key_x, (4, 32), jnp.float32)
    packed = pack_weights(w_gate, w_up)

    def loss_packed(p, x):
        return (swiglu_reference(x, p) ** 2).sum()

    def loss_separate(g, u, x):
        return (swiglu_reference(x, g, u) ** 2).sum()

    grad_packed, grad_x = jax.jit(jax.grad(loss_packed, argnums=(0, 1)))(packed, x)
    grad_gate, grad_up, grad_x_separate = jax.grad(loss_separate, argnums=(0, 1, 2))(
        w_gate, w_up, x)
    got_gate, got_up = unpack_weights(grad_packed)
    np.testing.assert_allclose(got_gate, grad_gate, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_up, grad_up, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad_x, grad_x_separate, rtol=1e-5, atol=1e-6)


def test_reference_of_quantized_weights_is_the_fp8_spec():
    w_gate, w_up = random_weights(jax.random.key(6), 64, 64, jnp.float32)
    weights = jax_swiglu.quantize_weights(w_gate, w_up)
    x = jax.random.normal(jax.random.key(7), (4, 64), jnp.bfloat16)
    np.testing.assert_array_equal(swiglu_reference(x, weights),
                                  jax_swiglu.swiglu_reference_quantized(x, weights))


def test_reference_on_bad_arguments():
    w_gate, w_up = random_weights(jax.random.key(8), 32, 64)
    packed = pack_weights(w_gate, w_up)
    x = jnp.ones((4, 32), jnp.bfloat16)
    with pytest.raises(TypeError, match=r"\(x, w_gate, w_up\) or, as swiglu, \(x, packed\)"):
        swiglu_reference(x, w_gate)
    with pytest.raises(ValueError, match="x has K=40 .* weights have K=32"):
        swiglu_reference(jnp.ones((4, 40), jnp.bfloat16), packed)
    with pytest.raises(ValueError, match="x_scale is for fp8 weights"):
        swiglu_reference(x, packed, x_scale=jnp.ones(4))
    with pytest.raises(ValueError, match="activation must be one of"):
        swiglu_reference(x, packed, activation="relu")
    with pytest.raises(TypeError, match="PackedWeights"):
        swiglu_reference(x, (w_gate, w_up))
