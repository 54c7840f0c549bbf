"""The tuning timer's bookkeeping on the CPU (the native launches faked): interleaved rounds,
medians, failures and wrong outputs reported, never chosen."""

import jax.numpy as jnp
import pytest

from jax_swiglu import _native, _tuning
from jax_swiglu.selection import _device

from test_selection import BANDED, DECODE, PREFILL


@pytest.fixture
def fake_native(monkeypatch):
    calls = []
    times = {PREFILL.id: [5.0, 7.0, 6.0], DECODE.id: [3.0, 2.0, 4.0]}

    def time_launches(kernel, dtype, config, *, samples, **kwargs):
        calls.append(config)
        if config == BANDED.id:
            raise RuntimeError("config 2 runs M in 2 bands")
        assert samples == 1  # one sample per round
        return [times[config][sum(c == config for c in calls) - 1]]

    monkeypatch.setattr(_native, "time_launches", time_launches)
    monkeypatch.setattr(_native, "workspace_bytes", lambda *a, **k: 0)
    monkeypatch.setattr(_tuning, "_output_stats", lambda out: (0, 1.0))
    return calls


def test_rounds_interleave_the_launches(fake_native):
    device = _device.Device("NVIDIA H200", 90, 132, 4.9e12, local=False)
    weights = [jnp.zeros((64, 256), jnp.bfloat16)]
    results = _tuning.time_launches(8, 128, 64, jnp.bfloat16,
                                    [(PREFILL, 1), (DECODE, 1), (BANDED, 1)], samples=3,
                                    device=device, weights=weights)
    # Every round times every launch once (the failed one only until it fails).
    assert fake_native[:3] == [PREFILL.id, DECODE.id, BANDED.id]
    assert sorted(fake_native[3:5]) == sorted(fake_native[5:7]) == [PREFILL.id, DECODE.id]
    assert results[PREFILL.key]["us"] == 6.0 and results[DECODE.key]["us"] == 3.0
    assert results[BANDED.key]["us"] is None and "bands" in results[BANDED.key]["error"]


def test_a_launch_with_wrong_outputs_is_flagged(monkeypatch, fake_native):
    magnitudes = iter([1.0, 1.5])  # PREFILL's output, then DECODE's: 50 % apart
    monkeypatch.setattr(_tuning, "_output_stats", lambda out: (0, next(magnitudes, 1.0)))
    results = _tuning.time_launches(
        8, 128, 64, jnp.bfloat16, [(PREFILL, 1), (DECODE, 1), (PREFILL, 1)], samples=1,
        device=_device.Device("x", 90, 132, 4.9e12, local=False),
        weights=[jnp.zeros((64, 256), jnp.bfloat16)])
    assert any("mean |output|" in (r["error"] or "") for r in results.values())
