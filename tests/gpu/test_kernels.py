"""The fused kernels on an SM90 GPU against an fp32 reference. Every kernel runs the same suite.

Each case draws fresh random inputs, poisons the output buffer with NaN (the output is
written into a donated NaN array, see ``test_output_is_written_in_place``), and requires
relative Frobenius error < 1e-2 and zero elements with |y - r| > 0.01 |r| + 1e-3, where r
is act(x @ Wg) * (x @ Wu) computed in fp32 from the same bf16 inputs, for each activation
(SiLU and GELU's tanh form: the tests taking ``activation`` run both).

Set JAX_SWIGLU_GPU_REPORT=path.jsonl to record every case's numbers.
"""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_swiglu
from jax_swiglu import QWEN25_MLPS, pack_weights, selection, swiglu
from jax_swiglu.selection import _model

from helpers import random_weights, random_x

# The fused families this build compiled that run any M (the pingpong kernel is an optional
# config); the gemv kernel runs at most 8 tokens and has its own suite (test_gemv.py).
FUSED_KERNELS = [k for k in jax_swiglu.KERNELS if k in jax_swiglu.kernel_configs() and k != "gemv"]
M_VALUES = [1, 7, 64, 128, 1000, 2048, 8192]


@pytest.fixture(params=list(jax_swiglu.ACTIVATIONS))
def activation(request):
    return request.param


def test_every_activation_is_compiled():
    assert jax_swiglu._native.activations() == tuple(jax_swiglu.ACTIVATIONS)


@functools.cache
def _fused(kernel, activation="silu"):
    # The NaN-filled first argument is donated and aliased to the output, so the kernel
    # writes into poisoned memory and any element it skips stays NaN. keep_unused: an
    # unused argument would otherwise be pruned, donation and all.
    return jax.jit(lambda poison, x, packed: swiglu(x, packed, kernel=kernel,
                                                    activation=activation),
                   donate_argnums=0, keep_unused=True)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _inputs(key, m, k, n, dtype):
    """Fresh random x, weights and their packing, in one compiled call (not a dozen)."""
    kx, kw = jax.random.split(key)
    w_gate, w_up = random_weights(kw, k, n, dtype)
    x = random_x(kx, (m, k), dtype)
    return x, w_gate, w_up, pack_weights(w_gate, w_up).data


@functools.partial(jax.jit, static_argnums=4)
def _errors(y, x, w_gate, w_up, activation):
    """Mismatch count, relative Frobenius error and max abs error against the fp32 reference."""
    f32 = functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)
    x = x.astype(jnp.float32)
    act = jax_swiglu.ACTIVATIONS[activation]
    r = act(f32(x, w_gate.astype(jnp.float32))) * f32(x, w_up.astype(jnp.float32))
    y = y.astype(jnp.float32)
    diff = jnp.abs(y - r)
    ok = diff <= 0.01 * jnp.abs(r) + 1e-3  # False for NaN: unwritten elements count
    rel_fro = jnp.linalg.norm(jnp.nan_to_num(y - r, nan=jnp.inf)) / jnp.linalg.norm(r)
    return jnp.sum(~ok), rel_fro, jnp.max(jnp.where(jnp.isnan(diff), jnp.inf, diff))


def _record(**row):
    path = os.environ.get("JAX_SWIGLU_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def check_kernel(kernel, m, k, n, key, dtype=jnp.bfloat16, activation="silu"):
    x, w_gate, w_up, packed_data = _inputs(key, m, k, n, jnp.dtype(dtype))
    packed = jax_swiglu.PackedWeights(packed_data, n)
    poison = jnp.full((m, n), jnp.nan, dtype)
    y = _fused(kernel, activation)(poison, x, packed)
    mismatches, rel_fro, max_abs = (float(v) for v in _errors(y, x, w_gate, w_up, activation))
    _record(kernel=kernel, m=m, k=k, n=n, dtype=jnp.dtype(dtype).name, activation=activation,
            mismatches=int(mismatches), rel_fro=rel_fro, max_abs_err=max_abs,
            choice=jax_swiglu.explain(x, packed, kernel=kernel, activation=activation))
    assert mismatches == 0, f"{int(mismatches)} elements off (rel_fro={rel_fro:.3g})"
    assert rel_fro < 1e-2
    return y


@pytest.mark.parametrize("kernel", FUSED_KERNELS)
@pytest.mark.parametrize("model", list(QWEN25_MLPS))
@pytest.mark.parametrize("m", M_VALUES)
def test_qwen_shapes(kernel, model, m, key, activation):
    k, n = QWEN25_MLPS[model]
    check_kernel(kernel, m, k, n, key, activation=activation)


@pytest.mark.parametrize("kernel", FUSED_KERNELS)
@pytest.mark.parametrize("m, k, n", [(1, 64, 8), (63, 136, 200), (129, 512, 1000), (300, 2048, 72)])
def test_odd_shapes(kernel, m, k, n, key, activation):
    """Partial tiles in M, N below one tile, N not a multiple of the gate/up block."""
    check_kernel(kernel, m, k, n, key, activation=activation)


def _any_m_configs(kernel):
    """The compiled configs of `kernel` that run any M (not those running M in bands, which
    need M to be a multiple of theirs: test_m_bands)."""
    return [c.id for c in jax_swiglu.kernel_configs().get(kernel, {}).values()
            if c.m_multiple == 1]


@pytest.mark.parametrize("kernel, config", [
    (kernel, config) for kernel in FUSED_KERNELS for config in _any_m_configs(kernel)])
@pytest.mark.parametrize("m", [5, 300, 2048])
def test_every_compiled_config(kernel, config, m, key, monkeypatch, activation):
    """Every compiled config, whether or not the selection picks it for the grid above."""
    monkeypatch.setenv(selection.CONFIG_ENV_VAR, str(config))
    jax.clear_caches()  # the variable is read at lowering
    try:
        check_kernel(kernel, m, 1536, 8960, key, activation=activation)
    finally:
        jax.clear_caches()


@pytest.mark.parametrize("config", _any_m_configs("interleaved"))
@pytest.mark.parametrize("m", [200, 1920, 1921])
def test_edge_tiles(config, m, key, monkeypatch, activation):
    """Tiles past the edge, whose loads move inside (ffi/kernels/edge_tiles.cuh), on every
    interleaved config: M = 1921 leaves 1 row in the last 128-row tile and 129 in the last
    256-row one; 1920 makes 15 rows of 128-row tiles, which 2x1 clusters pad with a tile wholly
    outside; 200 is below one 256-row tile and 2x1 clusters pad it too. N = 11008 makes 115
    tiles of 192 packed columns, an odd count that 1x2 clusters pad."""
    monkeypatch.setenv(selection.CONFIG_ENV_VAR, str(config))
    jax.clear_caches()  # the variable is read at lowering
    try:
        check_kernel("interleaved", m, 512, 11008, key, activation=activation)
    finally:
        jax.clear_caches()


def _twins(variant):
    """(config, its twin) for each config that `variant` picks: the twin is the plain persistent
    config with the same tiles, cluster and store (no split tail, no bands of M)."""
    configs = jax_swiglu.kernel_configs().get("interleaved", {})
    shape = lambda c: (c.schedule, c.tile_m, c.tile_n, c.tile_k, c.cluster_m, c.cluster_n, c.store)
    return [(c.id, t.id) for c in configs.values() if variant(c) for t in configs.values()
            if t.scheduler == "persistent" and t.m_bands == 1 and shape(t) == shape(c)]


def _assert_bitwise_twins(config, twin, m, k, n, key, monkeypatch):
    """Configs `config` and `twin`, each forced, pass check_kernel with bitwise equal outputs."""
    outputs = []
    for forced in (config, twin):
        monkeypatch.setenv(selection.CONFIG_ENV_VAR, str(forced))
        jax.clear_caches()  # the variable is read at lowering
        outputs.append(np.asarray(check_kernel("interleaved", m, k, n, key)).view(np.uint16))
    np.testing.assert_array_equal(outputs[0], outputs[1])


@pytest.mark.parametrize("config, twin", _twins(lambda c: c.scheduler == "split-tail"))
@pytest.mark.parametrize("m, k, n, halves", [
    # Clusters running a half tile on 132 SMs, for 2x1 and 1x2 clusters of 128x128 tiles:
    (2048, 896, 4864, (28, 28)),  # 0.5B: 1216 tiles, 9 rounds of 132, 28 tiles in 56 halves
    (1921, 896, 4864, (28, 28)),  # the same tiles; the last row moved inside (1 own row)
    (1800, 896, 4864, (28, 0)),   # 15 rows of tiles (+ a padding row, wholly outside, in 2x1)
    (1100, 512, 1024, (28, 12)),  # 9 rows (76 own rows in the last), 2 rounds
    (200, 512, 4096, (0, 0)),     # 128 tiles, one round: nothing to split
])
def test_split_tail(config, twin, m, k, n, halves, key, monkeypatch, request):
    """The split last round (ffi/kernels/split_tail.cuh): each half runs the whole K, so the
    output is bitwise that of the unsplit twin config, and every element is written."""
    configs = jax_swiglu.kernel_configs()["interleaved"]
    sms = jax.devices()[0].core_count
    expected = {(2, 1): halves[0], (1, 2): halves[1]}.get(
        (configs[config].cluster_m, configs[config].cluster_n))
    if sms == 132 and expected is not None:  # the counts above are an H200's
        assert _model.split_tail_clusters(configs[config], _model.Problem(m, n, k), sms) == expected
    request.addfinalizer(jax.clear_caches)
    _assert_bitwise_twins(config, twin, m, k, n, key, monkeypatch)


@pytest.mark.parametrize("config, twin", _twins(lambda c: c.m_bands > 1))
@pytest.mark.parametrize("k, n", [(2048, 11008), (512, 1000)])  # 115 and 11 columns of tiles
def test_m_bands(config, twin, k, n, key, monkeypatch, request):
    """A tile order in bands of M (ffi/kernels/m_bands.cuh) changes which CTA computes a tile
    and when, not how: the output is bitwise its twin's, every element written, at M = one and
    two multiples of its bands; other M are refused at trace time."""
    multiple = jax_swiglu.kernel_configs()["interleaved"][config].m_multiple
    request.addfinalizer(jax.clear_caches)
    for m in (multiple, 2 * multiple):
        _assert_bitwise_twins(config, twin, m, k, n, key, monkeypatch)
    monkeypatch.setenv(selection.CONFIG_ENV_VAR, str(config))
    jax.clear_caches()
    with pytest.raises(ValueError, match="bands"):
        check_kernel("interleaved", multiple + 128, k, n, key)


@pytest.mark.parametrize("kernel", FUSED_KERNELS)
@pytest.mark.parametrize("m", [7, 2048])
def test_float16(kernel, m, key, activation):
    check_kernel(kernel, m, 1536, 8960, key, dtype=jnp.float16, activation=activation)


@pytest.mark.parametrize("kernel, config", [(kernel, None) for kernel in FUSED_KERNELS] + [
    ("interleaved", config) for config in _any_m_configs("interleaved")])
def test_activation_over_the_whole_float_range(kernel, config, activation, monkeypatch,
                                               request):
    """The activation as the kernels compute it (MUFU exp; the sigmoid's reciprocal Newton's on
    even output columns and MUFU's on odd ones, or MUFU's on all in the interleaved kernel's
    pingpong configs) against the exact one, for gates from -inf to inf: x = e_0 makes every
    row's gate and up the first weight row. Each special value sits on both parities. With
    `config`, that interleaved config is forced (else the selection's). The exact values are
    float64 numpy: fp32's 1 + tanh(z) in jax.nn.gelu cancels for gates below about -5 (where
    outputs are far below the random-input tests' absolute tolerance), the sigmoid form does
    not."""
    if config is not None:
        monkeypatch.setenv(selection.CONFIG_ENV_VAR, str(config))
    jax.clear_caches()  # the variable is read at lowering
    request.addfinalizer(jax.clear_caches)
    m, k, n = 128, 64, 1024
    specials = np.repeat([-np.inf, np.inf, np.nan, -1e30, -120.0, -88.5, -87.0, -0.0, 0.0, 1e-30,
                          1e30], 2)
    gates = np.concatenate([specials, np.linspace(-100, 100, n - len(specials))])
    ups = np.where(np.arange(n) % 2 == 0, 1.0, -3.0)
    w_gate = jnp.zeros((k, n), jnp.bfloat16).at[0].set(jnp.asarray(gates, jnp.bfloat16))
    w_up = jnp.zeros((k, n), jnp.bfloat16).at[0].set(jnp.asarray(ups, jnp.bfloat16))
    x = jnp.zeros((m, k), jnp.bfloat16).at[:, 0].set(1)
    y = np.asarray(_fused(kernel, activation)(jnp.full((m, n), jnp.nan, jnp.bfloat16), x,
                                              pack_weights(w_gate, w_up)), np.float32)
    g, u = (np.asarray(w.astype(jnp.float32), np.float64)[0] for w in (w_gate, w_up))
    with np.errstate(over="ignore", invalid="ignore"):
        if activation == "silu":
            act = g / (1 + np.exp(-g))
        else:
            # 0.5 (1 + tanh(z)) = sigmoid(2z), exactly; in float64 without the cancellation.
            act = g / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))
    r = (act * u).astype(np.float32)[None, :]
    np.testing.assert_array_equal(np.isnan(y), np.broadcast_to(np.isnan(r), y.shape))
    np.testing.assert_array_equal(np.isinf(y), np.broadcast_to(np.isinf(r), y.shape))
    finite = np.isfinite(r)[0]
    assert (y[:, ~finite & ~np.isnan(r[0])] == r[:, ~finite & ~np.isnan(r[0])]).all()  # +-inf
    # Below g = -86.6 kernel and reference are 0 or within ~1e-36 of it.
    np.testing.assert_allclose(y[:, finite], np.broadcast_to(r[:, finite], (m, finite.sum())),
                               rtol=0.01, atol=1e-30)


@pytest.mark.parametrize("kernel", FUSED_KERNELS)
def test_output_is_written_in_place(kernel, key):
    """The poisoning works: the donated NaN buffer is the custom call's output buffer."""
    packed = pack_weights(*random_weights(key, 256, 512))
    args = (jnp.full((100, 512), jnp.nan, jnp.bfloat16), jnp.ones((100, 256), jnp.bfloat16), packed)
    compiled = _fused(kernel).lower(*args).compile().as_text()
    assert "input_output_alias={ {}: (0, {}, " in compiled, compiled[:400]
    entry = compiled[compiled.index("ENTRY"):]
    root = [line for line in entry.splitlines() if line.strip().startswith("ROOT")][0]
    assert "custom-call" in root and "jax_swiglu_" in root, root
    # ... and the kernel overwrites all of it.
    y = _fused(kernel)(*args)
    assert not bool(jnp.isnan(y).any())


def test_bad_calls_come_back_as_python_errors():
    """A malformed call reaching the handler is an error value, not a crash."""
    target = selection.choose(8, 64, 64, jnp.bfloat16, kernel="interleaved").target
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((8, 64), jnp.bfloat16))
    x = jnp.ones((8, 64), jnp.bfloat16)
    packed = jnp.ones((64, 128), jnp.bfloat16)

    def run(w, config=0, swizzle=1, raster=0, splits=1):
        attrs = dict(config=np.int64(config), swizzle=np.int64(swizzle), raster=np.int64(raster),
                     splits=np.int64(splits))
        return jax.block_until_ready(jax.jit(lambda x, w: call(x, w, **attrs))(x, w))

    run(packed)  # well-formed: runs
    with pytest.raises(Exception, match="inconsistent shapes"):
        run(jnp.ones((32, 128), jnp.bfloat16))  # K mismatch
    with pytest.raises(Exception, match="unknown interleaved kernel config"):
        run(packed, config=99)
    with pytest.raises(Exception, match="swizzle must be"):
        run(packed, swizzle=3)
    with pytest.raises(Exception, match="splits must be in"):
        run(packed, splits=0)
    with pytest.raises(Exception, match="has no split-K"):
        run(packed, config=0, splits=2)


def test_stream_k_workspace_is_checked():
    """A stream-K launch given no (or too little) scratch fails with the size it needs."""
    stream_k = [c.id for c in jax_swiglu.kernel_configs()["interleaved"].values()
                if c.scheduler == "stream-k"]
    assert stream_k, "no stream-K config compiled"
    m, k, n = 5, 1536, 8960  # 140 output tiles: the split spreads them over every SM
    needed = jax_swiglu._native.workspace_bytes(
        "interleaved", "bfloat16", stream_k[0], m=m, n=n, n_packed=n, k=k, swizzle=1, raster=0,
        activation="silu")
    assert needed > 0
    target = selection.choose(m, n, k, jnp.bfloat16, kernel="interleaved").target
    x = jnp.ones((m, k), jnp.bfloat16)
    packed = jnp.ones((k, 2 * n), jnp.bfloat16)
    attrs = dict(config=np.int64(stream_k[0]), swizzle=np.int64(1), raster=np.int64(0),
                 splits=np.int64(1))
    out = jax.ShapeDtypeStruct((m, n), jnp.bfloat16)
    for results in ([out], [out, jax.ShapeDtypeStruct((needed // 2,), jnp.uint8)]):
        call = jax.ffi.ffi_call(target, results)
        with pytest.raises(Exception, match=f"needs {needed} bytes of workspace"):
            jax.block_until_ready(jax.jit(lambda x, w: call(x, w, **attrs))(x, packed))
    call = jax.ffi.ffi_call(target, [out, jax.ShapeDtypeStruct((needed,), jnp.uint8)])
    y, _ = jax.jit(lambda x, w: call(x, w, **attrs))(x, packed)
    # x and the weights all ones: every gate and up value is k, so y = SiLU(k) * k = k^2.
    np.testing.assert_allclose(np.asarray(y, np.float32), np.float32(k) ** 2, rtol=1e-2)


# --- the decode (swap-AB) configs ------------------------------------------------------------

def _swap_ab_configs():
    return [c.id for c in jax_swiglu.kernel_configs().get("interleaved", {}).values()
            if c.m_side == "weights"]


def _forced(monkeypatch, config, splits=1):
    monkeypatch.setenv(selection.CONFIG_ENV_VAR, f"{config},splits={splits}")
    jax.clear_caches()  # the variable is read at lowering


DECODE_M = [1, 2, 3, 7, 15, 17, 33, 63, 65, 200]


@pytest.mark.parametrize("config", _swap_ab_configs())
@pytest.mark.parametrize("splits", [1, 2, 4])
@pytest.mark.parametrize("m", DECODE_M)
def test_swap_ab_configs(config, splits, m, key, monkeypatch, request, activation):
    """Weights on the wgmma M side, gate and up paired through shared memory, the K
    reduction split across CTAs (stream-K, or split-K 2 and 4) and summed in fixed order:
    every element written and within the criterion, on a shape whose packed columns make a
    ragged last wave (K = 2560, N = 9728: 152 tiles of 128 packed columns)."""
    request.addfinalizer(jax.clear_caches)
    _forced(monkeypatch, config, splits)
    check_kernel("interleaved", m, 2560, 9728, key, activation=activation)


@pytest.mark.parametrize("config", _swap_ab_configs())
@pytest.mark.parametrize("m, k, n", [(1, 64, 8), (5, 136, 200), (40, 4104, 1000), (64, 8192, 96)])
def test_swap_ab_odd_shapes(config, m, k, n, key, monkeypatch, request, activation):
    """N below one tile and not a multiple of the gate/up block, K not a multiple of the
    k-tile, more K-tiles than tiles (every tile split)."""
    request.addfinalizer(jax.clear_caches)
    _forced(monkeypatch, config)
    check_kernel("interleaved", m, k, n, key, activation=activation)


@pytest.mark.parametrize("config", _swap_ab_configs())
@pytest.mark.parametrize("splits", [1, 4])
def test_swap_ab_bitwise_deterministic(config, splits, key, monkeypatch, request, activation):
    """The split reduction adds partial sums in a fixed order: 100 calls give the same bits,
    and so does a recompiled program."""
    request.addfinalizer(jax.clear_caches)
    m, k, n = 33, 4096, 11008
    x, _, _, packed_data = _inputs(key, m, k, n, jnp.dtype(jnp.bfloat16))
    packed = jax_swiglu.PackedWeights(packed_data, n)
    _forced(monkeypatch, config, splits)
    call = jax.jit(lambda x, p: swiglu(x, p, activation=activation))
    first = np.asarray(call(x, packed)).view(np.uint16)
    for _ in range(100):
        np.testing.assert_array_equal(np.asarray(call(x, packed)).view(np.uint16), first)
    jax.clear_caches()
    again = jax.jit(lambda x, p: swiglu(x, p, activation=activation))
    np.testing.assert_array_equal(np.asarray(again(x, packed)).view(np.uint16), first)
