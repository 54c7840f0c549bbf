"""Bad or unusual input: a clear error at trace time, or a documented correct result.

Complements test_api.py (dtype, rank, K mismatch, unpacked weights, w_down) with the
remaining cases: alignment, empty M, NaN/Inf, non-SM90 GPUs and missing kernels.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_swiglu
from jax_swiglu import _native, pack_weights, selection, swiglu

from helpers import random_weights, random_x, requires_kernels


def test_alignment_is_an_error_at_pack_time():
    # K and N must keep 16-byte rows for TMA; we refuse rather than silently fall back.
    with pytest.raises(ValueError, match=r"K=20 and N=64 must be multiples of 8"):
        pack_weights(jnp.zeros((20, 64), jnp.bfloat16), jnp.zeros((20, 64), jnp.bfloat16))
    with pytest.raises(ValueError, match=r"K=16 and N=36 must be multiples of 8"):
        pack_weights(jnp.zeros((16, 36), jnp.bfloat16), jnp.zeros((16, 36), jnp.bfloat16))


def test_primitive_checks_alignment_too(key):
    # A direct bind with misaligned shapes is refused by the abstract eval.
    with pytest.raises(ValueError, match="multiples of 8"):
        jax.eval_shape(
            lambda x, w: jax_swiglu.swiglu_p.bind(x, w, n=60, weights="packed", kernel="auto",
                                                  launch=None, activation="silu",
                                                  out_dtype="bfloat16",
                                                  accumulation="promoted"),
            jax.ShapeDtypeStruct((4, 16), jnp.bfloat16), jax.ShapeDtypeStruct((16, 128), jnp.bfloat16))


def test_primitive_checks_the_fp8_call_of_16bit_x():
    """fp8 weights with a 16-bit x (quantized in the call): x of the output's dtype, its K the
    weights'; a direct bind that breaks either is refused by the abstract eval."""
    q = jax_swiglu.quantize_weights(*random_weights(jax.random.key(1), 64, 64, jnp.float32))

    def bind(x, out_dtype="bfloat16"):
        return jax.eval_shape(
            lambda x, d, s: jax_swiglu.swiglu_p.bind(
                x, d, s, n=64, weights="fp8", kernel="auto", launch=None, activation="silu",
                out_dtype=out_dtype, accumulation="promoted"),
            x, q.data, q.scales)

    assert bind(jax.ShapeDtypeStruct((4, 64), jnp.bfloat16)).shape == (4, 64)
    with pytest.raises(TypeError, match="output's dtype"):
        bind(jax.ShapeDtypeStruct((4, 64), jnp.float16))
    with pytest.raises(TypeError, match="bfloat16 or float16 x"):
        bind(jax.ShapeDtypeStruct((4, 64), jnp.float32))
    with pytest.raises(ValueError, match="do not match K=32"):
        bind(jax.ShapeDtypeStruct((4, 32), jnp.bfloat16))


@pytest.mark.parametrize("shape", [(0, 32), (3, 0, 32), (0,) * 3 + (32,)])
def test_empty_m(key, shape):
    packed = pack_weights(*random_weights(key, 32, 64))
    y = jax.jit(swiglu)(jnp.zeros(shape, jnp.bfloat16), packed)
    assert y.shape == shape[:-1] + (64,)
    w_down = jnp.zeros((64, 32), jnp.bfloat16)
    assert jax_swiglu.fused_mlp(jnp.zeros(shape, jnp.bfloat16), packed, w_down).shape == shape


def test_nan_and_inf_propagate_like_the_reference(key):
    kx, kw = jax.random.split(key)
    w_gate, w_up = random_weights(kw, 32, 64)
    x = random_x(kx, (6, 32))
    x = x.at[1, 3].set(jnp.nan).at[2, 5].set(jnp.inf).at[3, 0].set(-jnp.inf)
    y = jax.jit(swiglu)(x, pack_weights(w_gate, w_up))
    r = jax_swiglu.swiglu_reference(x, w_gate, w_up)
    y, r = np.asarray(y, np.float32), np.asarray(r, np.float32)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(r))
    assert np.isnan(y[1]).all()  # a NaN token poisons its whole row
    np.testing.assert_array_equal(y, r)  # NaN where the reference has NaN, equal elsewhere


def test_non_sm90_gpu_falls_back_to_xla_with_one_warning(monkeypatch):
    if not _native.kernels_available():
        pytest.skip("the fallback only matters when the kernels exist")
    monkeypatch.setattr(selection, "local_gpu_is_sm90", lambda: False)
    selection._warn_once.cache_clear()
    with pytest.warns(RuntimeWarning, match="SM90"):
        first = selection.choose(selection.Problem(128, 4864, 896, "bfloat16"))
    assert first.launch is None
    with warnings_as_errors():  # said once, not per call
        selection.choose(selection.Problem(256, 4864, 896, "bfloat16"))
    # Forcing a fused kernel there is an error that names the reason.
    with pytest.raises(RuntimeError, match="SM90"):
        selection.choose(selection.Problem(128, 4864, 896, "bfloat16"), kernel="interleaved")


def test_missing_extension_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr(_native, "_kernels", None)
    monkeypatch.setattr(_native, "_IMPORT_ERROR", "the extension was not built (test)")
    selection._warn_once.cache_clear()
    with pytest.warns(RuntimeWarning, match="not built"):
        assert selection.choose(selection.Problem(128, 4864, 896, "bfloat16")).launch is None
    with pytest.raises(RuntimeError, match="not built"):
        selection.choose(selection.Problem(128, 4864, 896, "bfloat16"), kernel="interleaved")


@requires_kernels
def test_lowering_on_a_non_sm90_gpu_has_no_custom_call(monkeypatch):
    monkeypatch.setattr(selection, "local_gpu_is_sm90", lambda: False)
    selection._warn_once.cache_clear()
    packed = pack_weights(*random_weights(jax.random.key(0), 64, 128))
    with pytest.warns(RuntimeWarning, match="SM90"):
        hlo = jax.jit(lambda x, p: swiglu(x, p)).trace(
            jax.ShapeDtypeStruct((8, 64), jnp.bfloat16), packed).lower(
            lowering_platforms=("cuda",)).as_text()
    assert "jax_swiglu_interleaved" not in hlo and "stablehlo.dot_general" in hlo


class warnings_as_errors:
    """Context manager: any warning inside fails the test."""

    def __enter__(self):
        import warnings
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)


def test_non_array_x_is_a_type_error_in_every_entry_point(key):
    packed = pack_weights(*random_weights(key, 32, 64))
    w_down = jnp.ones((64, 32), jnp.bfloat16)
    for call in (lambda: jax_swiglu.swiglu([[0.0] * 32], packed),
                 lambda: jax_swiglu.fused_mlp([[0.0] * 32], packed, w_down),
                 lambda: jax_swiglu.explain([[0.0] * 32], packed)):
        with pytest.raises(TypeError, match="x must be an array, got list"):
            call()
