"""The decode forms' special cases, on an SM90 GPU: swap-AB (weights on the wgmma M side) at
every decode M and split of K, the gemv kernel at every split of every shape class, and the
fixed-order sums of both: the same bits over 100 calls and after a recompile; the gemv rows'
plain projection (a down projection on the decode form)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_swiglu import Launch, _native, pack_weights, quantize_down, quantize_tokens, swiglu
from jax_swiglu._projection import gemv_projection
from jax_swiglu._quantize import dequantize_down

from criterion import FEW_OFF_PER_MILLION, check, inputs, rows

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


# The plain projection (a down projection on the decode form): (K, N) of a 7B-sized down
# projection (4096 outputs: 16 or 32 CTAs), N under one CTA's columns and not a multiple of
# 64 (the last TMA boxes past N), K of one step and a part (16-bit: not a multiple of 64).
PROJECTION_SHAPES = {"16bit": [(11008, 4096), (1000, 200), (136, 72)],
                     "e4m3": [(11008, 4096), (1008, 200), (144, 72)]}


def _projection_cases():
    """Every gemv row at one token and at its most, on every shape and split K allows."""
    cases = []
    for operands, shapes in PROJECTION_SHAPES.items():
        for row in rows(family="gemv", operands=operands):
            for m in sorted({1, row.tile_m}):
                cases += [(row.id, operands, m, k, n, s) for k, n in shapes
                          for s in _native.split_choices(row.id, k)]
    return cases


def _projection_inputs(key, m, k, n, operands):
    """x (e4m3: quantized per row, with its scales), the weights (16-bit [K, N], or a
    QuantizedDown), and the fp32 spec of x @ W on the values the kernel reads."""
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
    w = jax.random.normal(kw, (k, n), jnp.float32) / np.sqrt(k)
    if operands == "e4m3":
        down = quantize_down(w)
        x_q, x_scale = quantize_tokens(x)
        x_f32 = x_q.astype(jnp.float32) * x_scale[:, None]
        spec = jnp.matmul(x_f32, dequantize_down(down), precision=jax.lax.Precision.HIGHEST)
        return (x_q, down, x_scale), spec
    w = w.astype(jnp.bfloat16)
    spec = jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST)
    return (x, w, None), spec


@pytest.mark.parametrize("config, operands, m, k, n, splits", _projection_cases())
def test_gemv_projection(config, operands, m, k, n, splits, key):
    """x @ W with each column an output (no pairing, no activation): the spec's criterion
    (1 % + 1e-3 per element, 1e-2 relative Frobenius; e4m3 within the promotion allowance)
    and the same bits on a second call. (The output is XLA's fresh buffer, not a poisoned
    one: an element the kernel skipped is caught only where the buffer held no earlier
    case's answer.)"""
    (x, w, x_scale), spec = _projection_inputs(key, m, k, n, operands)
    call = jax.jit(lambda x, w, s: gemv_projection(x, w, config=config, splits=splits,
                                                   x_scale=s))
    y = call(x, w, x_scale)
    assert y.shape == (m, n) and y.dtype == jnp.bfloat16
    got, spec = np.asarray(y, np.float32), np.asarray(spec)
    off = ~(np.abs(got - spec) <= 0.01 * np.abs(spec) + 1e-3)  # NaN counts as off
    allowed = 0 if operands == "16bit" else max(1, int(FEW_OFF_PER_MILLION * got.size / 1e6))
    assert off.sum() <= allowed, f"{off.sum()} of {got.size} elements off"
    assert np.linalg.norm(got - spec) < 1e-2 * np.linalg.norm(spec)
    np.testing.assert_array_equal(np.asarray(call(x, w, x_scale)).view(np.uint16),
                                  np.asarray(y).view(np.uint16))


def test_gemv_projection_of_no_tokens(key):
    row = min(rows(family="gemv", operands="16bit"), key=lambda r: r.tile_m)
    (x, w, _), _ = _projection_inputs(key, 1, 136, 72, "16bit")
    y = jax.jit(lambda x, w: gemv_projection(x, w, config=row.id))(x[:0], w)
    assert y.shape == (0, 72)
