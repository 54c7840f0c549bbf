"""The tokens-on-M form's special cases, on an SM90 GPU: tiles past the edge of M, the split
last round and the banded tile order (each bitwise its plain twin), the activation over the
whole float range, and the handler's own checks (bad calls, the stream-K workspace)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_swiglu
from jax_swiglu import Launch, _native, pack_weights
from jax_swiglu.selection import _model

from criterion import check, fused, inputs, rows


def _tokens_rows():
    """The 16-bit interleaved rows with tokens on M that run any M."""
    return [r.id for r in rows(family="interleaved", operands="16bit", m_side="tokens",
                               m_multiple=1)]


@pytest.mark.parametrize("config", _tokens_rows())
@pytest.mark.parametrize("m", [200, 1920, 1921])
def test_edge_tiles(config, m, key):
    """Tiles past the edge, whose loads move inside (ffi/kernels/mainloop/edge_tiles.cuh):
    M = 1921 leaves 1 row in the last 128-row tile and 129 in the last 256-row one; 1920 makes
    15 rows of 128-row tiles, which 2x1 clusters pad with a tile wholly outside; 200 is below
    one 256-row tile and 2x1 clusters pad it too. N = 11008 makes 115 tiles of 192 packed
    columns, an odd count that 1x2 clusters pad."""
    check(m, 512, 11008, key, launch=Launch(config))


def _twins(variant):
    """(row, its twin) for each row that `variant` picks: the twin is the plain persistent
    row with the same tiles, cluster and store (no split tail, no bands of M)."""
    shape = lambda c: (c.schedule, c.tile_m, c.tile_n, c.tile_k, c.cluster_m, c.cluster_n,  # noqa: E731
                       c.store, c.operands)
    interleaved = rows(family="interleaved")
    return [(c.id, t.id) for c in interleaved if variant(c) for t in interleaved
            if t.scheduler == "persistent" and t.m_bands == 1 and shape(t) == shape(c)]


def _assert_bitwise_twins(config, twin, m, k, n, key):
    x, weights = inputs(key, m, k, n, jnp.dtype(jnp.bfloat16))
    outputs = [np.asarray(check(m, k, n, key, launch=Launch(c), x=x, weights=weights))
               for c in (config, twin)]
    np.testing.assert_array_equal(outputs[0].view(np.uint16), outputs[1].view(np.uint16))


@pytest.mark.parametrize("config, twin", _twins(lambda c: c.scheduler == "split-tail"))
@pytest.mark.parametrize("m, k, n, halves", [
    # Clusters running a half tile on 132 SMs, for 2x1 and 1x2 clusters of 128x128 tiles:
    (2048, 896, 4864, (28, 28)),  # 0.5B: 1216 tiles, 9 rounds of 132, 28 tiles in 56 halves
    (1921, 896, 4864, (28, 28)),  # the same tiles; the last row moved inside (1 own row)
    (1800, 896, 4864, (28, 0)),   # 15 rows of tiles (+ a padding row, wholly outside, in 2x1)
    (1100, 512, 1024, (28, 12)),  # 9 rows (76 own rows in the last), 2 rounds
    (200, 512, 4096, (0, 0)),     # 128 tiles, one round: nothing to split
])
def test_split_tail(config, twin, m, k, n, halves, key):
    """The split last round (ffi/kernels/schedulers/split_tail.cuh): each half runs the whole
    K, so the output is bitwise that of the unsplit twin row, and every element is written."""
    row = jax_swiglu.kernel_configs()[config]
    sms = getattr(jax.devices()[0], "core_count", 0)
    expected = {(2, 1): halves[0], (1, 2): halves[1]}.get((row.cluster_m, row.cluster_n))
    if sms == 132 and expected is not None:  # the counts above are an H200's
        assert _model.split_tail_clusters(row, _model.Problem(m, n, k), sms) == expected
    _assert_bitwise_twins(config, twin, m, k, n, key)


@pytest.mark.parametrize("config, twin", _twins(lambda c: c.m_bands > 1))
@pytest.mark.parametrize("k, n", [(2048, 11008), (512, 1000)])  # 115 and 11 columns of tiles
def test_m_bands(config, twin, k, n, key):
    """A tile order in bands of M (ffi/kernels/schedulers/m_bands.cuh) changes which CTA
    computes a tile and when, not how: the output is bitwise its twin's, every element
    written, at M = one and two multiples of its bands; other M are refused."""
    multiple = jax_swiglu.kernel_configs()[config].m_multiple
    for m in (multiple, 2 * multiple):
        _assert_bitwise_twins(config, twin, m, k, n, key)
    with pytest.raises(ValueError, match="bands"):
        check(multiple + 128, k, n, key, launch=Launch(config))


@pytest.mark.parametrize("config", [None] + _tokens_rows())
@pytest.mark.parametrize("activation", list(jax_swiglu.ACTIVATIONS))
def test_activation_over_the_whole_float_range(config, activation):
    """The activation as the kernels compute it (MUFU exp; the sigmoid's reciprocal Newton's on
    even output columns and MUFU's on odd ones, or MUFU's on all in the pingpong schedule)
    against the exact one, for gates from -inf to inf: x = e_0 makes every row's gate and up
    the first weight row. Each special value sits on both parities. With ``config``, that row
    is forced (else the selection's). The exact values are float64 numpy: fp32's 1 + tanh(z)
    in jax.nn.gelu cancels for gates below about -5, the sigmoid form does not."""
    m, k, n = 128, 64, 1024
    specials = np.repeat([-np.inf, np.inf, np.nan, -1e30, -120.0, -88.5, -87.0, -0.0, 0.0, 1e-30,
                          1e30], 2)
    gates = np.concatenate([specials, np.linspace(-100, 100, n - len(specials))])
    ups = np.where(np.arange(n) % 2 == 0, 1.0, -3.0)
    w_gate = jnp.zeros((k, n), jnp.bfloat16).at[0].set(jnp.asarray(gates, jnp.bfloat16))
    w_up = jnp.zeros((k, n), jnp.bfloat16).at[0].set(jnp.asarray(ups, jnp.bfloat16))
    x = jnp.zeros((m, k), jnp.bfloat16).at[:, 0].set(1)
    launch = None if config is None else Launch(config)
    y = np.asarray(fused(launch, "auto", activation)(jnp.full((m, n), jnp.nan, jnp.bfloat16), x,
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


@pytest.mark.parametrize("kernel", ["interleaved", "gate_then_up"])
def test_output_is_written_in_place(kernel, key):
    """The poisoning works: the donated NaN buffer is the custom call's output buffer."""
    x, packed = inputs(key, 100, 256, 512, jnp.dtype(jnp.bfloat16))
    args = (jnp.full((100, 512), jnp.nan, jnp.bfloat16), x, packed)
    compiled = fused(None, kernel).lower(*args).compile().as_text()
    assert "input_output_alias={ {}: (0, {}, " in compiled, compiled[:400]
    entry = compiled[compiled.index("ENTRY"):]
    root = [line for line in entry.splitlines() if line.strip().startswith("ROOT")][0]
    assert "custom-call" in root and "jax_swiglu_" in root, root
    # ... and the kernel overwrites all of it.
    assert not bool(jnp.isnan(fused(None, kernel)(*args)).any())


def test_bad_calls_come_back_as_python_errors():
    """A malformed call reaching the handler is an error value, not a crash."""
    row = rows(family="interleaved", operands="16bit", scheduler="persistent")[0]
    target = Launch(row.id).target("silu", "bfloat16")
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((8, 64), jnp.bfloat16))
    x = jnp.ones((8, 64), jnp.bfloat16)
    packed = jnp.ones((64, 128), jnp.bfloat16)

    def run(w, config=row.id, swizzle=1, raster=0, splits=1):
        attrs = dict(config=np.int64(config), swizzle=np.int64(swizzle), raster=np.int64(raster),
                     splits=np.int64(splits))
        return jax.block_until_ready(jax.jit(lambda x, w: call(x, w, **attrs))(x, w))

    run(packed)  # well-formed: runs
    with pytest.raises(Exception, match="inconsistent shapes"):
        run(jnp.ones((32, 128), jnp.bfloat16))  # K mismatch
    with pytest.raises(Exception, match="unknown kernel config 999"):
        run(packed, config=999)
    gemv = rows(family="gemv")[0].id
    with pytest.raises(Exception, match="is not a row of this target's kernel"):
        run(packed, config=gemv)
    with pytest.raises(Exception, match="swizzle must be"):
        run(packed, swizzle=3)
    with pytest.raises(Exception, match="has no split-K"):
        run(packed, splits=2)


def test_stream_k_workspace_is_checked():
    """A stream-K launch given no (or too little) scratch fails with the size it needs."""
    [stream_k] = rows(family="interleaved", operands="16bit", m_side="weights", tile_m=16,
                      tile_n=128)
    m, k, n = 5, 1536, 8960  # 140 output tiles: the split spreads them over every SM
    needed = _native.workspace_bytes(stream_k.id, "bfloat16", m=m, n=n, k=k)
    assert needed > 0
    target = Launch(stream_k.id).target("silu", "bfloat16")
    x = jnp.ones((m, k), jnp.bfloat16)
    packed = jnp.ones((k, 2 * n), jnp.bfloat16)
    attrs = dict(config=np.int64(stream_k.id), swizzle=np.int64(1), raster=np.int64(0),
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
