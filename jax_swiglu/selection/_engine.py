"""Which launch runs a call: the fused candidates and the XLA path, resolved in one order.

  1. the user's autotune cache (``jax_swiglu.autotune``) for this GPU and problem;
  2. the shipped tuning data for this GPU (same kind and SM count) where it measured the
     call's dtype, at a measured problem: its fastest candidate there;
  3. the same data's learned rule anywhere else: the cost model on this GPU, corrected by
     the nearest measurements (_data.py);
  4. where this GPU's data does not cover the dtype (or there is none): the cost model on
     this GPU, corrected by another shipped SM90 part's measurements of the dtype;
  5. a heuristic where no data covers the candidates (_heuristic.py): for 16-bit operands the
     cost model alone, for e4m3 operands a rule of waves;
  6. the XLA path, where no fused candidate can run the problem.
The XLA path is a candidate at steps 2-5 like any launch: where it measured (or is predicted)
faster, it wins. Every kernel family and operand type is a set of candidates of this one
engine; the caller passes the ones that can run the problem.
"""

from __future__ import annotations

import dataclasses

from .. import _launch, _native
from . import _cache, _data, _heuristic, _model
from ._device import Device, device_from_dict, local_device


# The source of a pick the cost model made on this GPU, corrected by the measurements of
# another part (an unmeasured GPU, or a dtype its data did not measure).
OTHER_GPU_DATA = "another GPU's tuning data"


@dataclasses.dataclass(frozen=True)
class Decision:
    """A launch (or the XLA path: ``launch`` None) and why it was chosen."""

    launch: _launch.Launch | None
    source: str  # which step decided (see the module docstring)
    reason: str


def target_device() -> Device | None:
    """The GPU the lowering targets: the local one, or, lowering for CUDA with no GPU here,
    the device of the shipped tuning data (of the part that measured the most 16-bit calls,
    where several are shipped: `_data.any_sm90`)."""
    device = local_device()
    if device is not None:
        return device
    reference = _data.any_sm90()
    return device_from_dict(reference.device, local=False) if reference is not None else None


def _fmt(us: float) -> str:
    return f"{us:.1f} us"


def _label(config: _native.KernelConfig, splits: int) -> str:
    return f"config {config.id}" + (f" (split {splits})" if splits > 1 else "")


def _runner_up(times: dict, best) -> str:
    others = sorted((t, label) for label, t in times.items() if label != best)
    return f"; next {others[0][1]} {_fmt(others[0][0])}" if others else ""


def decide(problem, candidates, *, xla_allowed: bool = True, version: str = "0") -> Decision:
    """Steps 1-6 of the module docstring for ``problem`` (a selection.Problem) among
    ``candidates`` (rows that can run it); ``xla_allowed`` False leaves XLA out."""
    if not candidates:
        return Decision(None, "no candidate",
                        f"no compiled config on {problem.operands} operands runs "
                        f"M={problem.m} N={problem.n} K={problem.k}")
    by_key = {config.key: config for config in candidates}
    device = target_device()
    dtype, m, n, k = problem.data_dtype, problem.m, problem.n, problem.k

    # 1. autotune cache
    if device is not None and device.local:
        record = _cache.cache(version).lookup(device.fingerprint, dtype, m, n, k)
        if record is not None:
            if record.get("launch") == "xla" and xla_allowed:
                return Decision(None, "autotune cache", _cached_reason(record))
            key, splits = _data.parse_launch_id(record.get("launch", ""))
            if key in by_key:
                return Decision(_launch.Launch(by_key[key].id, splits), "autotune cache",
                                _cached_reason(record))

    data = _data.shipped(device.kind) if device is not None else None
    same_device = (data is not None and data.measured(dtype) > 0
                   and data.device["sm_count"] == device.sm_count
                   and int(data.device["compute_capability"]) == device.compute_capability)

    # 2. an exact entry of the shipped data
    if same_device:
        entry = data.exact(dtype, m, n, k)
        if entry is not None:
            decision = _from_entry(entry, by_key, data, xla_allowed)
            if decision is not None:
                return decision

    # 3./4. the learned rule: the cost model on this device, corrected by measurements (of
    # this dtype: this part's where it has some, else another part's); else the heuristic.
    # (Lowering for CUDA with no GPU here and no shipped device to assume: the model needs
    # some SM count and bandwidth, and takes an H100 SXM's.)
    if device is None:
        device = Device("unknown", 90, 132, 3.35e12, local=False)
    corrections = _data.corrections_for(device.kind, dtype)
    model = _model.Problem(m, n, k, element_bytes=1 if problem.operands == "e4m3" else 2)
    predicted = predict(corrections, device, candidates, dtype, model)
    if not predicted:
        # This part's own constants where it has data (each part's cost model is fitted on it).
        return _heuristic.decide(problem, model, candidates, device,
                                 data if data is not None else corrections, xla_allowed)
    (best_key, best_splits), best_us = min(predicted.items(), key=lambda item: item[1])
    best = by_key[best_key]
    where = corrections.source.rsplit("/", 1)[-1]
    if same_device:
        source = "tuning data (learned rule)"
        basis = f"the cost model corrected by the nearest measurements in {where}"
    else:
        source = OTHER_GPU_DATA
        basis = (f"the cost model on {device.sm_count} SMs, corrected by the measurements of "
                 f"{corrections.device['kind']} in {where}")
    ratio = corrections.xla_ratio(dtype, m, n, k)
    if xla_allowed and ratio is not None and ratio < 1.0:
        return Decision(None, source, f"XLA predicted faster than "
                        f"{_label(best, best_splits)} ({basis})")
    labels = {_label(by_key[key], splits): us for (key, splits), us in predicted.items()}
    label = _label(best, best_splits)
    return Decision(_launch.Launch(best.id, best_splits), source,
                    f"predicted {_fmt(best_us)}{_runner_up(labels, label)} ({basis})")


def split_choices(config, k: int) -> tuple[int, ...]:
    """A compiled row's split choices on K (the extension's)."""
    return _native.split_choices(config.id, k)


def predict(data, device: Device, candidates, dtype: str, problem: _model.Problem,
            splits_of=None) -> dict:
    """The learned rule's time of every candidate launch, {(config key, splits): us}: the cost
    model corrected by the measurements of that launch near the problem, for the launches
    close to the fastest at a measured problem nearby. Empty where no measurement is near.
    ``splits_of(config, k)``: the splits a candidate can run on K (by default the
    extension's, for this build's rows)."""
    splits_of = splits_of or split_choices
    predicted = {}
    if data is None:
        return predicted
    m, n, k = problem.m, problem.n, problem.k
    competitive = data.competitive(dtype, m, n, k)
    if competitive is None:
        return predicted
    for config in candidates:
        for splits in _measured_splits(data, config, k, splits_of):
            launch = _data.launch_id(config.key, splits)
            if launch not in competitive:
                continue
            factor = data.correction(launch, dtype, m, n, k)
            if factor is not None:
                predicted[(config.key, splits)] = factor * _model.launch_us(
                    config, splits, problem, device.sm_count, device.dram_bytes_per_s,
                    data.constants, device.cluster_slots)
    return predicted


def _measured_splits(data, config, k: int, splits_of) -> tuple[int, ...]:
    """The splits of ``config`` the data measured that it can run on K (its split choices
    where the data measured none)."""
    choices = splits_of(config, k)
    if not config.takes_splits:
        return choices
    measured = data.measured_splits(config.key)
    return tuple(s for s in choices if s in measured) or choices


def _from_entry(entry, by_key, data, xla_allowed) -> Decision | None:
    times = {}
    for launch, us in entry.launch_us.items():
        key, splits = _data.parse_launch_id(launch)
        if key in by_key:
            times[(key, splits)] = us
    if not times:
        return None
    (key, splits), us = min(times.items(), key=lambda item: item[1])
    # The finalists the calibration also timed through JAX (CUPTI, as a model runs them) are
    # ranked by that time: where two launches are close natively, what a jitted call pays
    # around the kernel decides.
    finalists = {(k, s): cupti for (k, s) in times
                 if (cupti := (entry.cupti_us or {}).get(_data.launch_id(k, s))) is not None}
    ranked_by_jax = len(finalists) > 1 and (key, splits) in finalists
    if ranked_by_jax:
        key, splits = min(finalists, key=finalists.get)
        us = times[(key, splits)]
    config = by_key[key]
    # The run that timed the pick (an entry can hold launches of several runs).
    run = (entry.launch_calibration or {}).get(_data.launch_id(key, splits), entry.calibration)
    calibration = data.calibrations.get(run, {})
    when = f"calibration {run}" + (
        f" ({calibration.get('date', '')[:10]}, {calibration.get('gpu', '')})" if calibration else "")
    label = _label(config, splits)
    # The times named are the ones ranked: through JAX where the finalists were, else native.
    ranked = finalists if ranked_by_jax else times
    labels = {_label(by_key[k], s): t for (k, s), t in ranked.items()}
    ours = ranked[(key, splits)]
    if xla_allowed and entry.xla_us:
        # XLA's time is through JAX: against the pick's time through JAX where it has one.
        through_jax = (entry.cupti_us or {}).get(_data.launch_id(key, splits), us)
        if entry.xla_us < through_jax:
            return Decision(None, "tuning data (measured)",
                            f"XLA measured {_fmt(entry.xla_us)} against {_fmt(through_jax)} for "
                            f"{label} in {when}")
        if ranked_by_jax:
            labels["XLA"] = entry.xla_us
    how = (f"measured through JAX {_fmt(ours)}{_runner_up(labels, label)} (the launches close "
           f"natively, ranked by a jitted call's time; natively {_fmt(us)})" if ranked_by_jax
           else f"measured {_fmt(us)}{_runner_up(labels, label)}")
    return Decision(_launch.Launch(config.id, splits), "tuning data (measured)",
                    f"{how} in {when}")


def _cached_reason(record: dict) -> str:
    us = record.get("us")
    return (f"autotuned on this GPU" + (f": {_fmt(us)}" if us else "")
            + (f" ({record['date'][:10]})" if record.get("date") else ""))


def device_and_data(data: _data.TuningData | None = None):
    """(the target GPU, or an H100-like SM90 part when none is known; ``data`` or the tuning
    data of that GPU's kind, else another SM90 part's): what the cost model prices on."""
    device = target_device()
    if device is None:
        device = Device("unknown", 90, 132, 3.35e12, local=False)
    data = data or _data.shipped(device.kind) or _data.any_sm90()
    if data is None:
        raise RuntimeError("jax_swiglu: no tuning data file is shipped, so the cost model has "
                           "no constants; reinstall the package")
    return device, data


def decide_projection(m: int, n_out: int, k: int, candidates, element_bytes: int = 1):
    """(launch, reason) of a plain projection ``[m, k] x [k, n_out]`` among gemv
    ``candidates``, or None: the heuristic's pick (_heuristic.projection_gemv) on the target
    GPU with the shipped data's constants; no data measures projections yet."""
    device, data = device_and_data()
    return _heuristic.projection_gemv(_model.Problem(m, n_out // 2, k, element_bytes),
                                      candidates, device, data.constants)
