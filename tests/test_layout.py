"""The packed gate/up layout: round trips, the exact column mapping, and bad weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_swiglu
from jax_swiglu import GATE_UP_BLOCK, PackedWeights, pack_weights, swiglu, unpack_weights

from helpers import random_weights


@pytest.mark.parametrize("n", [8, 64, 200, 4864])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_round_trip(key, n, dtype):
    w_gate, w_up = random_weights(key, 32, n, dtype)
    packed = pack_weights(w_gate, w_up)
    assert packed.n == n and packed.k == 32 and packed.dtype == dtype
    assert packed.data.shape == (32, 2 * (-(-n // GATE_UP_BLOCK) * GATE_UP_BLOCK))
    gate, up = unpack_weights(packed)
    np.testing.assert_array_equal(np.asarray(gate), np.asarray(w_gate))
    np.testing.assert_array_equal(np.asarray(up), np.asarray(w_up))


def test_column_mapping(key):
    """Packed columns 64b .. 64b + 31 are gate columns 32b .. 32b + 31 and the next 32 up's,
    each run quad-transposed: position 8j + 2q + e holds column 8q + 2j + e of the run."""
    assert GATE_UP_BLOCK == 32  # tile widths 128, 192, 256 hold whole pairs (ffi/kernel_configs.h)
    n, block = 200, GATE_UP_BLOCK
    w_gate, w_up = random_weights(key, 16, n)
    data = np.asarray(pack_weights(w_gate, w_up).data)
    assert data.shape == (16, 2 * 224)
    for col in range(n):
        b, c = divmod(col, block)
        q, j, e = c // 8, c % 8 // 2, c % 2
        position = 8 * j + 2 * q + e
        np.testing.assert_array_equal(data[:, 2 * block * b + position], np.asarray(w_gate)[:, col])
        np.testing.assert_array_equal(data[:, 2 * block * b + block + position],
                                      np.asarray(w_up)[:, col])
    # Lane q of a wgmma quad holds positions 8j + 2q + e: columns 8q .. 8q + 7 of the run.
    for q in range(4):
        positions = [8 * j + 2 * q + e for j in range(4) for e in range(2)]
        np.testing.assert_array_equal(data[:, positions], np.asarray(w_gate)[:, 8 * q:8 * q + 8])
    # Padding columns (n..223 of each half) are zero, wherever the transpose put them.
    padded = [2 * block * 6 + half + 8 * j + 2 * q + e
              for half in (0, block) for q in range(4) for j in range(4) for e in range(2)
              if 6 * block + 8 * q + 2 * j + e >= n]
    assert len(padded) == 2 * (224 - n) and not data[:, padded].any()


def test_stacked_form_equals_separate(key):
    w_gate, w_up = random_weights(key, 24, 72)
    stacked = jnp.stack([w_gate, w_up], axis=1)  # [K, 2, N]
    np.testing.assert_array_equal(pack_weights(stacked).data, pack_weights(w_gate, w_up).data)


def test_dtype_cast(key):
    w_gate, w_up = random_weights(key, 16, 64, jnp.float32)
    packed = pack_weights(w_gate, w_up, dtype=jnp.bfloat16)
    assert packed.dtype == jnp.bfloat16


def test_packed_is_a_pytree(key):
    packed = pack_weights(*random_weights(key, 16, 64))
    leaves, tree = jax.tree_util.tree_flatten(packed)
    assert len(leaves) == 1 and leaves[0] is packed.data
    again = jax.tree_util.tree_unflatten(tree, leaves)
    assert again.n == packed.n and again.layout == packed.layout
    # Passes through jit with its metadata intact.
    out = jax.jit(lambda p: p)(packed)
    assert isinstance(out, PackedWeights) and out.n == 64


@pytest.mark.parametrize(
    "args, error, match",
    [
        (((16, 64), (16, 72)), ValueError, "same shape"),
        (((16, 64, 1), (16, 64, 1)), ValueError, r"must be \[K, N\]"),
        (((12, 64), (12, 64)), ValueError, "multiples of 8"),
        (((16, 60), (16, 60)), ValueError, "multiples of 8"),
        (((0, 64), (0, 64)), ValueError, "positive"),
    ],
)
def test_bad_shapes(args, error, match):
    (gate_shape, up_shape) = args
    with pytest.raises(error, match=match):
        pack_weights(jnp.zeros(gate_shape, jnp.bfloat16), jnp.zeros(up_shape, jnp.bfloat16))


def test_bad_stacked_form():
    with pytest.raises(ValueError, match=r"stacked \[K, 2, N\]"):
        pack_weights(jnp.zeros((16, 3, 64), jnp.bfloat16))
    with pytest.raises(ValueError, match=r"stacked \[K, 2, N\]"):
        pack_weights(jnp.zeros((16, 64), jnp.bfloat16))


def test_bad_dtypes():
    with pytest.raises(TypeError, match="floating-point"):
        pack_weights(jnp.zeros((16, 64), jnp.int32), jnp.zeros((16, 64), jnp.int32))
    with pytest.raises(TypeError, match="different dtypes"):
        pack_weights(jnp.zeros((16, 64), jnp.bfloat16), jnp.zeros((16, 64), jnp.float16))


def test_tampered_packed_weights_are_refused(key):
    packed = pack_weights(*random_weights(key, 16, 64))
    with pytest.raises(ValueError, match="not built by jax_swiglu.pack_weights"):
        PackedWeights(packed.data[:, :64], packed.n).validate()
    with pytest.raises(ValueError, match="layout"):
        PackedWeights(packed.data, packed.n, layout="even_odd").validate()
    # Weights packed by an earlier version, in 64-column blocks, are refused at trace time.
    old = PackedWeights(packed.data, packed.n, layout="gate_up_block64")
    with pytest.raises(ValueError, match="pack the weights again"):
        jax.jit(swiglu).trace(jnp.zeros((4, 16), jnp.bfloat16), old)
    # ... and so are those of the 32-column blocks before the quad transpose (2026-11-30).
    old = PackedWeights(packed.data, packed.n, layout="gate_up_block32")
    with pytest.raises(ValueError, match="pack the weights again"):
        jax.jit(swiglu).trace(jnp.zeros((4, 16), jnp.bfloat16), old)
    with pytest.raises(TypeError, match="PackedWeights"):
        unpack_weights(packed.data)
