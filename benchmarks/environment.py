"""Where a measurement was made: the provenance every results file and tuning entry carries."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys

import jax


def git_commit() -> str | None:
    """Short commit of the checkout, "+" if tracked files differ from it; None outside git."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here,
                              capture_output=True, text=True, timeout=30)
        if head.returncode != 0:
            return None
        diff = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=here,
                              capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+" if diff.returncode == 1 else "")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _first_line(command) -> str | None:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.strip().splitlines()
    return lines[0] if lines else None


def environment() -> dict:
    import jax_swiglu

    device = jax.devices()[0]
    smi = _first_line(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,"
                       "clocks.mem,power.limit", "--format=csv,noheader"])
    nvcc = None
    try:
        nvcc_out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True,
                                  timeout=30).stdout.strip().splitlines()
        nvcc = nvcc_out[-1] if nvcc_out else None
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "device": getattr(device, "device_kind", str(device)),
        "nvidia_smi": smi,
        "driver": smi.split(",")[1].strip() if smi and smi.count(",") >= 1 else None,
        "nvcc": nvcc,
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "cutlass": _version("nvidia-cutlass"),
        "jax_swiglu": jax_swiglu.__version__,
        "python": platform.python_version(),
        "git": git_commit(),
    }
