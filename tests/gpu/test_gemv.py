"""The gemv kernel (ffi/kernels/gemv_kernel.cuh, both forms: CUDA cores and mma.sync) on an
SM90 GPU.

Every compiled gemv config at every split of K (a cluster of 1, 2, 4 or 8 CTAs) runs the
tokens it is built for, against the same fp32 reference and criterion as test_kernels.py
(zero elements off), in both dtypes and activations; each form is bitwise deterministic over
100 calls and across recompiles; and M beyond a config's tokens is refused at trace time.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_swiglu
from jax_swiglu import PackedWeights, selection, swiglu

from test_kernels import _errors, _fused, _inputs, _record

GEMV = jax_swiglu.kernel_configs().get("gemv", {})
# (K, N): a 7B-sized MLP (2N = 22016: 86 CTAs of 256 packed columns, the last whole), a small
# one (the last CTA a quarter full; for 128-column CTAs, half), K not a multiple of 64 nor of
# 8 splits' steps, and for the mma.sync form not of its 16-row step, N not a multiple of 32
# (padded), and K of one 8-row step (no split possible).
SHAPES = [(4096, 11008), (896, 4864), (1000, 200), (136, 72), (8, 40)]


def _tokens(config):
    """M values a config runs. A CUDA-core row (one of a ladder of token counts): its most,
    and those below it down to the next row's. An mma.sync row (any M up to its token
    tiles): one token, a few, and each tile's last and first."""
    if config.schedule == "mma-sync":
        return sorted({1, 3, 7, 8, 9, 15, 16} & set(range(1, config.tile_m + 1)))
    smaller = [c.tile_m for c in GEMV.values()
               if c.schedule == config.schedule and c.tile_m < config.tile_m]
    low = max(smaller, default=0) + 1
    return sorted({low, (low + config.tile_m) // 2, config.tile_m})


def _cases():
    return [(c.id, m, k, n, s) for c in GEMV.values() for m in _tokens(c)
            for k, n in SHAPES for s in c.split_choices(k)]


def _check(config, splits, m, k, n, key, monkeypatch, dtype=jnp.bfloat16, activation="silu"):
    monkeypatch.setenv(selection.CONFIG_ENV_VAR, f"{config},splits={splits}")
    jax.clear_caches()  # the variable is read at lowering
    x, w_gate, w_up, data = _inputs(key, m, k, n, jnp.dtype(dtype))
    packed = PackedWeights(data, n)
    y = _fused("gemv", activation)(jnp.full((m, n), jnp.nan, dtype), x, packed)
    mismatches, rel_fro, max_abs = (float(v) for v in _errors(y, x, w_gate, w_up, activation))
    _record(kernel="gemv", config=config, splits=splits, m=m, k=k, n=n,
            dtype=jnp.dtype(dtype).name, activation=activation, mismatches=int(mismatches),
            rel_fro=rel_fro, max_abs_err=max_abs)
    assert mismatches == 0, f"{int(mismatches)} elements off (rel_fro={rel_fro:.3g})"
    assert rel_fro < 1e-2
    return y


pytestmark = pytest.mark.skipif(not GEMV, reason="no gemv config compiled")


@pytest.mark.parametrize("config, m, k, n, splits", _cases())
def test_every_config_and_split(config, m, k, n, splits, key, monkeypatch, request):
    request.addfinalizer(jax.clear_caches)
    _check(config, splits, m, k, n, key, monkeypatch)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("activation", list(jax_swiglu.ACTIVATIONS))
def test_dtypes_and_activations(dtype, activation, key, monkeypatch, request):
    request.addfinalizer(jax.clear_caches)
    for config in GEMV.values():
        _check(config.id, 4, config.tile_m, 1536, 8960, key, monkeypatch, dtype, activation)


def _widest_of_each_form():
    """The config of each form (CUDA cores, mma.sync) with the most tokens."""
    widest = {}
    for c in GEMV.values():
        if c.tile_m > widest.get(c.schedule, (0, None))[0]:
            widest[c.schedule] = (c.tile_m, c.id)
    return [config_id for _, config_id in widest.values()]


@pytest.mark.parametrize("config_id", _widest_of_each_form())
@pytest.mark.parametrize("splits", [1, 8])
def test_bitwise_deterministic(config_id, splits, key, monkeypatch, request):
    """Fixed-order sums (thread, warps, then the cluster's CTAs in rank order): the same bits
    over 100 calls and after a recompile."""
    request.addfinalizer(jax.clear_caches)
    config = GEMV[config_id]
    first = np.asarray(_check(config.id, splits, config.tile_m, 4096, 11008, key, monkeypatch))
    x, _, _, data = _inputs(key, config.tile_m, 4096, 11008, jnp.dtype(jnp.bfloat16))
    call = jax.jit(lambda x, p: swiglu(x, p, kernel="gemv"))
    packed = PackedWeights(data, 11008)
    outs = [call(x, packed) for _ in range(100)]
    jax.clear_caches()
    outs.append(jax.jit(lambda x, p: swiglu(x, p, kernel="gemv"))(x, packed))
    for out in outs:
        np.testing.assert_array_equal(np.asarray(out).view(np.uint16), first.view(np.uint16))


def test_too_many_tokens_is_a_trace_time_error(monkeypatch, request):
    request.addfinalizer(jax.clear_caches)
    most = max(c.tile_m for c in GEMV.values())
    x = jnp.ones((most + 1, 256), jnp.bfloat16)
    packed = jax_swiglu.pack_weights(jnp.ones((256, 64), jnp.bfloat16),
                                     jnp.ones((256, 64), jnp.bfloat16))
    with pytest.raises(ValueError, match="gemv"):
        jax.jit(lambda x, p: swiglu(x, p, kernel="gemv")).lower(x, packed)
    monkeypatch.setenv(selection.CONFIG_ENV_VAR, "0")
    jax.clear_caches()
    with pytest.raises(ValueError, match="at most"):
        jax.jit(lambda x, p: swiglu(x, p, kernel="gemv")).lower(x[:2], packed)
