"""Fixtures every test shares; helpers live in tests/helpers.py (importable as ``helpers``)."""

import zlib

import jax
import pytest


@pytest.fixture
def key(request):
    # A different key per test, stable across runs.
    return jax.random.key(zlib.crc32(request.node.nodeid.encode()))
