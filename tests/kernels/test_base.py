"""The one kernel suite: every compiled row of the config table, in every dtype and activation,
against the spec (criterion.py's one pass criterion), on an SM90 GPU.

Each row runs the M its form is built for (tokens on M: a partial tile, a ragged wave and
many waves; swap-AB: decode and past its token tile; the gemv kernel: its tokens) on a
7B-class shape in both dtypes and activations, and once more on an odd shape (K not a
multiple of the k tile, N below one tile and not a multiple of the gate/up block). Stream-K
rows run split-K too, gemv rows every cluster size. The per-form files of this folder add
only their special cases.
"""

import jax.numpy as jnp
import pytest

import jax_swiglu
from jax_swiglu import Launch, _native

from criterion import check

DTYPES = (jnp.bfloat16, jnp.float16)
SHAPE = (1536, 8960)  # K, N: 140 tiles of 128 packed columns per row of tiles


def _ms(row) -> tuple[int, ...]:
    """The M a row runs here: its form's, kept to what it can run."""
    if row.is_gemv:
        return (1, row.tile_m) if row.tile_m > 1 else (1,)
    if row.m_bands > 1:
        return (row.m_multiple,)
    if row.m_side == "weights":
        return (1, 33, 200)
    return (5, 300, 2048)


def _odd_shape(row) -> tuple[int, int]:
    return (144, 200) if row.operands == "e4m3" else (136, 200)


def _splits(row, k) -> tuple[int, ...]:
    choices = _native.split_choices(row.id, k)
    return choices if row.is_gemv else choices[:2]  # stream-K: itself and split-K 2


def _cases():
    cases = []
    for row in jax_swiglu.kernel_configs().values():
        k, n = SHAPE
        for dtype in DTYPES:
            for activation in jax_swiglu.ACTIVATIONS:
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


def test_every_activation_is_compiled():
    assert _native.activations() == tuple(jax_swiglu.ACTIVATIONS)


@pytest.mark.parametrize("kernel", ["auto", "interleaved", "gate_then_up", "gemv"])
@pytest.mark.parametrize("m", [1, 7, 64, 128, 1000, 8192])
@pytest.mark.parametrize("shape", [(896, 4864), (3584, 18944)])
def test_the_selection_on_qwen_shapes(kernel, m, shape, key):
    """The launch the selection (or a family's best) picks, on the smallest and a 7B Qwen2.5
    MLP; the gemv family only at the tokens it runs."""
    if kernel == "gemv" and m > max(row.max_m for row in jax_swiglu.kernel_configs().values()):
        pytest.skip("the gemv kernel runs a few tokens")
    check(m, *shape, key, kernel=kernel)


@pytest.mark.parametrize("m", [1, 64, 2048])
def test_fp8_selection(m, key):
    check(m, 1024, 2816, key, operands="e4m3")
