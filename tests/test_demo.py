"""``python -m jax_swiglu.demo`` runs end to end (small sizes), on whatever this machine has."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flax", reason="the demo needs flax (pip install 'jax_swiglu[flax]')")

import jax_swiglu  # noqa: E402
from helpers import gpu_skip_reason  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def test_demo_runs():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-m", "jax_swiglu.demo", "--layers", "2", "--prefill-tokens", "96",
         "--decode-tokens", "1", "4", "--runs", "2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "prefill: x [1, 96, 896], M = 96" in out
    assert "decode, batch 1: x [1, 1, 896], M = 1" in out
    assert "decode, batch 4: x [4, 1, 896], M = 4" in out
    if jax_swiglu.kernels_available():  # the demo lowers for CUDA and counts the custom calls
        # Each call's HLO agrees with the kernel the demo printed for it: the fused kernel's
        # custom call in both blocks, or none where the selection picks XLA.
        blocks = out.split("\n\n")[1:]
        calls = [b for b in blocks if "kernel: M=" in b]
        assert len(calls) == 3
        for block in calls:
            picks = re.search(r"details: (\w+) [\[(]", block)
            picks_xla = picks is not None and picks.group(1) == "xla"
            assert ("no jax_swiglu custom call" in block) == picks_xla, block
            if not picks_xla:
                assert f"2 custom calls, jax_swiglu_{picks.group(1)}_silu_bf16" in block, block
    if gpu_skip_reason() is None:
        assert out.count("time per forward (2 blocks, median of 2)") == 3
    else:
        assert "NO SM90 GPU, REFERENCE PATH" in out
        assert out.count("max |error| = 0 ") == 3
        assert "time per forward" not in out
