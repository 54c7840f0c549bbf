"""Lowering for CUDA on any machine: the custom call, its target name and the kernel choice.

``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`` needs no GPU, so these run on
CI. They need the compiled extension (which defines the targets).
"""

import re

import jax
import jax.numpy as jnp
import pytest

import jax_swiglu
from jax_swiglu import pack_weights, selection, swiglu

from helpers import random_weights, requires_kernels

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
    """The custom calls, [(target, config)], the selection picks for M, bf16 ([] for the XLA
    path)."""
    choice = selection.choose(m, n, 64, jnp.bfloat16, kernel=kernel)
    return [] if choice.kernel == "xla" else [(choice.target, choice.config.id)]


@pytest.mark.parametrize("m", [1, 7, 64, 65, 128, 300, 1000, 8192])
def test_custom_call_follows_the_selection(m):
    hlo = cuda_hlo(swiglu, _x(m), _packed())
    assert custom_calls(hlo) == _expected(m)
    assert ("jax_swiglu_" in hlo) == bool(_expected(m))


@pytest.mark.parametrize("m", [1, 16, 128, 512, 4096, 8192])
@pytest.mark.parametrize("n", [4864, 11008, 18944, 29568])
def test_lowering_carries_the_chosen_launch(m, n):
    packed = pack_weights(*random_weights(jax.random.key(0), 64, n))
    choice = selection.choose(m, n, 64, jnp.bfloat16)
    hlo = cuda_hlo(swiglu, _x(m), packed)
    if choice.kernel == "xla":
        assert custom_calls(hlo) == [] and "stablehlo.dot_general" in hlo
    else:
        assert custom_calls(hlo) == [(choice.target, choice.config.id)]
        assert f"splits = {choice.splits} : i64" in hlo
        assert f"swizzle = {choice.swizzle} : i64" in hlo


@pytest.mark.parametrize("dtype, suffix", [(jnp.bfloat16, "bf16"), (jnp.float16, "f16")])
def test_every_kernel_can_be_forced(dtype, suffix):
    compiled = jax_swiglu.kernel_configs()
    for kernel in jax_swiglu.KERNELS:
        if kernel == "xla":
            continue
        fn = lambda x, p: swiglu(x, p, kernel=kernel)  # noqa: E731
        m = 4 if kernel == "gemv" else 4096  # the gemv kernel runs a few tokens
        if kernel not in compiled:  # an optional family this build left out: a clear error
            with pytest.raises(RuntimeError, match="JAX_SWIGLU_ALL_CONFIGS=ON"):
                cuda_hlo(fn, _x(m, dtype=dtype), _packed(dtype=dtype))
            continue
        hlo = cuda_hlo(fn, _x(m, dtype=dtype), _packed(dtype=dtype))
        assert [t for t, _ in custom_calls(hlo)] == [f"jax_swiglu_{kernel}_silu_{suffix}"]


def test_float16_target():
    hlo = cuda_hlo(swiglu, _x(256, dtype=jnp.float16), _packed(dtype=jnp.float16))
    assert [t for t, _ in custom_calls(hlo)] == ["jax_swiglu_interleaved_silu_f16"]


def _set_kernel_env(monkeypatch, value):
    # The variable is read when a function is lowered; JAX caches lowerings, so a change
    # takes effect for functions lowered afterwards (or after jax.clear_caches()).
    monkeypatch.setenv(selection.ENV_VAR, value)
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
    assert forced and forced[0][0] == "jax_swiglu_interleaved_silu_bf16"
    hlo = cuda_hlo(lambda x, p: swiglu(x, p, kernel="interleaved"), _x(16), _packed())
    assert custom_calls(hlo) == forced
    _set_kernel_env(monkeypatch, "interleaved")
    assert custom_calls(cuda_hlo(swiglu, _x(16), _packed())) == forced
    _set_kernel_env(monkeypatch, "nonsense")
    with pytest.raises(ValueError, match=selection.ENV_VAR):
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


def test_explain_names_the_kernel_tiles_and_source():
    text = jax_swiglu.explain(_x(4096), _packed(), platform="cuda")
    [(target, config)] = _expected(4096)
    assert target in text
    assert jax_swiglu.kernel_configs()["interleaved"][config].describe() in text
    assert any(source in text for source in ("tuning data", "heuristic", "autotune cache"))


def test_config_table_is_exposed():
    configs = jax_swiglu.kernel_configs()["interleaved"]
    assert set(configs) <= set(range(len(configs) + 8))  # ids of rows; optional rows may be absent
    assert len({c.key for c in configs.values()}) == len(configs)  # keys name configs uniquely
    for config in configs.values():
        assert config.tile_n % (2 * jax_swiglu.GATE_UP_BLOCK) == 0
        assert config.m_side in ("tokens", "weights")
        if config.m_side == "weights":  # swap-AB: decode tiles of 8..64 tokens, stream-K
            assert config.tile_m <= 64 and config.scheduler == "stream-k"
            assert "swap-AB" in config.describe()


def test_forced_launch_knob(monkeypatch):
    packed = _packed()
    monkeypatch.setenv(selection.CONFIG_ENV_VAR, "3,swizzle=4,raster=m")
    jax.clear_caches()
    hlo = cuda_hlo(swiglu, _x(4096), packed)
    assert custom_calls(hlo) == [("jax_swiglu_interleaved_silu_bf16", 3)]
    assert re.search(r"raster = 1 : i64", hlo) and re.search(r"swizzle = 4 : i64", hlo)
    stream_k = [c.id for c in jax_swiglu.kernel_configs()["interleaved"].values()
                if c.splits_k]
    monkeypatch.setenv(selection.CONFIG_ENV_VAR, f"{stream_k[0]},splits=4")
    jax.clear_caches()
    assert re.search(r"splits = 4 : i64", cuda_hlo(swiglu, _x(64), packed))
    for bad in ("99", "x", "0,swizzle=3", "0,raster=diagonal", "0,tiles=2", "0,splits=2",
                f"{stream_k[0]},splits=0", f"{stream_k[0]},splits=17"):
        monkeypatch.setenv(selection.CONFIG_ENV_VAR, bad)
        jax.clear_caches()
        with pytest.raises(ValueError, match=selection.CONFIG_ENV_VAR):
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
        monkeypatch.setenv(selection.CONFIG_ENV_VAR, f"{config.id},swizzle=1")
        jax.clear_caches()
        assert custom_calls(cuda_hlo(swiglu, _x(4096), _packed())) == [
            ("jax_swiglu_interleaved_silu_bf16", config.id)]
        monkeypatch.setenv(selection.CONFIG_ENV_VAR, f"{config.id},swizzle=2")
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
        monkeypatch.setenv(selection.CONFIG_ENV_VAR, str(config.id))
        jax.clear_caches()
        assert custom_calls(cuda_hlo(swiglu, _x(2 * config.m_multiple), _packed())) == [
            ("jax_swiglu_interleaved_silu_bf16", config.id)]
        jax.clear_caches()
        with pytest.raises(ValueError, match=f"multiple of {config.m_multiple}"):
            cuda_hlo(swiglu, _x(config.m_multiple + 128), _packed())
    jax.clear_caches()


def test_output_store_paths_are_reported():
    """Each compiled config names its output path; every interleaved config but stream-K
    stores from registers, and the pingpong kernel through the TMA store."""
    configs = jax_swiglu.kernel_configs()
    for kernel, table in configs.items():
        for config in table.values():
            assert config.store in ("tma", "direct")
            assert ("direct store" in config.describe()) == (config.store == "direct")
    tma = [c.id for c in configs["interleaved"].values() if c.store == "tma"]
    assert tma == ([5] if 5 in configs["interleaved"] else [])  # config 5 is optional
    if tma:
        assert configs["interleaved"][5].scheduler == "stream-k"
    if "pingpong" in configs:  # an optional config
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
            env.setenv(selection.CONFIG_ENV_VAR, str(config))
            hlo = cuda_hlo(lambda x, p: swiglu(x, p, kernel="interleaved"), x, packed)
        [call] = [line for line in hlo.splitlines() if "stablehlo.custom_call" in line]
        results = call.rsplit("->", 1)[1]
        needed = jax_swiglu._native.workspace_bytes(
            "interleaved", "bfloat16", config, m=128, n=n, n_packed=n, k=k, swizzle=1, raster=0)
        assert (needed > 0) == (config in stream_k)  # 1120 and 140 tiles: a ragged last wave
        if config in stream_k:
            assert re.search(rf"\(tensor<128x8960xbf16>, tensor<{needed}xui8>\)", results), call
        else:
            assert results.strip() == "tensor<128x8960xbf16>", call


def test_workspace_size_bounds():
    """The stream-K workspace is sized for the local GPU or, with none, for every SM count
    (the split depends on it); M = 0 needs none; a dimension past int32 is a Python error."""
    from jax_swiglu import _native
    stream_k = [c.id for c in jax_swiglu.kernel_configs()["interleaved"].values()
                if c.scheduler == "stream-k"][0]
    shape = dict(n=18944, n_packed=18944, k=3584, swizzle=1, raster=0, splits=1)

    def for_sm_count(sms):
        return _native._kernels.workspace_bytes("interleaved", "silu", "bfloat16", stream_k,
                                                128, *shape.values(), sms)
    size = _native.workspace_bytes("interleaved", "bfloat16", stream_k, m=128, **shape)
    local = _native._kernels.device_sm_count()
    if local:  # a GPU here: sized for it
        assert size == for_sm_count(local) > 0
    else:
        assert size >= max(for_sm_count(sms) for sms in (66, 114, 132)) > 0
    assert _native.workspace_bytes("interleaved", "bfloat16", stream_k, m=0, **shape) == 0
    with pytest.raises(ValueError, match="exceeds 2\\^31 - 1"):
        _native.workspace_bytes("interleaved", "bfloat16", stream_k, m=2**31, **shape)


@pytest.mark.parametrize("activation", list(jax_swiglu.ACTIVATIONS))
@pytest.mark.parametrize("m", [1, 64, 300, 4096])
def test_activation_picks_its_target_and_the_same_launch(activation, m):
    """The activation picks the custom call's target (its name says which) and leaves the
    launch the selection chose alone; explain() names it."""
    packed = _packed(n=4864)
    hlo = cuda_hlo(lambda x, p: swiglu(x, p, activation=activation), _x(m), packed)
    silu = selection.choose(m, 4864, 64, jnp.bfloat16)
    choice = selection.choose(m, 4864, 64, jnp.bfloat16, activation=activation)
    assert (choice.config, choice.splits, choice.swizzle) == (silu.config, silu.splits,
                                                              silu.swizzle)
    if choice.kernel == "xla":
        assert custom_calls(hlo) == []
    else:
        assert custom_calls(hlo) == [(f"jax_swiglu_{choice.kernel}_{activation}_bf16",
                                      choice.config.id)]
    explained = jax_swiglu.explain(_x(m), packed, activation=activation, platform="cuda")
    assert f" {activation} on cuda: " in explained


def test_every_activation_is_compiled_and_has_targets():
    assert jax_swiglu._native.activations() == tuple(jax_swiglu.ACTIVATIONS)
    targets = jax_swiglu._native.targets()
    for activation in jax_swiglu.ACTIVATIONS:
        for dtype in ("bfloat16", "float16"):
            assert targets[("interleaved", activation, dtype)] == (
                f"jax_swiglu_interleaved_{activation}_{'bf16' if dtype == 'bfloat16' else 'f16'}")


def test_gemv_kernel_lowering(monkeypatch):
    """The gemv family: its rows in the table, its target in the HLO with the cluster split
    as the `splits` attribute and no workspace result; M beyond a config's tokens, or a
    split that is not a cluster size, is refused at trace time."""
    configs = jax_swiglu.kernel_configs()["gemv"]
    assert configs and all(c.schedule in ("cuda-cores", "mma-sync")
                           and c.max_m == c.tile_m <= 16 for c in configs.values())
    most = max(configs.values(), key=lambda c: c.tile_m)
    packed = _packed(k=128)  # 8 steps of either form: every cluster size
    fn = lambda x, p: swiglu(x, p, kernel="gemv")  # noqa: E731
    hlo = cuda_hlo(fn, _x(most.tile_m, k=128), packed)
    assert [t for t, _ in custom_calls(hlo)] == ["jax_swiglu_gemv_silu_bf16"]
    assert "tuple<" not in hlo.split("jax_swiglu_gemv_silu_bf16")[1].split("\n")[0]
    with pytest.raises(ValueError, match="gemv"):
        cuda_hlo(fn, _x(most.tile_m + 1, k=128), packed)
    monkeypatch.setenv(selection.CONFIG_ENV_VAR, f"{most.id},splits=8")
    jax.clear_caches()
    assert re.search(r"splits = 8 : i64", cuda_hlo(fn, _x(3, k=128), packed))
    for bad in (f"{most.id},splits=3", f"{most.id},splits=16"):
        monkeypatch.setenv(selection.CONFIG_ENV_VAR, bad)
        jax.clear_caches()
        with pytest.raises(ValueError, match="cluster"):
            cuda_hlo(fn, _x(3, k=128), packed)
    smallest = min(configs.values(), key=lambda c: c.tile_m)
    monkeypatch.setenv(selection.CONFIG_ENV_VAR, str(smallest.id))
    jax.clear_caches()
    with pytest.raises(ValueError, match="at most"):
        cuda_hlo(fn, _x(smallest.tile_m + 1, k=128), packed)
