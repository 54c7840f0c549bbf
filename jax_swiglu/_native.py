"""Loads the compiled kernels (``jax_swiglu._kernels``) and registers their FFI targets.

The extension is optional: without nvcc at install time the package is pure Python and
everything runs on the XLA reference path. ``kernels_available()`` says which it is.

Everything about a kernel config comes from C++ (``ffi/kernel_configs.h`` and
``ffi/can_implement.h``): the table's rows and what follows from them (the most tokens a row
runs, the M it needs a multiple of, its CTAs per SM), whether a row can run a problem, its
split choices and its workspace size. Python holds no copy of those rules.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util

import jax
import jax.numpy as jnp

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

# Operands of a row: bfloat16/float16 x and packed weights, or e4m3 ones with fp32 scales.
OPERANDS = ("16bit", "e4m3")


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """One row of the config table (ffi/kernel_configs.h, which says what each column means),
    as the extension reports it, or as tuning data recorded it from the build that measured it.
    A plain record: the derived columns (max_m, m_multiple, ctas_per_sm, takes_splits) are the
    extension's answers, recorded with the row."""

    family: str  # "interleaved", "gate_then_up" or "gemv"
    id: int
    schedule: str  # "cooperative", "pingpong" (CUTLASS's schedules) or "cuda-cores"
    tile_m: int  # tokens per tile (the gemv rows: the most tokens they run)
    tile_n: int  # packed columns (gate + up) per tile
    tile_k: int
    cluster_m: int
    cluster_n: int
    # "persistent", "stream-k" (tiles also split along K: a workspace), "split-tail" (the
    # last round's tiles split into 64-row halves on otherwise idle CTAs) or
    # "cluster-split-k" (the gemv kernel: K split over a cluster of CTAs, no workspace)
    scheduler: str = "persistent"
    store: str = "tma"  # or "direct": output from registers to global memory, no smem tile
    # persistent scheduler: tiles visited in this many bands of M (M a multiple of m_multiple)
    m_bands: int = 1
    # "tokens" (x rows on the wgmma M side) or "weights" (swap-AB: packed columns on it)
    m_side: str = "tokens"
    operands: str = "16bit"  # or "e4m3" (OPERANDS)
    # "promoted" (fp32 sums; an e4m3 row promotes the tensor cores' sums every `promotion`
    # wgmma), "promoted-in-halves" (e4m3: the same sums, each half of a warpgroup's columns
    # promoted while the tensor cores add the other's) or "fast" (e4m3: CUTLASS's
    # fast-accumulation mainloop, accumulation="fast" only)
    accumulation: str = "promoted"
    optional: bool = False  # compiled only with JAX_SWIGLU_ALL_CONFIGS
    compiled: bool = True
    max_m: int = 0  # the most tokens the row runs (0: any M)
    m_multiple: int = 1  # the M the row needs a multiple of
    ctas_per_sm: int = 1  # CTAs an SM holds at once (the gemv kernel's launch bounds)
    takes_splits: bool = False  # whether the `splits` launch attribute applies
    # runs grouped (mixture-of-experts) calls only: every expert's tiles in one persistent
    # grid, the group sizes read on the device (scheduler "grouped")
    grouped: bool = False

    @property
    def fast_accumulation(self) -> bool:
        """Whether the row's mainloop never promotes: it runs only accumulation="fast"."""
        return self.accumulation == "fast"

    def describe(self) -> str:
        fp8 = ("e4m3 fast accumulation, " if self.fast_accumulation else
               "e4m3 promoted in halves, " if self.accumulation == "promoted-in-halves" else
               "e4m3, " if self.operands == "e4m3" else "")
        if self.is_gemv:
            cores = "tensor cores (TMA, wgmma)" if self.schedule == "tensor-cores" else "CUDA cores"
            return (f"{fp8}{cores}, up to {self.tile_m} tokens, {self.tile_n} packed columns "
                    f"per CTA, K split over a cluster, direct store")
        if self.grouped:
            return (f"grouped {self.schedule} {self.tile_m}x{self.tile_n}x{self.tile_k}"
                    + (", swap-AB" if self.m_side == "weights" else "")
                    + ", every expert's tiles in one persistent grid, direct store")
        return (f"{fp8}{self.schedule} {self.tile_m}x{self.tile_n}x{self.tile_k}, "
                f"cluster {self.cluster_m}x{self.cluster_n}"
                + (", swap-AB" if self.m_side == "weights" else "")
                + (", stream-K" if self.scheduler == "stream-k" else "")
                + (", split tail" if self.scheduler == "split-tail" else "")
                + (", direct store" if self.store == "direct" else "")
                + (f", M in {self.m_bands} bands" if self.m_bands > 1 else ""))

    def in_words(self) -> str:
        """What the row's kernel does, without the tile jargon (docs/design.md has that)."""
        fp8 = ("fp8 fast-accumulation " if self.fast_accumulation else
               "fp8 " if self.operands == "e4m3" else "")
        if self.is_gemv:
            cores = "tensor-core" if self.schedule == "tensor-cores" else "CUDA-core"
            return (f"{fp8}{cores} GEMV: the weights streamed once, for at most "
                    f"{self.tile_m} token{'s' if self.tile_m > 1 else ''}")
        if self.grouped:
            return (f"{fp8}one grouped GEMM over every expert's packed gate/up weights, tiles "
                    f"of {self.tile_m} of an expert's tokens"
                    + (" on the tensor cores' narrow side" if self.m_side == "weights" else ""))
        if self.family == "gate_then_up":
            return f"{fp8}gate-then-up GEMM: each tile's gate product, then its up product"
        if self.m_side == "weights":
            return (f"{fp8}GEMM for few tokens: the weights on the tensor cores' wide side, "
                    f"tiles of {self.tile_m} tokens")
        return f"{fp8}one GEMM over the packed gate/up weights, tiles of {self.tile_m} tokens"

    @property
    def key(self) -> str:
        """A name for the configuration from its definition alone, not its row id: how tuning
        data refers to it, so the data stays valid when rows are added or reordered."""
        return config_key(self.family, self.operands, self.schedule, self.m_side, self.tile_m,
                          self.tile_n, self.tile_k, self.cluster_m, self.cluster_n,
                          self.scheduler, self.store, self.m_bands, self.accumulation)

    @property
    def is_gemv(self) -> bool:
        return self.scheduler == "cluster-split-k"

    def runs(self, m: int) -> bool:
        """Whether the row can run M tokens (the M-dependent part of can_implement)."""
        return m % self.m_multiple == 0 and (not self.max_m or m <= self.max_m)


def config_key(family, operands, schedule, m_side, tile_m, tile_n, tile_k, cluster_m,
               cluster_n, scheduler, store, m_bands, accumulation="promoted") -> str:
    kernel = family if operands == "16bit" else f"{family}/{operands}"
    if accumulation == "fast":
        kernel += "-fast"
    elif accumulation == "promoted-in-halves":
        kernel += "-halves"
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


def _require() -> None:
    if _kernels is None:
        raise RuntimeError(unavailable_reason())


@functools.cache
def targets() -> dict[tuple[str, str, str, str, bool], str]:
    """``(family, operands, activation, output dtype name, grouped) -> FFI target name``, as
    the extension defines them (grouped: the target of grouped rows, mixture-of-experts
    calls)."""
    if _kernels is None:
        return {}
    return {(t["family"], t["operands"], t["activation"], t["dtype"], t["grouped"]): t["name"]
            for t in _kernels.targets()}


def quantize_target(dtype) -> str:
    """The FFI target that quantizes 16-bit tokens per row to e4m3 before an fp8 kernel
    (``quantize_tokens``' values), for x of ``dtype``."""
    _require()
    return _quantize_targets()[jnp.dtype(dtype).name]


@functools.cache
def _quantize_targets() -> dict[str, str]:
    return dict(_kernels.quantize_targets())


def projection_target(operands: str, dtype) -> str:
    """The FFI target of the decode form's plain projection ``out = x @ W`` (a gated MLP's
    down projection at a few tokens, on the gemv rows) for ``operands`` ("16bit": x [M, K],
    W [K, N]; "e4m3": x_q [M, K] with x_scale [M], W K-major [N, K] with its scales) and
    output ``dtype``. Attributes: ``config`` (a gemv row of those operands), ``splits``,
    and for e4m3 ``promotion``."""
    _require()
    return _projection_targets()[(operands, jnp.dtype(dtype).name)]


@functools.cache
def _projection_targets() -> dict[tuple[str, str], str]:
    return dict(_kernels.projection_targets())


def can_implement_projection(config: int, *, m: int, n: int, k: int, splits: int = 1,
                             promotion: int = 4) -> str:
    """Why gemv row ``config`` cannot run the plain projection ``[m, k] x [k, n]``, or ""
    (ffi/can_implement.h's CannotRunProjection, which the launch checks too)."""
    _require()
    return _kernels.can_implement_projection(config, m, n, k, splits, promotion)


@functools.cache
def activations() -> tuple[str, ...]:
    """The activations the extension's kernels are compiled for (empty without it)."""
    return () if _kernels is None else tuple(_kernels.activations())


@functools.cache
def float16_activations() -> tuple[str, ...]:
    """The activations whose float16 kernels the extension compiled: SiLU's in a default
    install, every one with JAX_SWIGLU_ALL_CONFIGS (GELU-gated models run in bfloat16; each
    kernel costs build time). Every compiled row has its bfloat16 kernel of each."""
    return () if _kernels is None else tuple(_kernels.float16_activations())


def kernels_compiled_for(dtype: str, activation: str) -> bool:
    """Whether the compiled rows have kernels with a ``dtype`` output and ``activation`` (of
    ACTIVATIONS): every bfloat16 one, the float16 ones of float16_activations()."""
    return jnp.dtype(dtype) != jnp.float16 or activation in float16_activations()


@functools.cache
def all_configs() -> dict[int, KernelConfig]:
    """``config id -> KernelConfig`` of every row of the table, compiled in this build or not."""
    if _kernels is None:
        return {}
    return {row["id"]: KernelConfig(**row) for row in _kernels.kernel_configs()}


@functools.cache
def kernel_configs() -> dict[int, KernelConfig]:
    """``config id -> KernelConfig`` of the rows this build compiled (the ``config`` attribute
    of a custom call in the HLO is one of these ids)."""
    return {i: c for i, c in all_configs().items() if c.compiled}


def can_implement(config: int, *, m: int, n: int, k: int, splits: int = 1, swizzle: int = 1,
                  raster: int = 0, promotion: int = 4, experts: int = 0) -> str:
    """Why row ``config`` cannot run the problem with these launch attributes, or "" if it
    can (ffi/can_implement.h: the check every launch makes). ``experts``: a grouped call's
    expert count (m its tokens), 0 for a dense call."""
    _require()
    return _kernels.can_implement(config, m, n, k, splits, swizzle, raster, promotion, experts)


@functools.cache
def split_choices(config: int, k: int) -> tuple[int, ...]:
    """The split-K factors (stream-K rows) or cluster sizes (gemv rows) worth trying on K;
    (1,) for the others."""
    _require()
    return tuple(_kernels.split_choices(config, k))


# SMs of a full GH100: with no local GPU the workspace is sized for every SM count up to it.
_MAX_SM_COUNT = 144


def device_facts() -> dict:
    """The local CUDA device's SM count, compute capability (90 for SM90), L2 size, peak
    DRAM bandwidth and cluster slots (cluster size -> clusters of SM-filling CTAs that fit at
    once), as the extension reads them; zeros (no slots) without a GPU or the extension."""
    if _kernels is None:
        return {"sm_count": 0, "compute_capability": 0, "l2_bytes": 0, "dram_bytes_per_s": 0.0,
                "cluster_slots": {}}
    facts = dict(_kernels.device_facts())
    facts.setdefault("cluster_slots", {})  # (an extension built before the query)
    return facts


def workspace_bytes(config: int, dtype: str, *, m: int, n: int, k: int, swizzle: int = 1,
                    raster: int = 0, splits: int = 1, promotion: int = 4,
                    activation: str = "silu") -> int:
    """Bytes of scratch one call of row ``config`` needs (0 for most rows); ``dtype`` is the
    output's.

    A stream-K split depends on the SM count: sized for the local GPU's, or, lowering with
    no local GPU, the largest size over every SM count an SM90 part can have. The FFI
    handler checks the size again on the GPU it runs on and fails the call if too small.
    """
    if _kernels is None:
        return 0
    n_packed = _layout.padded_n(n)
    local = _kernels.device_sm_count()
    return max(int(_kernels.workspace_bytes(config, activation, dtype, m, n, n_packed, k,
                                            swizzle, raster, splits, promotion, sm_count))
               for sm_count in ([local] if local else range(1, _MAX_SM_COUNT + 1)))


def time_launches(config: int, dtype: str, *, m: int, n: int, k: int, splits: int, xs, packed,
                  out, workspace, calls: int, samples: int, swizzle: int = 1, raster: int = 0,
                  promotion: int = 4, x_scale=None, w_scale=None,
                  activation: str = "silu") -> list[float]:
    """Per-launch GPU times (us) of one row by CUDA-graph replay (ffi/timing.h), launch i on
    input set i % len(xs). ``xs``, ``packed``, ``out``, ``workspace`` (and an e4m3 row's
    ``x_scale`` and ``w_scale``) are device arrays (jax arrays on one GPU) that stay alive and
    unread by JAX during the call."""
    _require()

    def pointer(array):
        return array.unsafe_buffer_pointer() if array is not None else 0

    w_scale_stride = 1 if w_scale is not None and w_scale.size > 1 else 0
    return list(_kernels.time_launches(
        config, activation, dtype, m, n, _layout.padded_n(n), k, swizzle, raster, splits,
        promotion, [pointer(x) for x in xs], [pointer(p) for p in packed], pointer(out),
        pointer(workspace), int(workspace.size) if workspace is not None else 0,
        pointer(x_scale), pointer(w_scale), w_scale_stride, calls, samples))


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
