"""The tuning timer's bookkeeping on the CPU (the native launches faked): interleaved rounds,
medians, failures and wrong outputs reported, never chosen."""

import jax
import jax.numpy as jnp
import pytest

from jax_swiglu import _launch, _native, selection
from jax_swiglu.selection import _device
from jax_swiglu.tuning import measure

from test_selection import BANDED, CONFIGS, DECODE, PREFILL

PROBLEM = selection.Problem(8, 128, 64, "bfloat16")


@pytest.fixture
def fake_native(monkeypatch):
    calls = []
    times = {PREFILL.id: [5.0, 7.0, 6.0], DECODE.id: [3.0, 2.0, 4.0]}

    def time_launches(config, dtype, *, samples, **kwargs):
        calls.append(config)
        if config == BANDED.id:
            raise RuntimeError("config 2 runs M in 2 bands")
        assert samples == 1  # one sample per round
        return [times[config][sum(c == config for c in calls) - 1]]

    monkeypatch.setattr(_native, "time_launches", time_launches)
    monkeypatch.setattr(_native, "workspace_bytes", lambda *a, **k: 0)
    monkeypatch.setattr(_native, "all_configs", lambda: CONFIGS)
    monkeypatch.setattr(measure, "_output_stats", lambda out: (0, 1.0))
    return calls


def _inputs():
    return measure.make_inputs(jax.random.key(0), PROBLEM, 1)


def test_rounds_interleave_the_launches(fake_native):
    device = _device.Device("NVIDIA H200", 90, 132, 4.9e12, local=False)
    launches = [_launch.Launch(c.id) for c in (PREFILL, DECODE, BANDED)]
    results = measure.time_launches(PROBLEM, launches, samples=3, device=device,
                                    inputs=_inputs())
    # Every round times every launch once (the failed one only until it fails).
    assert fake_native[:3] == [PREFILL.id, DECODE.id, BANDED.id]
    assert sorted(fake_native[3:5]) == sorted(fake_native[5:7]) == [PREFILL.id, DECODE.id]
    assert results[PREFILL.key]["us"] == 6.0 and results[DECODE.key]["us"] == 3.0
    assert results[BANDED.key]["us"] is None and "bands" in results[BANDED.key]["error"]


def test_a_launch_with_wrong_outputs_is_flagged(monkeypatch, fake_native):
    magnitudes = iter([1.0, 1.5])  # PREFILL's output, then DECODE's: 50 % apart
    monkeypatch.setattr(measure, "_output_stats", lambda out: (0, next(magnitudes, 1.0)))
    results = measure.time_launches(
        PROBLEM, [_launch.Launch(PREFILL.id), _launch.Launch(DECODE.id)], samples=1,
        device=_device.Device("x", 90, 132, 4.9e12, local=False), inputs=_inputs())
    assert any("mean |output|" in (r["error"] or "") for r in results.values())


@pytest.mark.skipif(not _native.kernels_available(), reason="needs the built extension's config table")
@pytest.mark.parametrize("m", [1, 8, 16])
def test_autotune_candidates_include_every_decode_form_at_every_split(m):
    """What autotune times at decode M: each gemv row that holds M tokens (both forms) at
    every cluster split K allows, beside the swap-AB rows, on a 7B-sized shape."""
    problem = selection.Problem(m, 14336, 4096, "bfloat16")
    launches = {(launch.row.id, launch.splits) for launch in measure.candidate_launches(problem)}
    table = _native.kernel_configs()
    gemv = [row for row in table.values() if row.family == "gemv" and row.max_m >= m
            and row.operands == "16bit"]  # (a bfloat16 problem)
    assert {row.schedule for row in gemv} == {"cuda-cores", "tensor-cores"} or m > 8
    for row in gemv:
        splits = _native.split_choices(row.id, problem.k)
        assert len(splits) > 1 and {(row.id, s) for s in splits} <= launches
    assert any(table[config].family == "interleaved" and table[config].m_side == "weights"
               for config, _ in launches)
