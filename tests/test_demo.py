"""``python -m jax_swiglu.demo`` runs end to end (small sizes), on whatever this machine has."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flax", reason="the demo needs flax (pip install 'jax_swiglu[flax]')")

import jax_swiglu  # noqa: E402
from conftest import gpu_skip_reason  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def test_demo_runs():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-m", "jax_swiglu.demo", "--layers", "2", "--prefill-tokens", "96",
         "--decode-tokens", "4", "--runs", "2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "prefill: x [1, 96, 896], M = 96" in out and "decode: x [4, 1, 896], M = 4" in out
    if jax_swiglu.kernels_available():  # the demo lowers for CUDA and counts the custom calls
        # prefill (M = 96) runs the fused kernel; decode (M = 4) is XLA's, as the table says
        assert out.count("2 custom calls, jax_swiglu_interleaved_bf16") == 1
        assert out.count("no jax_swiglu custom call (the selection table picks the XLA") == 1
    if gpu_skip_reason() is None:
        assert out.count("time per forward (2 blocks, median of 2)") == 2
    else:
        assert "NO SM90 GPU, REFERENCE PATH" in out
        assert out.count("max |error| = 0 ") == 2
        assert "time per forward" not in out
