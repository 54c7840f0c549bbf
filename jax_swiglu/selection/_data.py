"""Tuning data: measured launch times, and what they say about shapes nobody measured.

A tuning data file (``jax_swiglu/data/<device kind>.json``, shipped in the wheel; written by
``benchmarks/tuning_data.py`` from calibration runs) holds, for one device fingerprint, the
GPU time of every candidate launch at each measured (dtype, M, N, K), each entry pointing at
the calibration that measured it (commit, GPU, driver, CUDA, jax, CUTLASS, date, command).

Two ways to use it:
  * an exact entry: the problem was measured; the fastest candidate there wins;
  * a learned rule for anything else: the cost model (_model.py) predicts every candidate's
    time from tiles, waves and bytes, and the measurements correct it. For each candidate the
    log of measured / predicted time at the measured problems nearest in (log M, log N,
    log K) is averaged, weighted by distance, and applied to the prediction at the new
    problem. The model carries what changes abruptly between shapes (rounds of tiles on the
    SMs, padding), the correction what changes smoothly (how efficient a config is there).

Grouped (mixture-of-experts) calls are corrected the same way from ``grouped_entries``: every
grouped row forced on some expert shapes and token counts under a balanced and a skewed routing
(the routing exists only on the device, so the choice weighs both), nearest in (log rows per
expert, log N, log K).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os

from .._native import KernelConfig
from . import _device, _model

FORMAT = "jax_swiglu-tuning/1"


@dataclasses.dataclass(frozen=True)
class LearnedRule:
    """How far measurements inform a prediction: the ``model.learned_rule`` section of a data
    file. A problem's distance to a measured one is in log units per dimension, divided by
    that dimension's ``log_scale`` (a factor of 2 in M counts as much as 1.6 in N or K); the
    ``neighbours`` nearest within ``max_distance`` are averaged, weighted by a Gaussian of
    their distance, and beyond it a candidate has no measurement close enough to correct it.
    The neighbours come from several shapes (``from_each_shape``): a calibration measures a
    shape at many M, and without that limit the nearest shape alone would fill them, its
    own tile rounding standing in for every shape's."""

    scale_m: float
    scale_n: float
    scale_k: float
    neighbours: int
    max_distance: float

    @classmethod
    def from_dict(cls, fields: dict) -> "LearnedRule":
        scales = fields["log_scale"]
        return cls(math.log(scales["m"]), math.log(scales["n"]), math.log(scales["k"]),
                   int(fields["neighbours"]), float(fields["max_distance"]))

    def distance(self, a, b) -> float:
        """How far apart two problems' (log m, log n, log k) are."""
        return math.sqrt(sum(((x - y) / scale) ** 2 for scale, x, y in
                             zip((self.scale_m, self.scale_n, self.scale_k), a, b)))

    def from_each_shape(self, points, here) -> list:
        """(distance to ``here``, value) of the measured ``points`` ((log m, log n, log k),
        value) that may inform a prediction at ``here``: of each measured shape (N, K), the
        point at here's M, or else the nearest M below it and the nearest above it."""
        chosen = {}
        for (lm, ln, lk), value in points:
            side = 0 if lm == here[0] else (1 if lm > here[0] else -1)
            distance = self.distance((lm, ln, lk), here)
            if (ln, lk, side) not in chosen or distance < chosen[(ln, lk, side)][0]:
                chosen[(ln, lk, side)] = (distance, value)
        return [found for (ln, lk, side), found in chosen.items()
                if side == 0 or (ln, lk, 0) not in chosen]

    def nearest_geometric_mean(self, scored) -> float | None:
        """exp of the Gaussian-weighted mean of the logs of the nearest (distance, log) pairs;
        None if none is near enough."""
        scored = [(d, r) for d, r in sorted(scored)[:self.neighbours] if d <= self.max_distance]
        if not scored:
            return None
        weights = [math.exp(-0.5 * d * d) for d, _ in scored]
        return math.exp(sum(w * r for w, (_, r) in zip(weights, scored)) / sum(weights))


def launch_id(config_key: str, splits: int = 1) -> str:
    """How tuning data names a launch: the config's key, and a split-K factor beyond 1."""
    return config_key if splits == 1 else f"{config_key}|splits={splits}"


def parse_launch_id(launch: str) -> tuple[str, int]:
    key, _, splits = launch.partition("|splits=")
    return key, int(splits) if splits else 1


@dataclasses.dataclass(frozen=True)
class Entry:
    dtype: str
    m: int
    n: int
    k: int
    launch_us: dict  # launch id -> GPU time (us)
    calibration: str
    xla_us: float | None = None  # the XLA path, timed through JAX
    cupti_us: dict | None = None  # launch id -> the same launch timed through JAX
    # Where launches of one entry come from several runs: launch id -> calibration id.
    launch_calibration: dict | None = None
    # The run that timed xla_us and cupti_us, where not ``calibration`` (a later run that
    # did not time XLA replaced the launches and kept them).
    xla_calibration: str | None = None

    @property
    def problem(self) -> _model.Problem:
        """The cost model's problem (fp8 entries stream one byte an element, as the model of
        an fp8 call does, so a correction relates like to like)."""
        return _model.Problem(self.m, self.n, self.k,
                              1 if self.dtype.startswith("float8") else 2)


@dataclasses.dataclass(frozen=True)
class GroupedEntry:
    """Grouped (mixture-of-experts) launches timed on one problem: ``m`` rows over ``experts``
    experts of ``[k, 2n]`` packed weights, routed as ``routing`` ("balanced" or "skewed", the
    cost model's ``routings``), each grouped row forced (benchmarks/bench_moe.py --launches)."""

    dtype: str
    m: int
    n: int
    k: int
    experts: int
    routing: str
    launch_us: dict  # config key -> GPU time (us)
    calibration: str

    @property
    def point(self) -> tuple[float, float, float]:
        return _grouped_point(self.m, self.n, self.k, self.experts)


class TuningData:
    """One device's measurements (see the module docstring)."""

    def __init__(self, document: dict, *, source: str = "<memory>"):
        if document.get("format") != FORMAT:
            raise ValueError(f"{source}: not a jax_swiglu tuning data file (format "
                             f"{document.get('format')!r}, expected {FORMAT!r})")
        self.source = source
        self.device = document["device"]
        model = document.get("model") or {}
        if "cost" not in model or "learned_rule" not in model:
            raise ValueError(f"{source}: no model constants (a 'model' section with 'cost' and "
                             "'learned_rule'); write the file with benchmarks/tuning_data.py")
        self.constants = _model.Constants.from_dict(model["cost"])
        self.rule = LearnedRule.from_dict(model["learned_rule"])
        self.heuristics = model.get("heuristics", {})
        self.calibrations = document.get("calibrations", {})
        self.configs = document.get("configs", {})
        self.entries = [Entry(**entry) for entry in document.get("entries", [])]
        self.grouped_entries = [GroupedEntry(**entry)
                                for entry in document.get("grouped_entries", [])]
        self._exact = {(e.dtype, e.m, e.n, e.k): e for e in self.entries}

    @classmethod
    def load(cls, path: str) -> "TuningData":
        with open(path) as f:
            return cls(json.load(f), source=path)

    def exact(self, dtype: str, m: int, n: int, k: int) -> Entry | None:
        return self._exact.get((dtype, m, n, k))

    def measured(self, dtype: str, *, grouped: bool = False) -> int:
        """How many problems of ``dtype`` (grouped ones with ``grouped``) the data measured."""
        return sum(e.dtype == dtype for e in (self.grouped_entries if grouped else self.entries))

    @functools.cached_property
    def _by_launch(self) -> dict:
        """launch id -> [(dtype, log m, log n, log k, log(measured / model))], for the
        correction; the model is evaluated with this data's own device."""
        device = self._model_device
        table: dict = {}
        for entry in self.entries:
            for launch, us in entry.launch_us.items():
                key, splits = parse_launch_id(launch)
                config = self.config(key)
                if config is None or not us or us <= 0:
                    continue
                predicted = _model.launch_us(config, splits, entry.problem, device.sm_count,
                                             device.dram_bytes_per_s, self.constants,
                                             device.cluster_slots)
                table.setdefault(launch, []).append(
                    (entry.dtype, math.log(entry.m), math.log(entry.n), math.log(entry.k),
                     math.log(us / predicted)))
        return table

    def measured_splits(self, key: str) -> set[int]:
        """The splits the data measured of the config named ``key``."""
        return {parse_launch_id(launch)[1] for launch in self._by_launch
                if parse_launch_id(launch)[0] == key}

    def config(self, key: str) -> KernelConfig | None:
        """The config a key names, as the data file records it (its id is the row in the build
        that measured it, informative only: this build may not compile it)."""
        fields = self.configs.get(key)
        if fields is None:
            return None
        known = {f.name for f in dataclasses.fields(KernelConfig)}
        return KernelConfig(**{name: value for name, value in fields.items() if name in known})

    def correction(self, launch: str, dtype: str, m: int, n: int, k: int) -> float | None:
        """exp(weighted mean log(measured / model)) of ``launch`` near (m, n, k), or None when
        no measurement of it is close enough."""
        here = _log_point(m, n, k)
        return self.rule.nearest_geometric_mean(self.rule.from_each_shape(
            [((lm, ln, lk), residual)
             for point_dtype, lm, ln, lk, residual in self._by_launch.get(launch, ())
             if point_dtype == dtype], here))

    def competitive(self, dtype: str, m: int, n: int, k: int, margin: float = 1.15) -> set | None:
        """Launch ids within ``margin`` of the fastest at one of the measured problems nearest
        to (m, n, k): the candidates worth predicting there (a launch never close to the best
        nearby is not trusted to win on an extrapolated correction). None without data near.
        Each nearby time is first carried to the call's M by the cost model (times the model's
        time at that M over its time at the neighbour's, on the neighbour's N and K): a
        neighbour whose M fills whole token tiles, or whole clusters of them, would otherwise
        rule out the launches that suit the M asked."""
        here = _log_point(m, n, k)
        near = sorted(self.rule.from_each_shape(
            [(_log_point(e.m, e.n, e.k), i)
             for i, e in enumerate(self.entries) if e.dtype == dtype and e.launch_us], here))
        near = [self.entries[i] for d, i in near[:self.rule.neighbours]
                if d <= self.rule.max_distance]
        if not near:
            return None
        found = set()
        for entry in near:
            at_m = dataclasses.replace(entry.problem, m=m)
            carried = {launch: us * self._model_ratio(launch, at_m, entry.problem)
                       for launch, us in entry.launch_us.items() if us and us > 0}
            best = min(carried.values())
            found |= {launch for launch, us in carried.items() if us <= margin * best}
        return found

    @functools.cached_property
    def _model_device(self):
        """The data's own device, as the cost model evaluates it (not the local GPU)."""
        return _device.device_from_dict(self.device, local=False)

    def _model_ratio(self, launch: str, here: _model.Problem, there: _model.Problem) -> float:
        """The cost model's time of ``launch`` at ``here`` over its time at ``there`` (1 where
        the data does not describe the launch's config)."""
        key, splits = parse_launch_id(launch)
        config = self.config(key)
        if config is None:
            return 1.0
        device = self._model_device
        times = [_model.launch_us(config, splits, problem, device.sm_count,
                                  device.dram_bytes_per_s, self.constants, device.cluster_slots)
                 for problem in (here, there)]
        return times[0] / times[1] if times[0] > 0 and times[1] > 0 else 1.0

    @functools.cached_property
    def _grouped_by_launch(self) -> dict:
        """(config key, routing) -> [(dtype, point, log(measured / model))] of the grouped
        entries, the model evaluated with this data's own device."""
        device = self._model_device
        table: dict = {}
        for entry in self.grouped_entries:
            groups = _model.routings(entry.m, entry.experts)[entry.routing]
            for key, us in entry.launch_us.items():
                config = self.config(key)
                if config is None or not us or us <= 0:
                    continue
                predicted = _model.grouped_us(config, _model.Problem(entry.m, entry.n, entry.k),
                                              groups, device.sm_count, device.dram_bytes_per_s,
                                              self.constants)
                table.setdefault((key, entry.routing), []).append(
                    (entry.dtype, entry.point, math.log(us / predicted)))
        return table

    def grouped_correction(self, key: str, routing: str, dtype: str, m: int, n: int, k: int,
                           experts: int) -> float | None:
        """The grouped row ``key``'s measured / model time under ``routing`` near the problem,
        as ``correction`` for dense launches; the distance's first coordinate is the rows per
        expert (what sizes a grouped call's tiles), not the rows. None when no grouped
        measurement of the row is close enough."""
        here = _grouped_point(m, n, k, experts)
        return self.rule.nearest_geometric_mean(
            [(self.rule.distance(point, here), residual)
             for point_dtype, point, residual in self._grouped_by_launch.get((key, routing), ())
             if point_dtype == dtype])

    def xla_ratio(self, dtype: str, m: int, n: int, k: int) -> float | None:
        """The XLA path's time over the fastest fused launch's, near (m, n, k): measured at an
        exact entry, else the distance-weighted geometric mean of the nearest entries that
        timed XLA. None where XLA was never timed nearby."""
        here = _log_point(m, n, k)
        scored = []
        for entry in self.entries:
            if entry.dtype != dtype or not entry.xla_us:
                continue
            ours = min((entry.cupti_us or entry.launch_us).values(), default=None)
            if ours:
                scored.append((self.rule.distance(_log_point(entry.m, entry.n, entry.k), here),
                               math.log(entry.xla_us / ours)))
        exact = [r for d, r in scored if d == 0.0]
        return math.exp(min(exact)) if exact else self.rule.nearest_geometric_mean(scored)


def _log_point(m: int, n: int, k: int) -> tuple[float, float, float]:
    return math.log(m), math.log(n), math.log(k)


def _grouped_point(m: int, n: int, k: int, experts: int) -> tuple[float, float, float]:
    return math.log(max(m, 1) / max(experts, 1)), math.log(n), math.log(k)


def data_path(device_kind: str) -> str:
    """The shipped data file for a device kind ("NVIDIA H200" -> data/NVIDIA_H200.json)."""
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in device_kind.strip())
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                        f"{name}.json")


@functools.cache
def shipped(device_kind: str) -> TuningData | None:
    """The shipped tuning data for ``device_kind``, or None if there is none."""
    path = data_path(device_kind)
    if not os.path.exists(path):
        return None
    return TuningData.load(path)


@functools.cache
def shipped_kinds() -> tuple[str, ...]:
    """Device kinds with shipped data."""
    folder = os.path.dirname(data_path("x"))
    kinds = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                kinds.append(json.load(f)["device"]["kind"])
    return tuple(kinds)


def _most_measured(documents, dtypes: tuple[str, ...], grouped: bool = False):
    """Of ``documents``, the one that measured the most problems of ``dtypes``; ties go to
    the first."""
    documents = [d for d in documents if d is not None]
    if not documents:
        return None
    return max(documents, key=lambda d: sum(d.measured(t, grouped=grouped) for t in dtypes))


SIXTEEN_BIT = ("bfloat16", "float16")


def any_sm90() -> TuningData | None:
    """The shipped SM90 part that measured the most 16-bit calls, the library's main ones
    (its constants and corrections serve a GPU with no data of its own; a lowering for CUDA
    with no GPU here assumes that part, so fp8 data measured on another part does not move
    the 16-bit picks made without a GPU)."""
    return _most_measured((shipped(kind) for kind in shipped_kinds()), SIXTEEN_BIT)


def corrections_for(device_kind: str | None, dtype: str, *,
                    grouped: bool = False) -> TuningData | None:
    """The data whose measurements correct the cost model for ``dtype`` calls (grouped ones
    with ``grouped``) on ``device_kind``: that kind's shipped data where it measured such
    calls; else the shipped part that measured most of them (another SM90 part's
    corrections: the model carries this GPU's SMs and bandwidth); else this kind's data or
    any_sm90's, for their constants alone."""
    own = shipped(device_kind) if device_kind else None
    if own is not None and own.measured(dtype, grouped=grouped):
        return own
    measured = [data for data in (shipped(kind) for kind in shipped_kinds())
                if data is not None and data.measured(dtype, grouped=grouped)]
    return _most_measured(measured, (dtype,), grouped) or own or any_sm90()
