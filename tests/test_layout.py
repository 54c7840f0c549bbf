"""The packed gate/up layout: round trips, the exact column mapping, and bad weights."""

import copy
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_swiglu
from jax_swiglu import GATE_UP_BLOCK, PackedWeights, pack_weights, swiglu, unpack_weights

from helpers import random_weights, random_x


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
    # JAX rebuilds it around other leaves too (placeholders, shardings), unchecked.
    assert jax.tree_util.tree_unflatten(tree, [None]).data is None
    # Passes through jit with its metadata intact, and is rebuilt around tracers under vmap.
    out = jax.jit(lambda p: p)(packed)
    assert isinstance(out, PackedWeights) and out.n == 64
    stacked = jax.tree.map(lambda data: jnp.stack([data, 2 * data]), packed)
    x = random_x(key, (3, 16))
    ys = jax.vmap(swiglu, in_axes=(None, 0))(x, stacked)
    np.testing.assert_array_equal(ys[0], swiglu(x, packed))
    # copy and pickle give the same weights.
    for copied in (copy.deepcopy(packed), pickle.loads(pickle.dumps(packed))):
        assert copied.n == packed.n and copied.layout == packed.layout
        np.testing.assert_array_equal(copied.data, packed.data)


def test_packed_weights_cannot_be_built_from_an_array(key):
    """The issue's case: a [gate | up] concatenation has the packed shape, and read as packed it
    gives wrong outputs; so an array never becomes PackedWeights without naming its layout."""
    w_gate, w_up = random_weights(key, 32, 64)
    concatenated = jnp.concatenate([w_gate, w_up], axis=1)
    with pytest.raises(TypeError, match="layout='concatenated'"):
        PackedWeights(concatenated, 64)
    with pytest.raises(TypeError, match="from_packed_data"):
        PackedWeights(data=concatenated, n=64)
    with pytest.raises(ValueError, match="layout='concatenated'"):
        pack_weights(concatenated)
    x = random_x(key, (4, 32))
    with pytest.raises(TypeError, match="layout='concatenated'.*from_packed_data"):
        swiglu(x, concatenated)
    # Named, the concatenation is an input layout like any other ...
    expected = jax_swiglu.swiglu_reference(x, w_gate, w_up)
    from_concatenation = pack_weights(concatenated, layout="concatenated")
    np.testing.assert_array_equal(from_concatenation.data, pack_weights(w_gate, w_up).data)
    np.testing.assert_array_equal(swiglu(x, from_concatenation), expected)
    # ... and what declaring it packed would have given is wrong, which is why it is refused.
    declared = PackedWeights.from_packed_data(concatenated, 64)
    assert not np.array_equal(np.asarray(swiglu(x, declared)), np.asarray(expected))


@pytest.mark.parametrize("n", [64, 200])
def test_every_source_layout_round_trips(key, n):
    w_gate, w_up = random_weights(key, 16, n)
    sources = {"separate": (w_gate, w_up), "stacked": (jnp.stack([w_gate, w_up], axis=1),),
               "concatenated": (jnp.concatenate([w_gate, w_up], axis=1),)}
    reference = pack_weights(w_gate, w_up)
    for layout, arrays in sources.items():
        packed = pack_weights(*arrays, layout=layout)
        assert packed.n == n
        np.testing.assert_array_equal(packed.data, reference.data)
        back = unpack_weights(packed, layout=layout)
        for got, given in zip(back if layout == "separate" else (back,), arrays):
            assert got.shape == given.shape and got.dtype == given.dtype
            np.testing.assert_array_equal(got, given)


def test_packing_does_not_modify_its_inputs(key):
    w_gate, w_up = (np.asarray(w) for w in random_weights(key, 16, 40))
    concatenated = np.concatenate([w_gate, w_up], axis=1)
    before = [w.copy() for w in (w_gate, w_up, concatenated)]
    pack_weights(w_gate, w_up, dtype=jnp.float16)
    pack_weights(concatenated, layout="concatenated")
    for w, copy_before in zip((w_gate, w_up, concatenated), before):
        np.testing.assert_array_equal(w, copy_before)


def test_from_packed_data_wraps_saved_data(key):
    packed = pack_weights(*random_weights(key, 32, 200))  # padded: n must be given
    again = PackedWeights.from_packed_data(np.asarray(packed.data), 200)
    assert again.n == 200 and again.n_padded == 224
    x = random_x(key, (4, 32))
    np.testing.assert_array_equal(swiglu(x, again), swiglu(x, packed))
    # Under jit, around a traced array.
    y = jax.jit(lambda d: swiglu(x, PackedWeights.from_packed_data(d, 200)))(packed.data)
    np.testing.assert_array_equal(y, swiglu(x, packed))
    with pytest.raises(ValueError, match=r"n=256 needs \[K, 512\]"):
        PackedWeights.from_packed_data(packed.data, 256)
    with pytest.raises(TypeError, match="n must be an int"):
        PackedWeights.from_packed_data(packed.data, None)
    with pytest.raises(TypeError, match="floating-point"):
        PackedWeights.from_packed_data(packed.data.astype(jnp.int8), 200)


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
    with pytest.raises(ValueError, match="does not say its layout"):
        pack_weights(jnp.zeros((16, 64), jnp.bfloat16))


@pytest.mark.parametrize("arrays, layout, match", [
    (((16, 2, 64),), "concatenated", r"concatenated' is one \[K, 2N\] array"),
    (((16, 63),), "concatenated", r"concatenated' is one \[K, 2N\] array"),
    (((16, 128),), "stacked", r"stacked' is one \[K, 2, N\] array"),
    (((16, 128),), "separate", "takes two arrays"),
    (((16, 64), (16, 64)), "concatenated", "pass it alone"),
    (((16, 128),), "interleaved", "layout must be one of"),
])
def test_bad_source_layouts(arrays, layout, match):
    with pytest.raises(ValueError, match=match):
        pack_weights(*(jnp.zeros(shape, jnp.bfloat16) for shape in arrays), layout=layout)
    with pytest.raises(ValueError, match="layout must be one of"):
        unpack_weights(pack_weights(jnp.zeros((16, 64)), jnp.zeros((16, 64))), layout="rows")


def test_bad_dtypes():
    with pytest.raises(TypeError, match="floating-point"):
        pack_weights(jnp.zeros((16, 64), jnp.int32), jnp.zeros((16, 64), jnp.int32))
    with pytest.raises(TypeError, match="different dtypes"):
        pack_weights(jnp.zeros((16, 64), jnp.bfloat16), jnp.zeros((16, 64), jnp.float16))
    # dtype= casts to a float of 16 bits or more: an int cast would zero the weights, and fp8
    # weights need scales (quantize_weights).
    w = jnp.ones((16, 64), jnp.float32)
    with pytest.raises(TypeError, match="dtype must be a floating-point dtype, got int8"):
        pack_weights(w, w, dtype=jnp.int8)
    for fp8 in (jnp.float8_e4m3fn, jnp.float8_e5m2):
        with pytest.raises(TypeError, match="quantize_weights"):
            pack_weights(w, w, dtype=fp8)
        with pytest.raises(TypeError, match="quantize_weights"):
            pack_weights(w.astype(fp8), w.astype(fp8))
    with pytest.raises(TypeError, match="w_gate must be an array, got list"):
        pack_weights([[1.0] * 64] * 16, w)


def test_tampered_packed_weights_are_refused(key):
    packed = pack_weights(*random_weights(key, 16, 64))
    with pytest.raises(ValueError, match="not built by jax_swiglu.pack_weights"):
        PackedWeights.from_packed_data(packed.data[:, :64], packed.n)
    with pytest.raises(ValueError, match="layout"):
        PackedWeights.from_packed_data(packed.data, packed.n, layout="even_odd")
    # Weights packed by an earlier version, in 64-column blocks, are refused ...
    with pytest.raises(ValueError, match="pack the weights again"):
        PackedWeights.from_packed_data(packed.data, packed.n, layout="gate_up_block64")
    # ... and so are those of the 32-column blocks before the quad transpose (2026-11-30),
    # also where the pytree rebuilds them (which checks nothing) and they reach a call.
    old = PackedWeights._wrap(packed.data, packed.n, "gate_up_block32")
    with pytest.raises(ValueError, match="pack the weights again"):
        jax.jit(swiglu).trace(jnp.zeros((4, 16), jnp.bfloat16), old)
    # Data changed through the pytree is checked when it is used.
    half = jax.tree.map(lambda data: data[:, :32], packed)
    with pytest.raises(ValueError, match="whole gate/up pairs"):
        jax.jit(swiglu).trace(jnp.zeros((4, 16), jnp.bfloat16), half)
    with pytest.raises(TypeError, match="PackedWeights"):
        unpack_weights(packed.data)
