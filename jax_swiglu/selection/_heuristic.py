"""Step 4 of the engine: what the hardware alone says, where no measurement is near.

* 16-bit operands: the cost model (_model.py) ranks every candidate launch from tiles, waves
  on this GPU's SMs and bytes, with the XLA path predicted the same way.
* e4m3 operands, which have no tuning data yet: a rule of waves. Few tokens (M up to the
  largest swap-AB tile) stream the weights once, so the tensor cores' M side should be the
  weights (swap-AB), with the smallest token tile that holds M (less shared memory per stage,
  more stages in flight) and stream-K spreading the K loop over every SM whatever the tile
  count. More tokens go on the M side: whole waves of tiles over the SM count run best on the
  persistent scheduler with 2x1 clusters (the weight tile multicast to both CTAs), in the
  tiles whose whole waves cost the least: the work they compute, and on the cooperative
  schedule, whose epilogue stalls both math warpgroups, an epilogue that costs as much as
  ``cooperative_epilogue_k`` more of K a tile (the pingpong schedule overlaps it with the
  other warpgroup's mainloop). Promoted accumulation has only 128 x 128 cooperative tiles;
  fast accumulation adds 128 x 256 cooperative and 128 x 192 pingpong ones; a tie goes to
  the larger tile (fewer operand bytes per product). A ragged last wave of the cooperative
  tile (less than ``full_last_wave`` of the SMs busy in a call of at most ``many_waves``
  waves) is spread over every SM by stream-K instead (whether that spread also pays
  against the pingpong tile is not measured yet: a pingpong pick stays persistent). The
  rule picks among the rows every build compiles; the Optional ones run when forced or
  autotuned.

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
        config, reason = waves_rule(problem.m, problem.n, problem.k, device.sm_count,
                                    candidates, data.heuristics["e4m3"])
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
    """(token tiles, packed-column tiles) of a tokens-side row, before cluster padding."""
    return math.ceil(m / config.tile_m), math.ceil(2 * _layout.padded_n(n) / config.tile_n)


def _padded_work(config, m: int, n: int, sm_count: int) -> int:
    """Tokens x packed columns the whole waves of a tokens-side row compute: its tiles padded
    to whole clusters (the cost model's grid: a padded tile computes too), the last wave
    counted whole."""
    tiles = math.prod(_model.tile_grid(config, _model.Problem(m, n, 1)))
    return math.ceil(tiles / sm_count) * sm_count * config.tile_m * config.tile_n


def _waves_cost(config, m: int, n: int, k: int, sm_count: int, constants: dict) -> float:
    """The rule's cost of a persistent tokens-side row: its padded whole-wave work, times
    (K + cooperative_epilogue_k) / K on the cooperative schedule."""
    work = _padded_work(config, m, n, sm_count)
    if config.schedule == "cooperative":
        work *= 1 + constants["cooperative_epilogue_k"] / k
    return work


def waves_rule(m: int, n: int, k: int, sm_count: int, candidates, constants: dict):
    """The e4m3 rule of the module docstring among ``candidates`` (rows that can run the
    problem; only the rows every build compiles are considered): (config, reason)."""
    rows = [c for c in candidates if not c.optional]
    swap = sorted((c for c in rows if c.m_side == "weights" and not c.is_gemv),
                  key=lambda c: c.tile_m)
    fitting = [c for c in swap if c.tile_m >= m]
    if fitting:
        c = fitting[0]
        return c, (f"M={m} tokens fit one swap-AB tile of {c.tile_m}: the weights stream once "
                   f"over all {sm_count} SMs (stream-K)")
    tokens = [c for c in rows if c.m_side == "tokens"]
    # The persistent rows (under fast accumulation the fast-accumulation rows too): the
    # cheapest whole waves, then a larger tile, then a fast-accumulation row.
    persistent_rows = [c for c in tokens if c.scheduler == "persistent"]
    persistent = min(persistent_rows,
                     key=lambda c: (_waves_cost(c, m, n, k, sm_count, constants),
                                    -c.tile_m * c.tile_n, not c.fast_accumulation))
    stream_k = next((c for c in tokens if c.scheduler == "stream-k"), None)
    tiles = math.prod(_tiles(persistent, m, n))
    waves = tiles / sm_count
    last = tiles % sm_count
    fill = 1.0 if last == 0 else last / sm_count
    described = (f"{tiles} tiles of {persistent.tile_m}x{persistent.tile_n} ({persistent.schedule})"
                 f" are {waves:.2f} waves on {sm_count} SMs")
    if (stream_k is None or persistent.schedule != "cooperative"
            or waves > constants["many_waves"] or fill >= constants["full_last_wave"]):
        return persistent, f"{described}: persistent"
    return stream_k, (f"{described}, the last {fill:.0%} full: stream-K "
                      f"({stream_k.tile_m}x{stream_k.tile_n}) spreads it")
