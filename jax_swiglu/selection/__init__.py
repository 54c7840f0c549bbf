"""Kernel selection: which implementation (and launch) runs a call of a given static shape.

``choose`` is what the lowering calls. The ``kernel=`` argument and the ``JAX_SWIGLU_KERNEL``
environment variable come first; then the checks that force the XLA path (no extension, a
non-CUDA platform, a non-SM90 GPU); then, for ``"auto"`` (or a forced kernel family, among
its own configs), the engine (_engine.py): autotune cache, shipped tuning data, learned rule,
analytic heuristic, XLA. ``JAX_SWIGLU_CONFIG`` forces one launch, for experiments.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings

import jax
import numpy as np

from .. import _native
from . import _device, _engine

# Public names of the implementations. "xla" is the plain XLA reference path.
KERNELS = ("interleaved", "pingpong", "gemv", "xla")
KERNEL_CHOICES = ("auto",) + KERNELS
ENV_VAR = "JAX_SWIGLU_KERNEL"
# Forces the launch of the fused kernel chosen, as "<config id>" (an id of kernel_configs()),
# optionally followed by ",swizzle=<1|2|4|8>", ",raster=<heuristic|m|n>" (the persistent
# scheduler's tile order) and ",splits=<n>" (a stream-K config's split-K factor). The
# calibration uses it through JAX; not meant for production.
CONFIG_ENV_VAR = "JAX_SWIGLU_CONFIG"
RASTER_ORDERS = {"heuristic": 0, "m": 1, "n": 2}  # FFI attribute values
SWIZZLES = (1, 2, 4, 8)
MAX_SPLITS = 16  # as the FFI handler accepts


@dataclasses.dataclass(frozen=True)
class Choice:
    """What the lowering emits for one call."""

    kernel: str  # one of KERNELS
    config: _native.KernelConfig | None  # None for "xla"
    target: str | None  # FFI target name, None for "xla"
    reason: str
    source: str = ""  # which step of the selection decided
    swizzle: int = 1
    raster: str = "heuristic"
    splits: int = 1

    def ffi_attributes(self) -> dict:
        """The custom call's attributes (exactly typed, as the FFI handler binds them)."""
        return {"config": np.int64(self.config.id), "swizzle": np.int64(self.swizzle),
                "raster": np.int64(RASTER_ORDERS[self.raster]),
                "splits": np.int64(self.splits)}

    def describe(self) -> str:
        by = f"{self.source}: " if self.source else ""
        if self.config is None:
            return f"xla ({by}{self.reason})"
        order = ""
        if self.swizzle != 1 or self.raster != "heuristic":
            order = f", swizzle {self.swizzle} raster {self.raster}"
        splits = f", split-K {self.splits}" if self.splits > 1 else ""
        return (f"{self.kernel} [{self.target}, config {self.config.id}: "
                f"{self.config.describe()}{splits}{order}] ({by}{self.reason})")


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


def local_gpu_is_sm90() -> bool | None:
    """True/False for the local CUDA GPU; None when there is none (cross-lowering)."""
    device = _device.local_device()
    return None if device is None else device.compute_capability == 90


def kernels_unusable_reason() -> str | None:
    """Why the fused kernels cannot run on this machine's GPU, or None if they can."""
    if not _native.kernels_available():
        return _native.unavailable_reason()
    sm90 = local_gpu_is_sm90()
    if sm90 is None:
        return "JAX sees no CUDA GPU"
    if not sm90:
        capability = getattr(jax.devices("cuda")[0], "compute_capability", "?")
        return f"the GPU has compute capability {capability}; the kernels need SM90 (Hopper)"
    return None


def _xla(reason: str, source: str = "") -> Choice:
    return Choice("xla", None, None, reason, source)


def choose(m: int, n: int, k: int, dtype, *, kernel: str = "auto", platform: str = "cuda",
           activation: str = "silu") -> Choice:
    """Picks the implementation for a ``[m, k] x [k, 2n]`` call of ``dtype`` on ``platform``.

    The activation does not enter the decision: it changes a few instructions per output
    element of the epilogue, not the tiles' traffic or waves, so the tuning data (measured
    with SiLU) serves both; it picks the FFI target.
    """
    from .. import __version__

    requested, source = requested_kernel(kernel)
    if requested == "xla":
        return _xla(source, "override")
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

    dtype_name = jax.numpy.dtype(dtype).name
    family = None if requested == "auto" else requested
    if family is not None and family not in _native.kernel_configs():
        raise RuntimeError(f"{source} was requested, but the {family} kernel is not compiled "
                           "in this build (rebuild with -DJAX_SWIGLU_ALL_CONFIGS=ON)")
    decision = _engine.decide(m, n, k, dtype_name, kernel=family, version=__version__)
    forced = os.environ.get(CONFIG_ENV_VAR, "").strip()
    if family is not None and decision.config is None and not forced:
        # A forced family that cannot run this M (the gemv kernel's few tokens).
        raise ValueError(f"{source} was requested, but {decision.reason}")
    if decision.config is None and not forced:
        return _xla(decision.reason, decision.source)
    kernel_name = family or (decision.config.kernel if decision.config is not None
                             else "interleaved")
    configs = _native.kernel_configs()[kernel_name]
    launch = {"config": decision.config.id if decision.config is not None else min(configs),
              "swizzle": 1, "raster": "heuristic", "splits": decision.splits}
    reason, by = decision.reason, decision.source
    if family is not None:
        by = f"{source}, then {by}"
    if forced:
        launch.update(_parse_forced_launch(forced, configs))
        by, reason = f"{CONFIG_ENV_VAR}={forced}", f"forced; the selection said {reason}"
        config = configs[launch["config"]]
        if config.max_m is not None and m > config.max_m:
            raise ValueError(f"{CONFIG_ENV_VAR}={forced!r}: {config.kernel} config {config.id} "
                             f"runs at most {config.max_m} tokens, got M={m}")
        if m % config.m_multiple:
            # Its tile order runs M in bands of whole clusters of tiles (ffi/kernels/m_bands.cuh).
            raise ValueError(f"{CONFIG_ENV_VAR}={forced!r}: config {config.id} runs M in "
                             f"{config.m_bands} bands and needs M to be a multiple of "
                             f"{config.m_multiple}, got M={m}")
        if config.scheduler == "split-tail" and launch["swizzle"] != 1:
            # Its mainloop plans the split on tiles padded to clusters, not to swizzle groups.
            raise ValueError(f"{CONFIG_ENV_VAR}={forced!r}: config {config.id} splits "
                             "its last round of tiles and takes no swizzle")
        if launch["splits"] > 1 and not config.splits_k:
            raise ValueError(f"{CONFIG_ENV_VAR}={forced!r}: config {config.id} has no "
                             "split-K (only stream-K and gemv configs take splits)")
        if (config.scheduler == "cluster-split-k"
                and launch["splits"] not in config.split_choices(k)):
            raise ValueError(f"{CONFIG_ENV_VAR}={forced!r}: the gemv kernel splits K over a "
                             f"cluster of {config.split_choices(k)} CTAs for K={k}")
    target = _native.targets().get((kernel_name, activation, dtype_name))
    if target is None:
        raise TypeError(f"the {kernel_name} kernel is not built for activation {activation!r} "
                        f"and dtype {dtype}; this build has {sorted(_native.targets())}")
    config = configs[launch["config"]]
    splits = launch["splits"] if config.splits_k else 1
    return Choice(kernel_name, config, target, reason, by, launch["swizzle"], launch["raster"],
                  splits)


def _parse_forced_launch(text: str, configs) -> dict:
    def bad(why):
        return ValueError(f"{CONFIG_ENV_VAR}={text!r}: {why}")

    config, *options = [part.strip() for part in text.split(",")]
    launch = {}
    if config:
        if not config.isdigit() or int(config) not in configs:
            raise bad(f"config must be one of {sorted(configs)}")
        launch["config"] = int(config)
    for option in options:
        key, _, value = option.partition("=")
        if key == "swizzle" and value.isdigit() and int(value) in SWIZZLES:
            launch["swizzle"] = int(value)
        elif key == "raster" and value in RASTER_ORDERS:
            launch["raster"] = value
        elif key == "splits" and value.isdigit() and 1 <= int(value) <= MAX_SPLITS:
            launch["splits"] = int(value)
        else:
            raise bad(f"options are swizzle={'|'.join(map(str, SWIZZLES))}, "
                      f"raster={'|'.join(RASTER_ORDERS)} and splits=1..{MAX_SPLITS}, "
                      f"got {option!r}")
    return launch
