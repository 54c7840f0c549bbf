"""Step 4 of the engine: what the hardware alone says, where no measurement is near.

* 16-bit operands: the cost model (_model.py) ranks every candidate launch from tiles, waves
  on this GPU's SMs and bytes, with the XLA path predicted the same way.
* e4m3 operands, which have no tuning data yet: at decode (up to the gemv rows' tokens) the
  tensor-core gemv row the cost model predicts fastest, K unsplit (the weights streamed
  once, no workspace); else a rule of waves. Few tokens (M up to the
  largest stream-K swap-AB tile) stream the weights once, so the tensor cores' M side should
  be the weights (swap-AB), with the smallest token tile that holds M (less shared memory per
  stage, more stages in flight) and stream-K spreading the K loop over every SM whatever the
  tile count. More tokens run persistent tiles, the weights multicast over 2-CTA clusters:
  tokens on the M side (128 x 128 and 128 x 192 cooperative tiles; under fast accumulation
  also 128 x 256 cooperative and 128 x 192 pingpong ones), or still on the N side in tiles of
  160 tokens by 128 packed columns, which pad a few hundred tokens less than 128-row tiles
  rounded up to their cluster do. The rule takes the tile whose whole waves over the SM count
  cost the least: the work they compute, times what each tile adds to its K loop. The
  cooperative schedule's epilogue stalls both math warpgroups for as long as
  ``cooperative_epilogue_k`` more of K would take (the pingpong schedule overlaps it with the
  other warpgroup's mainloop), the swap-AB epilogue's pairing of gate and up through shared
  memory ``swap_ab_epilogue_k`` more; under promoted accumulation each promotion drains the
  tensor cores (it waits for every wgmma in flight) for as long as ``promotion_drain_n`` more
  columns of a wgmma would take, so a wider wgmma hides it better (fast accumulation promotes
  once, after the last k tile). A row promoting in halves hides most of it behind the other
  half's wgmma; what it still costs, ``promotion_in_halves_drain_n`` columns, was measured per
  tile width (the nearest measured width stands for another). A tie goes to the larger tile
  (fewer operand bytes per product). A ragged last wave of the cooperative tokens-side tile
  (less than ``full_last_wave`` of the SMs busy in a call of at most ``many_waves`` waves) is
  spread over every SM by stream-K instead (whether that spread also pays against the
  pingpong or the swap-AB tile is not measured yet: those picks stay persistent). The rule
  picks among the rows every build compiles; the Optional ones run when forced or autotuned.

The constants of both come from a tuning data file (``model``): this GPU's, or another SM90
part's.
"""

from __future__ import annotations

import math

from .. import _launch, _layout
from . import _model


def _fmt(us: float) -> str:
    return f"{us:.1f} us"


def decide(problem, model: _model.Problem, candidates, device, data, xla_allowed: bool):
    """The heuristic's Decision for ``problem`` among ``candidates`` on ``device``, with the
    constants of ``data`` (a TuningData)."""
    from ._engine import Decision

    if data is None:
        raise RuntimeError("jax_swiglu: no tuning data file is shipped, so the cost model has "
                           "no constants; reinstall the package")
    if problem.operands == "e4m3":
        gemv = _e4m3_gemv(model, candidates, device, data.constants)
        if gemv is not None:
            return Decision(gemv[0], "heuristic", gemv[1])
        config, reason = waves_rule(problem.m, problem.n, problem.k, device.sm_count,
                                    candidates, data.heuristics["e4m3"],
                                    promoted=problem.accumulation != "fast")
        return Decision(_launch.Launch(config.id), "heuristic", reason)
    from ._engine import split_choices
    by_key = {config.key: config for config in candidates}
    predicted = model_alone(candidates, model, device, data.constants, split_choices)
    (best_key, best_splits), best_us = min(predicted.items(), key=lambda item: item[1])
    best_id = by_key[best_key].id
    basis = f"the cost model alone on {device.sm_count} SMs (no measurement near)"
    label = f"config {best_id}" + (f" (split {best_splits})" if best_splits > 1 else "")
    if xla_allowed and _model.xla_us(model, device.sm_count, device.dram_bytes_per_s,
                                     data.constants) < best_us:
        return Decision(None, "heuristic", f"XLA predicted faster than {label} ({basis})")
    others = sorted((us, key) for key, us in predicted.items() if key != (best_key, best_splits))
    runner_up = ""
    if others:
        (other_key, other_splits) = others[0][1]
        other_id = by_key[other_key].id
        runner_up = (f"; next config {other_id}" + (f" (split {other_splits})" if other_splits > 1
                                                     else "") + f" {_fmt(others[0][0])}")
    return Decision(_launch.Launch(best_id, best_splits), "heuristic",
                    f"predicted {_fmt(best_us)}{runner_up} ({basis})")


def _e4m3_gemv(model: _model.Problem, candidates, device, constants):
    """(launch, reason) of the e4m3 tensor-core gemv rows for a decode call (at most the
    rows' tokens), or None: the weights streamed once with no workspace, the row the cost
    model predicts fastest from its CTAs' waves on this GPU's SMs and its bytes. Unsplit:
    the model does not price a cluster's reduction (each extra CTA's partial sums through
    distributed shared memory, then a cluster barrier), and the measured tensor-core gemv
    splits (the 16-bit rows' tuning data, the fp8 decode runs) lose to the unsplit grid
    wherever it holds a few dozen CTAs; where fp8 tuning data is near, the learned rule splits."""
    rows = [c for c in candidates if c.is_gemv and not c.optional and c.runs(model.m)]
    predicted = model_alone(rows, model, device, constants, lambda config, k: (1,))
    if not predicted:
        return None
    (key, _), us = min(predicted.items(), key=lambda item: item[1])
    config = next(c for c in rows if c.key == key)
    ctas = math.ceil(model.packed / config.tile_n)
    return (_launch.Launch(config.id),
            f"M={model.m} tokens: the e4m3 gemv row of {config.tile_n} packed columns a CTA "
            f"({ctas} CTAs on {device.sm_count} SMs, K unsplit), predicted {_fmt(us)} "
            f"(the cost model alone)")


# A split of K costs what the cost model does not price (each extra CTA's partial sums through
# distributed shared memory, a cluster barrier): a plain projection takes the fewest splits
# whose prediction is within this share of the best.
PROJECTION_SPLIT_MARGIN = 0.05
PROJECTION_SPLITS = (1, 2, 4)


def projection_gemv(model: _model.Problem, candidates, device, constants):
    """(launch, reason) for a plain projection on the gemv rows (a block's down projection:
    ``model.packed`` output columns over K, at most the rows' tokens), or None. Unlike the
    gated call, whose wide grid of column tiles already fills the SMs, a down projection has
    a few dozen tiles of long K: one CTA a tile pulls at most what one SM can, so the cost
    model splits K over a cluster until the SMs together reach the HBM rate, and the fewest
    splits within PROJECTION_SPLIT_MARGIN of its best are taken."""
    rows = [c for c in candidates if c.is_gemv and not c.optional and c.runs(model.m)]
    predicted = model_alone(rows, model, device, constants, lambda config, k: PROJECTION_SPLITS)
    if not predicted:
        return None
    best = min(predicted.values())
    (key, splits), us = min(((launch, us) for launch, us in predicted.items()
                             if us <= best * (1 + PROJECTION_SPLIT_MARGIN)),
                            key=lambda item: (item[0][1], item[1]))
    config = next(c for c in rows if c.key == key)
    ctas = math.ceil(model.packed / config.tile_n)
    split = f"K over {splits} CTAs" if splits > 1 else "K unsplit"
    return (_launch.Launch(config.id, splits),
            f"M={model.m} tokens: the projection on the gemv row of {config.tile_n} columns a "
            f"CTA ({ctas} column tiles, {split}, on {device.sm_count} SMs), predicted "
            f"{_fmt(us)} (the cost model alone)")


def model_alone(candidates, model: _model.Problem, device, constants, splits_of) -> dict:
    """The cost model's time of every candidate launch, {(config key, splits): us}: stream-K
    configs with their own decomposition, the gemv kernel at each of its cluster sizes
    ``splits_of(config, k)`` (its only way to fill the SMs)."""
    return {(config.key, splits): _model.launch_us(config, splits, model, device.sm_count,
                                                   device.dram_bytes_per_s, constants,
                                                   device.cluster_slots)
            for config in candidates
            for splits in (splits_of(config, model.k) if config.is_gemv else (1,))}


def _tiles(config, m: int, n: int) -> tuple[int, int]:
    """(token tiles, packed-column tiles) of a row, before cluster padding."""
    return math.ceil(m / config.tile_m), math.ceil(2 * _layout.padded_n(n) / config.tile_n)


def _padded_work(config, m: int, n: int, sm_count: int) -> int:
    """Tokens x packed columns the whole waves of a row compute: its tiles padded
    to whole clusters (the cost model's grid: a padded tile computes too), the last wave
    counted whole."""
    tiles = math.prod(_model.tile_grid(config, _model.Problem(m, n, 1)))
    return math.ceil(tiles / sm_count) * sm_count * config.tile_m * config.tile_n


def _waves_cost(config, m: int, n: int, k: int, sm_count: int, constants: dict,
                promoted: bool) -> float:
    """The rule's cost of a persistent row: its padded whole-wave work, times (K + what its
    epilogue adds) / K (cooperative_epilogue_k on the cooperative schedule, swap_ab_epilogue_k
    more for a swap-AB tile) and, for a promoted call, (N + the drain's columns) / N of its
    wgmma's N side (the tile's packed columns, or a swap-AB tile's tokens)."""
    work = _padded_work(config, m, n, sm_count)
    epilogue_k = 0
    if config.schedule == "cooperative":
        epilogue_k += constants["cooperative_epilogue_k"]
    swap_ab = config.m_side == "weights"
    if swap_ab:
        epilogue_k += constants["swap_ab_epilogue_k"]
    work *= 1 + epilogue_k / k
    if promoted:
        width = config.tile_m if swap_ab else config.tile_n
        work *= 1 + _promotion_drain_n(config, width, constants) / width
    return work


def _promotion_drain_n(config, width: int, constants: dict) -> float:
    """The columns of wgmma a promotion's drain costs a tile ``width`` wide: CUTLASS's loop's
    ``promotion_drain_n``, or a row promoting in halves its measured width's value."""
    if config.accumulation != "promoted-in-halves":
        return constants["promotion_drain_n"]
    by_width = constants["promotion_in_halves_drain_n"]
    nearest = min(by_width, key=lambda measured: abs(math.log(int(measured) / width)))
    return by_width[nearest]


def waves_rule(m: int, n: int, k: int, sm_count: int, candidates, constants: dict,
               promoted: bool = True):
    """The e4m3 rule of the module docstring among ``candidates`` (rows that can run the
    problem; only the rows every build compiles are considered) for a promoted call, or with
    ``promoted=False`` a fast-accumulation one: (config, reason)."""
    rows = [c for c in candidates if not c.optional and not c.is_gemv]
    swap = sorted((c for c in rows if c.m_side == "weights" and c.scheduler == "stream-k"),
                  key=lambda c: c.tile_m)
    fitting = [c for c in swap if c.tile_m >= m]
    if fitting:
        c = fitting[0]
        return c, (f"M={m} tokens fit one swap-AB tile of {c.tile_m}: the weights stream once "
                   f"over all {sm_count} SMs (stream-K)")
    # The persistent rows (under fast accumulation the fast-accumulation rows too): the
    # cheapest whole waves, then a larger tile, then a fast-accumulation row.
    persistent_rows = [c for c in rows if c.scheduler == "persistent"]
    persistent = min(persistent_rows,
                     key=lambda c: (_waves_cost(c, m, n, k, sm_count, constants, promoted),
                                    -c.tile_m * c.tile_n, not c.fast_accumulation))
    tokens = [c for c in rows if c.m_side == "tokens"]
    stream_k = next((c for c in tokens if c.scheduler == "stream-k"), None)
    tiles = math.prod(_tiles(persistent, m, n))
    waves = tiles / sm_count
    last = tiles % sm_count
    fill = 1.0 if last == 0 else last / sm_count
    form = "swap-AB " if persistent.m_side == "weights" else ""
    described = (f"{tiles} {form}tiles of {persistent.tile_m}x{persistent.tile_n} "
                 f"({persistent.schedule}) are {waves:.2f} waves on {sm_count} SMs")
    if (stream_k is None or persistent.schedule != "cooperative"
            or persistent.m_side != "tokens"
            or waves > constants["many_waves"] or fill >= constants["full_last_wave"]):
        return persistent, f"{described}: persistent"
    return stream_k, (f"{described}, the last {fill:.0%} full: stream-K "
                      f"({stream_k.tile_m}x{stream_k.tile_n}) spreads it")
