"""Fixtures every test shares; helpers live in tests/helpers.py (importable as ``helpers``).

Every test under tests/kernels (the kernel suite) and tests/gpu needs an SM90 GPU and the
compiled kernels: each is marked ``gpu`` and skips, with the reason, where there is none
(CI runs them as skips)."""

import zlib

import jax
import pytest

from helpers import gpu_skip_reason

GPU_FOLDERS = ("/tests/gpu/", "/tests/kernels/")


@pytest.fixture
def key(request):
    # A different key per test, stable across runs.
    return jax.random.key(zlib.crc32(request.node.nodeid.encode()))


def pytest_collection_modifyitems(config, items):
    skip = None
    for item in items:
        path = str(item.path).replace("\\", "/")
        if not any(folder in path for folder in GPU_FOLDERS):
            continue
        item.add_marker(pytest.mark.gpu)
        if skip is None:
            skip = gpu_skip_reason() or ""
        if skip:
            item.add_marker(pytest.mark.skip(reason=f"GPU test: {skip}"))
