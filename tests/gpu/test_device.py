"""The GPU's facts as the selection reads them (jax_swiglu/selection/_device.py), on the GPU."""

import jax_swiglu  # noqa: F401  (the extension)
from jax_swiglu import _native
from jax_swiglu.selection import _device


def test_the_gpu_reports_its_cluster_slots():
    facts = _native.device_facts()
    sms = facts["sm_count"]
    slots = facts["cluster_slots"]
    # Every SM90 part holds clusters of 2 and 4; a cluster runs inside one GPC, so no size
    # fits more than SMs / size, and a larger size never holds more CTAs at once.
    assert {2, 4} <= set(slots), slots
    for size, clusters in slots.items():
        assert 0 < clusters <= sms // size, (size, clusters, sms)
    sizes = sorted(slots)
    assert all(slots[a] * a >= slots[b] * b for a, b in zip(sizes, sizes[1:])), slots
    # The selection's device carries what the part reported, not a file's copy.
    assert _device.local_device().cluster_slots == slots
