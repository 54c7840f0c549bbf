"""Shared test helpers: random inputs, the float64 reference, and why GPU tests skip."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
import jax_swiglu


def random_weights(key, k, n, dtype=jnp.bfloat16, scale=None):
    """Gate/up weights scaled so that x @ W has unit variance for unit-variance x."""
    scale = (1.0 / np.sqrt(k)) if scale is None else scale
    kg, ku = jax.random.split(key)
    w_gate = (jax.random.normal(kg, (k, n), jnp.float32) * scale).astype(dtype)
    w_up = (jax.random.normal(ku, (k, n), jnp.float32) * scale).astype(dtype)
    return w_gate, w_up


def random_x(key, shape, dtype=jnp.bfloat16):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def reference_f64(x, w_gate, w_up):
    """SiLU(x @ Wg) * (x @ Wu) in float64 numpy, unrounded."""
    x64 = np.asarray(x, np.float64)
    g = x64 @ np.asarray(w_gate, np.float64)
    u = x64 @ np.asarray(w_up, np.float64)
    return g / (1.0 + np.exp(-g)) * u


def rounding_tolerance(dtype):
    """One ulp of the output dtype, relative: the single final rounding uses half of it."""
    return {jnp.dtype(jnp.bfloat16): 2.0 ** -8, jnp.dtype(jnp.float16): 2.0 ** -11}[jnp.dtype(dtype)]



def gpu_skip_reason():
    """None on an SM90 GPU with the kernels built; otherwise why GPU tests skip."""
    from jax_swiglu import selection
    return selection.kernels_unusable_reason()


requires_kernels = pytest.mark.skipif(
    not jax_swiglu.kernels_available(),
    reason=f"needs the compiled extension: {jax_swiglu.unavailable_reason()}")
