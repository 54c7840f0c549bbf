"""Which launch runs a call: the fused candidates and the XLA path, resolved in one order.

  1. the user's autotune cache (``jax_swiglu.autotune``) for this GPU and problem;
  2. the shipped tuning data for this GPU (same kind and SM count), at a measured problem:
     its fastest candidate there;
  3. the same data's learned rule anywhere else: the cost model on this GPU, corrected by
     the nearest measurements (_data.py);
  4. an analytic heuristic where no data covers the GPU or the candidates: the cost model
     alone, with this GPU's SM count and bandwidth (corrected by the data of another SM90
     part where there is some);
  5. the XLA path, where no fused candidate can run the problem.
The XLA path is a candidate at steps 2-4 like any launch: where it measured (or is predicted)
faster, it wins. A candidate must be compiled in this build and able to run the problem
(a banded config runs only multiples of its bands).
"""

from __future__ import annotations

import dataclasses

from .. import _native
from . import _cache, _data, _model
from ._device import Device, device_from_dict, local_device

# Stream-K configs are predicted with their own decomposition only, where data has none.
_DEFAULT_SPLITS = (1,)


@dataclasses.dataclass(frozen=True)
class Decision:
    """A launch (or the XLA path: ``config`` None) and why it was chosen."""

    config: _native.KernelConfig | None
    splits: int
    source: str  # which step decided (see the module docstring)
    reason: str


def runnable(config: _native.KernelConfig, m: int) -> bool:
    return config.runs(m)


def target_device() -> Device | None:
    """The GPU the lowering targets: the local one, or, lowering for CUDA with no GPU here,
    the device of the shipped tuning data (when exactly one kind is shipped)."""
    device = local_device()
    if device is not None:
        return device
    kinds = _data.shipped_kinds()
    if len(kinds) == 1:
        return device_from_dict(_data.shipped(kinds[0]).device, local=False)
    return None


def _candidates(kernel: str | None, m: int) -> list[_native.KernelConfig]:
    families = _native.kernel_configs()
    return [config for name, table in sorted(families.items())
            if kernel is None or name == kernel
            for config in table.values() if runnable(config, m)]


def _fmt(us: float) -> str:
    return f"{us:.1f} us"


def _describe_launch(config, splits: int) -> str:
    name = f"{config.kernel} config {config.id}" if config.id is not None else config.key
    return name + (f" (split-K {splits})" if splits > 1 else "")


def _runner_up(times: dict, best) -> str:
    others = sorted((t, label) for label, t in times.items() if label != best)
    return f"; next {others[0][1]} {_fmt(others[0][0])}" if others else ""


def decide(m: int, n: int, k: int, dtype: str, *, kernel: str | None = None,
           version: str = "0") -> Decision:
    """Steps 1-5 of the module docstring for a problem; ``kernel`` restricts the fused
    candidates to one family (and leaves XLA out)."""
    candidates = _candidates(kernel, m)
    if not candidates:
        return Decision(None, 1, "no candidate",
                        f"no compiled {kernel or 'fused'} config runs M={m}")
    by_key = {config.key: config for config in candidates}
    device = target_device()
    xla_allowed = kernel is None

    # 1. autotune cache
    if device is not None and device.local:
        record = _cache.cache(version).lookup(device.fingerprint, dtype, m, n, k)
        if record is not None:
            if record.get("launch") == "xla" and xla_allowed:
                return Decision(None, 1, "autotune cache", _cached_reason(record))
            key, splits = _data.parse_launch_id(record.get("launch", ""))
            if key in by_key:
                return Decision(by_key[key], splits, "autotune cache", _cached_reason(record))

    data = _data.shipped(device.kind) if device is not None else None
    same_device = (data is not None and data.device["sm_count"] == device.sm_count
                   and int(data.device["compute_capability"]) == device.compute_capability)

    # 2. an exact entry of the shipped data
    if same_device:
        entry = data.exact(dtype, m, n, k)
        if entry is not None:
            decision = _from_entry(entry, by_key, data, xla_allowed)
            if decision is not None:
                return decision

    # 3./4. the learned rule: the cost model on this device, corrected by measurements.
    # (Lowering for CUDA with no GPU here and no single shipped device to assume: the model
    # needs some SM count and bandwidth, and takes an H100 SXM's.)
    if device is None:
        device = Device("unknown", 90, 132, 3.35e12, local=False)
    corrections = data if data is not None else _any_sm90_data()
    predicted, learned = predict(corrections, device, candidates, dtype, m, n, k)
    (best_key, best_splits), best_us = min(predicted.items(), key=lambda item: item[1])
    best = by_key[best_key]
    where = corrections.source.rsplit("/", 1)[-1] if corrections is not None else ""
    if learned and same_device:
        source = "tuning data (learned rule)"
        basis = f"the cost model corrected by the nearest measurements in {where}"
    elif learned:
        source = "heuristic"
        basis = (f"the cost model on {device.sm_count} SMs, corrected by the measurements of "
                 f"{corrections.device['kind']} in {where}")
    else:
        source = "heuristic"
        basis = f"the cost model alone on {device.sm_count} SMs (no measurement near)"
    if xla_allowed and _xla_predicted_faster(corrections if learned else None, device, dtype,
                                             m, n, k, best_us):
        return Decision(None, 1, source, f"XLA predicted faster than "
                        f"{_describe_launch(best, best_splits)} ({basis})")
    labels = {_describe_launch(by_key[key], splits): us for (key, splits), us in predicted.items()}
    label = _describe_launch(best, best_splits)
    return Decision(best, best_splits, source,
                    f"predicted {_fmt(best_us)}{_runner_up(labels, label)} ({basis})")


def predict(data, device: Device, candidates, dtype: str, m: int, n: int,
            k: int) -> tuple[dict, bool]:
    """Predicted time of every candidate launch, {(config key, splits): us}, and whether it is
    the learned rule (the model corrected by ``data``) or, where no measurement of any
    candidate is near, the model alone. Candidates without a near measurement are left out
    of a learned prediction."""
    problem = _model.Problem(m, n, k)
    predicted = {}
    competitive = data.competitive(dtype, m, n, k) if data is not None else None
    for config in candidates:
        for splits in _splits_measured(data, config, k):
            launch = _data.launch_id(config.key, splits)
            if competitive is not None and launch not in competitive:
                continue
            factor = data.correction(launch, dtype, m, n, k) if data is not None else None
            if factor is not None:
                predicted[(config.key, splits)] = factor * _model.launch_us(
                    config, splits, problem, device.sm_count, device.dram_bytes_per_s)
    if predicted:
        return predicted, True
    return {(c.key, s): _model.launch_us(c, s, problem, device.sm_count, device.dram_bytes_per_s)
            for c in candidates for s in _model_splits(c, k)}, False


def _xla_predicted_faster(data, device: Device, dtype: str, m: int, n: int, k: int,
                          best_us: float) -> bool:
    if data is not None:
        ratio = data.xla_ratio(dtype, m, n, k)
        return ratio is not None and ratio < 1.0
    problem = _model.Problem(m, n, k)
    return _model.xla_us(problem, device.sm_count, device.dram_bytes_per_s) < best_us


def _model_splits(config, k: int) -> tuple[int, ...]:
    """The splits the model alone predicts: stream-K configs with their own decomposition,
    the gemv kernel at each of its cluster sizes (its only way to fill the SMs)."""
    return config.split_choices(k) if config.scheduler == "cluster-split-k" else _DEFAULT_SPLITS


def _splits_measured(data, config, k: int) -> tuple[int, ...]:
    if data is None or not config.splits_k:
        return _model_splits(config, k)
    measured = sorted({_data.parse_launch_id(launch)[1] for launch in data._by_launch
                       if _data.parse_launch_id(launch)[0] == config.key})
    valid = [s for s in measured if s in config.split_choices(k, measured)]
    return tuple(valid) or _model_splits(config, k)


def _any_sm90_data():
    kinds = _data.shipped_kinds()
    return _data.shipped(kinds[0]) if kinds else None


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
    if len(finalists) > 1 and (key, splits) in finalists:
        key, splits = min(finalists, key=finalists.get)
        us = times[(key, splits)]
    config = by_key[key]
    calibration = data.calibrations.get(entry.calibration, {})
    when = f"calibration {entry.calibration}" + (
        f" ({calibration.get('date', '')[:10]}, {calibration.get('gpu', '')})" if calibration else "")
    labels = {_describe_launch(by_key[k], s): t for (k, s), t in times.items()}
    label = _describe_launch(config, splits)
    if xla_allowed and entry.xla_us:
        ours = (entry.cupti_us or {}).get(_data.launch_id(key, splits), us)
        if entry.xla_us < ours:
            return Decision(None, 1, "tuning data (measured)",
                            f"XLA measured {_fmt(entry.xla_us)} against {_fmt(ours)} for "
                            f"{label} in {when}")
        labels["XLA"] = entry.xla_us
    return Decision(config, splits, "tuning data (measured)",
                    f"measured {_fmt(us)}{_runner_up(labels, label)} in {when}")


def _cached_reason(record: dict) -> str:
    us = record.get("us")
    return (f"autotuned on this GPU" + (f": {_fmt(us)}" if us else "")
            + (f" ({record['date'][:10]})" if record.get("date") else ""))
