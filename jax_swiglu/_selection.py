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
import numpy as np

from . import _layout, _native

# Public names of the implementations. "xla" is the plain XLA reference path.
KERNELS = ("interleaved", "pingpong", "xla")
KERNEL_CHOICES = ("auto",) + KERNELS
ENV_VAR = "JAX_SWIGLU_KERNEL"
# Tuning knob: forces the launch of the fused kernel chosen, as "<config id>" (an id of
# kernel_configs()), optionally followed by ",swizzle=<1|2|4|8>" and/or
# ",raster=<heuristic|m|n>" (the persistent scheduler's tile order). The benchmarks use it
# to measure every variant; not meant for production.
CONFIG_ENV_VAR = "JAX_SWIGLU_CONFIG"
RASTER_ORDERS = {"heuristic": 0, "m": 1, "n": 2}  # FFI attribute values
SWIZZLES = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class Rule:
    """Use ``kernel`` with tile config ``config`` when ``min_m`` < M <= ``max_m`` and
    ``min_n`` < N <= ``max_n`` (and, with ``odd_m_tiles``, M makes an odd count of tiles
    of that many rows).

    ``None`` bounds are open.
    """

    max_m: int | None
    kernel: str
    config: int | None
    why: str
    min_m: int = 0
    min_n: int = 0
    max_n: int | None = None
    swizzle: int = 1  # persistent scheduler: tiles visited in groups of this size
    raster: str = "heuristic"  # ... along "m", "n", or CUTLASS's heuristic
    # Only where ceil(M / odd_m_tiles) is odd: where a 2x1 cluster of such tiles would pad
    # the last row of tiles with one wholly outside, which still runs its mainloop.
    odd_m_tiles: int | None = None
    # Only where the config's last round of tiles splits into halves (split_tail_clusters):
    # elsewhere a split-tail config runs its twin's whole tiles, and the twin's row applies.
    last_round_splits: bool = False
    # Only where M is a multiple of the config's bands of whole clusters of tiles (a config
    # with m_bands > 1 runs no other M).
    whole_m_bands: bool = False

    def admits(self, m: int, n: int) -> bool:
        return (m > self.min_m and (self.max_m is None or m <= self.max_m) and n > self.min_n
                and (self.max_n is None or n <= self.max_n)
                and (self.odd_m_tiles is None or -(-m // self.odd_m_tiles) % 2 == 1)
                and (not self.last_round_splits or split_tail_clusters(self.config, m, n) > 0)
                and (not self.whole_m_bands
                     or m % _native.kernel_configs()["interleaved"][self.config].m_multiple == 0))


_SMS = 132  # H200/H100 SXM multiprocessors: the wave size the N ranges below refer to


def split_tail_clusters(config: int, m: int, n: int, sms: int = _SMS) -> int:
    """How many clusters of split-tail interleaved config ``config`` run a 64-row half tile in
    the last round on a GPU of ``sms`` SMs (0: the round does not split), as the kernel plans
    it (ffi/kernels/split_tail.cuh, SplitTailPlan): the grid is every SM in whole clusters, but
    no more CTAs than tiles, and the tiles are padded to whole clusters."""
    c = _native.kernel_configs()["interleaved"][config]
    cluster = c.cluster_m * c.cluster_n
    tiles_m = -(-m // c.tile_m)
    tiles_n = -(-2 * _layout.padded_n(n) // c.tile_n)
    tiles = (-(-tiles_m // c.cluster_m) * c.cluster_m) * (-(-tiles_n // c.cluster_n) * c.cluster_n)
    ctas = min(sms // cluster * cluster, tiles)
    last = tiles % ctas
    return 2 * (last // cluster) if last and 2 * last <= ctas else 0

# Rows are tried in order; the first that admits (M, N) wins. Derived from runs on
# an H200, all under benchmarks/results/NVIDIA_H200/ (each row's "why" quotes GPU times
# from them: our kernel first, then the alternative it beat or lost to):
#   2026-11-29-calibration-both-kernels.md  both kernels, the cooperative configs, the 7
#       Qwen2.5 MLPs at M = 128, 512, 1024, 2048, 4096, 8192, 16384;
#   2026-11-29-calibration-pingpong-clusters.md  pingpong 128x128 and 64x256 tiles with
#       2x1 and 2x2 clusters against config 0, M = 512, 2048, 8192;
#   2026-11-29-calibration-64-row-tiles.md  pingpong 64x128 tiles, M = 1, 8, 64, 128, 1024;
#   2026-11-29-calibration-decode.md        the same at M = 16, 32;
#   2026-11-29-calibration-stream-k.md      stream-K 128x128 tiles at M = 128;
#   2026-11-29-calibration-large-m-small-k.md  configs 0 and 1 (after SiLU on MUFU in config
#       1), 0.5B-3B at M = 4096 and 8192; -calibration-pingpong-192-rows.md the same two (and
#       two 192-row configs, since dropped) on all 7 shapes at M = 512, 2048, 8192;
#   2026-11-29-calibration-320-wide-tiles.md  config 8 (cooperative 128x320) against 2, 3, 4, 5
#       at M = 64 and 128 on 3B, 7B, 14B (a one-wave tile for 7B);
#   2026-11-29-calibration-192-wide-tiles.md  configs 0, 1, 6, 7 on all 7 shapes at M = 512,
#       2048, 8192 (-m1024-m4096.md: the same at M = 1024 and 4096; -m128.md: config 6 against
#       2, 3, 5 at M = 128: slower everywhere);
#   2026-11-29-calibration-192-wide-no-cluster.md  128x192 tiles without a cluster (pingpong and
#       cooperative, the latter now config 9) against 1, 2, 3, 6 at M = 128 and 512, 0.5B..7B;
#   2026-11-29-calibration-direct-store.md  (-m512-m2048.md) configs 1, 6, 7 against twins that
#       store straight from registers, 0.5B..14B at M = 512, 2048, 8192: config 6 kept the
#       direct store;
#   2026-11-29-calibration-small-k-swizzle.md  (-m2048.md) swizzle 2/4/8 of configs 1, 6, 7 on
#       0.5B..3B: slower or level everywhere;
#   2026-11-29-calibration-tile-order-rounds.md  swizzle 1/4/8 of config 0, 7B..72B, M = 8192,
#       timed in interleaved rounds. (An earlier run, -calibration-tile-order.md, timed each
#       launch in one block and had favoured swizzling by 5-7%: clock drift, not reuse.)
#   2026-11-30-calibration-16-byte-stores-both-paths.md  (-large-models.md) configs 1, 6 and 7
#       with both output paths after the layout gave every store 16 bytes, 0.5B..3B at M = 512,
#       2048, 4096, 8192 and 7B..72B at M = 2048, 8192: config 7 took the direct store, 3B
#       M=512 config 6 (-16-byte-stores.md: the experiment that found the 16-byte stores);
#   2026-11-30-calibration-direct-store-twins.md  configs 0 and 1 against their direct-store
#       twins (both took the direct store) and config 7 against its 1x2-cluster twin (now
#       config 10), each beside the bare GEMM (c); -cluster-1x2.md: config 10 against 7 on
#       7B..72B at M = 2048, 4096, 8192 and 3B, and pingpong 128x128 with 1x2 and 1x1 clusters;
#       -direct-store-small-m.md: configs 2, 3, 4, 8, 9 against their direct-store twins at
#       M = 32, 64, 128 (all took the direct store; the rows' times below predate it);
#   2026-12-01-calibration-clusters-m512.md  4-CTA and 8-CTA clusters (cuBLAS's 4x2 at 3B
#       M=512) on pingpong 128x128 and 128x192 tiles against configs 1, 6, 7, 0.5B..14B at
#       M = 512 and 0.5B..3B at M = 2048, 8192 (config 11 kept for 3B M=512);
#   2026-12-01-calibration-pingpong-1x2.md  config 12 (config 1's tiles with a 1x2 cluster)
#       against 1 and 6, 0.5B..14B at M = 384, 512, 1664, 1920, 2048: it wins where M makes
#       an odd count of 128-row tiles (3, 13, 15), level at 2048, slower at 512.
#   2026-12-01-calibration-split-tail.md  configs 13 and 14 (configs 1 and 12 with a split last
#       round) against 1 and 12, 0.5B..7B at M = 512..2048;
#   2026-12-01-calibration-m-bands.md  configs 15-17 (configs 6 and 7 with their tiles in 2 or
#       4 bands of M) against 6, 7 and 10, 1.5B..14B at M = 8192 (-m4096.md: level at 3B
#       M = 4096, where x fits in L2).
# The -pingpong-clusters and -64-row-tiles runs number the configs as they were then: their 4
# is config 1 now and their 7 is config 4. Their 5 (pingpong 128x128, 2x2 cluster) tied
# their 4 at M = 512 (1.5B 46.4 vs 46.6 us, 3B 71.4 vs 72.8) and lost elsewhere; their 1
# and 6 (pingpong 64x256) won nowhere; all three were removed.
# The pingpong kernel (Kernel-1) has no row: it was slower than the best interleaved config
# on every shape and M (1.1-1.3x at M = 128, 1.4-2.6x at M >= 2048; README, "The kernels").
# An "xla" row runs the reference lowering on the packed weights (one [K, 2N] GEMM with an
# fp32 result, then SiLU * up): slower than XLA on separate weights at large M, so such a
# row is only worth it where XLA wins clearly (2026-11-29-first-table.md, 72B M=8192: that path
# 12.05 ms, our kernel 11.18 ms, XLA on separate weights 11.43 ms).
# Config ids: ffi/kernel_configs.h.
SELECTION_TABLE: tuple[Rule, ...] = (
    Rule(1, "interleaved", 4,
         "M = 1, N <= 6144: XLA's matrix-vector path is slow on this shape (0.5B: 8.4 vs "
         "16.5 us)", max_n=6144),
    Rule(16, "xla", None,
         "M <= 16 (decode): the call streams the weights, and cuBLAS (through XLA) streams "
         "them faster than our 64-row tiles, which split neither K nor the last wave "
         "(M=8: 72B 243.5 vs 225.2 us, 1.5B 20.4 vs 17.0 us; M=16: slower on 6 of 7 shapes)"),
    Rule(64, "interleaved", 4,
         "16 < M <= 64: 64-row pingpong tiles, no rows wasted, and twice the CTAs of 128x128 "
         "tiles (M=64: 7B 69.9 vs 83.1 us for XLA, 72B 228.3 vs 228.4 us; M=32: faster on "
         "4 of 7 shapes, 0.95x at worst)"),
    Rule(128, "interleaved", 3,
         "M <= 128, N <= 6144: 128x128 tiles give twice the CTAs of 128x256 on a small N "
         "(0.5B: 9.2 vs 13.4 us; 64-row tiles 11.1 us)", max_n=6144),
    Rule(128, "interleaved", 9,
         "64 < M <= 128, 6144 < N <= 11008 (1.5B, 3B): 128x192 tiles, no cluster, keep 94 and "
         "115 SMs streaming the weights where 128x256 tiles keep 70 and 86 (1.5B: 18.5 vs 20.4 "
         "us for config 2; 3B: 26.8 vs 27.4; pingpong 128x192 tiles 18.6 and 27.0)",
         min_n=6144, max_n=11008),
    Rule(128, "interleaved", 8,
         "64 < M <= 128, N in 132 x (128, 160]: 128x256 tiles would make 1.1 waves; 128x320 "
         "tiles make one wave that streams the weights on nearly every SM (7B: 71.4 us vs "
         "76.9 for stream-K config 5, the row's choice before, and 99.9 for config 2; M = 64 "
         "kept 64-row tiles: 70.6 vs 70.2, a tie)",
         min_n=_SMS * 128,
         max_n=_SMS * 160),
    Rule(128, "interleaved", 2,
         "M <= 128: one 128-row tile, 128x256 tiles, no cluster (a 2x1 cluster would idle "
         "half its CTAs on the empty second row of tiles)"),
    Rule(512, "interleaved", 11,
         "384 < M <= 512, 8960 < N <= 11008 (3B): config 6's pingpong 128x192 tiles with a 4x1 "
         "cluster, so the four CTAs of a column of tiles share each weight tile's load, as "
         "cuBLAS's kernel here does with a 4x2 cluster (M=512: 65.4 vs 67.1 us for config 6, "
         "the bare GEMM 65.1; pingpong 128x128 with a 4x2 cluster 65.7, 128x192 2x2 65.5). "
         "Lost at 1.5B (49.3 vs 39.4) and at M >= 2048, 0.5B..3B (3B M=2048 240.4 vs 225.5)",
         min_m=384, min_n=8960, max_n=11008),
    Rule(512, "interleaved", 6,
         "384 < M <= 512, 6144 < N <= 8960 (1.5B; 3B had it until config 11 above): pingpong "
         "128x192 tiles with a 2x1 cluster make 2.85 and 3.5 waves at M = 512 where 128x128 "
         "tiles make 4.24 and 5.2 "
         "(1.5B 39.3 vs 43.2 us for config 1, 3B 66.4 vs 68.0, with 16-byte stores; before "
         "them 1.5B 41.7 vs 43.5 and 3B a loss, 70.1 vs 68.2). Measured at M = 512 only; by "
         "the same wave count they would tie at two rows of tiles (M = 129-256) and trail at "
         "three (257-384), so M <= 384 keeps config 1 (config 12 at 257-384, below)",
         min_m=384, min_n=6144, max_n=8960),
    Rule(512, "interleaved", 12,
         "M <= 512, 4096 < N <= 18944, an odd count of 128-row tiles: config 1's pingpong "
         "128x128 tiles with a 1x2 cluster (each token tile shared by two CTAs), where config "
         "1's 2x1 cluster would run a padding row of tiles (M=384: 3B 51.4 vs 68.1 us for "
         "config 1, 14B 157.8 vs 199.9, 0.5B 14.4 vs 17.7; at M=512, 4 rows, it loses: 0.5B "
         "19.0 vs 17.7). Measured on the Qwen2.5 shapes only (N >= 4864)",
         min_n=4096, max_n=18944, odd_m_tiles=128),
    Rule(512, "interleaved", 13,
         "M <= 512, N <= 11008, where the last round of tiles is at most half full: config 1 "
         "with that round's tiles run as 64-row halves on the CTAs it would leave idle "
         "(ffi/kernels/split_tail.cuh; M=512: 0.5B 16.9 vs 17.8 us for config 1; 1.5B 42.7 vs "
         "43.9 and 3B 65.8 vs 68.4, where the rows above keep configs 6 and 11)",
         max_n=11008, last_round_splits=True),
    Rule(512, "interleaved", 1,
         "M <= 512, N <= 18944: pingpong 128x128 tiles hide each tile's epilogue behind the "
         "other warpgroup's mainloop, and enough CTAs on these N (M=512: 0.5B 17.8 vs 19.0 us "
         "for config 6, a tie since 16-byte stores, 17.8 vs 17.8; 7B 189.4 vs 200.0 for "
         "config 0 and a tie with config 6, 180.6 vs 179.7). Stores from registers since "
         "2026-11-30 (7B 180.4 vs 181.6 through a TMA store, 14B level, 197.3 vs 197.2)",
         max_n=18944),
    Rule(512, "interleaved", 0,
         "M <= 512, N > 18944 (32B, 72B): 128x256 tiles with a 2x1 cluster (M=512: 72B 621.2 "
         "vs 642.4 us for config 7 and 642.4 for config 1; 32B 385.4 vs 403.5 for config 7, "
         "377.8 for config 6). Stores from registers since 2026-11-30 (M=512: 72B 616.8 vs "
         "618.6 us through a TMA store, 32B 380.7 vs 383.5; M=256: 350.7 vs 353.0, 222.8 vs "
         "223.9)"),
    Rule(2048, "interleaved", 14,
         "1024 < M <= 2048, N <= 6144 (0.5B), where the last round of tiles is at most half "
         "full: config 12 with that round's tiles split as above (M=2048: 50.6 vs 51.4 us for "
         "config 1; M=1664: 42.6 vs 43.0 for config 12; M=1792: 46.0 vs 46.8 for both)",
         min_m=1024, max_n=6144, last_round_splits=True),
    Rule(2048, "interleaved", 12,
         "512 < M <= 2048, 4096 < N <= 11008, an odd count of 128-row tiles: config 12, as "
         "above (M=1664: 0.5B 42.8 vs 45.7 us for config 1, 1.5B 121.5 vs 128.5, 3B 197.6 vs 210.7 "
         "and 207.3 for config 6; M=1920: 0.5B 47.2 vs 50.4, 1.5B 136.9 vs 143.4, 3B 228.7 vs "
         "234.2 and 227.4 for config 6, a tie)", min_m=512, min_n=4096, max_n=11008,
         odd_m_tiles=128),
    Rule(1024, "interleaved", 13,
         "512 < M <= 1024, N <= 11008, where the last round splits: config 13, as above "
         "(M=1024: 1.5B 76.6 vs 77.6 us for config 1, 3B 123.5 vs 124.1; M=768: 0.5B 22.4 vs "
         "22.9)", min_m=512, max_n=11008, last_round_splits=True),
    Rule(4096, "interleaved", 6,
         "1024 < M <= 4096, 8960 < N <= 11008 (3B): pingpong 128x192 tiles storing straight "
         "from registers (M=2048: 226.5 vs 232.7 us for config 1 and 229.9 for the same tiles "
         "through a shared-memory tile and TMA store; 225.4 vs 232.8 in another run, 226.0 for "
         "config 7; M=4096: 442.6 vs 453.2 for config 7). At M = 8192 config 7 stays (936.9 "
         "vs 941.7)", min_m=1024, min_n=8960, max_n=11008),
    Rule(2048, "interleaved", 1,
         "M <= 2048, N <= 11008: pingpong 128x128 tiles, as above (M=1024: 1.5B 82.5 vs "
         "90.1 us for config 2, and config 0 measured 88.1 in another run; M=2048: 1.5B "
         "145.8 vs 153.9 us for config 6 and 155.8 for config 0; 3B a tie with config 6, "
         "234.3 vs 234.0; with the direct store 0.5B 50.4 vs 50.8, 1.5B 143.2 vs 144.0; a 1x2 "
         "cluster level, 50.3 and 141.9, no cluster slower, 52.4 and 171.5)", max_n=11008),
    Rule(1024, "interleaved", 6,
         "512 < M <= 1024, N > 11008: pingpong 128x192 tiles with a 2x1 cluster, within 3% of "
         "the fastest config on every such shape, where configs 7 and 0 trail by up to 7% and "
         "5% (M=1024: 14B 367.9 vs 393.4 us for config 7 and 375.2 for config 0; 7B 345.9 vs "
         "339.6 for config 7; 72B 1242.0 vs 1206.1 for config 0)"),
    Rule(None, "interleaved", 15,
         "M > 4096, 6144 < N <= 11008 (1.5B, 3B), M a multiple of 512: config 6's pingpong "
         "128x192 tiles visited in 2 bands of M (ffi/kernels/m_bands.cuh), so the rounds of "
         "tiles reread half of x from L2, not all of it from DRAM (M=8192: 3B 883.8 vs 927.9 us "
         "for config 6 and 925.0 for config 7, the bare GEMM 888.3; 1.5B 546.8 vs 551.9; level "
         "at 3B M=4096, 442.7 vs 440.9, where x fits)",
         min_m=4096, min_n=6144, max_n=11008, whole_m_bands=True),
    Rule(None, "interleaved", 6,
         "M > 2048, N <= 8960 (0.5B, 1.5B; K = 896 and 1536): pingpong 128x192 tiles with a 2x1 "
         "cluster, the most work per tile a pingpong warpgroup holds, storing straight from "
         "registers (M=8192: 0.5B 184.1 vs 193.9 us through shared memory and a TMA store, "
         "207.0 for config 7; 1.5B 560.6 vs 569.8 and 579.9; before the direct store: 0.5B "
         "196.2 vs 198.4 for config 1, 1.5B 581.5 vs 582.6 for config 0)",
         max_n=8960),
    Rule(None, "interleaved", 17,
         "M > 4096, 11008 < N <= 18944 (7B, 14B), M a multiple of 2048: config 7's tiles in 4 "
         "bands of M, as above (M=8192: 7B 2691.9 vs 2734.9 us for config 10 and 2761.4 for "
         "config 7, 2 bands 2701.1, the bare GEMM 2689.4; 14B 2790.7 vs 2830.3 and 2864.2)",
         min_m=4096, min_n=11008, max_n=18944, whole_m_bands=True),
    Rule(None, "interleaved", 7,
         "M > 4096, N > 27648 (72B): 256x192 tiles with a 2x1 cluster sharing each weight "
         "tile, as below, where the 1x2 cluster of config 10 lost (M=8192: 10319 vs 10482 "
         "us; a row at the 700 W limit that moves by several percent between runs)",
         min_m=4096, min_n=27648),
    Rule(None, "interleaved", 10,
         "M > 1024, N > 11008 (7B..72B): 256x192 tiles, 128x192 per warpgroup, with a 1x2 "
         "cluster sharing each token tile (32 KB a k-step) where config 7's 2x1 shares the "
         "weight tile (24 KB): faster than config 7 on all 11 such rows measured, by 0.1-2.5% "
         "(M=8192: 7B 2768 vs 2807 us, 32B 5798 vs 5929; M=4096: 72B 4904 vs 5031; M=2048: "
         "7B 669.2 vs 670.6, 72B 2398 vs 2401)", min_m=1024, min_n=11008),
    Rule(None, "interleaved", 7,
         "M > 4096, N <= 11008 (3B): 256x192 tiles with a 2x1 cluster sharing each weight tile "
         "(M=8192: 935.4 vs 936.3 us for config 6, 955.0 for config 10's 1x2 cluster; before: "
         "957.5 vs 969.9 for config 0). Since 16-byte stores it stores straight from "
         "registers, with a 4th stage (3B 928.0 vs 938.4 us through a TMA store; 7B 2775 vs "
         "2799, 72B 10020 vs 10898)"),
)


@dataclasses.dataclass(frozen=True)
class Choice:
    """What the lowering emits for one call."""

    kernel: str  # one of KERNELS
    config: _native.KernelConfig | None  # None for "xla"
    target: str | None  # FFI target name, None for "xla"
    reason: str
    swizzle: int = 1
    raster: str = "heuristic"

    def ffi_attributes(self) -> dict:
        """The custom call's attributes (exactly typed, as the FFI handler binds them)."""
        return {"config": np.int64(self.config.id), "swizzle": np.int64(self.swizzle),
                "raster": np.int64(RASTER_ORDERS[self.raster])}

    def describe(self) -> str:
        if self.config is None:
            return f"xla ({self.reason})"
        order = f", swizzle {self.swizzle} raster {self.raster}"
        return f"{self.kernel} [{self.target}, {self.config.describe()}{order}] ({self.reason})"


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


def _lookup(m: int, n: int, kernel: str | None = None) -> Rule | None:
    """The first row admitting (M, N) (among ``kernel``'s rows, if given; else its last)."""
    rows = [rule for rule in SELECTION_TABLE if kernel is None or rule.kernel == kernel]
    for rule in rows:
        if rule.admits(m, n):
            return rule
    return rows[-1] if rows else None


def _xla(reason: str) -> Choice:
    return Choice("xla", None, None, reason)


def choose(m: int, n: int, k: int, dtype, *, kernel: str = "auto",
           platform: str = "cuda") -> Choice:
    """Picks the implementation for a ``[m, k] x [k, 2n]`` call of ``dtype`` on ``platform``."""
    del k  # no row depends on K yet
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
        rule = _lookup(m, n)
        kernel_name, reason = rule.kernel, rule.why
    else:  # forced: the launch the table uses for that kernel at this shape
        rule = _lookup(m, n, requested)
        kernel_name, reason = requested, source
    if kernel_name == "xla":
        return _xla(reason)
    target = _native.targets().get((kernel_name, jax.numpy.dtype(dtype).name))
    if target is None:
        raise TypeError(f"the {kernel_name} kernel is not built for dtype {dtype}")
    configs = _native.kernel_configs()[kernel_name]
    launch = ({"config": rule.config, "swizzle": rule.swizzle, "raster": rule.raster} if rule
              else {"config": min(configs), "swizzle": 1, "raster": "heuristic"})
    forced = os.environ.get(CONFIG_ENV_VAR, "").strip()
    if forced:
        launch.update(_parse_forced_launch(forced, configs))
        reason += f", {CONFIG_ENV_VAR}={forced}"
        if m % configs[launch["config"]].m_multiple:
            # Its tile order runs M in bands of whole clusters of tiles (ffi/kernels/m_bands.cuh).
            raise ValueError(f"{CONFIG_ENV_VAR}={forced!r}: config {launch['config']} runs M in "
                             f"{configs[launch['config']].m_bands} bands and needs M to be a "
                             f"multiple of {configs[launch['config']].m_multiple}, got M={m}")
        if configs[launch["config"]].scheduler == "split-tail" and launch["swizzle"] != 1:
            # Its mainloop plans the split on tiles padded to clusters, not to swizzle groups.
            raise ValueError(f"{CONFIG_ENV_VAR}={forced!r}: config {launch['config']} splits "
                             "its last round of tiles and takes no swizzle")
    return Choice(kernel_name, configs[launch["config"]], target, reason,
                  launch["swizzle"], launch["raster"])


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
        else:
            raise bad(f"options are swizzle={'|'.join(map(str, SWIZZLES))} and "
                      f"raster={'|'.join(RASTER_ORDERS)}, got {option!r}")
    return launch
