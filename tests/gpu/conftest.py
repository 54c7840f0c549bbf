"""Every test under tests/gpu needs an SM90 GPU and the compiled kernels: each is marked
``gpu`` and skips, with the reason, where there is none (CI runs them as skips)."""

import pytest

from helpers import gpu_skip_reason

_SKIP = gpu_skip_reason()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/gpu/" not in str(item.path).replace("\\", "/"):
            continue
        item.add_marker(pytest.mark.gpu)
        if _SKIP is not None:
            item.add_marker(pytest.mark.skip(reason=f"GPU test: {_SKIP}"))
