"""The public API on the reference path (any machine): math, shapes, transforms, errors."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_swiglu
from jax_swiglu import fused_mlp, pack_weights, swiglu

from helpers import random_weights, random_x, reference_f64, rounding_tolerance


def _assert_close_to_f64(y, x, w_gate, w_up):
    r = reference_f64(x, w_gate, w_up)
    tol = rounding_tolerance(y.dtype)
    err = np.abs(np.asarray(y, np.float64) - r)
    # One final rounding (half an ulp) plus fp32 accumulation error, far below an ulp.
    assert np.all(err <= tol * np.abs(r) + 1e-6), float(np.max(err / (np.abs(r) + 1e-6)))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("m, k, n", [(1, 64, 64), (7, 96, 200), (130, 256, 136)])
def test_matches_float64_reference(key, dtype, m, k, n):
    kx, kw = jax.random.split(key)
    w_gate, w_up = random_weights(kw, k, n, dtype)
    x = random_x(kx, (m, k), dtype)
    y = jax.jit(swiglu)(x, pack_weights(w_gate, w_up))
    assert y.shape == (m, n) and y.dtype == dtype
    _assert_close_to_f64(y, x, w_gate, w_up)


def test_eager_call_and_reference_agree(key):
    kx, kw = jax.random.split(key)
    w_gate, w_up = random_weights(kw, 64, 128)
    x = random_x(kx, (5, 64))
    packed = pack_weights(w_gate, w_up)
    # The XLA path is the reference's computation, bit for bit; a fused kernel (on a GPU)
    # sums in another order, so the default call is held to the bound instead.
    y = swiglu(x, packed, kernel="xla")  # no jit
    np.testing.assert_array_equal(y, jax_swiglu.swiglu_reference(x, w_gate, w_up))
    _assert_close_to_f64(swiglu(x, packed), x, w_gate, w_up)


@pytest.mark.parametrize("lead", [(), (3,), (2, 5), (2, 3, 4)])
def test_leading_dims(key, lead):
    kx, kw = jax.random.split(key)
    w_gate, w_up = random_weights(kw, 32, 72)
    x = random_x(kx, (*lead, 32))
    y = jax.jit(swiglu)(x, pack_weights(w_gate, w_up))
    assert y.shape == (*lead, 72)
    _assert_close_to_f64(y.reshape(-1, 72), x.reshape(-1, 32), w_gate, w_up)


def test_empty_m_gives_empty_result(key):
    packed = pack_weights(*random_weights(key, 32, 64))
    y = jax.jit(swiglu)(jnp.zeros((0, 4, 32), jnp.bfloat16), packed)
    assert y.shape == (0, 4, 64) and y.dtype == jnp.bfloat16


def test_vmap_over_tokens_folds_into_m(key):
    kx, kw = jax.random.split(key)
    w_gate, w_up = random_weights(kw, 32, 64)
    packed = pack_weights(w_gate, w_up)
    x = random_x(kx, (4, 6, 32))
    y = jax.jit(jax.vmap(swiglu, in_axes=(1, None), out_axes=1))(x, packed)
    np.testing.assert_array_equal(y, swiglu(x, packed))
    # The batch dim was folded into M: one primitive on [24, 32].
    jaxpr = jax.make_jaxpr(jax.vmap(swiglu, in_axes=(1, None)))(x, packed)
    eqns = [e for e in jaxpr.jaxpr.eqns if e.primitive is jax_swiglu.swiglu_p]
    assert len(eqns) == 1 and eqns[0].invars[0].aval.shape == (24, 32)


def test_vmap_over_weights(key):
    kx, kw = jax.random.split(key)
    weights = [random_weights(k, 32, 64) for k in jax.random.split(kw, 3)]
    packed = jax.tree.map(lambda *a: jnp.stack(a), *[pack_weights(g, u) for g, u in weights])
    x = random_x(kx, (3, 5, 32))
    y = jax.jit(jax.vmap(swiglu))(x, packed)
    for i, (g, u) in enumerate(weights):
        np.testing.assert_array_equal(y[i], jax_swiglu.swiglu_reference(x[i], g, u))


def test_fused_mlp_matches_reference_mlp(key):
    kx, kw, kd = jax.random.split(key, 3)
    w_gate, w_up = random_weights(kw, 64, 128)
    w_down = (jax.random.normal(kd, (128, 64)) / np.sqrt(128)).astype(jnp.bfloat16)
    x = random_x(kx, (2, 9, 64))
    out = jax.jit(fused_mlp)(x, pack_weights(w_gate, w_up), w_down)
    expected = jax_swiglu.swiglu_reference(x, w_gate, w_up) @ w_down
    assert out.shape == (2, 9, 64) and out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(out, expected)


def test_grad_is_refused_as_inference_only(key):
    packed = pack_weights(*random_weights(key, 32, 64))
    x = random_x(key, (4, 32))
    with pytest.raises(NotImplementedError, match="inference-only"):
        jax.grad(lambda x: swiglu(x, packed).astype(jnp.float32).sum())(x)
    with pytest.raises(NotImplementedError, match="inference-only"):
        jax.grad(lambda d: swiglu(x, jax_swiglu.PackedWeights.from_packed_data(d, packed.n))
                 .astype(jnp.float32).sum())(packed.data)
    # No gradient needed through it (inputs under stop_gradient): fine.
    g = jax.grad(lambda x: swiglu(jax.lax.stop_gradient(x), packed).astype(jnp.float32).sum()
                 + x.astype(jnp.float32).sum())(x)
    assert g.shape == x.shape


# --- bad input: each gets a clear error at trace time -------------------------------------

@pytest.fixture
def packed(key):
    return pack_weights(*random_weights(key, 32, 64))


@pytest.mark.parametrize(
    "x, error, match",
    [
        (jnp.zeros((4, 32), jnp.float32), TypeError, "x is float32 but the packed weights are bfloat16"),
        (jnp.zeros((4, 32), jnp.int8), TypeError, "floating-point array .*got int8"),
        (jnp.zeros((4, 32), jnp.float8_e4m3fn), TypeError, "fp8 x runs on fp8 weights"),
        (jnp.zeros((4, 32), jnp.float16), TypeError, "x is float16 but the packed weights are bfloat16"),
        (jnp.zeros((4, 40), jnp.bfloat16), ValueError, "x has K=40 .* weights have K=32"),
        (jnp.zeros((), jnp.bfloat16), ValueError, "at least one dimension"),
    ],
)
def test_bad_x(packed, x, error, match):
    with pytest.raises(error, match=match):
        jax.jit(swiglu)(x, packed)


def test_unpacked_weights_are_refused(key):
    w_gate, w_up = random_weights(key, 32, 64)
    x = jnp.zeros((4, 32), jnp.bfloat16)
    with pytest.raises(TypeError, match="pack_weights"):
        swiglu(x, w_gate)
    with pytest.raises(TypeError, match=r"stacked \[K, 2, N\]"):
        swiglu(x, jnp.stack([w_gate, w_up], axis=1))
    with pytest.raises(TypeError, match="PackedWeights"):
        swiglu(x, (w_gate, w_up))


def test_bad_kernel_name(packed):
    with pytest.raises(ValueError, match="kernel must be one of"):
        swiglu(jnp.zeros((4, 32), jnp.bfloat16), packed, kernel="fastest")


def test_bad_w_down(packed):
    x = jnp.zeros((4, 32), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"w_down must be \[N, K_out\] with N=64"):
        fused_mlp(x, packed, jnp.zeros((32, 64), jnp.bfloat16))
    with pytest.raises(TypeError, match="w_down is float32"):
        fused_mlp(x, packed, jnp.zeros((64, 32), jnp.float32))


@pytest.mark.parametrize("reduce_dtype", [jnp.int32, jnp.float16, jnp.float64])
def test_bad_reduce_dtype(packed, reduce_dtype):
    x = jnp.zeros((4, 32), jnp.bfloat16)
    with pytest.raises(TypeError, match=r"reduce_dtype must be None \(x's dtype, bfloat16\) or float32"):
        fused_mlp(x, packed, jnp.zeros((64, 32), jnp.bfloat16), reduce_dtype=reduce_dtype)


def test_reduce_dtype_sets_the_down_projections_sums(packed):
    """The dot's result type is reduce_dtype (x's by default); the output is x's dtype."""
    x, w_down = jnp.ones((4, 32), jnp.bfloat16), jnp.ones((64, 16), jnp.bfloat16)
    for reduce_dtype in (None, jnp.float32, jnp.bfloat16):
        jaxpr = jax.make_jaxpr(
            lambda x, p, w: fused_mlp(x, p, w, reduce_dtype=reduce_dtype))(x, packed, w_down)
        dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
        assert [str(e.outvars[0].aval.dtype) for e in dots] == [jnp.dtype(reduce_dtype or x.dtype).name]
        assert jaxpr.out_avals[0].dtype == jnp.bfloat16


def test_explain_on_cpu(packed):
    text = jax_swiglu.explain(jax.ShapeDtypeStruct((8, 32), jnp.bfloat16), packed, platform="cpu")
    assert "M=8 N=64 K=32" in text and "xla" in text


# --- any float dtype and any activation: the XLA path ----------------------------------------

def _lowered_for_cuda(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("kernel", ["auto", "xla"])
def test_float32_runs_the_reference_math(key, kernel):
    kx, kw = jax.random.split(key)
    w_gate, w_up = random_weights(kw, 64, 96, jnp.float32)
    x = random_x(kx, (2, 3, 64), jnp.float32)
    packed = pack_weights(w_gate, w_up)
    y = jax.jit(lambda x, p: swiglu(x, p, kernel=kernel))(x, packed)
    assert y.shape == (2, 3, 96) and y.dtype == jnp.float32
    np.testing.assert_array_equal(y, jax_swiglu.swiglu_reference(x, packed))
    np.testing.assert_allclose(y, reference_f64(x, w_gate, w_up), rtol=1e-5, atol=1e-6)
    # On a GPU too it is plain XLA (no custom call), and differentiable there.
    assert "custom_call" not in _lowered_for_cuda(lambda x, p: swiglu(x, p, kernel=kernel),
                                                  x, packed)
    grad = jax.grad(lambda x: swiglu(x, packed).sum())(x)
    np.testing.assert_array_equal(
        grad, jax.grad(lambda x: jax_swiglu.swiglu_reference(x, packed).sum())(x))
    w_down = random_weights(kw, 96, 64, jnp.float32)[0]
    np.testing.assert_array_equal(fused_mlp(x, packed, w_down), y @ w_down)


def test_float64_runs_the_reference_math(key):
    with jax.enable_x64(True):
        w_gate, w_up = random_weights(key, 32, 64, jnp.float64)
        x = random_x(key, (5, 32), jnp.float64)
        y = swiglu(x, pack_weights(w_gate, w_up))
        assert y.dtype == jnp.float64
        np.testing.assert_allclose(y, reference_f64(x, w_gate, w_up), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("forced", [{"kernel": "interleaved"}, {"kernel": "gemv"},
                                    {"launch": "interleaved:0"}])
def test_a_forced_kernel_on_float32_is_a_trace_time_error(key, forced):
    packed = pack_weights(*random_weights(key, 64, 64, jnp.float32))
    x = jax.ShapeDtypeStruct((4, 64), jnp.float32)
    with pytest.raises(ValueError, match="cannot run this call: the fused kernels take bfloat16 "
                                         "or float16, x is float32.*'xla' runs it"):
        jax.jit(lambda x, p: swiglu(x, p, **forced)).trace(x, packed)
    with pytest.raises(ValueError, match="cannot run this call"):
        jax_swiglu.explain(x, packed, platform="cuda", **forced)


def test_explain_says_why_float32_does_not_fuse(key):
    packed = pack_weights(*random_weights(key, 64, 64, jnp.float32))
    text = jax_swiglu.explain(jax.ShapeDtypeStruct((16, 64), jnp.float32), packed,
                              platform="cuda")
    assert text.startswith("M=16 N=64 K=64 float32 silu on cuda: runs plain XLA, since the fused "
                           "kernels take bfloat16 or float16, x is float32\n"), text


@pytest.mark.parametrize("alias, name", [("swish", "silu"), (jax.nn.silu, "silu"),
                                         ("gelu_pytorch_tanh", "gelu_tanh"),
                                         ("gelu_new", "gelu_tanh"), (jax.nn.gelu, "gelu_tanh")])
def test_activation_aliases_are_the_kernels_activations(key, alias, name):
    kx, kw = jax.random.split(key)
    packed = pack_weights(*random_weights(kw, 64, 64))
    x = random_x(kx, (8, 64))
    np.testing.assert_array_equal(jax.jit(lambda x, p: swiglu(x, p, activation=alias))(x, packed),
                                  swiglu(x, packed, activation=name))
    # The same fused target lowers for CUDA as with the name itself.
    lowered = _lowered_for_cuda(lambda x, p: swiglu(x, p, activation=alias), x, packed)
    if jax_swiglu.kernels_available():
        assert re.search(rf"custom_call @jax_swiglu_[a-z_]+?_{name}_bf16\b", lowered), lowered
    assert f" {name} on cuda: " in jax_swiglu.explain(x, packed, activation=alias,
                                                      platform="cuda")


def test_a_callable_activation_runs_on_the_xla_path(key):
    kx, kw = jax.random.split(key)
    w_gate, w_up = random_weights(kw, 64, 64)
    packed = pack_weights(w_gate, w_up)
    x = random_x(kx, (8, 64))

    def relu_squared(g):
        return jnp.square(jax.nn.relu(g))
    y = jax.jit(lambda x, p: swiglu(x, p, activation=relu_squared))(x, packed)
    # fp32 products, act(g) * u in fp32, one rounding: as for the kernels' activations.
    gate = np.asarray(x, np.float32) @ np.asarray(w_gate, np.float32)
    up = np.asarray(x, np.float32) @ np.asarray(w_up, np.float32)
    expected = (np.square(np.maximum(gate, 0)) * up).astype(jnp.bfloat16)
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(expected, np.float32),
                               rtol=1e-2, atol=1e-3)
    np.testing.assert_array_equal(y, jax_swiglu.swiglu_reference(x, packed,
                                                                 activation=relu_squared))
    assert "custom_call" not in _lowered_for_cuda(
        lambda x, p: swiglu(x, p, activation=relu_squared), x, packed)
    text = jax_swiglu.explain(x, packed, activation=relu_squared, platform="cuda")
    assert " relu_squared on cuda: runs plain XLA, since the activation relu_squared is a " \
           "callable; the kernels compile silu, gelu_tanh\n" in text, text
    with pytest.raises(ValueError, match="kernel='interleaved' cannot run this call: the "
                                         "activation relu_squared is a callable"):
        swiglu(x, packed, kernel="interleaved", activation=relu_squared)
    # fp8 weights take it too, on their own spec.
    q = jax_swiglu.quantize_weights(w_gate, w_up)
    np.testing.assert_array_equal(
        swiglu(x, q, activation=relu_squared),
        jax_swiglu.swiglu_reference_quantized(x, q, activation=relu_squared))


@pytest.mark.parametrize("bad", ["gelu", "SiLU", 3, None])
def test_an_unknown_activation_names_what_is_taken(key, bad):
    packed = pack_weights(*random_weights(key, 64, 64))
    with pytest.raises(ValueError, match=r"activation must be one of \('silu', 'gelu_tanh'\).*"
                                         r"swish, gelu_pytorch_tanh, gelu_new.*or a callable"):
        swiglu(jnp.ones((2, 64), jnp.bfloat16), packed, activation=bad)
