"""The one kernel suite: every compiled row of the config table, in every dtype and activation,
against the spec (criterion.py's one pass criterion), on an SM90 GPU.

Each dense row runs the M its form is built for (tokens on M: a partial tile, a ragged wave and
many waves; swap-AB: decode and past its token tile; the gemv kernel: its tokens) on a
7B-class shape in both dtypes and activations, and once more on an odd shape (K not a
multiple of the k tile, N below one tile and not a multiple of the gate/up block). Stream-K
rows run split-K too, gemv rows every cluster size. Grouped rows (mixture-of-experts calls)
run routings that reach every path of their scheduler: balanced and skewed, empty experts,
sizes summing under T (rows of zeros), negative sizes and a sum past T, few tokens over many
experts, one token, and an expert of more token tiles than a band (its tiles walked in bands,
the last one short). The per-form files of this folder add only their special cases.
"""

import jax.numpy as jnp
import pytest

import jax_swiglu
from jax_swiglu import Launch, _native

from criterion import check, check_grouped

DTYPES = (jnp.bfloat16, jnp.float16)
SHAPE = (1536, 8960)  # K, N: 140 tiles of 128 packed columns per row of tiles


def _ms(row) -> tuple[int, ...]:
    """The M a row runs here: its form's, kept to what it can run."""
    if row.is_gemv:
        return (1, row.tile_m) if row.tile_m > 1 else (1,)
    if row.m_bands > 1:
        return (row.m_multiple,)
    if row.m_side == "weights":  # decode, a partial tile, several (a ragged last) at mid M
        return (1, 33, 200) + ((777,) if row.tile_m > 64 else ())
    return (5, 300, 2048)


def _odd_shape(row) -> tuple[int, int]:
    return (144, 200) if row.operands == "e4m3" else (136, 200)


def _splits(row, k) -> tuple[int, ...]:
    choices = _native.split_choices(row.id, k)
    return choices if row.is_gemv else choices[:2]  # stream-K: itself and split-K 2


def _compiled_activations(dtype) -> tuple[str, ...]:
    """The activations whose ``dtype`` kernels this build compiled (float16 ones of SiLU only
    in a default install; every one with JAX_SWIGLU_ALL_CONFIGS, as CI and the GPU check)."""
    return tuple(a for a in jax_swiglu.ACTIVATIONS
                 if _native.kernels_compiled_for(jnp.dtype(dtype).name, a))


def _cases():
    cases = []
    for row in jax_swiglu.kernel_configs().values():
        if row.grouped:
            continue
        k, n = SHAPE
        for dtype in DTYPES:
            for activation in _compiled_activations(dtype):
                for m in _ms(row):
                    for splits in _splits(row, k):
                        cases.append((row.id, splits, m, k, n, dtype, activation))
        k, n = _odd_shape(row)
        cases.append((row.id, 1, _ms(row)[0], k, n, jnp.bfloat16, "silu"))
    return cases


def _id(case):
    config, splits, m, k, n, dtype, activation = case
    return f"c{config}-s{splits}-m{m}-{k}x{n}-{jnp.dtype(dtype).name}-{activation}"


@pytest.mark.parametrize("case", _cases(), ids=_id)
def test_every_row(case, key):
    config, splits, m, k, n, dtype, activation = case
    row = jax_swiglu.kernel_configs()[config]
    check(m, k, n, key, launch=Launch(config, splits), dtype=dtype, operands=row.operands,
          activation=activation)


# Grouped calls: (T, group sizes) routings over E experts, and a 7B-expert-class shape.
GROUPED_SHAPE = (1536, 1024)  # K, F per expert
ROUTINGS = {
    "balanced": (1024, [128] * 8),
    "skewed": (1000, [500, 0, 260, 0, 100, 77, 63, 0]),  # half on one, a few empty, ragged
    "under": (777, [100, 3, 0, 250, 64, 1, 129, 0]),  # sums to 547: 230 rows of zeros
    "defined": (300, [-5, 120, 0, 90, 200, 7, -1, 40]),  # negatives and a sum past T
    "decode": (16, [0] * 20 + [3, 0, 1, 4] + [0] * 36 + [8, 0, 0, 0]),  # 64 experts
    "one token": (1, [0, 0, 0, 1, 0, 0, 0, 0]),
    # Past every grouped row's band (ffi/kernels/schedulers/expert_groups.cuh) on 132 SMs, in
    # several bands with a short last one.
    "heavy": (3000, [2600, 0, 301, 99]),
}


def _grouped_cases():
    cases = []
    for row in jax_swiglu.kernel_configs().values():
        if not row.grouped:
            continue
        k, n = GROUPED_SHAPE
        for routing in ROUTINGS:
            for dtype in DTYPES:
                for activation in _compiled_activations(dtype):
                    if routing == "balanced" or (dtype, activation) == (DTYPES[0], "silu"):
                        cases.append((row.id, routing, k, n, dtype, activation))
        cases.append((row.id, "skewed", 136, 200, jnp.bfloat16, "silu"))  # odd K and F
    return cases


def _grouped_id(case):
    config, routing, k, n, dtype, activation = case
    return (f"c{config}-{routing.replace(' ', '_')}-{k}x{n}-{jnp.dtype(dtype).name}-"
            f"{activation}")


@pytest.mark.parametrize("case", _grouped_cases(), ids=_grouped_id)
def test_every_grouped_row(case, key):
    config, routing, k, n, dtype, activation = case
    t, sizes = ROUTINGS[routing]
    check_grouped(t, k, n, sizes, key, launch=Launch(config), dtype=dtype, activation=activation)


@pytest.mark.parametrize("routing", ["balanced", "skewed", "decode"])
def test_the_grouped_selection(routing, key):
    t, sizes = ROUTINGS[routing]
    check_grouped(t, *GROUPED_SHAPE, sizes, key)


def test_every_activation_is_compiled():
    assert _native.activations() == tuple(jax_swiglu.ACTIVATIONS)
    # float16: SiLU's kernels in every build, the others' where every config is compiled.
    every_config = any(row.optional and row.compiled for row in _native.all_configs().values())
    assert _native.float16_activations() == (tuple(jax_swiglu.ACTIVATIONS) if every_config
                                             else ("silu",))


@pytest.mark.parametrize("kernel", ["auto", "interleaved", "gate_then_up", "gemv"])
@pytest.mark.parametrize("m", [1, 7, 64, 128, 1000, 8192])
@pytest.mark.parametrize("shape", [(896, 4864), (3584, 18944)])
def test_the_selection_on_qwen_shapes(kernel, m, shape, key):
    """The launch the selection (or a family's best) picks, on the smallest and a 7B Qwen2.5
    MLP; the gemv family only at the tokens it runs."""
    if kernel == "gemv" and m > max(row.max_m for row in jax_swiglu.kernel_configs().values()):
        pytest.skip("the gemv kernel runs a few tokens")
    check(m, *shape, key, kernel=kernel)


@pytest.mark.parametrize("accumulation", ["promoted", "fast"])
@pytest.mark.parametrize("m", [1, 64, 2048])
def test_fp8_selection(m, accumulation, key):
    check(m, 1024, 2816, key, operands="e4m3", accumulation=accumulation)
