"""Lowering for CUDA on any machine: the custom call, its target name and the kernel choice.

``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`` needs no GPU, so these run on
CI. They need the compiled extension (which defines the targets).
"""

import re

import jax
import jax.numpy as jnp
import pytest

import jax_swiglu
from jax_swiglu import _selection, pack_weights, swiglu

from conftest import random_weights, requires_kernels

pytestmark = requires_kernels


def cuda_hlo(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def custom_calls(hlo: str):
    """[(target, config)] of every jax_swiglu custom call in the StableHLO text."""
    calls = re.findall(r"stablehlo.custom_call @(jax_swiglu_\w+)\(.*?config = (\d+)", hlo)
    return [(target, int(config)) for target, config in calls]


def _packed(k=64, n=128, dtype=jnp.bfloat16):
    return pack_weights(*random_weights(jax.random.key(0), k, n, dtype))


def _x(m, k=64, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct((m, k), dtype)


def _expected(m, kernel="auto", n=128):
    """The custom calls, [(target, config)], the selection table says for M, bf16 ([] for
    the XLA path)."""
    choice = _selection.choose(m, n, 64, jnp.bfloat16, kernel=kernel)
    return [] if choice.kernel == "xla" else [(choice.target, choice.config.id)]


@pytest.mark.parametrize("m", [1, 7, 64, 65, 128, 1000, 8192])
def test_custom_call_follows_the_selection_table(m):
    hlo = cuda_hlo(swiglu, _x(m), _packed())
    assert custom_calls(hlo) == _expected(m)
    assert ("jax_swiglu_interleaved_bf16" in hlo) == bool(_expected(m))


@pytest.mark.parametrize("m", [1, 16, 128, 512, 4096, 8192])
@pytest.mark.parametrize("n", [4864, 11008, 18944, 29568])
def test_lowering_follows_the_table_in_m_and_n(m, n):
    packed = pack_weights(*random_weights(jax.random.key(0), 64, n))
    rule = _selection._lookup(m, n)
    hlo = cuda_hlo(swiglu, _x(m), packed)
    if rule.kernel == "xla":
        assert custom_calls(hlo) == [] and "stablehlo.dot_general" in hlo
    else:
        assert custom_calls(hlo) == [(f"jax_swiglu_{rule.kernel}_bf16", rule.config)]
        assert f"swizzle = {rule.swizzle} : i64" in hlo


def test_measured_choices():
    """Spot checks of the table against the calibration runs it was derived from."""
    def pick(m, model):
        rule = _selection._lookup(m, jax_swiglu.QWEN25_MLPS[model][1])
        return rule.kernel, rule.config, rule.swizzle
    assert pick(8, "qwen2.5-72b") == ("xla", None, 1)  # decode: XLA's small-M GEMMs
    assert pick(1, "qwen2.5-0.5b") == ("interleaved", 4, 1)
    assert pick(64, "qwen2.5-7b") == ("interleaved", 4, 1)  # 64-row pingpong tiles
    assert pick(512, "qwen2.5-1.5b") == ("interleaved", 6, 1)  # pingpong 128x192 2x1
    assert pick(384, "qwen2.5-1.5b") == ("interleaved", 12, 1)  # 3 rows of tiles: 1x2 cluster
    assert pick(256, "qwen2.5-1.5b") == ("interleaved", 13, 1)  # 2 rows, 280 tiles: split tail
    assert pick(512, "qwen2.5-0.5b") == ("interleaved", 13, 1)  # 304 tiles: 2 rounds + 40
    assert pick(1024, "qwen2.5-0.5b") == ("interleaved", 1, 1)  # 608 tiles: the tail of 80 stays
    assert pick(512, "qwen2.5-3b") == ("interleaved", 11, 1)  # 128x192, 4x1 cluster
    assert pick(448, "qwen2.5-3b") == ("interleaved", 11, 1)
    assert pick(384, "qwen2.5-3b") == ("interleaved", 12, 1)
    assert pick(1920, "qwen2.5-0.5b") == ("interleaved", 12, 1)  # 15 rows of 128-row tiles
    assert pick(1664, "qwen2.5-3b") == ("interleaved", 12, 1)  # before config 6's 3B row
    assert pick(1921, "qwen2.5-0.5b") == ("interleaved", 14, 1)  # 16 rows: 9 rounds + 28 tiles
    assert pick(2048, "qwen2.5-0.5b") == ("interleaved", 14, 1)
    assert pick(385, "qwen2.5-14b") == ("interleaved", 1, 1)  # 4 rows
    assert pick(512, "qwen2.5-7b") == ("interleaved", 1, 1)  # pingpong 128x128 2x1
    assert pick(128, "qwen2.5-1.5b") == ("interleaved", 9, 1)  # cooperative 128x192 1x1
    assert pick(128, "qwen2.5-3b") == ("interleaved", 9, 1)
    assert pick(128, "qwen2.5-14b") == ("interleaved", 2, 1)
    assert pick(512, "qwen2.5-32b") == ("interleaved", 0, 1)
    assert pick(2048, "qwen2.5-3b") == ("interleaved", 6, 1)  # 128x192, direct store
    assert pick(1024, "qwen2.5-3b") == ("interleaved", 13, 1)  # 1376 tiles: 10 rounds + 56
    assert pick(4096, "qwen2.5-3b") == ("interleaved", 6, 1)
    assert pick(2048, "qwen2.5-1.5b") == ("interleaved", 1, 1)
    assert pick(8192, "qwen2.5-0.5b") == ("interleaved", 6, 1)  # pingpong 128x192 2x1
    assert pick(8192, "qwen2.5-1.5b") == ("interleaved", 15, 1)  # config 6 in 2 bands of M
    assert pick(8192, "qwen2.5-3b") == ("interleaved", 15, 1)
    assert pick(8704, "qwen2.5-3b") == ("interleaved", 15, 1)  # 17 x 512
    assert pick(8200, "qwen2.5-3b") == ("interleaved", 7, 1)  # no whole bands: cooperative 256x192
    assert pick(8192, "qwen2.5-7b") == ("interleaved", 17, 1)  # config 7 in 4 bands of M
    assert pick(8192, "qwen2.5-14b") == ("interleaved", 17, 1)
    assert pick(9216, "qwen2.5-7b") == ("interleaved", 10, 1)  # not a multiple of 2048
    assert pick(16, "qwen2.5-7b") == ("xla", None, 1)
    assert pick(128, "qwen2.5-7b") == ("interleaved", 8, 1)  # 128x320: one wave of tiles
    assert pick(128, "qwen2.5-72b") == ("interleaved", 2, 1)
    assert pick(2048, "qwen2.5-72b") == ("interleaved", 10, 1)  # 256x192, 1x2 cluster
    assert pick(4096, "qwen2.5-72b") == ("interleaved", 10, 1)
    assert pick(8192, "qwen2.5-72b") == ("interleaved", 7, 1)  # where the 1x2 cluster lost
    assert pick(8192, "qwen2.5-32b") == ("interleaved", 10, 1)
    assert pick(2048, "qwen2.5-7b") == ("interleaved", 10, 1)
    assert pick(16384, "qwen2.5-72b") == ("interleaved", 7, 1)
    # No row picks the pingpong kernel: it lost everywhere it was measured.
    assert all(rule.kernel != "pingpong" for rule in _selection.SELECTION_TABLE)


def test_table_rows_are_reachable():
    """Every row of the table is the choice for some Qwen2.5 shape at some M."""
    used = {
        _selection._lookup(m, n)
        for m in (1, 8, 32, 128, 384, 512, 1024, 1920, 2048, 8192, 8200, 16384)
        for _, n in jax_swiglu.QWEN25_MLPS.values()
    }
    assert used == set(_selection.SELECTION_TABLE)


@pytest.mark.parametrize("dtype, suffix", [(jnp.bfloat16, "bf16"), (jnp.float16, "f16")])
def test_every_kernel_can_be_forced(dtype, suffix):
    for kernel in jax_swiglu.KERNELS:
        if kernel == "xla":
            continue
        hlo = cuda_hlo(lambda x, p: swiglu(x, p, kernel=kernel), _x(4096, dtype=dtype),
                       _packed(dtype=dtype))
        assert [t for t, _ in custom_calls(hlo)] == [f"jax_swiglu_{kernel}_{suffix}"]


def test_float16_target():
    hlo = cuda_hlo(swiglu, _x(256, dtype=jnp.float16), _packed(dtype=jnp.float16))
    assert [t for t, _ in custom_calls(hlo)] == ["jax_swiglu_interleaved_f16"]


def _set_kernel_env(monkeypatch, value):
    # The variable is read when a function is lowered; JAX caches lowerings, so a change
    # takes effect for functions lowered afterwards (or after jax.clear_caches()).
    monkeypatch.setenv(_selection.ENV_VAR, value)
    jax.clear_caches()


def test_forced_xla_has_no_custom_call(monkeypatch):
    hlo = cuda_hlo(lambda x, p: swiglu(x, p, kernel="xla"), _x(32), _packed())
    assert custom_calls(hlo) == [] and "stablehlo.dot_general" in hlo
    _set_kernel_env(monkeypatch, "xla")
    assert custom_calls(cuda_hlo(swiglu, _x(32), _packed())) == []
    # The argument wins over the environment.
    hlo = cuda_hlo(lambda x, p: swiglu(x, p, kernel="interleaved"), _x(32), _packed())
    assert custom_calls(hlo) == _expected(32, "interleaved")


def test_forced_kernel_by_argument_and_environment(monkeypatch):
    forced = _expected(16, "interleaved")
    assert forced and _expected(16) == []  # the table alone picks XLA at M = 16
    hlo = cuda_hlo(lambda x, p: swiglu(x, p, kernel="interleaved"), _x(16), _packed())
    assert custom_calls(hlo) == forced
    _set_kernel_env(monkeypatch, "interleaved")
    assert custom_calls(cuda_hlo(swiglu, _x(16), _packed())) == forced
    _set_kernel_env(monkeypatch, "nonsense")
    with pytest.raises(ValueError, match=_selection.ENV_VAR):
        cuda_hlo(swiglu, _x(16), _packed())


def test_vmap_lowers_to_one_call_on_folded_m():
    packed = _packed()
    fn = jax.vmap(swiglu, in_axes=(0, None))
    hlo = cuda_hlo(fn, jax.ShapeDtypeStruct((8, 512, 64), jnp.bfloat16), packed)
    assert custom_calls(hlo) == _expected(8 * 512)
    assert "tensor<4096x64xbf16>" in hlo


def test_fused_mlp_lowers_to_custom_call_and_dot():
    packed = _packed()
    w_down = jax.ShapeDtypeStruct((128, 64), jnp.bfloat16)
    hlo = cuda_hlo(jax_swiglu.fused_mlp, _x(256), packed, w_down)
    assert custom_calls(hlo) == _expected(256)
    assert "stablehlo.dot_general" in hlo


def test_cpu_lowering_is_the_reference():
    hlo = jax.jit(swiglu).trace(_x(32), _packed()).lower(lowering_platforms=("cpu",)).as_text()
    assert custom_calls(hlo) == [] and "stablehlo.dot_general" in hlo


def test_explain_names_the_kernel_and_tiles():
    text = jax_swiglu.explain(_x(4096), _packed(), platform="cuda")
    [(target, config)] = _expected(4096)
    assert target in text
    assert jax_swiglu.kernel_configs()["interleaved"][config].describe() in text


def test_config_table_is_exposed():
    configs = jax_swiglu.kernel_configs()["interleaved"]
    assert set(configs) == set(range(len(configs)))
    for config in configs.values():
        assert config.tile_n % (2 * jax_swiglu.GATE_UP_BLOCK) == 0
    for rule in _selection.SELECTION_TABLE:
        if rule.kernel != "xla":
            assert rule.config in jax_swiglu.kernel_configs()[rule.kernel]


def test_forced_launch_knob(monkeypatch):
    packed = _packed()
    monkeypatch.setenv(_selection.CONFIG_ENV_VAR, "3,swizzle=4,raster=m")
    jax.clear_caches()
    hlo = cuda_hlo(swiglu, _x(4096), packed)
    assert custom_calls(hlo) == [("jax_swiglu_interleaved_bf16", 3)]
    assert re.search(r"raster = 1 : i64", hlo) and re.search(r"swizzle = 4 : i64", hlo)
    for bad in ("99", "x", "0,swizzle=3", "0,raster=diagonal", "0,tiles=2"):
        monkeypatch.setenv(_selection.CONFIG_ENV_VAR, bad)
        jax.clear_caches()
        with pytest.raises(ValueError, match=_selection.CONFIG_ENV_VAR):
            cuda_hlo(swiglu, _x(4096), packed)


def test_split_tail_configs_take_no_swizzle(monkeypatch):
    """A config that splits its last round (ffi/kernels/split_tail.cuh) is a pingpong 128-row
    config with the direct store, says so, and refuses a swizzle at trace time."""
    configs = jax_swiglu.kernel_configs()["interleaved"]
    split = [c for c in configs.values() if c.scheduler == "split-tail"]
    assert split, "no split-tail config compiled"
    for config in split:
        assert (config.schedule, config.tile_m, config.store) == ("pingpong", 128, "direct")
        assert "split tail" in config.describe()
        monkeypatch.setenv(_selection.CONFIG_ENV_VAR, f"{config.id},swizzle=1")
        jax.clear_caches()
        assert custom_calls(cuda_hlo(swiglu, _x(4096), _packed())) == [
            ("jax_swiglu_interleaved_bf16", config.id)]
        monkeypatch.setenv(_selection.CONFIG_ENV_VAR, f"{config.id},swizzle=2")
        jax.clear_caches()
        with pytest.raises(ValueError, match="takes no swizzle"):
            cuda_hlo(swiglu, _x(4096), _packed())
    jax.clear_caches()


def test_m_bands_configs_need_whole_bands(monkeypatch):
    """A config that runs M in bands (ffi/kernels/m_bands.cuh) says so, lowers where M is a
    multiple of its bands of whole clusters of tiles, and refuses other M at trace time."""
    configs = jax_swiglu.kernel_configs()["interleaved"]
    banded = [c for c in configs.values() if c.m_bands > 1]
    assert banded, "no config with M in bands compiled"
    for config in banded:
        assert config.scheduler == "persistent" and config.cluster_n == 1
        assert f"M in {config.m_bands} bands" in config.describe()
        assert config.m_multiple == config.m_bands * config.tile_m * config.cluster_m
        monkeypatch.setenv(_selection.CONFIG_ENV_VAR, str(config.id))
        jax.clear_caches()
        assert custom_calls(cuda_hlo(swiglu, _x(2 * config.m_multiple), _packed())) == [
            ("jax_swiglu_interleaved_bf16", config.id)]
        jax.clear_caches()
        with pytest.raises(ValueError, match=f"multiple of {config.m_multiple}"):
            cuda_hlo(swiglu, _x(config.m_multiple + 128), _packed())
    jax.clear_caches()


def test_split_tail_rows_apply_where_the_last_round_splits():
    """The split-tail rows (configs 13 and 14) take a shape only where the last round of
    tiles is at most half full on 132 SMs; elsewhere their twins' rows apply."""
    for rule in _selection.SELECTION_TABLE:
        if rule.last_round_splits:
            assert jax_swiglu.kernel_configs()["interleaved"][rule.config].scheduler == "split-tail"
    clusters = _selection.split_tail_clusters
    # 0.5B (N = 4864): 76 columns of 128x128 tiles; 2048 rows make 1216 tiles, 9 rounds + 28.
    assert clusters(13, 2048, 4864) == 28 and clusters(14, 2048, 4864) == 28
    assert clusters(13, 1024, 4864) == 0  # 608 tiles: a last round of 80, over half
    assert clusters(13, 512, 4864) == 40  # 304 tiles: 2 rounds + 40 tiles in 80 halves
    assert clusters(13, 100, 512) == 0    # 16 tiles (8 and a padding row): a grid of 16
    expected = {(512, 4864): 13, (1024, 4864): 1, (2048, 4864): 14, (1920, 4864): 12,
                (1024, 8960): 13, (2048, 8960): 1, (512, 18944): 1, (512, 11008): 11}
    for (m, n), config in expected.items():
        assert _selection._lookup(m, n).config == config, (m, n)


def test_output_store_paths_are_reported():
    """Each compiled config names its output path; every interleaved config but stream-K
    stores from registers, and the pingpong kernel through the TMA store."""
    configs = jax_swiglu.kernel_configs()
    for kernel, table in configs.items():
        for config in table.values():
            assert config.store in ("tma", "direct")
            assert ("direct store" in config.describe()) == (config.store == "direct")
    assert [c.id for c in configs["interleaved"].values() if c.store == "tma"] == [5]
    assert configs["interleaved"][5].scheduler == "stream-k"
    assert configs["pingpong"][0].store == "tma"


def test_stream_k_config_gets_a_workspace_result():
    """A stream-K launch lowers with a second, scratch result (uint8) that nothing reads;
    the other configs keep a single result."""
    configs = jax_swiglu.kernel_configs()["interleaved"]
    stream_k = [c.id for c in configs.values() if c.scheduler == "stream-k"]
    assert stream_k and "stream-K" in configs[stream_k[0]].describe()
    k, n = 1536, 8960
    packed = pack_weights(*random_weights(jax.random.key(0), k, n))
    x = _x(128, k)
    for config in configs:
        if 128 % configs[config].m_multiple:
            continue  # runs M in bands: test_m_bands_configs_need_whole_bands
        with pytest.MonkeyPatch.context() as env:
            env.setenv(_selection.CONFIG_ENV_VAR, str(config))
            hlo = cuda_hlo(lambda x, p: swiglu(x, p, kernel="interleaved"), x, packed)
        [call] = [line for line in hlo.splitlines() if "stablehlo.custom_call" in line]
        results = call.rsplit("->", 1)[1]
        if config in stream_k:
            assert re.search(r"\(tensor<128x8960xbf16>, tensor<\d+xui8>\)", results), call
        else:
            assert results.strip() == "tensor<128x8960xbf16>", call


def test_workspace_size_bounds():
    """The stream-K workspace is sized for the local GPU or, with none, for every SM count
    (the split depends on it); M = 0 needs none; a dimension past int32 is a Python error."""
    from jax_swiglu import _native
    [stream_k] = [c.id for c in jax_swiglu.kernel_configs()["interleaved"].values()
                  if c.scheduler == "stream-k"]
    shape = dict(n=18944, n_packed=18944, k=3584, swizzle=1, raster=0)
    def for_sm_count(sms):
        return _native._kernels.workspace_bytes("interleaved", "bfloat16", stream_k, 128,
                                                *shape.values(), sms)
    size = _native.workspace_bytes("interleaved", "bfloat16", stream_k, m=128, **shape)
    local = _native._kernels.device_sm_count()
    if local:  # a GPU here: sized for it
        assert size == for_sm_count(local) > 0
    else:
        assert size >= max(for_sm_count(sms) for sms in (66, 114, 132)) > 0
    assert _native.workspace_bytes("interleaved", "bfloat16", stream_k, m=0, **shape) == 0
    with pytest.raises(ValueError, match="exceeds 2\\^31 - 1"):
        _native.workspace_bytes("interleaved", "bfloat16", stream_k, m=2**31, **shape)
