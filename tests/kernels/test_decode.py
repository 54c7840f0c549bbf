"""The decode forms' special cases, on an SM90 GPU: swap-AB (weights on the wgmma M side) at
every decode M and split of K, the gemv kernel at every split of every shape class, and the
fixed-order sums of both: the same bits over 100 calls and after a recompile."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_swiglu import Launch, _native, pack_weights, swiglu

from criterion import check, inputs, rows

DECODE_M = [1, 2, 3, 7, 15, 17, 33, 63, 65, 200]


def _swap_ab(operands="16bit"):
    return [r.id for r in rows(family="interleaved", m_side="weights", operands=operands)]


def _swap_ab_splits(config, wanted=(1, 2, 4), k=2560):
    """The splits of ``wanted`` that row ``config`` takes on K (split-K is the stream-K
    rows'; the persistent rows run whole tiles only)."""
    return [s for s in wanted if s in _native.split_choices(config, k)]


@pytest.mark.parametrize("config, splits",
                         [(c, s) for c in _swap_ab() for s in _swap_ab_splits(c)])
@pytest.mark.parametrize("m", DECODE_M)
def test_swap_ab_rows(config, splits, m, key):
    """Weights on the wgmma M side, gate and up paired through shared memory, the K
    reduction split across CTAs (stream-K, or split-K 2 and 4) and summed in fixed order,
    on a shape whose packed columns make a ragged last wave (K = 2560, N = 9728: 152 tiles
    of 128 packed columns)."""
    check(m, 2560, 9728, key, launch=Launch(config, splits))


def _odd_cases():
    """N below one tile and not a multiple of the gate/up block, K not a multiple of the
    k-tile (nor of 16 for 16-bit operands), more K-tiles than tiles (every tile split)."""
    cases = []
    for operands, ragged_k in (("16bit", 136), ("e4m3", 144)):
        for config in _swap_ab(operands):
            cases += [(config, operands, m, k, n) for m, k, n in
                      ((1, 64, 8), (5, ragged_k, 200), (40, 4112, 1000), (64, 8192, 96))]
    return cases


@pytest.mark.parametrize("config, operands, m, k, n", _odd_cases())
def test_swap_ab_odd_shapes(config, operands, m, k, n, key):
    check(m, k, n, key, launch=Launch(config), operands=operands)


# (K, N): a 7B-sized MLP (2N = 22016: 86 CTAs of 256 packed columns, the last whole), a small
# one (the last CTA a quarter full), K not a multiple of 64 nor of 8 splits' steps, N not a
# multiple of 32 (padded), and K of one 8-row step (no split possible). The e4m3 rows' K
# are multiples of 16 (their rows of fp8 are 16-byte aligned): one k tile of 128 and a part,
# and 9 k tiles, which 8 splits leave some CTAs without (their sums are zeros).
GEMV_SHAPES = {"16bit": [(4096, 11008), (896, 4864), (1000, 200), (136, 72), (8, 40)],
               "e4m3": [(4096, 11008), (896, 4864), (1152, 200), (1008, 200), (144, 72),
                        (16, 40)]}


def _gemv_cases():
    """Each gemv row at its most tokens and those below it: the CUDA-core rows (a ladder of
    token counts) down to the next row's, the tensor-core rows (any M up to their token
    tile) down to 1; on every shape and split K allows."""
    cases = []
    for schedule, operands in (("cuda-cores", "16bit"), ("tensor-cores", "16bit"),
                               ("tensor-cores", "e4m3")):
        gemv = sorted(rows(family="gemv", schedule=schedule, operands=operands),
                      key=lambda r: r.tile_m)
        for below, row in zip([None] + gemv[:-1], gemv):
            low = (below.tile_m if below and schedule == "cuda-cores" else 0) + 1
            for m in sorted({low, (low + row.tile_m) // 2, row.tile_m}):
                for k, n in GEMV_SHAPES[operands]:
                    cases += [(row.id, operands, m, k, n, s)
                              for s in _native.split_choices(row.id, k)]
    return cases


@pytest.mark.parametrize("config, operands, m, k, n, splits", _gemv_cases())
def test_gemv_rows_and_splits(config, operands, m, k, n, splits, key):
    check(m, k, n, key, launch=Launch(config, splits), operands=operands)


def _deterministic_cases():
    widest_gemv = [(max(rows(family="gemv", schedule=s, operands=o), key=lambda r: r.tile_m), o)
                   for s, o in (("cuda-cores", "16bit"), ("tensor-cores", "16bit"),
                                ("tensor-cores", "e4m3"))
                   if rows(family="gemv", schedule=s, operands=o)]
    return ([(c, s, 33, "16bit") for c in _swap_ab() for s in _swap_ab_splits(c, (1, 4), 4096)]
            + [(row.id, s, row.tile_m, o) for row, o in widest_gemv for s in (1, 8)]
            + [(c, 1, 33, "e4m3") for c in _swap_ab("e4m3")]
            + [(r.id, 1, 300, "e4m3") for r in rows(operands="e4m3", scheduler="stream-k",
                                                    m_side="tokens")])


@pytest.mark.parametrize("config, splits, m, operands", _deterministic_cases())
def test_bitwise_deterministic(config, splits, m, operands, key):
    """Fixed-order sums (stream-K's and split-K's reduction, the gemv cluster's CTAs in rank
    order): 100 calls give the same bits, and so does a recompiled program."""
    x, weights = inputs(key, m, 4096, 11008, jnp.dtype(jnp.bfloat16), operands)
    launch = Launch(config, splits)
    first = np.asarray(check(m, 4096, 11008, key, launch=launch, operands=operands, x=x,
                             weights=weights)).view(np.uint16)
    call = jax.jit(lambda x, w: swiglu(x, w, launch=launch))
    for _ in range(100):
        np.testing.assert_array_equal(np.asarray(call(x, weights)).view(np.uint16), first)
    again = jax.jit(lambda x, w: swiglu(x, w, launch=launch))  # a new function: recompiled
    np.testing.assert_array_equal(np.asarray(again(x, weights)).view(np.uint16), first)


def test_too_many_tokens_is_an_error():
    most = max(r.tile_m for r in rows(family="gemv", operands="16bit"))
    x = jnp.ones((most + 1, 256), jnp.bfloat16)
    packed = pack_weights(jnp.ones((256, 64), jnp.bfloat16), jnp.ones((256, 64), jnp.bfloat16))
    with pytest.raises(ValueError, match="gemv"):
        jax.jit(lambda x, p: swiglu(x, p, kernel="gemv")).lower(x, packed)
    fewest = min(rows(family="gemv", operands="16bit"), key=lambda r: r.tile_m)
    with pytest.raises(ValueError, match="at most"):
        jax.jit(lambda x, p: swiglu(x, p, launch=fewest)).lower(x[:2], packed)
