"""Which fp8 kernel config runs a call on fp8 weights: an analytic rule from the hardware.

The fp8 kernel (ffi/kernels/fp8_kernel.cuh) has few configs, and which one wins follows from
two facts of the GPU rather than from measured shapes:

* Few tokens (M up to the largest swap-AB tile, 64): the call streams the weights once, so
  the tensor cores' M side should be the weights (swap-AB), with the smallest token tile
  that holds M (less shared memory per stage, more stages in flight) and stream-K spreading
  the K loop over every SM whatever the tile count.
* More tokens: tokens on the M side in 128 x 128 tiles. Whole waves of tiles over the SM
  count run best on the persistent scheduler with 2x1 clusters (the weight tile multicast
  to both CTAs); a ragged last wave (less than ``FULL_LAST_WAVE`` of the SMs busy in a call
  of few waves) is spread over every SM by stream-K instead.

The rule picks among the rows every build compiles; the Optional ones (a wider tile, 64-deep k
tiles, the gemv kernel's fp8 form: kernel_configs.h says what their probe found) run when
``JAX_SWIGLU_CONFIG`` names them. The engine of :mod:`jax_swiglu.selection` (tuning
data, autotune cache) covers the 16-bit kernels; fp8 calls have no tuning data yet, and
``explain`` says so.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax.numpy as jnp
import numpy as np

from .. import _layout, _native
from . import _engine

# A last wave at least this full is left to the persistent scheduler (its idle SMs cost less
# than stream-K's fixup), and so is any call of more than MANY_WAVES waves.
FULL_LAST_WAVE = 0.75
MANY_WAVES = 4
# The fp8 rows need K in whole 16-byte TMA rows of fp8 elements.
K_MULTIPLE = 16
# SMs assumed when lowering for CUDA with no GPU here (an H100 SXM or H200).
DEFAULT_SM_COUNT = 132
# Promotions of the tensor cores' fp8 accumulators into fp32 come after whole k tiles, counted
# in wgmma instructions of WGMMA_K each: by default after every k tile (tile_promotion), or
# after any multiple of it among PROMOTIONS (JAX_SWIGLU_CONFIG's promotion=).
WGMMA_K = 32
PROMOTIONS = (2, 4, 8, 16)


def tile_promotion(config) -> int:
    """The wgmma of one k tile of ``config``: its default promotion interval, and the unit of
    any other."""
    return config.tile_k // WGMMA_K


@dataclasses.dataclass(frozen=True)
class Fp8Choice:
    """What the lowering emits for one fp8 call: a config of the fp8 kernel, or XLA."""

    config: _native.KernelConfig | None  # None: the XLA path (dequantize, reference)
    target: str | None
    reason: str
    source: str = "fp8 rule"
    promotion: int | None = None  # wgmma between promotions; None: after every k tile
    splits: int = 1  # the gemv form's cluster split of K

    def ffi_attributes(self) -> dict:
        promotion = self.promotion or tile_promotion(self.config)
        return {"config": np.int64(self.config.id), "swizzle": np.int64(1),
                "raster": np.int64(0), "splits": np.int64(self.splits),
                "promotion": np.int64(promotion)}

    def describe(self) -> str:
        if self.config is None:
            return f"xla (dequantized, fp32 reference; {self.source}: {self.reason})"
        promotion = (f", promotion every {self.promotion}"
                     if self.promotion not in (None, tile_promotion(self.config)) else "")
        if self.splits > 1:
            promotion += f", K over {self.splits} CTAs"
        return (f"interleaved fp8 [{self.target}, config {self.config.id}: "
                f"{self.config.describe()}{promotion}] ({self.source}: {self.reason})")


def _xla(reason: str, source: str = "fp8 rule") -> Fp8Choice:
    return Fp8Choice(None, None, reason, source)


def rule(m: int, n: int, sm_count: int, configs) -> tuple[int, str]:
    """The config id the rule picks among ``configs`` (id -> KernelConfig; its wgmma rows),
    and why."""
    swap = sorted((c for c in configs.values() if c.m_side == "weights" and not c.is_gemv),
                  key=lambda c: c.tile_m)
    fitting = [c for c in swap if c.tile_m >= m]
    if fitting:
        c = fitting[0]
        return c.id, (f"M={m} tokens fit one swap-AB tile of {c.tile_m}: the weights stream once "
                      f"over all {sm_count} SMs (stream-K)")
    tokens = [c for c in configs.values() if c.m_side == "tokens"]
    persistent = next(c for c in tokens if c.scheduler == "persistent")
    stream_k = next((c for c in tokens if c.scheduler == "stream-k"), None)
    tiles = math.ceil(m / persistent.tile_m) * math.ceil(2 * _layout.padded_n(n)
                                                          / persistent.tile_n)
    waves = tiles / sm_count
    last = tiles % sm_count
    fill = 1.0 if last == 0 else last / sm_count
    if stream_k is None or waves > MANY_WAVES or fill >= FULL_LAST_WAVE:
        return persistent.id, (f"{tiles} tiles of {persistent.tile_m}x{persistent.tile_n} are "
                               f"{waves:.2f} waves on {sm_count} SMs: persistent")
    return stream_k.id, (f"{tiles} tiles of {stream_k.tile_m}x{stream_k.tile_n} are "
                         f"{waves:.2f} waves on {sm_count} SMs, the last {fill:.0%} full: "
                         "stream-K spreads it")


def choose_fp8(m: int, n: int, k: int, out_dtype, *, kernel: str = "auto",
               platform: str = "cuda", activation: str = "silu",
               weights_dtype=jnp.float8_e4m3fn) -> Fp8Choice:
    """Picks the implementation of a call on fp8 weights (``[m, k] x [k, 2n]``, output
    ``out_dtype``). ``kernel``: "auto", "interleaved" (the fused fp8 kernel, or an error
    saying why it cannot run) or "xla"; ``JAX_SWIGLU_CONFIG`` forces a config id."""
    from . import CONFIG_ENV_VAR, _warn_once, local_gpu_is_sm90, requested_kernel

    requested, source = requested_kernel(kernel)
    if requested == "xla":
        return _xla(source, "override")

    def unavailable(why: str) -> Fp8Choice:
        if requested != "auto":
            raise RuntimeError(f"{source} was requested for fp8 weights, but {why}")
        return _xla(why)

    if requested == "pingpong":
        raise RuntimeError(f"{source} was requested for fp8 weights, but the pingpong kernel "
                           "has no fp8 form; kernel='auto' or 'interleaved' runs the fused fp8 "
                           "kernel")
    if platform != "cuda":
        return _xla(f"platform {platform!r} has no fused kernel")
    if not _native.kernels_available():
        if requested != "auto":
            raise RuntimeError(f"{source} was requested, but {_native.unavailable_reason()}")
        _warn_once(f"jax_swiglu: {_native.unavailable_reason()}")
        return _xla("the CUDA extension is not built")
    if local_gpu_is_sm90() is False:
        return unavailable("the fused kernels need an SM90 (Hopper) GPU and this GPU is not one")
    if jnp.dtype(weights_dtype) != jnp.dtype(jnp.float8_e4m3fn):
        return unavailable(f"the fused fp8 kernel runs float8_e4m3fn, not "
                           f"{jnp.dtype(weights_dtype).name}")
    if k % K_MULTIPLE:
        return unavailable(f"the fused fp8 kernel needs K to be a multiple of {K_MULTIPLE} "
                           f"(16-byte rows of fp8), got K={k}")
    out_name = jnp.dtype(out_dtype).name
    target = _native.fp8_targets().get((activation, out_name))
    configs = _native.fp8_configs()
    if target is None or not configs:
        return unavailable(f"this build has no fp8 kernel for {activation} with {out_name} "
                           "output")
    device = _engine.target_device()
    sm_count = device.sm_count if device is not None else DEFAULT_SM_COUNT
    # Always rows only: the Optional ones run when forced (the module docstring).
    config_id, reason = rule(m, n, sm_count,
                             {i: c for i, c in configs.items() if not c.optional})
    by = "fp8 rule" if requested == "auto" else f"{source}, then the fp8 rule"
    forced = os.environ.get(CONFIG_ENV_VAR, "").strip()
    promotion, splits = None, 1
    if forced:
        config_text, *options = [part.strip() for part in forced.split(",")]
        usage = (f"{CONFIG_ENV_VAR}={forced!r}: with fp8 weights it is '<fp8 config>"
                 f"[,promotion=<{'|'.join(map(str, PROMOTIONS))}>]' (a wgmma row) or "
                 f"'<fp8 config>[,splits=<s>]' (a gemv row), configs {sorted(configs)}")
        for option in options:
            key, _, value = option.partition("=")
            if key == "promotion" and value.isdigit() and int(value) in PROMOTIONS:
                promotion = int(value)
            elif key == "splits" and value.isdigit() and int(value) in _native.GEMV_SPLITS:
                splits = int(value)
            else:
                raise ValueError(usage)
        if config_text:
            if not config_text.isdigit() or int(config_text) not in configs:
                raise ValueError(usage)
            reason = f"forced; the fp8 rule said config {config_id}: {reason}"
            config_id = int(config_text)
        by = f"{CONFIG_ENV_VAR}={forced}"
        _check_forced(configs[config_id], m, k, promotion, splits, usage)
    return Fp8Choice(configs[config_id], target, reason, by, promotion, splits)


def _check_forced(config, m: int, k: int, promotion, splits: int, usage: str) -> None:
    """A clear error where a forced launch cannot run: a gemv row past its tokens, with a split
    that K has too few steps for, or with a promotion (it promotes after every mma); a wgmma
    row with splits, or with a promotion that is not whole k tiles of it."""
    name = f"fp8 config {config.id}"
    if config.is_gemv:
        if not config.runs(m):
            raise ValueError(f"{usage}: {name} runs at most {config.max_m} tokens, got M={m}")
        if splits not in config.split_choices(k):
            raise ValueError(f"{usage}: {name} splits K={k} over one of "
                             f"{config.split_choices(k)} CTAs, not {splits}")
        if promotion is not None:
            raise ValueError(f"{usage}: {name} is the gemv form, which promotes after every "
                             "mma (no promotion=)")
        return
    if splits != 1:
        raise ValueError(f"{usage}: {name} takes no splits= (only the gemv rows do)")
    unit = tile_promotion(config)
    if promotion is not None and promotion % unit:
        raise ValueError(f"{usage}: {name} promotes after whole k tiles of {unit} wgmma, so "
                         f"promotion={promotion} cannot run on it")
