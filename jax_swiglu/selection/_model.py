"""An analytic cost model of one call: what follows from the hardware, before any measurement.

For a launch (tile config, split-K factor) on a problem (M tokens, N outputs, K) it counts
the tiles, the rounds of tiles the device's SMs run (wave quantization: a last round of 30
tiles on 132 SMs costs a whole round of time), the padded work per tile, and the bytes the
call must move through DRAM; a round costs the larger of its tensor-core time and its share
of the DRAM stream. The rates are nominal (per-SM tensor-core peak, the device's DRAM peak):
what the model gets right is the *shape* of the cost over M, N and K, where tiles, waves and
padding change it abruptly. How fast each config really is at a given place (its efficiency)
comes from measurements (_data.py), as a correction to this model that varies smoothly.

With no measurements at all (an unknown GPU), the model alone ranks the candidates.
"""

from __future__ import annotations

import dataclasses
import math

from .. import _layout

@dataclasses.dataclass(frozen=True)
class Constants:
    """The model's rates and costs for one GPU: the ``model.cost`` section of its tuning data
    file (jax_swiglu/data/<device>.json), where benchmarks/tuning_data.py records them with
    what they were checked against. Nominal rates are leads; the fixed costs are what the
    leave-one-shape-out check (tuning_data --cross-validate) settled."""

    # Dense 16-bit tensor-core rate of one SM (e4m3 runs twice it).
    peak_flops_per_sm: float
    # How much more than its even share of DRAM bandwidth one SM can pull: a round with few
    # active tiles still streams faster than the even share, but not without limit.
    sm_bandwidth_factor: float
    # Fixed cost of a launch, and what stream-K adds to it: the workspace's memset before the
    # kernel and the fixed-order reduction of the split tiles at its end. That reduction is a
    # chain: the CTA that finishes a tile waits for each peer's partial sums in turn, so each
    # peer of a tile adds a link's latency (a flag and a partial tile through the L2).
    launch_us: float
    stream_k_us: float
    stream_k_peer_us: float
    # Stream-K's fixed-order reduction: a partial tile written and read back once per split.
    fixup_bytes_per_element: float
    # The share of the smaller of a round's tensor-core time and its DRAM time that the
    # pipeline does not hide behind the larger: 0 is a perfect roofline, 1 no overlap at all.
    # It matters where the two are close (the swap-AB tiles at a few hundred tokens).
    unhidden_share: float
    # The gemv kernel (CUDA cores): an SM's fp32 FMA lanes at its boost clock, and the
    # instructions each FMA brings along (unpacking the 16-bit values, loads, addressing).
    gemv_fma_per_sm_per_s: float
    gemv_issue_per_fma: float
    # How much more than its even share of DRAM bandwidth one SM pulls with the gemv kernel's
    # 16-byte loads, where few of its CTAs share the machine; and with the tensor-core form's
    # TMA stream, whose bytes in flight a CTA's ring of shared-memory stages bounds.
    gemv_sm_bandwidth_factor: float
    gemv_tma_sm_bandwidth_factor: float
    # What each round of the gemv kernels' CTAs costs beyond its bytes: a CTA starts its
    # stream empty (the first loads' latency) and ends with the cluster's reduction and the
    # store, which the next round's CTAs hide only in part.
    gemv_round_us: float
    # Of the operand bytes that tiles load more than once (the weights once per row of token
    # tiles, x once per column of weight tiles), the share that comes from DRAM again rather
    # than from the L2: tiles sharing an operand run at nearby times, but not all at once.
    reread_from_dram: float

    @classmethod
    def from_dict(cls, fields: dict) -> "Constants":
        known = {f.name for f in dataclasses.fields(cls)}
        missing = known - set(fields)
        if missing:
            raise ValueError(f"the tuning data's model constants lack {sorted(missing)}")
        return cls(**{name: float(fields[name]) for name in known})


@dataclasses.dataclass(frozen=True)
class Problem:
    m: int
    n: int
    k: int
    element_bytes: int = 2  # of x and the weights: 2 for 16-bit operands, 1 for e4m3

    @property
    def packed(self) -> int:
        """Packed columns: 2 * N rounded up to whole gate/up blocks."""
        return 2 * _layout.padded_n(self.n)

    @property
    def dram_bytes(self) -> int:
        """Each input read once and the output written once."""
        return self.element_bytes * (self.k * self.packed + self.m * self.k + self.m * self.n)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.packed


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def tile_grid(config, problem: Problem) -> tuple[int, int]:
    """(token tiles, packed-column tiles) of ``config`` on ``problem``, padded to clusters."""
    tiles_m = _ceil(problem.m, config.tile_m)
    tiles_n = _ceil(problem.packed, config.tile_n)
    tiles_m = _ceil(tiles_m, config.cluster_m) * config.cluster_m
    tiles_n = _ceil(tiles_n, config.cluster_n) * config.cluster_n
    return tiles_m, tiles_n


def round_ctas(config, sm_count: int, cluster_slots: dict | None = None) -> int:
    """CTAs of the persistent grid, one round of tiles: whole clusters. A cluster's CTAs run
    in one GPC (a group of SMs), so fewer clusters than sm_count / size may fit at once;
    ``cluster_slots`` (the device's count per cluster size, as the GPU reports it:
    ffi/cluster_slots.cu) says how many, and the kernels' grid is that many
    (ffi/kernels/launch_gemm.cuh, MaxActiveClusters). Without it, sm_count / size."""
    cluster = config.cluster_m * config.cluster_n
    slots = (cluster_slots or {}).get(cluster, sm_count // cluster)
    return max(cluster, slots * cluster)


def split_tail_clusters(config, problem: Problem, sm_count: int,
                        cluster_slots: dict | None = None) -> int:
    """Clusters of a split-tail config that run a 64-row half tile in the last round (0: the
    round does not split), as the kernel plans it (ffi/kernels/split_tail.cuh,
    SplitTailPlan): the persistent grid (round_ctas) but no more CTAs than tiles, tiles
    padded to whole clusters, and a last round at most half full split in halves."""
    tiles_m, tiles_n = tile_grid(config, problem)
    cluster = config.cluster_m * config.cluster_n
    ctas = min(round_ctas(config, sm_count, cluster_slots), tiles_m * tiles_n)
    last = (tiles_m * tiles_n) % ctas
    return 2 * (last // cluster) if last and 2 * last <= ctas else 0


def _stream_k_keeps_whole_tiles(tiles: int, per_round: int, k_tiles: int) -> bool:
    """Where CUTLASS's stream-K scheduler splits no tile: whole rounds, or too few k tiles."""
    return tiles % per_round == 0 or k_tiles <= 8


def rounds(config, splits: int, problem: Problem, sm_count: int,
           cluster_slots: dict | None = None) -> float:
    """Rounds of whole-tile time the call takes on ``sm_count`` SMs (fractions where the
    scheduler balances a ragged last round: stream-K, split tails)."""
    tiles_m, tiles_n = tile_grid(config, problem)
    tiles = tiles_m * tiles_n
    per_round = round_ctas(config, sm_count, cluster_slots)
    k_tiles = _ceil(problem.k, config.tile_k)
    if config.scheduler == "stream-k":
        if splits > 1:
            splits = min(splits, k_tiles)
            return math.ceil(tiles * splits / per_round) / splits
        if _stream_k_keeps_whole_tiles(tiles, per_round, k_tiles):
            return math.ceil(tiles / per_round)
        return tiles / per_round
    per_round = min(per_round, tiles)
    full, last = divmod(tiles, per_round)
    if config.scheduler == "split-tail" and split_tail_clusters(config, problem, sm_count,
                                                                  cluster_slots):
        return full + 0.5
    return full + (1 if last else 0)


def gemv_slots(config, splits: int, sm_count: int, cluster_slots: dict | None = None) -> int:
    """CTAs of a gemv launch with K split over clusters of ``splits`` that run at once: the
    clusters that fit (a cluster runs inside one GPC: ``cluster_slots``, as round_ctas), each
    SM holding ``config.ctas_per_sm``."""
    clusters = sm_count if splits == 1 else (cluster_slots or {}).get(splits, sm_count // splits)
    return max(splits, clusters * splits) * config.ctas_per_sm


def gemv_us(config, splits: int, problem: Problem, sm_count: int, dram_bytes_per_s: float,
            constants: Constants, cluster_slots: dict | None = None) -> float:
    """Predicted GPU time (us) of a gemv kernel with K split over ``splits`` CTAs: the
    larger of the FMA issue (the CUDA-core form) and the weight stream, plus a fixed cost per
    round of CTAs (the SMs hold ``gemv_slots`` at once). Every CTA streams the same share of
    the weights, and the stream takes the longer of the DRAM's time for all of them and the
    busiest SM's for its CTAs (ceil(CTAs / SMs) of them, at most gemv_sm_bandwidth_factor
    times its even share of the bandwidth, gemv_tma_sm_bandwidth_factor for the tensor-core
    form): a grid of a little more CTAs than SMs waits for the SMs that run two, and a grid
    of fewer CTAs than SMs cannot reach the DRAM's rate."""
    ctas = _ceil(problem.packed, config.tile_n) * splits
    slots = gemv_slots(config, splits, sm_count, cluster_slots)
    cta_bytes = problem.element_bytes * config.tile_n * _ceil(problem.k, splits)
    factor = (constants.gemv_tma_sm_bandwidth_factor if config.schedule == "tensor-cores"
              else constants.gemv_sm_bandwidth_factor)
    sm_rate = factor * dram_bytes_per_s / sm_count
    stream_s = max(ctas * cta_bytes / dram_bytes_per_s,
                   _ceil(ctas, sm_count) * cta_bytes / sm_rate)
    stream_s += problem.element_bytes * problem.m * (problem.k + problem.n) / dram_bytes_per_s
    fma_s = 0.0
    if config.schedule == "cuda-cores":  # the tensor cores' multiply is a few instructions
        fma_s = (constants.gemv_issue_per_fma * problem.m * problem.k * problem.packed
                 / (constants.gemv_fma_per_sm_per_s * sm_count))
    return (constants.launch_us + constants.gemv_round_us * _ceil(ctas, slots)
            + 1e6 * max(fma_s, stream_s))


def stream_k_peers(config, splits: int, problem: Problem, sm_count: int) -> float:
    """Peers per tile in a stream-K launch's fixup chain (0 for other schedulers): split-K's
    other splits; stream-K's CTAs sharing a tile where there are fewer tiles than SMs (at
    most one per k tile), one where only a ragged last wave is spread; none where CUTLASS
    keeps whole tiles."""
    if config.scheduler != "stream-k":
        return 0.0
    tiles_m, tiles_n = tile_grid(config, problem)
    tiles = tiles_m * tiles_n
    k_tiles = _ceil(problem.k, config.tile_k)
    if splits > 1:
        return float(min(splits, k_tiles) - 1)
    if _stream_k_keeps_whole_tiles(tiles, sm_count, k_tiles):
        return 0.0
    if tiles < sm_count:
        return max(0.0, min(sm_count / tiles, k_tiles) - 1)
    return 1.0


def launch_us(config, splits: int, problem: Problem, sm_count: int, dram_bytes_per_s: float,
              constants: Constants, cluster_slots: dict | None = None) -> float:
    """Predicted GPU time (us) of one launch of ``config`` with ``splits`` (``cluster_slots``:
    round_ctas)."""
    if config.scheduler == "cluster-split-k":
        return gemv_us(config, splits, problem, sm_count, dram_bytes_per_s, constants,
                       cluster_slots)
    tiles_m, tiles_n = tile_grid(config, problem)
    tiles = tiles_m * tiles_n
    k_padded = _ceil(problem.k, config.tile_k) * config.tile_k
    tile_flops = 2 * config.tile_m * config.tile_n * k_padded
    compute_s = tile_flops / (constants.peak_flops_per_sm * (2 if problem.element_bytes == 1 else 1))
    # A round's share of the DRAM stream (each operand once, and a share of the rereads of
    # the weights by every row of token tiles and of x by every column of weight tiles), and
    # what one SM's tile can pull alone.
    round_count = rounds(config, splits, problem, sm_count, cluster_slots)
    e = problem.element_bytes
    loaded = e * k_padded * (tiles_m * config.tile_m * tiles_n + tiles_n * config.tile_n * tiles_m)
    once = e * k_padded * (tiles_m * config.tile_m + tiles_n * config.tile_n)
    dram_bytes = problem.dram_bytes + constants.reread_from_dram * max(0, loaded - once)
    per_round_s = dram_bytes / dram_bytes_per_s / max(round_count, 1e-9)
    tile_bytes = problem.element_bytes * config.tile_n * k_padded
    per_tile_s = tile_bytes / (constants.sm_bandwidth_factor * dram_bytes_per_s / sm_count)
    memory_s = max(per_round_s, per_tile_s)
    seconds = round_count * (max(compute_s, memory_s)
                             + constants.unhidden_share * min(compute_s, memory_s))
    overhead_us = constants.launch_us
    if config.scheduler == "stream-k":
        split_tiles = tiles if splits > 1 else min(tiles, sm_count)
        seconds += (split_tiles * config.tile_m * config.tile_n
                    * constants.fixup_bytes_per_element / dram_bytes_per_s)
        overhead_us += (constants.stream_k_us + constants.stream_k_peer_us
                        * stream_k_peers(config, splits, problem, sm_count))
    return overhead_us + 1e6 * seconds


def xla_us(problem: Problem, sm_count: int, dram_bytes_per_s: float,
           constants: Constants) -> float:
    """Predicted GPU time (us) of the XLA path on packed weights: one GEMM with an fp32
    result, then SiLU * up, which writes and reads the [M, 2N] fp32 product once more."""
    gemm_s = max(problem.flops / (constants.peak_flops_per_sm * sm_count),
                 problem.dram_bytes / dram_bytes_per_s)
    round_trip_s = (problem.m * problem.packed * 4 * 2) / dram_bytes_per_s
    return 2 * constants.launch_us + 1e6 * (gemm_s + round_trip_s)


def routings(m: int, experts: int) -> dict[str, list[tuple[int, int]]]:
    """Two routings of ``m`` rows over ``experts`` experts, as (rows, experts with that many)
    pairs, that a grouped call's choice weighs (its group sizes exist only on the device):
    "balanced" (an equal share each, within one row; with fewer rows than experts, one row
    each for m of them) and "skewed" (one expert takes half the rows, a quarter of the
    experts none, the rest an equal share), benchmarks/bench_moe.py's two routings."""
    def spread(rows: int, over: int) -> list[tuple[int, int]]:
        share, extra = divmod(rows, over)
        return [(r, c) for r, c in ((share + 1, extra), (share, over - extra)) if r and c]

    balanced = spread(m, experts)
    if experts == 1:
        return {"balanced": balanced, "skewed": balanced}
    heavy = m // 2
    rest = max(1, experts - 1 - experts // 4)
    skewed = ([(heavy, 1)] if heavy else []) + spread(m - heavy, rest)
    return {"balanced": balanced, "skewed": skewed}


def grouped_us(config, problem: Problem, groups: list[tuple[int, int]], sm_count: int,
               dram_bytes_per_s: float, constants: Constants) -> float:
    """Predicted GPU time (us) of a grouped row on a mixture-of-experts call of
    ``problem.m`` rows routed as ``groups`` ((rows, experts with that many) pairs, from
    ``routings``). Every expert's token tiles (its last one ragged) and column tiles run in
    one persistent grid, one tile per SM at a time, no clusters
    (ffi/kernels/schedulers/expert_groups.cuh); each active expert's weights stream from
    DRAM once, and the rereads (of an expert's weights by its further token tiles, of its x
    rows by its further column tiles) add the dense model's share."""
    tiles_n = _ceil(problem.packed, config.tile_n)
    k_padded = _ceil(problem.k, config.tile_k) * config.tile_k
    e = problem.element_bytes
    active = sum(count for rows, count in groups if rows)
    tiles_m = sum(_ceil(rows, config.tile_m) * count for rows, count in groups)
    tiles = max(1, tiles_m * tiles_n)
    round_count = _ceil(tiles, sm_count)
    compute_s = 2 * config.tile_m * config.tile_n * k_padded / constants.peak_flops_per_sm
    weights = e * k_padded * tiles_n * config.tile_n  # one expert's
    rereads = (max(0, tiles_m - active) * weights
               + e * k_padded * (tiles_n - 1) * tiles_m * config.tile_m)
    dram_bytes = (active * weights + e * problem.m * (problem.k + problem.n)
                  + constants.reread_from_dram * rereads)
    per_round_s = dram_bytes / dram_bytes_per_s / round_count
    per_tile_s = e * config.tile_n * k_padded / (constants.sm_bandwidth_factor
                                                 * dram_bytes_per_s / sm_count)
    memory_s = max(per_round_s, per_tile_s)
    return constants.launch_us + 1e6 * round_count * (
        max(compute_s, memory_s) + constants.unhidden_share * min(compute_s, memory_s))
