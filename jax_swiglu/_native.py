"""Loads the compiled kernels (``jax_swiglu._kernels``) and registers their FFI targets.

The extension is optional: without nvcc at install time the package is pure Python and
everything runs on the XLA reference path. ``kernels_available()`` says which it is.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util

import jax

from . import _layout

if importlib.util.find_spec(f"{__package__}._kernels") is None:
    _kernels = None
    _IMPORT_ERROR: str | None = "the extension was not built (no nvcc at install time)"
else:
    try:
        from . import _kernels  # type: ignore[attr-defined]
        _IMPORT_ERROR = None
    except ImportError as error:  # built, but cannot load (e.g. a missing library)
        _kernels = None
        _IMPORT_ERROR = f"the extension failed to load: {error}"


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """One tile configuration: a row of ffi/kernel_configs.h, which says what each column
    means (the extension's rows, or a row tuning data recorded from the build it measured)."""

    kernel: str
    id: int
    schedule: str
    tile_m: int  # tokens per tile
    tile_n: int  # packed columns (gate + up) per tile
    tile_k: int
    cluster_m: int
    cluster_n: int
    # "persistent", "stream-k" (tiles also split along K: a workspace), "split-tail" (the
    # last round's tiles split into 64-row halves on otherwise idle CTAs) or
    # "cluster-split-k" (the gemv kernel: K split over a cluster of CTAs, no workspace)
    scheduler: str = "persistent"
    store: str = "tma"  # or "direct": output from registers to global memory, no smem tile
    # persistent scheduler: tiles visited in this many bands of M (M a multiple of
    # m_bands * tile_m * cluster_m)
    m_bands: int = 1
    # "tokens" (x rows on the wgmma M side) or "weights" (swap-AB: packed columns on it)
    m_side: str = "tokens"
    optional: bool = False  # compiled only with JAX_SWIGLU_ALL_CONFIGS

    def describe(self) -> str:
        if self.is_gemv:
            how = "CUDA cores" if self.schedule == "cuda-cores" else "mma.sync on the tensor cores"
            return (f"{how}, up to {self.tile_m} tokens, {self.tile_n} packed columns "
                    f"per CTA, K split over a cluster, direct store")
        return (f"{self.schedule} {self.tile_m}x{self.tile_n}x{self.tile_k}, "
                f"cluster {self.cluster_m}x{self.cluster_n}"
                + (", swap-AB" if self.m_side == "weights" else "")
                + (", stream-K" if self.scheduler == "stream-k" else "")
                + (", split tail" if self.scheduler == "split-tail" else "")
                + (", direct store" if self.store == "direct" else "")
                + (f", M in {self.m_bands} bands" if self.m_bands > 1 else ""))

    @property
    def key(self) -> str:
        """A name for the configuration from its definition alone, not its row id: how tuning
        data refers to it, so the data stays valid when rows are added or reordered."""
        return config_key(self.kernel, self.schedule, self.m_side, self.tile_m, self.tile_n,
                          self.tile_k, self.cluster_m, self.cluster_n, self.scheduler,
                          self.store, self.m_bands)

    @property
    def m_multiple(self) -> int:
        """The M this config needs a multiple of (1: any M)."""
        return self.m_bands * self.tile_m * self.cluster_m if self.m_bands > 1 else 1

    @property
    def is_gemv(self) -> bool:
        """A row of the gemv kernel (either form: CUDA cores or mma.sync)."""
        return self.scheduler == "cluster-split-k"

    @property
    def max_m(self) -> int | None:
        """The most tokens the config runs (None: any M). The gemv kernel keeps every
        token's sums in registers, so its rows are built for at most tile_m tokens."""
        return self.tile_m if self.is_gemv else None

    @property
    def ctas_per_sm(self) -> int:
        """CTAs one SM holds at once. The gemv kernel's launch bounds ask for two where the
        sums leave room in the registers (ffi/kernels/gemv_kernel.cuh: GemvMinBlocks for the
        CUDA-core form, at most 4 tokens; always for the mma.sync form), one otherwise; the
        wgmma kernels are persistent, one CTA per SM."""
        if self.schedule == "cuda-cores":
            return 2 if self.tile_m <= 4 else 1
        return 2 if self.schedule == "mma-sync" else 1

    def runs(self, m: int) -> bool:
        """Whether the config can run M tokens."""
        return m % self.m_multiple == 0 and (self.max_m is None or m <= self.max_m)

    @property
    def splits_k(self) -> bool:
        """Whether the config takes a split-K factor (the ``splits`` launch attribute)."""
        return self.scheduler in ("stream-k", "cluster-split-k")

    def split_choices(self, k: int, stream_k_splits=(1, 2, 4)) -> tuple[int, ...]:
        """The split-K factors worth measuring for K: ``stream_k_splits`` for a stream-K
        config (at most one split per k tile); the cluster sizes of the gemv kernel (1, 2, 4
        or 8 CTAs, at least one step of tile_k rows each; a last step may be partial)."""
        if self.is_gemv:
            return tuple(s for s in GEMV_SPLITS if s <= -(-k // self.tile_k))
        if self.scheduler == "stream-k":
            k_tiles = -(-k // self.tile_k)
            return tuple(s for s in stream_k_splits if s == 1 or s <= k_tiles)
        return (1,)


# Cluster sizes the gemv kernel splits K over (ffi/kernels/gemv_kernel.cuh).
GEMV_SPLITS = (1, 2, 4, 8)


def config_key(kernel, schedule, m_side, tile_m, tile_n, tile_k, cluster_m, cluster_n,
               scheduler, store, m_bands) -> str:
    return (f"{kernel}/{schedule}/{m_side}/{tile_m}x{tile_n}x{tile_k}/{cluster_m}x{cluster_n}/"
            f"{scheduler}/{store}" + (f"/bands{m_bands}" if m_bands > 1 else ""))


def kernels_available() -> bool:
    """True if the CUDA kernels were built and loaded (they still need an SM90 GPU)."""
    return _kernels is not None


def unavailable_reason() -> str | None:
    """Why the kernels are not available, or None if they are."""
    if _kernels is None:
        return (f"jax_swiglu's CUDA kernels are unavailable: {_IMPORT_ERROR}; the XLA "
                "reference path runs instead")
    return None


@functools.cache
def targets() -> dict[tuple[str, str, str], str]:
    """``(kernel, activation, dtype name) -> FFI target name``, as the extension defines them."""
    if _kernels is None:
        return {}
    return {(t["kernel"], t["activation"], t["dtype"]): t["name"] for t in _kernels.targets()}


@functools.cache
def activations() -> tuple[str, ...]:
    """The activations the extension's kernels are compiled for (empty without it)."""
    return () if _kernels is None else tuple(_kernels.activations())


@functools.cache
def kernel_configs() -> dict[str, dict[int, KernelConfig]]:
    """``kernel -> {config id -> KernelConfig}`` from the compiled table."""
    if _kernels is None:
        return {}
    table: dict[str, dict[int, KernelConfig]] = {}
    for row in _kernels.kernel_configs():
        config = KernelConfig(**row)
        table.setdefault(config.kernel, {})[config.id] = config
    return table


@functools.cache
def fp8_targets() -> dict[tuple[str, str], str]:
    """``(activation, output dtype name) -> FFI target name`` of the fp8 kernel."""
    if _kernels is None or not hasattr(_kernels, "fp8_targets"):
        return {}
    return {(t["activation"], t["dtype"]): t["name"] for t in _kernels.fp8_targets()}


@functools.cache
def fp8_configs() -> dict[int, KernelConfig]:
    """``config id -> KernelConfig`` of the fp8 kernel's table (ffi/kernel_configs.h)."""
    if _kernels is None or not hasattr(_kernels, "fp8_configs"):
        return {}
    return {row["id"]: KernelConfig(**row) for row in _kernels.fp8_configs()}


# SMs of a full GH100: with no local GPU the workspace is sized for every SM count up to it.
_MAX_SM_COUNT = 144


def device_facts() -> dict:
    """The local CUDA device's SM count, compute capability (90 for SM90), L2 size and peak
    DRAM bandwidth, as the extension reads them; zeros without a GPU or the extension."""
    if _kernels is None:
        return {"sm_count": 0, "compute_capability": 0, "l2_bytes": 0, "dram_bytes_per_s": 0.0}
    return dict(_kernels.device_facts())


def workspace_bytes(kernel: str, dtype: str, config: int, *, m: int, n: int, n_packed: int,
                    k: int, swizzle: int, raster: int, splits: int = 1,
                    activation: str = "silu") -> int:
    """Bytes of scratch one call of ``kernel``/``config`` needs (0 for most configs).

    A stream-K split depends on the SM count: sized for the local GPU's, or, lowering with
    no local GPU, the largest size over every SM count an SM90 part can have. The FFI
    handler checks the size again on the GPU it runs on and fails the call if too small.
    """
    if _kernels is None:
        return 0
    local = _kernels.device_sm_count()
    return max(int(_kernels.workspace_bytes(kernel, activation, dtype, config, m, n, n_packed,
                                            k, swizzle, raster, splits, sm_count))
               for sm_count in ([local] if local else range(1, _MAX_SM_COUNT + 1)))


def time_launches(kernel: str, dtype: str, config: int, *, m: int, n: int, n_packed: int,
                  k: int, swizzle: int, raster: int, splits: int, xs, packed, out, workspace,
                  calls: int, samples: int, activation: str = "silu") -> list[float]:
    """Per-launch GPU times (us) of one config by CUDA-graph replay (ffi/timing.h), launch i
    on input set i % len(xs). ``xs``, ``packed``, ``out`` and ``workspace`` are device arrays
    (jax arrays on one GPU) that stay alive and unread by JAX during the call."""
    if _kernels is None:
        raise RuntimeError(unavailable_reason())

    def pointer(array):
        return array.unsafe_buffer_pointer()

    return list(_kernels.time_launches(
        kernel, activation, dtype, config, m, n, n_packed, k, swizzle, raster, splits,
        [pointer(x) for x in xs], [pointer(p) for p in packed], pointer(out),
        pointer(workspace) if workspace is not None else 0,
        int(workspace.size) if workspace is not None else 0, calls, samples))


def _register() -> None:
    if _kernels is None:
        return
    if _kernels.gate_up_block != _layout.GATE_UP_BLOCK:
        raise ImportError(
            f"jax_swiglu: the compiled kernels read gate/up blocks of {_kernels.gate_up_block} "
            f"but the Python layout packs blocks of {_layout.GATE_UP_BLOCK}; rebuild the package")
    for name, capsule in _kernels.registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")


_register()
