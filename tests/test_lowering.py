"""Lowering for CUDA on any machine: the custom call, its target name and the launch it runs.

``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`` needs no GPU, so these run on
CI. They need the compiled extension (which defines the targets). A forced launch is a
parameter of the call (``launch=``), part of the traced program: nothing here clears JAX's
caches.
"""

import re

import jax
import jax.numpy as jnp
import pytest

import jax_swiglu
from jax_swiglu import _native, pack_weights, selection, swiglu

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


def _abstract_packed(k, n, dtype=jnp.bfloat16):
    w = jax.ShapeDtypeStruct((k, n), dtype)
    return jax.eval_shape(pack_weights, w, w)


def _x(m, k=64, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct((m, k), dtype)


def _rows(family=None, operands="16bit", **fields):
    """The compiled rows of a family and operands whose fields match ``fields`` (dense rows
    unless ``grouped=True`` is given)."""
    fields.setdefault("grouped", False)
    return [row for row in _native.kernel_configs().values()
            if (family is None or row.family == family) and row.operands == operands
            and all(getattr(row, name) == value for name, value in fields.items())]


def _row_id(key: str) -> int:
    [row] = [row for row in _native.kernel_configs().values() if row.key == key]
    return row.id


# Measured points of the shipped data a lowering for CUDA without a GPU here targets (the
# part that measured the most 16-bit calls, _data.any_sm90: the H100's,
# jax_swiglu/data/NVIDIA_H100_80GB_HBM3.json) and the launch measured fastest there (after
# the finalists timed through JAX), written out by hand.
MEASURED = [
    (1, 4864, 896, "gemv/tensor-cores/weights/16x128x64/1x1/cluster-split-k/direct", 1),
    (8, 14336, 4096, "gemv/tensor-cores/weights/16x256x64/1x1/cluster-split-k/direct", 1),
    (48, 18944, 3584, "interleaved/pingpong/tokens/64x128x64/1x1/persistent/direct", 1),
    (128, 4864, 896, "interleaved/cooperative/tokens/128x128x64/1x1/persistent/direct", 1),
    (128, 18944, 3584, "interleaved/cooperative/tokens/128x320x64/1x1/persistent/direct", 1),
    (512, 4864, 896, "interleaved/pingpong/tokens/128x128x64/2x1/split-tail/direct", 1),
    (2048, 18944, 3584, "interleaved/cooperative/tokens/256x192x64/1x2/persistent/direct", 1),
    (8192, 18944, 3584, "interleaved/pingpong/tokens/128x192x64/2x1/persistent/direct", 1),
]


@pytest.mark.parametrize("m, n, k, key, splits", MEASURED)
def test_lowering_runs_the_fastest_measured_launch(m, n, k, key, splits):
    hlo = cuda_hlo(lambda x, p: swiglu(x, p), _x(m, k), _abstract_packed(k, n))
    target = "jax_swiglu_gemv_silu_bf16" if key.startswith("gemv") else \
        "jax_swiglu_interleaved_silu_bf16"
    assert custom_calls(hlo) == [(target, _row_id(key))]
    assert f"splits = {splits} : i64" in hlo


@pytest.mark.parametrize("m", [1, 16, 128, 512, 4096, 8192])
@pytest.mark.parametrize("n", [4864, 11008, 18944, 29568])
def test_lowering_carries_the_chosen_launch(m, n):
    """The call emits exactly the launch the selection chose for its shapes."""
    choice = selection.choose(selection.Problem(m, n, 64, "bfloat16"))
    hlo = cuda_hlo(lambda x, p: swiglu(x, p), _x(m), _abstract_packed(64, n))
    if choice.launch is None:
        assert custom_calls(hlo) == [] and "stablehlo.dot_general" in hlo
    else:
        assert custom_calls(hlo) == [(choice.launch.target("silu", "bfloat16"),
                                      choice.launch.config)]
        assert f"splits = {choice.launch.splits} : i64" in hlo
        assert f"swizzle = {choice.launch.swizzle} : i64" in hlo


@pytest.mark.parametrize("dtype, suffix", [(jnp.bfloat16, "bf16"), (jnp.float16, "f16")])
@pytest.mark.parametrize("kernel", ["interleaved", "gate_then_up", "pingpong", "gemv"])
def test_every_kernel_value_runs_in_this_build(kernel, dtype, suffix):
    """Every public kernel= value (the alias too) runs its family, in the default build."""
    m = 4 if kernel == "gemv" else 4096  # the gemv kernel runs a few tokens
    hlo = cuda_hlo(lambda x, p: swiglu(x, p, kernel=kernel), _x(m, dtype=dtype),
                   _packed(dtype=dtype))
    family = selection.canonical_kernel(kernel)
    [(target, config)] = custom_calls(hlo)
    assert target == f"jax_swiglu_{family}_silu_{suffix}"
    assert _native.kernel_configs()[config].family == family


def test_forced_xla_has_no_custom_call(monkeypatch):
    hlo = cuda_hlo(lambda x, p: swiglu(x, p, kernel="xla"), _x(32), _packed())
    assert custom_calls(hlo) == [] and "stablehlo.dot_general" in hlo
    # The environment is read when a call is traced: a function traced after it is set.
    monkeypatch.setenv(selection.ENV_VAR, "xla")
    assert custom_calls(cuda_hlo(lambda x, p: swiglu(x, p), _x(32), _packed())) == []
    # The argument wins over the environment.
    hlo = cuda_hlo(lambda x, p: swiglu(x, p, kernel="interleaved"), _x(32), _packed())
    [(target, _)] = custom_calls(hlo)
    assert target == "jax_swiglu_interleaved_silu_bf16"
    monkeypatch.setenv(selection.ENV_VAR, "nonsense")
    with pytest.raises(ValueError, match=selection.ENV_VAR):
        cuda_hlo(lambda x, p: swiglu(x, p), _x(16), _packed())


def test_vmap_lowers_to_one_call_on_folded_m():
    fn = jax.vmap(swiglu, in_axes=(0, None))
    hlo = cuda_hlo(fn, jax.ShapeDtypeStruct((8, 512, 64), jnp.bfloat16), _packed())
    choice = selection.choose(selection.Problem(8 * 512, 128, 64, "bfloat16"))
    assert custom_calls(hlo) == [(choice.launch.target("silu", "bfloat16"),
                                  choice.launch.config)]
    assert "tensor<4096x64xbf16>" in hlo


def test_fused_mlp_lowers_to_custom_call_and_dot():
    w_down = jax.ShapeDtypeStruct((128, 64), jnp.bfloat16)
    hlo = cuda_hlo(jax_swiglu.fused_mlp, _x(256), _packed(), w_down)
    assert len(custom_calls(hlo)) == 1 and "stablehlo.dot_general" in hlo


def test_cpu_lowering_is_the_reference():
    hlo = jax.jit(swiglu).trace(_x(32), _packed()).lower(lowering_platforms=("cpu",)).as_text()
    assert custom_calls(hlo) == [] and "stablehlo.dot_general" in hlo
    # A forced launch is for CUDA: elsewhere the reference runs.
    hlo = jax.jit(lambda x, p: swiglu(x, p, launch=3)).trace(_x(32), _packed()).lower(
        lowering_platforms=("cpu",)).as_text()
    assert custom_calls(hlo) == []


def test_explain_names_the_kernel_tiles_and_source():
    text = jax_swiglu.explain(_x(4096), _packed(), platform="cuda")
    choice = selection.choose(selection.Problem(4096, 128, 64, "bfloat16"))
    assert choice.launch.target("silu", "bfloat16") in text
    assert choice.launch.row.describe() in text
    assert any(source in text for source in ("tuning data", "heuristic", "autotune cache"))


def test_config_table_is_exposed():
    configs = jax_swiglu.kernel_configs()
    assert list(configs) == sorted(configs) and all(c.compiled for c in configs.values())
    assert len({c.key for c in configs.values()}) == len(configs)  # keys name rows uniquely
    for config in configs.values():
        assert config.tile_n % (2 * jax_swiglu.GATE_UP_BLOCK) == 0 or config.is_gemv
        assert config.family in ("interleaved", "gate_then_up", "gemv")
        assert config.operands in _native.OPERANDS
        if config.m_side == "weights" and not config.is_gemv:  # swap-AB: 16..256 tokens
            assert config.tile_m % 16 == 0 and config.tile_m <= 256
            assert config.tile_m % (8 * config.cluster_n) == 0
            assert config.cluster_m in (1, 2) and config.cluster_m * config.cluster_n <= 4
            assert "swap-AB" in config.describe()


def test_a_forced_launch_is_emitted_as_given():
    packed = _packed()
    hlo = cuda_hlo(lambda x, p: swiglu(x, p, launch="3,swizzle=4,raster=m"), _x(4096), packed)
    assert custom_calls(hlo) == [("jax_swiglu_interleaved_silu_bf16", 3)]
    assert re.search(r"raster = 1 : i64", hlo) and re.search(r"swizzle = 4 : i64", hlo)
    [stream_k] = _rows("interleaved", m_side="weights", tile_m=16, tile_n=128)
    for launch in (f"interleaved:{stream_k.id},splits=4", jax_swiglu.Launch(stream_k.id, 4)):
        hlo = cuda_hlo(lambda x, p: swiglu(x, p, launch=launch), _x(64), packed)
        assert re.search(r"splits = 4 : i64", hlo)
    # A row of kernel_configs() is a launch too.
    row = jax_swiglu.kernel_configs()[3]
    assert custom_calls(cuda_hlo(lambda x, p: swiglu(x, p, launch=row), _x(64), packed)) == [
        ("jax_swiglu_interleaved_silu_bf16", 3)]


@pytest.mark.parametrize("launch, match", [
    ("999", "no config 999"),
    ("x", "not a config id"),
    ("0,swizzle=3", "swizzle must be 1, 2, 4 or 8"),
    ("0,raster=diagonal", "raster must be one of"),
    ("0,tiles=2", "unknown option"),
    ("0,splits=2", "has no split-K"),
    ("gemv:0", "a row of the interleaved kernel, not of gemv"),
])
def test_a_bad_forced_launch_is_a_trace_time_error(launch, match):
    with pytest.raises(ValueError, match=match):
        jax.jit(lambda x, p: swiglu(x, p, launch=launch)).trace(_x(64), _packed())


def test_a_forced_split_out_of_range_is_refused():
    [stream_k] = _rows("interleaved", m_side="weights", tile_m=16, tile_n=128)
    for bad in (f"{stream_k.id},splits=0", f"{stream_k.id},splits=17"):
        with pytest.raises(ValueError, match="takes splits in 1..16"):
            cuda_hlo(lambda x, p: swiglu(x, p, launch=bad), _x(4096), _packed())


def test_split_tail_configs_take_no_swizzle():
    """A config that splits its last round (ffi/kernels/schedulers/split_tail.cuh) is a
    pingpong 128-row config with the direct store, says so, and refuses a swizzle."""
    split = _rows("interleaved", scheduler="split-tail")
    assert split, "no split-tail config compiled"
    for config in split:
        assert (config.schedule, config.tile_m, config.store) == ("pingpong", 128, "direct")
        assert "split tail" in config.describe()
        hlo = cuda_hlo(lambda x, p: swiglu(x, p, launch=f"{config.id},swizzle=1"), _x(4096),
                       _packed())
        assert custom_calls(hlo) == [("jax_swiglu_interleaved_silu_bf16", config.id)]
        with pytest.raises(ValueError, match="takes no swizzle"):
            cuda_hlo(lambda x, p: swiglu(x, p, launch=f"{config.id},swizzle=2"), _x(4096),
                     _packed())


def test_m_bands_configs_need_whole_bands():
    """A config that runs M in bands (ffi/kernels/schedulers/m_bands.cuh) says so, lowers
    where M is a multiple of its bands of whole clusters of tiles, and refuses other M."""
    banded = [c for c in _native.kernel_configs().values() if c.m_bands > 1]
    assert banded, "no config with M in bands compiled"
    for config in banded:
        assert config.scheduler == "persistent" and config.cluster_n == 1
        assert f"M in {config.m_bands} bands" in config.describe()
        assert config.m_multiple == config.m_bands * config.tile_m * config.cluster_m
        hlo = cuda_hlo(lambda x, p: swiglu(x, p, launch=config), _x(2 * config.m_multiple),
                       _packed())
        assert custom_calls(hlo) == [("jax_swiglu_interleaved_silu_bf16", config.id)]
        with pytest.raises(ValueError, match=f"multiple of {config.m_multiple}"):
            cuda_hlo(lambda x, p: swiglu(x, p, launch=config), _x(config.m_multiple + 128),
                     _packed())


def test_output_store_paths_are_reported():
    """Each compiled config names its output path; the interleaved kernel stores from
    registers but for its stream-K TMA row, and the gate-then-up kernel through TMA."""
    for config in _native.kernel_configs().values():
        assert config.store in ("tma", "direct")
        assert ("direct store" in config.describe()) == (config.store == "direct")
    for config in _rows("interleaved", store="tma"):
        assert config.scheduler == "stream-k"
    for config in _rows("gate_then_up"):
        assert config.store == "tma"


def test_every_gate_then_up_row_lowers_as_forced():
    """Each gate-then-up row (the cooperative clustered one in every build, the pingpong ones
    in builds with every config) lowers to its family's target with its id, at a ragged M
    and K not a multiple of its k tile."""
    rows = _rows("gate_then_up")
    assert rows
    for row in rows:
        hlo = cuda_hlo(lambda x, p: swiglu(x, p, launch=row), _x(65, k=200), _packed(k=200))
        assert custom_calls(hlo) == [("jax_swiglu_gate_then_up_silu_bf16", row.id)]
        assert "gate-then-up" in row.in_words()


def test_stream_k_config_gets_a_workspace_result():
    """A stream-K launch lowers with a second, scratch result (uint8) that nothing reads;
    the other configs keep a single result."""
    stream_k = [c.id for c in _rows("interleaved", scheduler="stream-k")]
    assert stream_k
    k, n = 1536, 8960
    packed = _abstract_packed(k, n)
    for config in _rows("interleaved"):
        if 128 % config.m_multiple:
            continue  # runs M in bands: test_m_bands_configs_need_whole_bands
        hlo = cuda_hlo(lambda x, p: swiglu(x, p, launch=config), _x(128, k), packed)
        [call] = [line for line in hlo.splitlines() if "stablehlo.custom_call" in line]
        results = call.rsplit("->", 1)[1]
        needed = _native.workspace_bytes(config.id, "bfloat16", m=128, n=n, k=k)
        assert (needed > 0) == (config.id in stream_k)  # 1120 and 140 tiles: a ragged last wave
        if config.id in stream_k:
            assert re.search(rf"\(tensor<128x8960xbf16>, tensor<{needed}xui8>\)", results), call
        else:
            assert results.strip() == "tensor<128x8960xbf16>", call


def test_workspace_size_bounds():
    """The stream-K workspace is sized for the local GPU or, with none, for every SM count
    (the split depends on it); M = 0 needs none; a dimension past int32 is a Python error."""
    [stream_k] = _rows("interleaved", m_side="weights", tile_m=16, tile_n=128)
    shape = dict(n=18944, k=3584)

    def for_sm_count(sms):
        return _native._kernels.workspace_bytes(stream_k.id, "silu", "bfloat16", 128, 18944,
                                                18944, 3584, 1, 0, 1, 4, sms)
    size = _native.workspace_bytes(stream_k.id, "bfloat16", m=128, **shape)
    local = _native._kernels.device_sm_count()
    if local:  # a GPU here: sized for it
        assert size == for_sm_count(local) > 0
    else:
        assert size >= max(for_sm_count(sms) for sms in (66, 114, 132)) > 0
    assert _native.workspace_bytes(stream_k.id, "bfloat16", m=0, **shape) == 0
    with pytest.raises(ValueError, match="exceeds 2\\^31 - 1"):
        _native.workspace_bytes(stream_k.id, "bfloat16", m=2**31, **shape)


@pytest.mark.parametrize("activation", list(jax_swiglu.ACTIVATIONS))
@pytest.mark.parametrize("m", [1, 64, 300, 4096])
def test_activation_picks_its_target_and_the_same_launch(activation, m):
    """The activation picks the custom call's target (its name says which) and leaves the
    launch the selection chose alone; explain() names it."""
    packed = _abstract_packed(64, 4864)
    hlo = cuda_hlo(lambda x, p: swiglu(x, p, activation=activation), _x(m), packed)
    silu = selection.choose(selection.Problem(m, 4864, 64, "bfloat16"))
    choice = selection.choose(selection.Problem(m, 4864, 64, "bfloat16", activation=activation))
    assert choice.launch == silu.launch
    if choice.launch is None:
        assert custom_calls(hlo) == []
    else:
        assert custom_calls(hlo) == [(f"jax_swiglu_{choice.launch.family}_{activation}_bf16",
                                      choice.launch.config)]
    explained = jax_swiglu.explain(_x(m), packed, activation=activation, platform="cuda")
    assert f" {activation} on cuda: " in explained


def test_every_activation_is_compiled_and_has_targets():
    assert _native.activations() == tuple(jax_swiglu.ACTIVATIONS)
    targets = _native.targets()
    for activation in jax_swiglu.ACTIVATIONS:
        for dtype, suffix in (("bfloat16", "bf16"), ("float16", "f16")):
            assert targets[("interleaved", "16bit", activation, dtype, False)] == (
                f"jax_swiglu_interleaved_{activation}_{suffix}")
            assert targets[("interleaved", "e4m3", activation, dtype, False)] == (
                f"jax_swiglu_interleaved_fp8_{activation}_{suffix}")
            assert targets[("interleaved", "16bit", activation, dtype, True)] == (
                f"jax_swiglu_grouped_{activation}_{suffix}")


def test_gemv_kernel_lowering():
    """The gemv family: its rows in the table, its target in the HLO with the cluster split
    as the `splits` attribute and no workspace result; M beyond a config's tokens, or a
    split that is not a cluster size, is refused."""
    configs = _rows("gemv")
    assert {c.schedule for c in configs} == {"cuda-cores", "tensor-cores"}
    assert all(c.max_m == c.tile_m <= (8 if c.schedule == "cuda-cores" else 16)
               for c in configs)
    most = max(configs, key=lambda c: c.tile_m)
    k = 512  # 64 steps of 8 rows, 8 of 64: every cluster size for both forms
    packed = _packed(k=k)
    fn = lambda x, p: swiglu(x, p, kernel="gemv")  # noqa: E731
    hlo = cuda_hlo(fn, _x(most.tile_m, k=k), packed)
    assert [t for t, _ in custom_calls(hlo)] == ["jax_swiglu_gemv_silu_bf16"]
    assert "tuple<" not in hlo.split("jax_swiglu_gemv_silu_bf16")[1].split("\n")[0]
    with pytest.raises(ValueError, match="gemv"):
        cuda_hlo(fn, _x(most.tile_m + 1, k=k), packed)
    for row in configs:
        x = _x(min(3, row.tile_m), k=k)
        hlo = cuda_hlo(lambda x, p: swiglu(x, p, launch=f"{row.id},splits=8"), x, packed)
        assert re.search(r"splits = 8 : i64", hlo)
        for bad in (f"{row.id},splits=3", f"{row.id},splits=16"):
            with pytest.raises(ValueError, match="cluster"):
                jax.jit(lambda x, p: swiglu(x, p, launch=bad)).trace(x, packed)
    smallest = min(configs, key=lambda c: c.tile_m)
    with pytest.raises(ValueError, match="at most"):
        cuda_hlo(lambda x, p: swiglu(x, p, launch=smallest), _x(smallest.tile_m + 1, k=k),
                 packed)


def test_gemv_projection_lowering():
    """The gemv rows' plain projection (a down projection on the decode form): its target,
    row and split in the HLO, for 16-bit and e4m3 operands; shapes, tokens, splits, rows and
    dtypes it cannot run are trace-time errors in the launch check's words."""
    from jax_swiglu._projection import gemv_projection
    k, n = 512, 200
    w = jax.ShapeDtypeStruct((k, n), jnp.bfloat16)
    for row in _rows("gemv"):
        hlo = cuda_hlo(lambda x, w: gemv_projection(x, w, config=row.id, splits=2),
                       _x(row.tile_m, k=k), w)
        assert custom_calls(hlo) == [("jax_swiglu_gemv_projection_bf16", row.id)]
        assert re.search(r"splits = 2 : i64", hlo)
    down = jax.eval_shape(jax_swiglu.quantize_down, jax.ShapeDtypeStruct((k, n), jnp.float32))
    x_q, x_scale = _x(16, k=k, dtype=jnp.float8_e4m3fn), jax.ShapeDtypeStruct((16,), jnp.float32)
    for row in _rows("gemv", operands="e4m3"):
        hlo = cuda_hlo(lambda x, s, d: gemv_projection(x, d, config=row.id, x_scale=s),
                       x_q, x_scale, down)
        assert custom_calls(hlo) == [("jax_swiglu_gemv_projection_fp8_bf16", row.id)]
    most = max(_rows("gemv"), key=lambda c: c.tile_m)
    interleaved = _rows("interleaved")[0]
    for x, w_, config, splits, match in (
            (_x(most.tile_m + 1, k=k), w, most.id, 1, "at most"),
            (_x(1, k=k), jax.ShapeDtypeStruct((k, 196), jnp.bfloat16), most.id, 1, "multiple of 8"),
            (_x(1, k=k), w, most.id, 3, "cluster"),
            (_x(1, k=k), w, interleaved.id, 1, "not a gemv row"),
            (_x(1, k=256), w, most.id, 1, "contract")):
        with pytest.raises(ValueError, match=match):
            jax.jit(lambda x, w: gemv_projection(x, w, config=config, splits=splits)).trace(x, w_)
    with pytest.raises(TypeError, match="one dtype"):
        jax.jit(lambda x, w: gemv_projection(x, w, config=most.id)).trace(
            _x(1, k=k, dtype=jnp.float16), w)
