"""Sharding: the partitioning rules of the primitive and the layout's rules for shards.

The multi-device checks need 8 devices, and XLA_FLAGS must give the CPU backend those
before JAX starts; this process has started it already. So ``sharding_checks.py`` runs
them all in one fresh interpreter (``test_on_8_host_devices``, one test per check); the
pure rules are tested here directly.
"""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import sharding_checks
from jax_swiglu import PackedWeights, _layout, _primitive, pack_weights, swiglu, unpack_weights

from helpers import random_weights, random_x

CHECKS_SCRIPT = Path(sharding_checks.__file__)


@pytest.fixture(scope="module")
def multidevice_results():
    # The script sets up its interpreter (8 CPU devices, this checkout's package) itself.
    run = subprocess.run([sys.executable, str(CHECKS_SCRIPT)], capture_output=True,
                         text=True, timeout=900)
    results = {}
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            results[result["name"]] = result
    if run.returncode not in (0, 1) or not results:
        pytest.fail(f"{CHECKS_SCRIPT.name} exited with {run.returncode}:\n{run.stderr[-5000:]}")
    return results


@pytest.mark.parametrize("name", list(sharding_checks.CHECKS))
def test_on_8_host_devices(multidevice_results, name):
    result = multidevice_results.get(name)
    assert result is not None, f"{name} did not report; see `python {CHECKS_SCRIPT}`"
    if result["status"] == "skipped":
        pytest.skip(result["detail"])
    assert result["status"] == "passed", result["detail"]


# --- the pure rules -----------------------------------------------------------------------

AXIS_SIZES = {"data": 2, "model": 4}


@pytest.mark.parametrize(
    "x_spec, packed_spec, expected",
    [
        (P(), P(), ((), (), 1024)),
        (P("data"), P(None, "model"), (("data",), ("model",), 256)),
        (P("data", "model"), P(), (("data",), (), 1024)),  # K sharding is dropped: gathered
        (P(), P("model", None), ((), (), 1024)),
        (P("model"), P(None, "model"), ((), ("model",), 256)),  # the weights keep the axis
        (P(("data", "model")), P(None, "model"), (("data",), ("model",), 256)),
        (P(), P(None, ("data", "model")), ((), ("data", "model"), 128)),
    ],
)
def test_split(x_spec, packed_spec, expected):
    plan = _primitive.split("packed", [x_spec, packed_spec], AXIS_SIZES, 1024)
    assert (plan.m_axes, plan.n_axes, plan.local_n) == expected
    x_out, packed_out = plan.operand_specs()
    assert x_out[1] is None and packed_out[0] is None  # K is replicated


@pytest.mark.parametrize("n, shards", [(32 * 9, 8), (200, 2), (32, 2), (1024 + 8, 4)])
def test_shard_n_refuses_pairs_across_shards(n, shards):
    with pytest.raises(ValueError, match=f"multiple of 32 \\* {shards}"):
        _layout.shard_n(n, shards)


def test_shard_n():
    assert _layout.shard_n(200, 1) == 200
    assert _layout.shard_n(4864, 4) == 1216
    assert _layout.shard_n(1024, 16) == 64


def test_n_is_read_off_the_data_unless_padded(key):
    w_gate, w_up = random_weights(key, 32, 256)
    packed = pack_weights(w_gate, w_up)
    # An explicit n that the data implies is dropped: one tree structure for both.
    assert (jax.tree_util.tree_structure(packed)
            == jax.tree_util.tree_structure(PackedWeights.from_packed_data(packed.data, 256)))
    # A run of whole pairs (what shard_map hands its body) is packed weights of its own.
    shard = jax.tree.map(lambda data: data[:, 128:384], packed)
    assert shard.n == 128
    gate, up = unpack_weights(shard)
    np.testing.assert_array_equal(np.asarray(gate), np.asarray(w_gate[:, 64:192]))
    np.testing.assert_array_equal(np.asarray(up), np.asarray(w_up[:, 64:192]))
    x = random_x(key, (4, 32))
    np.testing.assert_array_equal(swiglu(x, shard), swiglu(x, packed)[:, 64:192])


def test_padded_n_is_kept_and_cannot_be_split(key):
    packed = pack_weights(*random_weights(key, 32, 200))
    assert packed.n == 200 and packed.n_padded == 224
    half = jax.tree.map(lambda data: data[:, :224], packed)
    with pytest.raises(ValueError, match="cannot be split along N"):
        half.validate()


def test_half_a_pair_is_refused(key):
    packed = pack_weights(*random_weights(key, 32, 256))
    with pytest.raises(ValueError, match="whole gate/up pairs"):
        jax.tree.map(lambda data: data[:, :32], packed).validate()


def test_explicit_n_that_contradicts_the_data_is_refused(key):
    packed = pack_weights(*random_weights(key, 32, 256))
    with pytest.raises(ValueError, match="not built by jax_swiglu.pack_weights"):
        PackedWeights.from_packed_data(packed.data, 128)


def test_packed_weights_are_immutable(key):
    packed = pack_weights(*random_weights(key, 16, 64))
    with pytest.raises(AttributeError, match="immutable"):
        packed.n = 128


def test_single_device_lowering_has_no_partitioning_call(key):
    """Without a mesh the op lowers straight to the per-device computation."""
    packed = pack_weights(*random_weights(key, 32, 64))
    text = jax.jit(swiglu).lower(jnp.zeros((4, 32), jnp.bfloat16), packed).as_text()
    assert "CustomSPMDPartitioning" not in text and "dot_general" in text
