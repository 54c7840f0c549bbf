"""A launch: one row of the config table with its launch attributes, what a custom call runs.

``Launch`` is the static, hashable value the selection hands the primitive and the primitive
emits; users force one with ``swiglu(..., launch=...)``, as a ``Launch``, a row of
``jax_swiglu.kernel_configs()``, or its text form, which ``explain`` prints and the tuning
data and autotune cache store::

    "18"                      row 18, its default attributes
    "interleaved:18,splits=2" the same row (its family named too), split-K 2
    "3,swizzle=4,raster=m"    tile order of the persistent scheduler
    "27,promotion=8"          an e4m3 row promoting every 8 wgmma
    "27,promotion=0"          ... promoting once, after the last k tile (fast accumulation)
    "49"                      a fast-accumulation row (promotion 0 is its only value)

Whether the row can run a problem is the extension's question (``_native.can_implement``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import _native

RASTER_ORDERS = {"heuristic": 0, "m": 1, "n": 2}  # FFI attribute values
# The e4m3 rows' promotion for fast accumulation: the tensor cores add all of K, promoted to
# fp32 once (ffi/launch.h, kFastAccumulation).
FAST_ACCUMULATION = 0


@dataclasses.dataclass(frozen=True)
class Launch:
    """Row ``config`` of ``kernel_configs()`` with its launch attributes."""

    config: int
    splits: int = 1  # stream-K rows: the split-K factor (1: stream-K); gemv rows: cluster size
    swizzle: int = 1  # persistent and stream-K rows: tile groups along the minor axis
    raster: str = "heuristic"  # or "m" / "n": the persistent scheduler's tile order
    promotion: int | None = None  # e4m3 rows: wgmma between promotions (None: every k tile;
    # FAST_ACCUMULATION: once, at the end)

    @property
    def row(self) -> _native.KernelConfig:
        row = _native.all_configs().get(self.config)
        if row is None:
            rows = sorted(_native.all_configs())
            raise ValueError(f"launch={self}: there is no config {self.config} (rows "
                             + (f"{rows[0]}..{rows[-1]})" if rows else "none: no extension)"))
        return row

    @property
    def family(self) -> str:
        return self.row.family

    @property
    def promotion_interval(self) -> int:
        """The e4m3 rows' promotion attribute: the given one, else one k tile's wgmma (a
        fast-accumulation row's: FAST_ACCUMULATION)."""
        if self.promotion is not None:
            return self.promotion
        return FAST_ACCUMULATION if self.row.fast_accumulation else max(1, self.row.tile_k // 32)

    @property
    def fast_accumulation(self) -> bool:
        """Whether the tensor cores add all of K (promotion 0, or a fast-accumulation row)."""
        return self.promotion_interval == FAST_ACCUMULATION and self.row.operands == "e4m3"

    def __str__(self) -> str:
        row = _native.all_configs().get(self.config)
        parts = [f"{row.family}:{self.config}" if row is not None else str(self.config)]
        if self.splits != 1:
            parts.append(f"splits={self.splits}")
        if self.swizzle != 1:
            parts.append(f"swizzle={self.swizzle}")
        if self.raster != "heuristic":
            parts.append(f"raster={self.raster}")
        if self.promotion is not None:
            parts.append(f"promotion={self.promotion}")
        return ",".join(parts)

    def describe(self) -> str:
        row = self.row
        extra = ""
        if self.splits > 1:
            extra += (f", K over {self.splits} CTAs" if row.is_gemv
                      else f", split-K {self.splits}")
        if self.swizzle != 1 or self.raster != "heuristic":
            extra += f", swizzle {self.swizzle} raster {self.raster}"
        if self.fast_accumulation and not row.fast_accumulation:
            extra += ", fast accumulation (one promotion, after the last k tile)"
        elif self.promotion is not None:
            extra += f", promotion every {self.promotion}"
        return f"config {self.config}: {row.describe()}{extra}"

    def cannot_run(self, m: int, n: int, k: int, experts: int = 0) -> str:
        """Why this launch cannot run ``[m, k] x [k, 2n]`` (over ``experts`` experts' weights
        for a grouped call), or ""."""
        return _native.can_implement(self.config, m=m, n=n, k=k, splits=self.splits,
                                     swizzle=self.swizzle, raster=RASTER_ORDERS[self.raster],
                                     promotion=self.promotion_interval, experts=experts)

    def target(self, activation: str, dtype: str) -> str:
        """The FFI target that runs this launch for ``activation`` and output ``dtype``."""
        row = self.row
        name = _native.targets().get((row.family, row.operands, activation, dtype, row.grouped))
        if name is None:
            raise TypeError(f"no {'grouped ' if row.grouped else ''}{row.family} kernel on "
                            f"{row.operands} operands is built for activation {activation!r} "
                            f"and output dtype {dtype}")
        return name

    def ffi_attributes(self) -> dict:
        """The custom call's attributes (exactly typed, as the FFI handler binds them)."""
        attributes = {"config": np.int64(self.config), "swizzle": np.int64(self.swizzle),
                      "raster": np.int64(RASTER_ORDERS[self.raster]),
                      "splits": np.int64(self.splits)}
        if self.row.operands == "e4m3":
            attributes["promotion"] = np.int64(self.promotion_interval)
        return attributes


_OPTIONS = ("splits", "swizzle", "raster", "promotion")


def parse(value) -> Launch:
    """A ``Launch`` from a Launch, a row of ``kernel_configs()``, a config id or its text form
    (the module docstring); a ValueError that says what is accepted otherwise."""
    if isinstance(value, Launch):
        return value
    if isinstance(value, _native.KernelConfig):
        return Launch(value.id)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return Launch(int(value))
    if not isinstance(value, str):
        raise TypeError(f"launch must be a jax_swiglu Launch, a row of kernel_configs(), a "
                        f"config id or its text form like 'interleaved:18,splits=2'; got "
                        f"{type(value).__name__}")

    def bad(why):
        return ValueError(f"launch={value!r}: {why}. The form is '<config id>' or "
                          "'<family>:<config id>', then ',splits=<n>', ',swizzle=<1|2|4|8>', "
                          "',raster=<heuristic|m|n>' or ',promotion=<n>' as the row takes them")

    head, *options = [part.strip() for part in value.split(",")]
    family, _, config = head.rpartition(":")
    if not config.isdigit():
        raise bad(f"{head!r} is not a config id")
    fields = {}
    for option in options:
        key, _, text = option.partition("=")
        if key not in _OPTIONS or not text:
            raise bad(f"unknown option {option!r}")
        if key == "raster":
            if text not in RASTER_ORDERS:
                raise bad(f"raster must be one of {tuple(RASTER_ORDERS)}")
            fields[key] = text
        elif text.isdigit():
            fields[key] = int(text)
        else:
            raise bad(f"{key} must be a positive integer")
    launch = Launch(int(config), **fields)
    if family and _native.all_configs():
        if launch.config not in _native.all_configs():
            raise bad(f"there is no config {launch.config} (rows "
                      f"{min(_native.all_configs())}..{max(_native.all_configs())})")
        if launch.row.family != family:
            raise bad(f"config {launch.config} is a row of the {launch.row.family} kernel, "
                      f"not of {family}")
    return launch
