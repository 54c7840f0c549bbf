"""FP8 weights (jax_swiglu/_quantize.py): quantization, layout, the XLA fp8 path against the
spec (fp32 math on the dequantized inputs), and the errors bad input gets at trace time.

Criterion, as the issue states it: no element more than 1 % + 1e-3 off
``swiglu_reference_quantized`` (fp32 math on the dequantized x and weights).
"""

import copy
import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_swiglu
from jax_swiglu import (QuantizedWeights, dequantize_weights, pack_weights, quantize_tokens,
                        quantize_weights, swiglu, swiglu_reference_quantized)

from jax_swiglu import _native, _primitive, _reference, selection

from helpers import random_weights, random_x, requires_kernels

FORMATS = [jnp.float8_e4m3fn, jnp.float8_e5m2]
MODES = ["per_channel", "per_tensor"]


def _mismatches(y, r):
    y, r = np.asarray(y, np.float32), np.asarray(r, np.float32)
    return int(np.sum(~(np.abs(y - r) <= 0.01 * np.abs(r) + 1e-3)))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", MODES)
def test_layout_scales_and_dequantization(fmt, mode):
    w_gate, w_up = random_weights(jax.random.key(0), 128, 40, jnp.float32)
    q = quantize_weights(w_gate, w_up, dtype=fmt, scale=mode)
    assert q.data.shape == (128, 128) and q.data.dtype == jnp.dtype(fmt)  # [2 N_pad, K]
    assert q.scales.dtype == jnp.float32
    assert q.scales.shape == ((128,) if mode == "per_channel" else ())
    assert (q.n, q.k, q.n_padded) == (40, 128, 64)
    # Row p of the K-major data is packed column p of the bf16 layout.
    packed = np.asarray(pack_weights(w_gate, w_up).data, np.float32)
    stand_for = np.asarray(q.data.astype(jnp.float32).T * q.scales)
    relative = 2.0 ** -(3 if fmt == jnp.float8_e4m3fn else 2)  # a half-ulp, and some
    assert np.all(np.abs(stand_for - packed) <= relative * np.abs(packed).max(axis=0) + 1e-30)
    gate, up = dequantize_weights(q)
    np.testing.assert_array_equal(np.asarray(gate), jax_swiglu._layout.split_gate_up(
        jnp.asarray(stand_for), 40)[0])
    assert gate.shape == up.shape == (128, 40)
    # Each column's (or the matrix's) largest magnitude lands on the format's largest value.
    largest = float(jnp.finfo(fmt).max)
    data = np.abs(np.asarray(q.data.astype(jnp.float32)))
    real = np.asarray(jax_swiglu._layout.interleave_gate_up(*(np.arange(64) < 40,) * 2))
    peaks = data.max(axis=1)[real] if mode == "per_channel" else data.max()  # not the padding
    np.testing.assert_array_equal(peaks, largest)


def test_values_on_the_fp8_grid_round_trip_exactly():
    """Weights that are e4m3 values times a power of two, with every column's largest at
    448: the scale is that power of two and dequantization gives the weights back bit-exactly."""
    key_g, key_u = jax.random.split(jax.random.key(1))
    grid = lambda key: jax.random.normal(key, (64, 32)).astype(jnp.float8_e4m3fn).astype(
        jnp.float32).at[0].set(448.0) * 2.0 ** -7
    w_gate, w_up = grid(key_g), grid(key_u)
    q = quantize_weights(w_gate, w_up)
    np.testing.assert_array_equal(np.asarray(q.scales), 2.0 ** -7)
    gate, up = dequantize_weights(q)
    np.testing.assert_array_equal(gate, w_gate)
    np.testing.assert_array_equal(up, w_up)


def test_tokens_are_quantized_per_row():
    x = jnp.asarray([[1.0, -2.0, 0.5, 4.0] * 2, [0.0] * 8, [1e-3] * 8], jnp.bfloat16)
    x_q, x_scale = quantize_tokens(x)
    assert x_q.dtype == jnp.float8_e4m3fn and x_scale.shape == (3,)
    # Powers of two: 4 needs 2^-6 (4 * 2^6 = 256 <= 448 < 512); bf16's 1e-3 needs 2^-18.
    np.testing.assert_array_equal(np.asarray(x_scale), [2.0 ** -6, 1.0, 2.0 ** -18])
    np.testing.assert_array_equal(np.asarray(x_q[1].astype(jnp.float32)), 0.0)
    np.testing.assert_allclose(np.asarray(x_q.astype(jnp.float32) * x_scale[:, None]),
                               np.asarray(x, np.float32), rtol=2 ** -3)


@pytest.mark.parametrize("fmt", FORMATS)
def test_token_scales_are_the_smallest_power_of_two_that_fits(fmt):
    """Each row's scale is a power of two 2^e with amax / 2^e in (largest / 2, largest], so
    x / scale is exact and the cast the one rounding: eager and jitted calls agree bit for
    bit, and x_q is the fp8 rounding of x / scale computed in float64. Rows of zeros, or
    with an infinity or a NaN, get scale 1 (an infinity saturates, a NaN stays NaN)."""
    largest = float(jnp.finfo(fmt).max)
    rng = np.random.default_rng(0)
    rows = 64
    magnitudes = 2.0 ** rng.uniform(-100, 100, rows)
    x = (rng.standard_normal((rows, 96)) * magnitudes[:, None]).astype(np.float32)
    x[3] = 0.0
    x[4, 5] = np.inf
    x[5, 7] = np.nan
    x[6] = largest  # exactly the largest: scale 1
    x[7] = np.nextafter(np.float32(largest), np.float32(np.inf))  # just past it: scale 2
    x_q, x_scale = quantize_tokens(jnp.asarray(x), fmt)
    jitted = jax.jit(quantize_tokens, static_argnums=1)(jnp.asarray(x), fmt)
    for a, b in zip((x_q, x_scale), jitted):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
    scale = np.asarray(x_scale, np.float64)
    assert np.all(np.frexp(scale)[0] == 0.5)  # powers of two
    np.testing.assert_array_equal(scale[[3, 4, 5, 6, 7]], [1.0, 1.0, 1.0, 1.0, 2.0])
    ordinary = np.setdiff1d(np.arange(rows), [3, 4, 5])
    ratio = np.abs(x[ordinary]).max(axis=1) / scale[ordinary]
    assert np.all((ratio > largest / 2) & (ratio <= largest))
    expected = (x[ordinary] / scale[ordinary, None]).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(x_q[ordinary].astype(jnp.float32)),
                                  np.asarray(jnp.asarray(expected).astype(fmt).astype(jnp.float32)))
    assert float(x_q[4, 5].astype(jnp.float32)) == largest
    assert np.isnan(float(x_q[5, 7].astype(jnp.float32)))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("activation", list(jax_swiglu.ACTIVATIONS))
@pytest.mark.parametrize("m", [1, 7, 300])
def test_xla_fp8_path_meets_the_criterion(fmt, mode, activation, m):
    k, n = 256, 200
    w_gate, w_up = random_weights(jax.random.key(2), k, n, jnp.float32)
    q = quantize_weights(w_gate, w_up, dtype=fmt, scale=mode)
    x = random_x(jax.random.key(3), (m, k))
    y = jax.jit(lambda x, q: swiglu(x, q, activation=activation))(x, q)
    assert y.shape == (m, n) and y.dtype == jnp.bfloat16
    reference = swiglu_reference_quantized(x, q, activation=activation)
    assert _mismatches(y, reference) == 0
    # ... and quantizing x first, then passing it with its scales, is the same call.
    x_q, x_scale = quantize_tokens(x, fmt)
    prequantized = jax.jit(lambda x, s, q: swiglu(x, q, x_scale=s, activation=activation))
    np.testing.assert_array_equal(np.asarray(prequantized(x_q, x_scale, q)), np.asarray(y))


def test_fp8_is_close_to_the_bf16_result():
    """The quantization error is what fp8 costs, not a bug: within a few percent of the
    bf16 call in relative Frobenius norm on unit-scale inputs."""
    w_gate, w_up = random_weights(jax.random.key(4), 512, 256, jnp.bfloat16)
    x = random_x(jax.random.key(5), (64, 512))
    bf16 = np.asarray(swiglu(x, pack_weights(w_gate, w_up)), np.float32)
    fp8 = np.asarray(swiglu(x, quantize_weights(w_gate, w_up)), np.float32)
    assert np.linalg.norm(fp8 - bf16) / np.linalg.norm(bf16) < 0.08


def test_fused_mlp_leading_dims_vmap_and_explain():
    w_gate, w_up = random_weights(jax.random.key(6), 64, 96, jnp.float32)
    q = quantize_weights(w_gate, w_up)
    w_down = (jax.random.normal(jax.random.key(7), (96, 64)) / 10).astype(jnp.bfloat16)
    x = random_x(jax.random.key(8), (2, 3, 64))
    out = jax.jit(jax_swiglu.fused_mlp)(x, q, w_down)
    expected = jnp.matmul(swiglu_reference_quantized(x, q), w_down)
    assert out.shape == (2, 3, 64) and out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(expected, np.float32),
                               rtol=0.02, atol=0.02)
    batched = jax.vmap(lambda x: swiglu(x, q))(x)
    np.testing.assert_array_equal(np.asarray(batched), np.asarray(swiglu(x, q)))
    text = jax_swiglu.explain(jax.ShapeDtypeStruct((4, 64), jnp.bfloat16), q, platform="cpu")
    assert "float8_e4m3fn weights (per_channel)" in text and "xla on the dequantized" in text


def _dots(fn, x, q):
    hlo = jax.jit(fn).trace(x, q).lower(lowering_platforms=("cuda",)).as_text()
    assert "custom_call" not in hlo
    return [line for line in hlo.splitlines() if "stablehlo.dot_general" in line]


def test_cuda_lowering_of_the_xla_path_is_xlas_fp8_gemm(monkeypatch):
    """kernel="xla" on a GPU with fp8 tensor cores (here the shipped data's part) runs XLA's
    own scaled fp8 dot, at Precision.HIGHEST for promoted sums and at default precision
    for fast ones, as do calls no kernel can run; e5m2 weights, K not a multiple of 16 and
    a GPU without fp8 tensor cores run the spec: fp32 dots of the dequantized values behind
    an optimization barrier (so XLA cannot turn them back into its own fp8 GEMM). No custom
    call either way."""
    x = jax.ShapeDtypeStruct((8, 64), jnp.bfloat16)
    q = quantize_weights(*random_weights(jax.random.key(9), 64, 64, jnp.float32))
    for accumulation, precision in (("promoted", "HIGHEST"), ("fast", None)):
        dots = _dots(functools.partial(swiglu, kernel="xla", accumulation=accumulation), x, q)
        assert len(dots) == 1 and "tensor<8x64xf8E4M3FN>, tensor<128x64xf8E4M3FN>" in dots[0]
        assert "-> tensor<8x128xf32>" in dots[0]
        assert (precision in dots[0]) if precision else ("HIGHEST" not in dots[0])
    text = jax_swiglu.explain(x, q, kernel="xla", platform="cuda")
    assert "xla fp8 GEMM (promoted sums)" in text
    # A call no kernel can run (a callable activation) takes the same XLA path.
    relu = lambda g: jnp.maximum(g, 0.0)  # noqa: E731
    dots = _dots(functools.partial(swiglu, activation=relu), x, q)
    assert len(dots) == 1 and "tensor<8x64xf8E4M3FN>, tensor<128x64xf8E4M3FN>" in dots[0]
    assert "xla (XLA's fp8 GEMM, promoted sums)" in jax_swiglu.explain(
        x, q, activation=relu, platform="cuda")

    def spec(dots):
        return len(dots) == 2 and all("xf32>" in d and "f8E" not in d for d in dots)
    e5m2 = quantize_weights(*random_weights(jax.random.key(9), 64, 64, jnp.float32),
                            dtype=jnp.float8_e5m2)
    assert spec(_dots(functools.partial(swiglu, kernel="xla"), x, e5m2))
    k72 = quantize_weights(*random_weights(jax.random.key(9), 72, 64, jnp.float32))
    assert spec(_dots(functools.partial(swiglu, kernel="xla"),
                      jax.ShapeDtypeStruct((8, 72), jnp.bfloat16), k72))
    from jax_swiglu.selection import _device, _engine
    monkeypatch.setattr(_engine, "target_device",
                        lambda: _device.Device("NVIDIA A100-SXM4-80GB", 80, 108, 2.0e12))
    assert spec(_dots(functools.partial(swiglu, kernel="xla"), x, q))
    assert spec(_dots(functools.partial(swiglu, activation=relu), x, q))
    assert "xla on the dequantized inputs" in jax_swiglu.explain(x, q, kernel="xla",
                                                                  platform="cuda")
    assert "xla (the XLA reference)" in jax_swiglu.explain(x, q, activation=relu,
                                                            platform="cuda")


def test_the_xla_baseline_is_one_fp8_dot():
    """The benchmarks' baseline, XLA's own fp8 path: an fp8 x fp8 dot asking for fp32."""
    q = quantize_weights(*random_weights(jax.random.key(9), 64, 64, jnp.float32))
    hlo = jax.jit(jax_swiglu._reference.swiglu_xla_quantized).trace(
        jax.ShapeDtypeStruct((8, 64), jnp.bfloat16), q).lower(
        lowering_platforms=("cuda",)).as_text()
    dots = [line for line in hlo.splitlines() if "stablehlo.dot_general" in line]
    assert len(dots) == 1 and "tensor<8x64xf8E4M3FN>, tensor<128x64xf8E4M3FN>" in dots[0]
    assert "-> tensor<8x128xf32>" in dots[0]


def _custom_calls(hlo):
    """Every custom call's target, in program order."""
    return re.findall(r"stablehlo.custom_call @(\w+)\(", hlo)


def _fp8_calls(hlo):
    return [(t, int(c)) for t, c in
            re.findall(r"stablehlo.custom_call @(jax_swiglu_\w+)\(.*?config = (\d+)", hlo)]


@requires_kernels
@pytest.mark.parametrize("m", [1, 16, 17, 64, 65, 300, 4096])
@pytest.mark.parametrize("x_dtype, suffix", [(jnp.bfloat16, "bf16"), (jnp.float16, "f16")])
def test_cuda_lowering_runs_the_fp8_launch_the_selection_picks(m, x_dtype, suffix):
    q = quantize_weights(*random_weights(jax.random.key(9), 256, 1024, jnp.float32))
    out = jnp.dtype(x_dtype).name
    choice = selection.choose(selection.Problem(m, 1024, 256, out, "e4m3"))
    hlo = jax.jit(lambda x, w: swiglu(x, w)).trace(
        jax.ShapeDtypeStruct((m, 256), x_dtype), q).lower(lowering_platforms=("cuda",)).as_text()
    family = "gemv" if choice.launch.row.is_gemv else "interleaved"
    assert _fp8_calls(hlo) == [(f"jax_swiglu_{family}_fp8_silu_{suffix}", choice.launch.config)]
    # x is quantized per row before the fused kernel: by the extension's kernel, or (until
    # the GPU has run it) by XLA; no dot is left for XLA.
    quantize = [f"jax_swiglu_quantize_rows_e4m3_{suffix}"] if _primitive.QUANTIZE_KERNEL else []
    assert _custom_calls(hlo) == [*quantize, f"jax_swiglu_{family}_fp8_silu_{suffix}"]
    assert "stablehlo.dot_general" not in hlo
    assert ("stablehlo.reduce" in hlo) != _primitive.QUANTIZE_KERNEL
    text = jax_swiglu.explain(jax.ShapeDtypeStruct((m, 256), x_dtype), q, platform="cuda")
    assert f"config {choice.launch.config}" in text and choice.source in text


@requires_kernels
def test_fp8_calls_the_kernel_cannot_run_lower_to_xla():
    """e5m2 weights, and K = 40 (rows of 40 fp8 bytes, which TMA cannot load), run XLA."""
    w = random_weights(jax.random.key(9), 48, 64, jnp.float32)
    for q, k in ((quantize_weights(*w, dtype=jnp.float8_e5m2), 48),
                 (quantize_weights(*random_weights(jax.random.key(9), 40, 64, jnp.float32)), 40)):
        hlo = jax.jit(lambda x, w: swiglu(x, w)).trace(
            jax.ShapeDtypeStruct((8, k), jnp.bfloat16), q).lower(
            lowering_platforms=("cuda",)).as_text()
        assert _fp8_calls(hlo) == [] and "stablehlo.dot_general" in hlo
        text = jax_swiglu.explain(jax.ShapeDtypeStruct((8, k), jnp.bfloat16), q, platform="cuda")
        assert "xla" in text and ("e5m2" in text or "K=40" in text)
        # Forcing the fused kernel there is an error that says why, when the call is lowered.
        with pytest.raises(ValueError, match="e5m2 operands|multiple of 16"):
            jax.jit(lambda x, w: swiglu(x, w, kernel="interleaved")).trace(
                jax.ShapeDtypeStruct((8, k), jnp.bfloat16), q).lower(lowering_platforms=("cuda",))


def test_the_fp8_primitive_on_the_cpu_is_the_xla_path():
    with jax.default_device(jax.devices("cpu")[0]):
        _check_the_fp8_primitive_is_the_xla_path()


def _check_the_fp8_primitive_is_the_xla_path():
    q = quantize_weights(*random_weights(jax.random.key(11), 128, 96, jnp.float32),
                         scale="per_tensor")
    x = random_x(jax.random.key(12), (3, 5, 128))
    expected = swiglu_reference_quantized(x, q)
    np.testing.assert_array_equal(np.asarray(swiglu(x, q)), np.asarray(expected))
    np.testing.assert_array_equal(np.asarray(jax.jit(swiglu)(x, q)), np.asarray(expected))
    batched = jax.vmap(lambda x: swiglu(x, q), in_axes=1)(x)
    np.testing.assert_array_equal(np.asarray(batched), np.asarray(jnp.swapaxes(expected, 0, 1)))
    with pytest.raises(NotImplementedError, match="inference-only"):
        jax.grad(lambda x: swiglu(x, q).astype(jnp.float32).sum())(x)


def test_quantized_weights_are_a_pytree():
    q = quantize_weights(*random_weights(jax.random.key(10), 64, 40, jnp.float32))
    leaves, tree = jax.tree.flatten(q)
    assert len(leaves) == 2
    again = jax.tree.unflatten(tree, leaves)
    assert (again.n, again.scale_mode) == (40, "per_channel")
    with pytest.raises(AttributeError, match="immutable"):
        q.scales = None


# --- bad input ------------------------------------------------------------------------------

@pytest.fixture
def quantized():
    return quantize_weights(*random_weights(jax.random.key(11), 64, 64, jnp.float32))


def test_bad_quantize_arguments():
    w_gate, w_up = random_weights(jax.random.key(12), 64, 64, jnp.float32)
    with pytest.raises(TypeError, match="float8_e4m3fn or float8_e5m2"):
        quantize_weights(w_gate, w_up, dtype=jnp.int8)
    with pytest.raises(ValueError, match="scale must be one of"):
        quantize_weights(w_gate, w_up, scale="per_block")
    with pytest.raises(TypeError, match="to quantize"):
        quantize_weights(w_gate.astype(jnp.float8_e4m3fn), w_up)
    with pytest.raises(ValueError, match="same shape"):
        quantize_weights(w_gate, w_up[:, :32])
    with pytest.raises(ValueError, match="multiples of 8"):
        quantize_weights(w_gate[:, :60], w_up[:, :60])
    # Tokens and the down projection: arrays of floats with something to scale.
    with pytest.raises(TypeError, match="x must be an array"):
        jax_swiglu.quantize_tokens([[1.0, 2.0]])
    for bad in (jnp.ones((3, 4), jnp.int32), jnp.ones((3, 4), jnp.complex64)):
        with pytest.raises(TypeError, match="floating-point array to quantize"):
            jax_swiglu.quantize_tokens(bad)
    for bad in (jnp.float32(3.0), jnp.ones((3, 0))):
        with pytest.raises(ValueError, match="K > 0"):
            jax_swiglu.quantize_tokens(bad)
    with pytest.raises(ValueError, match="non-empty"):
        jax_swiglu.quantize_down(jnp.zeros((0, 64)))
    # M = 0 is still a call (no rows, no scales).
    x_q, x_scale = jax_swiglu.quantize_tokens(jnp.ones((0, 64)))
    assert x_q.shape == (0, 64) and x_scale.shape == (0,)


def test_bad_scales_are_refused(quantized):
    n = quantized.n
    with pytest.raises(ValueError, match="scales .per_channel. must have shape"):
        QuantizedWeights.from_packed_data(quantized.data, quantized.scales[:64], n)
    with pytest.raises(TypeError, match="scales must be float32"):
        QuantizedWeights.from_packed_data(quantized.data, quantized.scales.astype(jnp.bfloat16), n)
    with pytest.raises(TypeError, match="data must be float8"):
        QuantizedWeights.from_packed_data(quantized.data.astype(jnp.bfloat16), quantized.scales, n)
    # Arrays changed through the pytree (which rebuilds without checks) are refused at trace time.
    x = jax.ShapeDtypeStruct((4, 64), jnp.bfloat16)
    wrong_shape = jax.tree.map(lambda a: a[:64] if a.ndim == 1 else a, quantized)
    with pytest.raises(ValueError, match="scales .per_channel. must have shape"):
        jax.jit(swiglu).trace(x, wrong_shape)


def test_quantized_weights_are_built_by_quantize_weights_or_named(quantized):
    with pytest.raises(TypeError, match="quantize_weights"):
        QuantizedWeights(quantized.data, quantized.scales)
    again = QuantizedWeights.from_packed_data(quantized.data, quantized.scales, quantized.n,
                                              quantized.scale_mode)
    x = random_x(jax.random.key(14), (4, 64))
    np.testing.assert_array_equal(swiglu(x, again), swiglu(x, quantized))
    copied = copy.deepcopy(quantized)
    assert copied.n == quantized.n and copied.scale_mode == quantized.scale_mode
    np.testing.assert_array_equal(np.asarray(copied.data).view(np.uint8),
                                  np.asarray(quantized.data).view(np.uint8))


def test_bad_fp8_calls_are_refused(quantized):
    x = random_x(jax.random.key(13), (4, 64))
    x_q, x_scale = quantize_tokens(x)
    with pytest.raises(TypeError, match="pass x_scale"):
        swiglu(x_q, quantized)
    with pytest.raises(TypeError, match="one fp8 format"):
        swiglu(quantize_tokens(x, jnp.float8_e5m2)[0], quantized, x_scale=x_scale)
    with pytest.raises(ValueError, match="one scale per row"):
        swiglu(x_q, quantized, x_scale=x_scale[:2])
    with pytest.raises(TypeError, match="x_scale must be float32"):
        swiglu(x_q, quantized, x_scale=x_scale.astype(jnp.bfloat16))
    with pytest.raises(ValueError, match="x_scale is for fp8 x"):
        swiglu(x, quantized, x_scale=x_scale)
    with pytest.raises(ValueError, match="x_scale is for fp8 weights"):
        swiglu(x, pack_weights(*random_weights(jax.random.key(0), 64, 64)), x_scale=x_scale)
    with pytest.raises(TypeError, match="bfloat16, float16 or fp8"):
        swiglu(x.astype(jnp.float32), quantized)
    with pytest.raises(ValueError, match="K=32"):
        swiglu(x[:, :32], quantized)
    with pytest.raises(TypeError, match="w_down is float32"):
        jax_swiglu.fused_mlp(x, quantized, jnp.zeros((64, 64), jnp.float32))


@requires_kernels
def test_a_family_without_an_fp8_form_is_refused(quantized):
    x = random_x(jax.random.key(13), (4, 64))
    with pytest.raises(ValueError, match="no gate_then_up kernel on e4m3 operands"):
        jax.jit(lambda x, w: swiglu(x, w, kernel="pingpong")).trace(x, quantized).lower(
            lowering_platforms=("cuda",))


@requires_kernels
def test_the_fp8_gemv_rows_lower_to_their_target():
    """The e4m3 tensor-core gemv rows (every build has them): their own target with the
    config, the cluster split and the promotion; at most their tokens, whole k tiles of
    promotion, cluster sizes only."""
    gemv = [row for row in jax_swiglu.kernel_configs().values()
            if row.operands == "e4m3" and row.family == "gemv"]
    assert {row.tile_n for row in gemv} == {128, 256}
    for row in gemv:
        hlo = _fp8_hlo(f"{row.id},splits=2,promotion=8", m=row.tile_m, k=512)
        assert _fp8_calls(hlo) == [("jax_swiglu_gemv_fp8_silu_bf16", row.id)]
        assert re.search(r"splits = 2 : i64", hlo) and re.search(r"promotion = 8 : i64", hlo)
        assert re.search(r"promotion = 4 : i64", _fp8_hlo(f"{row.id}", m=1, k=512))
        with pytest.raises(ValueError, match="at most"):
            _fp8_hlo(f"{row.id}", m=row.tile_m + 1, k=512)
        with pytest.raises(ValueError, match="promotes after whole k tiles of 4 wgmma"):
            _fp8_hlo(f"{row.id},promotion=2", m=1, k=512)
        with pytest.raises(ValueError, match="cluster"):
            _fp8_hlo(f"{row.id},splits=3", m=1, k=512)


def _fp8_row(**fields):
    """The one e4m3 row with ``fields`` (promoted accumulation unless they say otherwise)."""
    fields.setdefault("accumulation", "promoted")
    [row] = [row for row in _native.all_configs().values() if row.operands == "e4m3"
             and all(getattr(row, k) == v for k, v in fields.items())]
    if not row.compiled:  # an Optional row: CI builds every config, a default install does not
        pytest.skip(f"row {row.id} is not in this build (JAX_SWIGLU_ALL_CONFIGS=1 builds it)")
    return row


def _fp8_hlo(launch, m=2048, k=256, accumulation="promoted"):
    q = quantize_weights(*random_weights(jax.random.key(9), k, 1024, jnp.float32))
    return jax.jit(lambda x, w: swiglu(x, w, launch=launch, accumulation=accumulation)).trace(
        jax.ShapeDtypeStruct((m, k), jnp.bfloat16), q).lower(
        lowering_platforms=("cuda",)).as_text()


@requires_kernels
@pytest.mark.parametrize("m", [8, 2048])
def test_fast_accumulation_is_promotion_0_or_a_fast_accumulation_row(m):
    """accumulation='fast' runs promotion 0 (one promotion, after the last k tile): the launch
    chosen for the promoted call, or where the waves rule takes it (M = 2048: 128 tiles of
    128 x 256 fill one wave as 256 of 128 x 128 fill two) a fast-accumulation row; chosen or
    forced, and explain says so."""
    promoted, fast = _fp8_hlo(None, m=m), _fp8_hlo(None, m=m, accumulation="fast")
    config = re.search(r"config = (\d+) : i64", promoted).group(1)
    fast_config = int(re.search(r"config = (\d+) : i64", fast).group(1))
    if m == 2048:
        assert jax_swiglu.kernel_configs()[fast_config].fast_accumulation, fast
    else:
        assert fast_config == int(config)
    assert re.search(r"promotion = 0 : i64", fast) and not re.search(r"promotion = 0 ", promoted)
    deep = _fp8_row(m_side="tokens", scheduler="persistent", tile_n=128, tile_k=128)
    assert re.search(r"promotion = 0 : i64", _fp8_hlo(f"{deep.id}", accumulation="fast"))
    assert re.search(r"promotion = 0 : i64", _fp8_hlo(f"{deep.id},promotion=0"))
    q = quantize_weights(*random_weights(jax.random.key(9), 256, 1024, jnp.float32))
    x = jax.ShapeDtypeStruct((m, 256), jnp.bfloat16)
    explained = jax_swiglu.explain(x, q, platform="cuda", accumulation="fast")
    assert ("fast accumulation (one promotion, after the last k tile)" if m == 8
            else "e4m3 fast accumulation") in explained, explained
    assert "fast accumulation" not in jax_swiglu.explain(x, q, platform="cuda")


def test_accumulation_is_checked_when_the_call_is_traced():
    q = quantize_weights(*random_weights(jax.random.key(9), 256, 1024, jnp.float32))
    packed = jax_swiglu.pack_weights(*random_weights(jax.random.key(9), 256, 1024))
    x = jnp.zeros((8, 256), jnp.bfloat16)
    with pytest.raises(ValueError, match="accumulation must be one of"):
        swiglu(x, q, accumulation="exact")
    with pytest.raises(ValueError, match="is for fp8 weights"):
        swiglu(x, packed, accumulation="fast")
    with pytest.raises(ValueError, match="accumulation='fast' contradicts"):
        swiglu(x, q, launch="27,promotion=8", accumulation="fast")
    # Off CUDA (and on the XLA path) the spec runs: fp32 sums in either mode.
    np.testing.assert_array_equal(swiglu(x, q, accumulation="fast"), swiglu(x, q))


@requires_kernels
def test_a_forced_promotion_is_whole_k_tiles_of_the_config():
    """promotion=<p> counts wgmma of 32 of K: a multiple of the row's k tile (128: 4 of
    them; 64: 2), or a clear error when the call is traced."""
    deep = _fp8_row(m_side="tokens", scheduler="persistent", tile_n=128, tile_k=128)
    assert re.search(r"promotion = 8 : i64", _fp8_hlo(f"{deep.id},promotion=8"))
    assert re.search(r"promotion = 4 : i64", _fp8_hlo(f"{deep.id}"))
    with pytest.raises(ValueError, match="promotes after whole k tiles of 4 wgmma"):
        _fp8_hlo(f"{deep.id},promotion=2")
    shallow = [row for row in jax_swiglu.kernel_configs().values()
               if row.operands == "e4m3" and row.tile_k == 64]
    for row in shallow:  # an Optional row: in builds with every config
        assert re.search(r"promotion = 2 : i64", _fp8_hlo(f"{row.id}"))
        assert re.search(r"promotion = 8 : i64", _fp8_hlo(f"{row.id},promotion=8"))
    explained = jax_swiglu.explain(jax.ShapeDtypeStruct((64, 256), jnp.bfloat16),
                                   quantize_weights(*random_weights(jax.random.key(9), 256, 1024,
                                                                    jnp.float32)),
                                   launch=f"{deep.id},promotion=8", platform="cuda")
    assert "promotion every 8" in explained and "forced" in explained


@requires_kernels
@pytest.mark.parametrize("launch, match", [
    ("999", "no config 999"), ("{fp8},promotion=5", "promotes after whole k tiles"),
    ("{fp8},splits=2", "has no split-K"), ("0", "runs 16bit operands")])
def test_a_bad_forced_fp8_launch_is_a_trace_time_error(launch, match):
    fp8 = _fp8_row(m_side="tokens", scheduler="persistent", tile_n=128, tile_k=128).id
    with pytest.raises(ValueError, match=match):
        _fp8_hlo(launch.format(fp8=fp8))


@requires_kernels
def test_an_e4m3_launch_forced_on_e5m2_weights_names_them():
    fp8 = _fp8_row(m_side="tokens", scheduler="persistent", tile_n=128, tile_k=128).id
    q5 = quantize_weights(*random_weights(jax.random.key(0), 64, 96, jnp.float32),
                          dtype=jnp.float8_e5m2)
    with pytest.raises(ValueError, match="runs e4m3 operands, but the weights are e5m2 fp8"):
        swiglu(jnp.ones((5, 64), jnp.bfloat16), q5, launch=fp8)


@requires_kernels
def test_a_fast_accumulation_row_runs_only_fast_calls():
    """The fast-accumulation rows (no promotion in their mainloop) join the candidates of a
    fast call only; forced on a promoted call, or with a promotion interval, they are a clear
    error when the call is traced."""
    wide = _fp8_row(m_side="tokens", scheduler="persistent", tile_n=256, accumulation="fast")
    hlo = _fp8_hlo(f"{wide.id}", accumulation="fast")
    assert re.search(rf"config = {wide.id} : i64", hlo) and re.search(r"promotion = 0 : i64", hlo)
    with pytest.raises(ValueError, match="pass accumulation='fast'"):
        _fp8_hlo(f"{wide.id}")
    with pytest.raises(ValueError, match="fast accumulation"):
        _fp8_hlo(f"{wide.id},promotion=4")
    with pytest.raises(ValueError, match="contradicts"):
        _fp8_hlo(f"{wide.id},promotion=4", accumulation="fast")
    problem = lambda accumulation: selection.Problem(  # noqa: E731
        2048, 1024, 256, "bfloat16", "e4m3", accumulation=accumulation)
    assert wide in selection.candidates(problem("fast"))
    assert wide not in selection.candidates(problem("promoted"))
    assert problem("fast").data_dtype != problem("promoted").data_dtype  # own autotune entries


@requires_kernels
def test_a_row_promoting_in_halves_runs_promoted_and_fast_calls_as_its_twin():
    """A row whose math loop promotes each half of a warpgroup's columns while the tensor cores
    add the other (mainloop/promotion_in_halves.cuh) is an e4m3 tile of one
    64-row wgmma a warpgroup (of tokens, or of packed columns on a swap-AB tile), named apart
    from its twin on CUTLASS's loop (the same tile, in builds with every config), and takes
    the calls and promotion intervals the twin takes. The default promoted 128 x 128 and
    128 x 192 tiles and the 160-token swap-AB tile are such rows."""
    table = jax_swiglu.kernel_configs().values()
    halves = [row for row in table if row.accumulation == "promoted-in-halves"]
    every_config = any(row.optional for row in table)
    assert {(row.tile_m, row.tile_n, row.m_side) for row in halves if not row.optional} >= {
        (128, 128, "tokens"), (128, 192, "tokens"), (160, 128, "weights")}
    for row in halves:
        assert row.operands == "e4m3" and row.family == "interleaved" and not row.grouped
        wgmma_m_side = row.tile_n if row.m_side == "weights" else row.tile_m
        assert wgmma_m_side == (128 if row.schedule == "cooperative" else 64)
        assert not row.fast_accumulation and "promoted in halves" in row.describe()
        twins = [other for other in table if other.accumulation == "promoted"
                 and dataclasses.replace(other, id=row.id, accumulation=row.accumulation,
                                         optional=row.optional) == row]
        assert len(twins) == 1 if every_config else len(twins) <= 1
        for twin in twins:
            assert twin.key != row.key and twin.key == row.key.replace("-halves", "")
        for launch, accumulation, promotion in ((f"{row.id}", "promoted", 4),
                                                (f"{row.id},promotion=8", "promoted", 8),
                                                (f"{row.id}", "fast", 0)):
            hlo = _fp8_hlo(launch, accumulation=accumulation)
            assert re.search(rf"config = {row.id} : i64", hlo)
            assert re.search(rf"promotion = {promotion} : i64", hlo)
        with pytest.raises(ValueError, match="promotes after whole k tiles of 4 wgmma"):
            _fp8_hlo(f"{row.id},promotion=2")


# --- the down projection in fp8 (the whole block) ----------------------------------------

def _down(key, n, k_out, scale="per_channel"):
    w_down = jax.random.normal(key, (n, k_out), jnp.float32) / np.sqrt(n)
    return w_down, jax_swiglu.quantize_down(w_down, scale=scale)


@pytest.mark.parametrize("scale", ["per_channel", "per_tensor"])
def test_quantize_down_is_k_major_with_a_scale_per_output_channel(key, scale):
    w_down, down = _down(key, 96, 64, scale)
    assert down.data.shape == (64, 96) and down.data.dtype == jnp.float8_e4m3fn
    assert down.scales.shape == ((64,) if scale == "per_channel" else ())
    assert (down.n, down.k_out, down.scale_mode) == (96, 64, scale)
    back = np.asarray(jax_swiglu.dequantize_down(down))
    # e4m3 keeps 3 mantissa bits: each weight within 2^-4 of its channel's largest.
    amax = np.abs(np.asarray(w_down)).max(axis=0 if scale == "per_channel" else None)
    assert np.all(np.abs(back - np.asarray(w_down)) <= amax / 16 + 1e-7)
    leaves, tree = jax.tree_util.tree_flatten(down)
    again = jax.tree_util.tree_unflatten(tree, leaves)
    assert isinstance(again, jax_swiglu.QuantizedDown) and again.scale_mode == scale
    assert copy.deepcopy(down).data.shape == (64, 96)
    with pytest.raises(AttributeError, match="immutable"):
        down.scales = down.scales


def test_quantize_down_refuses_what_it_cannot_quantize(key):
    with pytest.raises(ValueError, match=r"\[N, K_out\]"):
        jax_swiglu.quantize_down(jnp.zeros((4, 4, 4)))
    with pytest.raises(TypeError, match="to quantize"):
        jax_swiglu.quantize_down(jnp.zeros((8, 8), jnp.float8_e4m3fn))
    with pytest.raises(ValueError, match="scale must be one of"):
        jax_swiglu.quantize_down(jnp.zeros((8, 8)), scale="per_row")
    _, down = _down(key, 16, 8)
    with pytest.raises(ValueError, match="must have shape"):
        jax_swiglu.QuantizedDown(down.data, down.scales[:4])
    with pytest.raises(TypeError, match="float32"):
        jax_swiglu.QuantizedDown(down.data, down.scales.astype(jnp.bfloat16))
    with pytest.raises(TypeError, match="float8"):
        jax_swiglu.QuantizedDown(down.data.astype(jnp.bfloat16), down.scales)


@pytest.mark.parametrize("scale", ["per_channel", "per_tensor"])
def test_fused_mlp_with_the_down_projection_in_fp8_is_the_whole_fp8_spec(key, scale):
    """The block in fp8: the gated activations quantized per row, the down dot on the fp8
    values, both scales applied in fp32: within the criterion's 1 % + 1e-3 of the spec on
    every element, jitted or not, in x's dtype or reduced in float32. The two halves are
    checked apart, h against its spec and the block against the down projection's spec of
    that h (on the CPU the same h, so the whole spec; on a GPU h is the fused kernel's, and
    one bf16 step in h may be a whole fp8 step after its quantization)."""
    kx, kw, kd = jax.random.split(key, 3)
    x = random_x(kx, (3, 11, 256))
    q = quantize_weights(*random_weights(kw, 256, 192, jnp.float32), scale=scale)
    _, down = _down(kd, 192, 256, scale)
    h = swiglu(x, q)
    assert _mismatches(h, swiglu_reference_quantized(x, q)) == 0
    if jax.default_backend() == "cpu":
        np.testing.assert_array_equal(np.asarray(h), np.asarray(swiglu_reference_quantized(x, q)))
    spec = np.asarray(_reference.down_projection_reference_quantized(
        h, down, out_dtype=jnp.bfloat16), np.float32)
    for out in (jax_swiglu.fused_mlp(x, q, down), jax.jit(jax_swiglu.fused_mlp)(x, q, down),
                jax_swiglu.fused_mlp(x, q, down, reduce_dtype=jnp.float32)):
        assert out.shape == (3, 11, 256) and out.dtype == jnp.bfloat16
        got = np.asarray(out, np.float32)
        assert np.all(np.abs(got - spec) <= 0.01 * np.abs(spec) + 1e-3)
    # 16-bit gate/up weights with an fp8 down projection run too.
    w_gate, w_up = random_weights(kw, 256, 192)
    mixed = jax_swiglu.fused_mlp(x, pack_weights(w_gate, w_up), down)
    assert mixed.shape == (3, 11, 256) and mixed.dtype == jnp.bfloat16
    # A float32 block (gate/up on XLA's path) projects on XLA's fp8 dot too, as its spec.
    x32, packed32 = x.astype(jnp.float32), pack_weights(*random_weights(kw, 256, 192,
                                                                        jnp.float32))
    block32 = jax_swiglu.fused_mlp(x32, packed32, down)
    assert block32.shape == (3, 11, 256) and block32.dtype == jnp.float32
    np.testing.assert_array_equal(block32, _reference.down_projection_quantized(
        swiglu(x32, packed32), down, reduce_dtype=jnp.dtype(jnp.float32)))
    with pytest.raises(ValueError, match="contracts N=192"):
        jax_swiglu.fused_mlp(x, quantize_weights(*random_weights(kw, 256, 128, jnp.float32)),
                             down)
    with pytest.raises(TypeError, match="reduce_dtype"):
        jax_swiglu.fused_mlp(x, q, down, reduce_dtype=jnp.float16)


def test_the_fp8_down_projection_lowers_to_one_fp8_dot(key):
    """For CUDA the down projection is one dot of fp8 operands into fp32 (XLA's fp8 GEMM),
    at HIGHEST precision for promoted sums and default precision for fast accumulation."""
    q = quantize_weights(*random_weights(key, 256, 192, jnp.float32))
    _, down = _down(key, 192, 256)
    x = jax.ShapeDtypeStruct((64, 256), jnp.bfloat16)

    def down_dots(accumulation):
        text = jax.jit(lambda x, q, d: jax_swiglu.fused_mlp(x, q, d, accumulation=accumulation)
                       ).trace(x, q, down).lower(lowering_platforms=("cuda",)).as_text()
        return [line for line in text.splitlines() if "dot_general" in line
                and "tensor<64x192xf8E4M3FN>" in line and "tensor<256x192xf8E4M3FN>" in line]

    [promoted] = down_dots("promoted")
    [fast] = down_dots("fast")
    assert "HIGHEST" in promoted and "HIGHEST" not in fast


@requires_kernels
@pytest.mark.parametrize("m", [1, 2, 8, 9, 64])
@pytest.mark.parametrize("scale", ["per_channel", "per_tensor"])
def test_the_fp8_down_projection_runs_the_decode_form_at_a_few_tokens(key, m, scale):
    """Lowered for CUDA on one device: at the token counts selection.choose_projection gives
    the decode form (h quantized by the quantize kernel, then the e4m3 gemv row's plain
    projection with the split the engine chose), no fp8 dot left for XLA; at other M XLA's
    scaled fp8 dot. The CPU lowering is XLA's dot at every M."""
    q = quantize_weights(*random_weights(key, 1024, 2816, jnp.float32))
    _, down = _down(key, 2816, 1024, scale)
    x = jax.ShapeDtypeStruct((m, 1024), jnp.bfloat16)
    block = jax.jit(lambda x, q, d: jax_swiglu.fused_mlp(x, q, d))
    hlo = block.trace(x, q, down).lower(lowering_platforms=("cuda",)).as_text()
    choice = selection.choose_projection(m, 1024, 2816, "bfloat16")
    fp8_dots = [line for line in hlo.splitlines() if "dot_general" in line and "f8E4M3FN" in line]
    if m in selection.PROJECTION_TOKENS:
        assert choice.launch is not None and choice.launch.row.is_gemv
        calls = _custom_calls(hlo)
        assert calls[-1] == "jax_swiglu_gemv_projection_fp8_bf16" and not fp8_dots
        assert calls.count("jax_swiglu_quantize_rows_e4m3_bf16") == (
            2 if _primitive.QUANTIZE_KERNEL else 0)
        assert f"config = {choice.launch.config}" in hlo.split("gemv_projection_fp8_bf16")[-1]
    else:
        assert choice.launch is None
        assert "gemv_projection" not in hlo and len(fp8_dots) == 1
    cpu = block.trace(x, q, down).lower(lowering_platforms=("cpu",)).as_text()
    assert "gemv_projection" not in cpu and "custom_call" not in cpu


def test_the_fp8_down_projection_primitive_batches_and_refuses_gradients(key):
    """vmap over h folds into M (the same values as the unbatched call); no gradient."""
    _, down = _down(key, 96, 64)
    h = random_x(key, (3, 5, 96))
    bind = functools.partial(_primitive.down_projection_p.bind, accumulation="promoted",
                             reduce_dtype="bfloat16")
    batched = jax.vmap(lambda h: bind(h, down.data, down.scales))(h)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(batched[i]),
                                      np.asarray(bind(h[i], down.data, down.scales)))
    with pytest.raises(NotImplementedError, match="inference-only"):
        jax.grad(lambda h: bind(h, down.data, down.scales).astype(jnp.float32).sum())(h[0])


def test_the_fp8_down_projection_primitive_refuses_bad_operands(key):
    """A direct bind with operands that do not fit is a clear error when traced."""
    _, down = _down(key, 96, 64)
    h = random_x(key, (4, 96))
    bind = functools.partial(_primitive.down_projection_p.bind, accumulation="promoted",
                             reduce_dtype="bfloat16")
    with pytest.raises(ValueError, match=r"h \[M, N\] and data \[K_out, N\]"):
        jax.jit(bind).trace(h[:, :64], down.data, down.scales)
    with pytest.raises(TypeError, match="bfloat16 or float16 h"):
        jax.jit(bind).trace(h.astype(jnp.float32), down.data, down.scales)
    with pytest.raises(TypeError, match="float8"):
        jax.jit(bind).trace(h, down.data.astype(jnp.bfloat16), down.scales)
    with pytest.raises(ValueError, match="scales must be float32"):
        jax.jit(bind).trace(h, down.data, down.scales[:8])
    with pytest.raises(TypeError, match="reduce_dtype"):
        jax.jit(functools.partial(_primitive.down_projection_p.bind, accumulation="promoted",
                                  reduce_dtype="float16")).trace(h, down.data, down.scales)
    with pytest.raises(ValueError, match="accumulation must be one of"):
        jax.jit(functools.partial(_primitive.down_projection_p.bind, accumulation="exact",
                                  reduce_dtype="bfloat16")).trace(h, down.data, down.scales)
