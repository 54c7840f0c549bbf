"""Kernel selection: which kernel (and tile config) runs for a given static shape.

``SELECTION_TABLE`` is the one table the lowering reads. ``choose`` applies it, after the
overrides (the ``kernel=`` argument, then the ``JAX_SWIGLU_KERNEL`` environment variable)
and the checks that can force the XLA path (no extension, non-CUDA platform, non-SM90 GPU).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings

import jax

from . import _native

# Public names of the implementations. "xla" is the plain XLA reference path.
KERNELS = ("interleaved", "xla")
KERNEL_CHOICES = ("auto",) + KERNELS
ENV_VAR = "JAX_SWIGLU_KERNEL"
# Tuning knob: forces the tile config (an id of kernel_configs()) of the fused kernel
# chosen. The benchmarks use it to measure every config; not meant for production.
CONFIG_ENV_VAR = "JAX_SWIGLU_CONFIG"


@dataclasses.dataclass(frozen=True)
class Rule:
    """Use ``kernel`` with tile config ``config`` when M <= ``max_m`` (None: any M)."""

    max_m: int | None
    kernel: str
    config: int | None
    why: str


# Rows are tried in order; the first whose max_m admits M wins.
# Provenance: initial rows from the tile shapes alone (64-row tiles waste less of a
# partial tile at decode sizes); not yet calibrated on the GPU.
SELECTION_TABLE: tuple[Rule, ...] = (
    Rule(64, "interleaved", 1,
         "M <= 64: one 64-row pingpong tile covers all tokens, half the idle rows of a 128-row tile"),
    Rule(None, "interleaved", 0,
         "M > 64: 128x256 cooperative tiles with a 2x1 cluster sharing weight tiles"),
)


@dataclasses.dataclass(frozen=True)
class Choice:
    """What the lowering emits for one call."""

    kernel: str  # one of KERNELS
    config: _native.KernelConfig | None  # None for "xla"
    target: str | None  # FFI target name, None for "xla"
    reason: str

    def describe(self) -> str:
        if self.config is None:
            return f"xla ({self.reason})"
        return f"{self.kernel} [{self.target}, {self.config.describe()}] ({self.reason})"


def check_kernel_name(kernel: str) -> None:
    if kernel not in KERNEL_CHOICES:
        raise ValueError(f"kernel must be one of {KERNEL_CHOICES}, got {kernel!r}")


def requested_kernel(kernel: str) -> tuple[str, str]:
    """The kernel asked for, and by whom: the argument wins, then the environment."""
    check_kernel_name(kernel)
    if kernel != "auto":
        return kernel, f"kernel={kernel!r}"
    env = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if env not in KERNEL_CHOICES:
        raise ValueError(f"{ENV_VAR}={env!r}: must be one of {KERNEL_CHOICES}")
    return env, (f"{ENV_VAR}={env}" if env != "auto" else "auto")


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


@functools.cache
def local_gpu_is_sm90() -> bool | None:
    """True/False for the local CUDA GPU; None when there is none (cross-lowering)."""
    try:
        devices = jax.devices("cuda")
    except RuntimeError:
        return None
    capability = getattr(devices[0], "compute_capability", None)
    if capability is None:
        return None
    return str(capability) in ("9.0", "90")


def _lookup(m: int, kernel: str | None = None) -> Rule | None:
    """The first row admitting M (among ``kernel``'s rows, if given; else its last)."""
    rows = [rule for rule in SELECTION_TABLE if kernel is None or rule.kernel == kernel]
    for rule in rows:
        if rule.max_m is None or m <= rule.max_m:
            return rule
    return rows[-1] if rows else None


def _xla(reason: str) -> Choice:
    return Choice("xla", None, None, reason)


def choose(m: int, n: int, k: int, dtype, *, kernel: str = "auto",
           platform: str = "cuda") -> Choice:
    """Picks the implementation for a ``[m, k] x [k, 2n]`` call of ``dtype`` on ``platform``."""
    del n, k  # the table is by M for now; the signature is what later tables need
    requested, source = requested_kernel(kernel)
    if requested == "xla":
        return _xla(source)
    if platform != "cuda":
        if requested != "auto":
            # Forcing a kernel is for CUDA; elsewhere the reference is the only path.
            return _xla(f"{source} ignored on platform {platform!r}: no fused kernel there")
        return _xla(f"platform {platform!r} has no fused kernel")

    if not _native.kernels_available():
        why = _native.unavailable_reason()
        if requested != "auto":
            raise RuntimeError(f"{source} was requested, but {why}")
        _warn_once(f"jax_swiglu: {why}")
        return _xla("the CUDA extension is not built")
    sm90 = local_gpu_is_sm90()
    if sm90 is False:
        why = "the fused kernels need an SM90 (Hopper) GPU and this GPU is not one"
        if requested != "auto":
            raise RuntimeError(f"{source} was requested, but {why}")
        _warn_once(f"jax_swiglu: {why}; using the XLA path")
        return _xla("GPU is not SM90")

    if requested == "auto":
        rule = _lookup(m)
        kernel_name, config_id, reason = rule.kernel, rule.config, rule.why
    else:  # forced: the tile config the table uses for that kernel at this M
        rule = _lookup(m, requested)
        kernel_name = requested
        config_id = rule.config if rule else min(_native.kernel_configs()[requested])
        reason = source
    if kernel_name == "xla":
        return _xla(reason)
    target = _native.targets().get((kernel_name, jax.numpy.dtype(dtype).name))
    if target is None:
        raise TypeError(f"the {kernel_name} kernel is not built for dtype {dtype}")
    configs = _native.kernel_configs()[kernel_name]
    forced_config = os.environ.get(CONFIG_ENV_VAR, "").strip()
    if forced_config:
        if not forced_config.isdigit() or int(forced_config) not in configs:
            raise ValueError(
                f"{CONFIG_ENV_VAR}={forced_config!r}: the {kernel_name} kernel has configs "
                f"{sorted(configs)}")
        config_id = int(forced_config)
        reason += f", {CONFIG_ENV_VAR}={config_id}"
    return Choice(kernel_name, configs[config_id], target, reason)
