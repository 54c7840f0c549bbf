"""The selection engine on the CPU: resolution order, the learned rule, the cost model, the
autotune cache, the fp8 rule, and (where the data file ships) that the engine reproduces its
argmin."""

import dataclasses
import functools
import json
import math
import multiprocessing
import os
import re
import stat
import warnings

import jax
import jax.numpy as jnp
import pytest

import jax_swiglu
from benchmarks import shapes
from jax_swiglu import _launch, _native, selection
from jax_swiglu.selection import _cache, _data, _device, _engine, _heuristic, _model

from helpers import requires_kernels

H200 = _device.Device("NVIDIA H200", 90, 132, 4.9e12, local=False)
with open(_data.data_path("NVIDIA H200")) as _f:
    MODEL = json.load(_f)["model"]
CONSTANTS = _model.Constants.from_dict(MODEL["cost"])


def config(id, **fields):
    """A row for the engine's tests (ids of no row of the real table: these are not launched)."""
    base = dict(family="interleaved", id=id, schedule="cooperative", tile_m=128, tile_n=256,
                tile_k=64, cluster_m=1, cluster_n=1, scheduler="persistent", store="direct",
                m_bands=1, m_side="tokens")
    fields = {**base, **fields}
    fields.setdefault("m_multiple", fields["m_bands"] * fields["tile_m"] * fields["cluster_m"]
                      if fields["m_bands"] > 1 else 1)
    fields.setdefault("takes_splits", fields["scheduler"] in ("stream-k", "cluster-split-k"))
    return _native.KernelConfig(**fields)


PREFILL = config(100)
DECODE = config(101, m_side="weights", tile_m=16, tile_n=128, scheduler="stream-k")
BANDED = config(102, schedule="pingpong", tile_n=192, cluster_m=2, m_bands=2)
CONFIGS = {c.id: c for c in (PREFILL, DECODE, BANDED)}


def fake_split_choices(config, k):
    """The split choices of the test rows (the extension's rule, written out)."""
    if config.scheduler == "stream-k":
        return tuple(s for s in (1, 2, 4) if s == 1 or s <= -(-k // config.tile_k))
    return (1,)


def problem(m, n=4096, k=4096, dtype="bfloat16"):
    return selection.Problem(m, n, k, dtype)


def decide(m, n=4096, k=4096, **kwargs):
    """The engine over the test rows that run M (what selection.candidates hands it)."""
    return _engine.decide(problem(m, n, k), [c for c in CONFIGS.values() if c.runs(m)],
                          **kwargs)


def document(entries, device=H200):
    configs = {c.key: {k: v for k, v in c.__dict__.items()} for c in CONFIGS.values()}
    return {"format": _data.FORMAT, "device": device.as_dict(), "model": MODEL,
            "calibrations": {"c1": {"date": "2026-12-01T00:00:00+00:00", "gpu": device.kind}},
            "configs": configs, "entries": entries}


def entry(m, n, k, times, **extra):
    return {"dtype": "bfloat16", "m": m, "n": n, "k": k, "calibration": "c1",
            "launch_us": {(c if isinstance(c, str) else c.key): t for c, t in times.items()},
            **extra}


def picked(decision):
    """The test row a decision launches (None for XLA)."""
    return None if decision.launch is None else CONFIGS[decision.launch.config]


@pytest.fixture
def engine(monkeypatch, tmp_path):
    """The engine over CONFIGS and a data document set by the test, on an H200 fingerprint."""
    state = {"data": None, "device": H200}
    monkeypatch.setattr(_engine, "target_device", lambda: state["device"])
    monkeypatch.setattr(_engine, "split_choices", fake_split_choices)
    monkeypatch.setattr(_data, "shipped", lambda kind: state["data"])
    monkeypatch.setattr(_data, "shipped_kinds", lambda: ["NVIDIA H200"])
    monkeypatch.setattr(_data, "any_sm90", lambda: state["data"])
    monkeypatch.setenv(_cache.CACHE_DIR_ENV_VAR, str(tmp_path / "cache"))

    def set_data(entries, device=H200):
        state["data"] = _data.TuningData(document(entries, device), source="data/NVIDIA_H200.json")

    state["set_data"] = set_data
    return state


def test_an_exact_entry_picks_its_fastest_candidate(engine):
    engine["set_data"]([entry(8, 4096, 4096, {PREFILL: 30.0, DECODE: 20.0}),
                        entry(4096, 4096, 4096, {PREFILL: 300.0, DECODE: 900.0})])
    decision = decide(8)
    assert picked(decision) is DECODE and decision.source == "tuning data (measured)"
    assert "measured 20.0 us" in decision.reason and "calibration c1" in decision.reason
    assert picked(decide(4096)) is PREFILL


def test_an_entry_names_the_run_that_timed_its_pick(engine):
    """A row timed by a later run (calibrate --configs) is named with that run, not with the
    run that made the entry."""
    engine["set_data"]([entry(8, 4096, 4096, {PREFILL: 30.0, DECODE: 20.0},
                              launch_calibration={PREFILL.key: "c1", DECODE.key: "c2"})])
    engine["data"].calibrations["c2"] = {"date": "2026-12-04T00:00:00+00:00", "gpu": "H200"}
    reason = decide(8).reason
    assert "in calibration c2 (2026-12-04, H200)" in reason, reason


def test_finalists_timed_through_jax_are_ranked_by_that_time(engine):
    """Close natively, the launch a jitted call runs faster wins; one CUPTI time alone (or
    none) leaves the native ranking."""
    engine["set_data"]([entry(1, 4096, 4096, {PREFILL: 20.0, DECODE: 20.3},
                              cupti_us={PREFILL.key: 21.0, DECODE.key: 19.8}),
                        entry(2, 4096, 4096, {PREFILL: 20.0, DECODE: 20.3},
                              cupti_us={DECODE.key: 19.8})])
    assert picked(decide(1)) is DECODE
    assert picked(decide(2)) is PREFILL
    # explain names the times it ranked by, so the pick never reads as the slower one.
    reason = decide(1).reason
    assert reason.startswith(f"measured through JAX 19.8 us; next config {PREFILL.id} 21.0 us "
                             "(the launches close natively, ranked by a jitted call's time; "
                             "natively 20.3 us)"), reason
    assert decide(2).reason.startswith(f"measured 20.0 us; next config {DECODE.id} 20.3 us")


def test_xla_is_a_measured_candidate(engine):
    engine["set_data"]([entry(1, 4096, 4096, {PREFILL: 30.0, DECODE: 20.0}, xla_us=18.0,
                              cupti_us={DECODE.key: 19.5})])
    decision = decide(1)
    assert picked(decision) is None
    assert "XLA measured 18.0 us against 19.5 us" in decision.reason
    # A forced fused family never falls back to XLA.
    assert picked(decide(1, xla_allowed=False)) is DECODE


def test_the_learned_rule_corrects_the_model_with_the_nearest_measurements(engine):
    # DECODE measured 2x its model, PREFILL 0.5x, at M = 8 and 16 on a shape: at M = 12 (not
    # measured) the prediction keeps those corrections.
    shape = lambda m: _model.Problem(m, 4096, 4096)  # noqa: E731
    model = lambda c, m: _model.launch_us(c, 1, shape(m), 132, 4.9e12, CONSTANTS)  # noqa: E731
    engine["set_data"]([entry(m, 4096, 4096, {PREFILL: 0.5 * model(PREFILL, m),
                                             DECODE: 2.0 * model(DECODE, m)}) for m in (8, 16)])
    data = engine["data"]
    assert data.correction(DECODE.key, "bfloat16", 12, 4096, 4096) == pytest.approx(2.0)
    predicted = _engine.predict(data, H200, [PREFILL, DECODE], "bfloat16", shape(12),
                                fake_split_choices)
    assert predicted[(PREFILL.key, 1)] == pytest.approx(0.5 * model(PREFILL, 12))
    decision = decide(12)
    assert decision.source == "tuning data (learned rule)" and picked(decision) is PREFILL
    # Far from every measurement there is nothing to correct with: the model alone decides.
    far = decide(12, 64, 128)
    assert far.source == "heuristic" and "the cost model alone" in far.reason


def test_a_shape_measured_at_many_m_speaks_once_on_each_side(engine):
    """The rule's neighbours come from several shapes: of each measured shape, the point at
    the query's M, or else the nearest M below and above it. A shape calibrated at many M
    (the nearest here) would otherwise fill every neighbour, its own tile rounding standing
    in for every shape's."""
    rule = _data.LearnedRule.from_dict(MODEL["learned_rule"])
    log = math.log
    near = [((log(m), log(9728), log(2560)), f"near {m}") for m in (160, 176, 192, 208, 224)]
    other = [((log(m), log(14336), log(4096)), f"other {m}") for m in (128, 256)]
    here = (log(200), log(8192), log(3072))
    assert sorted(v for _, v in rule.from_each_shape(near + other, here)) == [
        "near 192", "near 208", "other 128", "other 256"]
    # At a measured M the shape's point there alone.
    at_192 = (log(192), log(8192), log(3072))
    assert sorted(v for _, v in rule.from_each_shape(near + other, at_192)) == [
        "near 192", "other 128", "other 256"]
    # Corrections: DECODE runs 0.5x its model on a shape measured at eight M, 2x on one
    # measured at two; at a shape between them both shapes count alike, not the first more.
    dense, sparse = (4096, 4096), (8192, 8192)

    def timed(m, n, k, factor):
        return entry(m, n, k, {DECODE: factor * _model.launch_us(
            DECODE, 1, _model.Problem(m, n, k), 132, 4.9e12, CONSTANTS)})
    engine["set_data"]([timed(m, *dense, 0.5) for m in (2, 3, 4, 5, 6, 7, 9, 10)]
                       + [timed(m, *sparse, 2.0) for m in (7, 9)])
    factor = engine["data"].correction(DECODE.key, "bfloat16", 8, 5792, 5792)
    assert factor == pytest.approx(1.0, rel=1e-3), factor  # M = 7 and 9 of each, equally far


def test_launches_compete_at_the_m_asked_not_at_the_neighbours(engine):
    """Which launches the rule predicts is judged on the neighbours' times carried to the
    call's M by the cost model: at M = 256 a 2x1 cluster of 128-token tiles fills whole
    clusters and beats PREFILL by 1.2x, but at M = 300 it rounds up to 512 tokens where
    PREFILL computes 384, so PREFILL must stay a candidate there."""
    clustered = config(103, cluster_m=2)
    doc = document([entry(256, 32768, 4096, {PREFILL: 120.0, clustered.key: 100.0})])
    doc["configs"][clustered.key] = dict(clustered.__dict__)
    data = _data.TuningData(doc, source="data/NVIDIA_H200.json")
    assert data.competitive("bfloat16", 256, 32768, 4096) == {clustered.key}
    assert data.competitive("bfloat16", 300, 32768, 4096) == {clustered.key, PREFILL.key}
    predicted = _engine.predict(data, H200, [PREFILL, clustered], "bfloat16",
                                _model.Problem(300, 32768, 4096), fake_split_choices)
    assert min(predicted, key=predicted.get)[0] == PREFILL.key, predicted


FP8_TOKENS = config(110, operands="e4m3", tile_n=128, tile_k=128, cluster_m=2,
                    accumulation="promoted-in-halves")
FP8_SWAP = config(111, operands="e4m3", m_side="weights", tile_m=160, tile_n=128, tile_k=128,
                  cluster_n=2, accumulation="promoted-in-halves")
FP8_FAST = config(112, operands="e4m3", schedule="pingpong", tile_n=192, tile_k=128,
                  cluster_m=2, accumulation="fast")


def test_fp8_measurements_decide_fp8_calls_as_16_bit_ones(engine):
    """Tuning data measured on e4m3 operands (calibrate --operands e4m3) decides a promoted
    fp8 call as 16-bit data decides a 16-bit one: at a measured problem its fastest launch,
    near one the learned rule. Fast accumulation is its own dtype in the data (its rows and
    promotions differ), so promoted measurements leave a fast call to the rule of waves, and
    16-bit calls never read fp8 entries."""
    n, k = 14336, 4096
    fp8_rows = (FP8_TOKENS, FP8_SWAP, FP8_FAST)
    measured = [entry(777, n, k, {FP8_TOKENS: 194.0, FP8_SWAP: 175.8}),
                entry(2048, n, k, {FP8_TOKENS: 392.9, FP8_SWAP: 424.1})]
    for e in measured:
        e["dtype"] = "float8_e4m3fn"
    doc = document(measured)
    doc["configs"].update({c.key: dict(c.__dict__) for c in fp8_rows})
    engine["data"] = _data.TuningData(doc, source="data/NVIDIA_H200.json")

    def fp8(m, accumulation="promoted"):
        call = selection.Problem(m, n, k, "bfloat16", "e4m3", accumulation=accumulation)
        rows = [c for c in fp8_rows if accumulation == "fast" or not c.fast_accumulation]
        return _engine.decide(call, rows)

    # Corrections relate a measurement to the model of the same operands (one byte each).
    fp8_model = _model.launch_us(FP8_SWAP, 1, _model.Problem(777, n, k, 1), 132, 4.9e12,
                                 CONSTANTS)
    assert engine["data"].correction(FP8_SWAP.key, "float8_e4m3fn", 777, n, k) == (
        pytest.approx(175.8 / fp8_model))
    at_777, at_2048 = fp8(777), fp8(2048)
    assert at_777.launch == _launch.Launch(FP8_SWAP.id)
    assert at_2048.launch == _launch.Launch(FP8_TOKENS.id)
    assert at_777.source == at_2048.source == "tuning data (measured)"
    assert fp8(1024).source == "tuning data (learned rule)"
    assert fp8(777, "fast").source == "heuristic"
    assert decide(777, n, k).source == "heuristic"


def test_another_sm_count_is_corrected_as_another_gpu(engine):
    engine["set_data"]([entry(8, 4096, 4096, {PREFILL: 30.0, DECODE: 20.0})])
    engine["device"] = _device.Device("NVIDIA H100 PCIe", 90, 114, 2.0e12)
    decision = decide(8)
    assert decision.source == _engine.OTHER_GPU_DATA
    assert "114 SMs, corrected by the measurements of NVIDIA H200" in decision.reason
    assert "corrected by another GPU's measurements" in selection._WHY_LAUNCH[decision.source]


# (the engine fixture replaces these)
_SHIPPED_PART_MEASURED_MOST, _ENGINE_TARGET_DEVICE = _data.any_sm90, _engine.target_device


def test_each_dtype_is_corrected_by_the_part_that_measured_it(engine, monkeypatch):
    """Two parts ship data: one measured 16-bit calls, the other fp8 calls only. On the
    second, a 16-bit call is priced on its own SMs and bandwidth and corrected by the first
    part's measurements (as on a part with no data), an fp8 call by its own (an exact entry
    there); on the first, fp8 calls take the second's corrections; a lowering with no GPU
    here assumes the part that measured the most 16-bit calls, whatever the fp8 count."""
    h100 = _device.Device("NVIDIA H100 80GB HBM3", 90, 132, 3.35e12)
    n, k = 14336, 4096
    sixteen_bit = document([entry(m, n, k, {PREFILL: 3.0 * m, DECODE: 2.0 * m + 40.0})
                            for m in (8, 64, 512)])
    sixteen_bit["grouped_entries"] = [{
        "dtype": "bfloat16", "m": 512, "n": 768, "k": 2048, "experts": 128,
        "routing": "balanced", "launch_us": {PREFILL.key: 50.0}, "calibration": "c1"}]
    fp8_entries = [entry(m, n, k, {FP8_TOKENS: 1.0 * m + 60.0, FP8_SWAP: 1.5 * m})
                   for m in (777, 1400, 2048, 4096, 8192)]
    for e in fp8_entries:
        e["dtype"] = "float8_e4m3fn"
    fp8_only = document(fp8_entries, h100)
    fp8_only["configs"].update({c.key: dict(c.__dict__) for c in (FP8_TOKENS, FP8_SWAP)})
    parts = {H200.kind: _data.TuningData(sixteen_bit, source="data/NVIDIA_H200.json"),
             h100.kind: _data.TuningData(fp8_only, source="data/NVIDIA_H100_80GB_HBM3.json")}
    monkeypatch.setattr(_data, "shipped", parts.get)
    monkeypatch.setattr(_data, "shipped_kinds", lambda: tuple(sorted(parts)))
    monkeypatch.setattr(_data, "any_sm90", _SHIPPED_PART_MEASURED_MOST)
    assert _data.any_sm90() is parts[H200.kind]  # 3 16-bit problems against none (5 fp8)
    assert _data.corrections_for(h100.kind, "bfloat16") is parts[H200.kind]
    assert _data.corrections_for(h100.kind, "float8_e4m3fn") is parts[h100.kind]
    assert _data.corrections_for(H200.kind, "float8_e4m3fn") is parts[h100.kind]
    assert _data.corrections_for(H200.kind, "float8_e4m3fn/fast") is parts[H200.kind]
    assert _data.corrections_for(h100.kind, "bfloat16", grouped=True) is parts[H200.kind]
    assert _data.corrections_for("NVIDIA H20", "bfloat16", grouped=True) is parts[H200.kind]
    # No part measured fast calls: the constants of the part a lowering with no GPU assumes.
    assert _data.corrections_for("NVIDIA H20", "float8_e4m3fn/fast") is parts[H200.kind]

    def fp8(m):
        return _engine.decide(selection.Problem(m, n, k, "bfloat16", "e4m3"),
                              [FP8_TOKENS, FP8_SWAP])

    engine["device"] = h100
    on_h100 = decide(100, n, k)
    assert on_h100.source == _engine.OTHER_GPU_DATA and (
        "corrected by the measurements of NVIDIA H200" in on_h100.reason)
    assert fp8(777).source == "tuning data (measured)"
    assert fp8(777).launch == _launch.Launch(FP8_TOKENS.id)  # 837 us against 1165.5
    assert fp8(1024).source == "tuning data (learned rule)"
    engine["device"] = H200
    assert decide(8, n, k).source == "tuning data (measured)"
    on_h200 = fp8(777)
    assert on_h200.source == _engine.OTHER_GPU_DATA and (
        "corrected by the measurements of NVIDIA H100 80GB HBM3" in on_h200.reason)
    monkeypatch.setattr(_engine, "local_device", lambda: None)
    assert _ENGINE_TARGET_DEVICE().kind == H200.kind


@requires_kernels
def test_grouped_calls_on_a_gpu_without_grouped_data_take_another_gpus(monkeypatch):
    """A Hopper part with no shipped data (an H800's kind on an H100's facts): its grouped
    choice is the cost model on its SMs, corrected by the grouped measurements of the part
    that has the most of them, and says so; on an H100, its own grouped data decides."""
    facts = dict(_data.shipped("NVIDIA H100 80GB HBM3").device, kind="NVIDIA H800")
    h800 = _device.device_from_dict(facts, local=True)
    assert _data.shipped(h800.kind) is None
    most = max((_data.shipped(kind) for kind in _data.shipped_kinds()),
               key=lambda data: len(data.grouped_entries))
    measured = most.grouped_entries[0]
    problem = selection.GroupedProblem(measured.m, measured.n, measured.k, measured.experts,
                                       "bfloat16")
    monkeypatch.setattr(_engine, "target_device", lambda: h800)
    choice = selection.choose_grouped(problem)
    assert choice.source == _engine.OTHER_GPU_DATA, choice
    assert f"grouped measurements of {most.device['kind']}" in choice.reason
    assert "another GPU's measurements" in choice.in_words()
    h100 = _device.device_from_dict(_data.shipped("NVIDIA H100 80GB HBM3").device, local=True)
    assert _data.shipped(h100.kind).grouped_entries
    monkeypatch.setattr(_engine, "target_device", lambda: h100)
    assert selection.choose_grouped(problem).source != _engine.OTHER_GPU_DATA


@requires_kernels
@pytest.mark.parametrize("m", [1, 7, 9, 100, 384, 700, 1000, 1536, 3000, 4096])
def test_candidates_are_the_rows_that_can_run_the_call(m):
    """The candidates of a call are this build's rows of its operands that can run it: a
    banded row only at multiples of its bands, a gemv row only up to its tokens."""
    found = selection.candidates(problem(m))
    assert found and all(row.compiled and row.operands == "16bit" for row in found)
    assert all(m % row.m_multiple == 0 for row in found)
    assert all(row.max_m == 0 or m <= row.max_m for row in found)
    banded = [row for row in _native.kernel_configs().values() if row.m_bands > 1]
    assert {row.id for row in banded if m % row.m_multiple == 0} <= {row.id for row in found}
    fp8 = selection.candidates(selection.Problem(m, 4096, 4096, "bfloat16", "e4m3"))
    assert fp8 and all(row.operands == "e4m3" for row in fp8)
    # K not a multiple of 16 leaves no e4m3 row that can run.
    assert selection.candidates(selection.Problem(m, 4096, 4104, "bfloat16", "e4m3")) == []


def test_the_autotune_cache_comes_first(engine):
    engine["set_data"]([entry(8, 4096, 4096, {PREFILL: 30.0, DECODE: 20.0})])
    engine["device"] = _device.Device("NVIDIA H200", 90, 132, 4.9e12, local=True)
    cache = _cache.cache(jax_swiglu.__version__)
    assert cache.store(engine["device"].fingerprint, "bfloat16", 8, 4096, 4096,
                       {"launch": PREFILL.key, "us": 25.0, "date": "2026-12-01T00:00:00"})
    decision = decide(8, version=jax_swiglu.__version__)
    assert decision.source == "autotune cache" and picked(decision) is PREFILL
    assert "25.0 us" in decision.reason


def fake_extension(monkeypatch):
    """The selection as on an SM90 GPU with an extension that compiled CONFIGS."""
    monkeypatch.setattr(_native, "kernels_available", lambda: True)
    monkeypatch.setattr(selection, "local_gpu_is_sm90", lambda: True)
    monkeypatch.setattr(_native, "kernel_configs", lambda: CONFIGS)
    monkeypatch.setattr(_native, "all_configs", lambda: CONFIGS)
    monkeypatch.setattr(_native, "can_implement", lambda *args, **kwargs: "")


def test_explain_names_the_source(engine, monkeypatch):
    engine["set_data"]([entry(8, 4096, 4096, {PREFILL: 30.0, DECODE: 20.0})])
    fake_extension(monkeypatch)
    monkeypatch.setattr(_native, "targets",
                        lambda: {("interleaved", "16bit", "silu", "bfloat16", False): "t_bf16"})
    p = problem(8)
    text = selection.choose(p).describe(p)
    assert text.startswith("interleaved [t_bf16, config 101: cooperative 16x128x64")
    assert "swap-AB" in text and "(tuning data (measured): measured 20.0 us" in text
    # explain's first line: the same choice in plain words, no tile jargon.
    assert selection.choose(p).in_words() == (
        "runs the fused kernel interleaved config 101 (GEMM for few tokens: the weights on the "
        "tensor cores' wide side, tiles of 16 tokens), the fastest measured at this shape on "
        "this kind of GPU")
    assert selection.choose(p, kernel="xla").in_words() == "runs plain XLA, as asked (kernel='xla')"


def test_a_dtype_and_activation_the_build_lacks_run_xla_or_raise(engine, monkeypatch):
    """A default install compiles float16 kernels of SiLU only: a float16 GELU call runs the
    XLA path with a warning that says how to get the kernels, a forced kernel or launch is a
    clear error, and bfloat16 GELU and float16 SiLU still run the fused kernels."""
    engine["set_data"]([entry(8, 4096, 4096, {PREFILL: 30.0, DECODE: 20.0})])
    fake_extension(monkeypatch)
    monkeypatch.setattr(_native, "float16_activations", lambda: ("silu",))
    lacking = selection.Problem(8, 4096, 4096, "float16", activation="gelu_tanh")
    selection._warn_once.cache_clear()
    with pytest.warns(RuntimeWarning, match="no float16 gelu_tanh kernels.*ALL_CONFIGS=1"):
        choice = selection.choose(lacking)
    assert choice.launch is None and "ALL_CONFIGS" in choice.reason
    assert selection.candidates(lacking) == []
    with pytest.raises(ValueError, match="kernel='interleaved' was requested, but this build"):
        selection.choose(lacking, kernel="interleaved")
    with pytest.raises(ValueError, match="launch=.* was requested, but this build"):
        selection.choose(lacking, launch=_launch.Launch(DECODE.id))
    grouped = selection.GroupedProblem(64, 4096, 4096, 8, "float16", "gelu_tanh")
    selection._warn_once.cache_clear()  # warned once per message
    with pytest.warns(RuntimeWarning, match="no float16 gelu_tanh kernels"):
        assert selection.choose_grouped(grouped).launch is None
    for dtype, activation in (("bfloat16", "gelu_tanh"), ("float16", "silu")):
        call = selection.Problem(8, 4096, 4096, dtype, activation=activation)
        assert selection.choose(call).launch.config == DECODE.id


@requires_kernels
def test_float16_runs_what_bfloat16_measured():
    """bfloat16 and float16 run the same tiles at the same rate: a float16 call takes the
    launch the shipped bfloat16 measurements pick."""
    for m, n, k, _, _ in MEASURED:
        bf16 = selection.choose(problem(m, n, k))
        f16 = selection.choose(problem(m, n, k, "float16"))
        assert f16.launch == bf16.launch and f16.source == bf16.source == "tuning data (measured)"


# The lowering tests' measured points (tests/test_lowering.py).
from test_lowering import MEASURED  # noqa: E402


# --- the cost model --------------------------------------------------------------------------

def test_rounds_follow_the_sm_count():
    persistent = config(9, tile_m=128, tile_n=128)
    # 132 tiles (one row of 128-row tiles, 132 column tiles) is one round; 133 is two.
    assert _model.rounds(persistent, 1, _model.Problem(128, 132 * 64, 64), 132) == 1
    assert _model.rounds(persistent, 1, _model.Problem(128, 133 * 64, 64), 132) == 2
    assert _model.rounds(persistent, 1, _model.Problem(128, 133 * 64, 64), 114) == 2
    assert _model.rounds(persistent, 1, _model.Problem(129, 133 * 64, 64), 114) == 3
    # Stream-K spreads a ragged last round over every SM (with enough K to split) ...
    stream_k = config(10, tile_m=128, tile_n=128, scheduler="stream-k")
    assert _model.rounds(stream_k, 1, _model.Problem(128, 133 * 64, 4096), 132) == pytest.approx(
        133 / 132)
    # ... but keeps whole tiles where K is too short to split, and split-K rounds up.
    assert _model.rounds(stream_k, 1, _model.Problem(128, 133 * 64, 512), 132) == 2
    assert _model.rounds(stream_k, 2, _model.Problem(128, 133 * 64, 4096), 132) == 1.5


def test_rounds_count_the_clusters_that_fit_at_once():
    """A cluster runs inside one GPC: where the device's measured slots say fewer clusters fit
    than sm_count / size (the H200: 30 of 4 CTAs, not 33), a round holds fewer tiles, and
    the kernels' grid is that many (launch_gemm.cuh)."""
    four = config(11, schedule="pingpong", tile_m=128, tile_n=192, cluster_m=4)
    problem = _model.Problem(512, 32 * 96, 1024)  # 4 x 32 = 128 tiles
    assert _model.round_ctas(four, 132) == 132
    assert _model.rounds(four, 1, problem, 132) == 1
    assert _model.round_ctas(four, 132, {4: 30}) == 120
    assert _model.rounds(four, 1, problem, 132, {4: 30}) == 2
    assert (_model.launch_us(four, 1, problem, 132, 4.8e12, CONSTANTS, {4: 30})
            > _model.launch_us(four, 1, problem, 132, 4.8e12, CONSTANTS))
    # Sizes the device did not measure keep sm_count / size.
    assert _model.round_ctas(config(12, cluster_m=2), 132, {4: 30}) == 132
    # The facts travel with the device (tuning data's "device" section).
    from jax_swiglu.selection import _device
    facts = {"kind": "NVIDIA H200", "compute_capability": 90, "sm_count": 132,
             "dram_bytes_per_s": 4.8e12, "cluster_slots": {"4": 30, "2": 66}}
    device = _device.device_from_dict(facts, local=False)
    assert device.cluster_slots == {2: 66, 4: 30}
    assert _device.device_from_dict(device.as_dict(), local=False) == device


class _FakeGpu:
    device_kind = "NVIDIA H200"
    compute_capability = "9.0"
    core_count = 132


@pytest.mark.parametrize("reported, expected", [
    ({2: 64, 4: 28, 8: 14}, {2: 64, 4: 28, 8: 14}),  # what the part says wins over the file
    ({}, {2: 66, 4: 30, 8: 15, 16: 7}),  # an extension without the query: the H200's file
])
def test_the_local_device_takes_the_cluster_slots_the_gpu_reports(monkeypatch, reported,
                                                                   expected):
    """The selection's device on a GPU: the cluster slots the extension reads from the part
    (cudaOccupancyMaxActiveClusters), so a part with no tuning data rounds its clusters by
    its own GPCs; the shipped data's copy only where the extension reports none."""
    from jax_swiglu import _native
    monkeypatch.setattr(_device.jax, "devices", lambda backend=None: [_FakeGpu()])
    monkeypatch.setattr(_native, "device_facts", lambda: {
        "sm_count": 132, "compute_capability": 90, "l2_bytes": 50 << 20,
        "dram_bytes_per_s": 4.8e12, "cluster_slots": reported})
    device = _device.local_device.__wrapped__()
    assert device.kind == "NVIDIA H200" and device.sm_count == 132
    assert device.cluster_slots == expected


def test_split_tail_plan_mirrors_the_kernel():
    tail = config(11, schedule="pingpong", tile_m=128, tile_n=128, cluster_m=2,
                  scheduler="split-tail")
    # 0.5B at M = 2048: 16 x 76 = 1216 tiles on 132 CTAs, a last round of 28 tiles split in
    # 56 halves (28 clusters).
    assert _model.split_tail_clusters(tail, _model.Problem(2048, 4864, 896), 132) == 28
    assert _model.rounds(tail, 1, _model.Problem(2048, 4864, 896), 132) == 9.5
    assert _model.split_tail_clusters(tail, _model.Problem(200, 4096, 512), 132) == 0


def test_decode_is_bound_by_the_weight_stream():
    problem = _model.Problem(1, 14336, 4096)
    floor_us = 1e6 * problem.dram_bytes / 4.9e12
    assert _model.launch_us(DECODE, 1, problem, 132, 4.9e12, CONSTANTS) >= floor_us
    assert _model.xla_us(problem, 132, 4.9e12, CONSTANTS) >= floor_us


# --- the autotune cache -----------------------------------------------------------------------

def test_cache_round_trip(tmp_path):
    cache = _cache.AutotuneCache(str(tmp_path), "1.0")
    assert cache.lookup("gpu", "bfloat16", 8, 64, 64) is None
    assert cache.store("gpu", "bfloat16", 8, 64, 64, {"launch": "x", "us": 1.0})
    fresh = _cache.AutotuneCache(str(tmp_path), "1.0")  # another process, later
    assert fresh.lookup("gpu", "bfloat16", 8, 64, 64) == {"launch": "x", "us": 1.0}
    assert fresh.lookup("other gpu", "bfloat16", 8, 64, 64) is None
    assert _cache.AutotuneCache(str(tmp_path), "2.0").lookup("gpu", "bfloat16", 8, 64, 64) is None


def test_cache_with_a_corrupt_file_warns_once_and_recovers(tmp_path):
    cache = _cache.AutotuneCache(str(tmp_path), "1.0")
    cache.store("gpu", "bfloat16", 8, 64, 64, {"launch": "x"})
    [path] = tmp_path.glob("autotune-*.json")
    path.write_text("{not json")
    fresh = _cache.AutotuneCache(str(tmp_path), "1.0")
    with pytest.warns(RuntimeWarning, match="unreadable"):
        assert fresh.lookup("gpu", "bfloat16", 8, 64, 64) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fresh.store("gpu", "bfloat16", 16, 64, 64, {"launch": "y"})  # rewrites it whole
    assert json.loads(path.read_text())["entries"]["bfloat16:16x64x64"] == {"launch": "y"}


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_cache_in_a_read_only_directory_stays_in_memory(tmp_path):
    tmp_path.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        cache = _cache.AutotuneCache(str(tmp_path / "sub"), "1.0")
        with pytest.warns(RuntimeWarning, match="cannot be written"):
            assert not cache.store("gpu", "bfloat16", 8, 64, 64, {"launch": "x"})
        assert cache.lookup("gpu", "bfloat16", 8, 64, 64) == {"launch": "x"}
    finally:
        tmp_path.chmod(stat.S_IRWXU)


def test_cache_that_cannot_be_created_stays_in_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the directory should be")
    cache = _cache.AutotuneCache(str(blocker / "cache"), "1.0")
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        assert not cache.store("gpu", "bfloat16", 8, 64, 64, {"launch": "x"})
    assert cache.lookup("gpu", "bfloat16", 8, 64, 64) == {"launch": "x"}


def _write_entries(directory, start):
    cache = _cache.AutotuneCache(directory, "1.0")
    for m in range(start, start + 20):
        cache.store("gpu", "bfloat16", m, 64, 64, {"launch": f"l{m}"})


def test_two_processes_writing_keep_both_entries(tmp_path):
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_write_entries, args=(str(tmp_path), start))
               for start in (1, 101)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    merged = _cache.AutotuneCache(str(tmp_path), "1.0")
    for m in list(range(1, 21)) + list(range(101, 121)):
        assert merged.lookup("gpu", "bfloat16", m, 64, 64) == {"launch": f"l{m}"}


def test_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(_cache.CACHE_DIR_ENV_VAR, str(tmp_path / "here"))
    assert _cache.cache("x").directory == str(tmp_path / "here")
    monkeypatch.delenv(_cache.CACHE_DIR_ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _cache.cache("x").directory == os.path.join(str(tmp_path / "xdg"), "jax_swiglu")


# --- the shipped data ---------------------------------------------------------------------------

def _shipped_documents():
    folder = os.path.dirname(_data.data_path("x"))
    if not os.path.isdir(folder):
        return []
    return [os.path.join(folder, name) for name in sorted(os.listdir(folder))
            if name.endswith(".json")]


@pytest.mark.parametrize("path", _shipped_documents())
def test_shipped_data_has_provenance(path):
    data = _data.TuningData.load(path)
    assert data.entries, "no entries"
    for calibration in data.calibrations.values():
        for field in ("date", "commit", "gpu", "driver", "cuda", "jax", "cutlass", "command"):
            assert calibration.get(field), f"calibration without {field}"
    assert {e.calibration for e in data.entries} <= set(data.calibrations)
    held_out = {shapes.PUBLIC_MLPS[name] for name in shapes.HELD_OUT}
    assert not [e for e in data.entries if (e.k, e.n) in held_out or e.m in shapes.HELD_OUT_M]
    with open(path) as f:
        model = json.load(f)["model"]
    assert model["provenance"] and data.constants and data.rule  # the cost model's constants
    # Grouped entries: from recorded runs, of rows the data defines, never a held-out MoE shape.
    assert {e.calibration for e in data.grouped_entries} <= set(data.calibrations)
    assert all(data.config(key) is not None for e in data.grouped_entries for key in e.launch_us)
    held_out_moe = {shapes.MOE_MLPS[name][:3] for name in shapes.MOE_HELD_OUT}
    assert not [e for e in data.grouped_entries if (e.k, e.n, e.experts) in held_out_moe]


def _problem_of_entry(entry) -> selection.Problem:
    """The call a tuning data entry measured (its dtype is the problem's data_dtype)."""
    if entry.dtype.startswith("float8_e4m3fn"):
        accumulation = "fast" if entry.dtype.endswith("/fast") else "promoted"
        return selection.Problem(entry.m, entry.n, entry.k, "bfloat16", "e4m3",
                                 accumulation=accumulation)
    return selection.Problem(entry.m, entry.n, entry.k, entry.dtype)


@requires_kernels
@pytest.mark.parametrize("path", _shipped_documents())
def test_engine_reproduces_the_argmin_of_the_shipped_data(path, monkeypatch, tmp_path):
    """At every measured point, the engine's choice is the fastest measured candidate that
    this build compiled and that can run the point (XLA included, where measured)."""
    data = _data.TuningData.load(path)
    device = _device.device_from_dict(data.device, local=False)
    monkeypatch.setattr(_engine, "target_device", lambda: device)
    monkeypatch.setenv(_cache.CACHE_DIR_ENV_VAR, str(tmp_path))
    compiled = {c.key: c for c in _native.kernel_configs().values()}
    for e in data.entries:
        measured = {launch: us for launch, us in e.launch_us.items()
                    if _data.parse_launch_id(launch)[0] in compiled
                    and compiled[_data.parse_launch_id(launch)[0]].runs(e.m)}
        if not measured:
            continue
        best = min(measured, key=measured.get)
        # Finalists timed through JAX too are ranked by that time (_engine._from_entry).
        finalists = {launch: us for launch, us in (e.cupti_us or {}).items() if launch in measured}
        if len(finalists) > 1 and best in finalists:
            best = min(finalists, key=finalists.get)
        ours = (e.cupti_us or {}).get(best, measured[best])
        p = _problem_of_entry(e)
        decision = _engine.decide(p, selection.candidates(p))
        if e.xla_us and e.xla_us < ours:
            assert decision.launch is None, (e.m, e.n, e.k)
        else:
            got = _data.launch_id(decision.launch.row.key, decision.launch.splits)
            assert got == best, (e.m, e.n, e.k, got, best)


@pytest.mark.parametrize("path", _shipped_documents())
def test_the_learned_rule_holds_across_the_shipped_shapes(path):
    """Leave one shape out (benchmarks/tuning_data.py --cross-validate): from the other shapes'
    data alone the rule picks, at each measured point of a shape, a launch whose measured time
    is on geometric mean within 1.5 % of the fastest there. A regression guard for changes to
    the cost model and the rule; the report lists the points that miss 2 %."""
    from benchmarks import tuning_data
    with open(path) as f:
        results = tuning_data.cross_validate(json.load(f))
    assert len(results) >= 100
    geomean = math.exp(sum(math.log(r["ratio"]) for r in results) / len(results))
    assert geomean <= 1.015, geomean


def test_autotune_needs_a_gpu_and_says_so(capsys):
    if selection.kernels_unusable_reason() is None:
        pytest.skip("an SM90 GPU is here: tests/gpu runs autotune")
    with pytest.raises(RuntimeError, match="needs an SM90 GPU"):
        jax_swiglu.autotune(problems=[(8, 128, 64)])
    from jax_swiglu import tune
    assert tune.main(["--shapes", "64x128", "--m", "8"]) == 1
    assert "needs an SM90 GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tune.main(["--shapes", "not-a-shape", "--m", "8"])
    assert "'not-a-shape' is not KxN" in capsys.readouterr().err
    assert tune.main(["--shapes", "64x12", "--m", "8"]) == 1  # checked before the GPU
    assert "multiples of 8" in capsys.readouterr().err


def test_autotune_checks_its_arguments_as_the_calls_do():
    """Bad arguments are errors before any GPU work (here, before the missing GPU is): what
    swiglu refuses, autotune refuses, and nothing is silently ignored."""
    k, n = 64, 128
    packed = jax_swiglu.pack_weights(jnp.ones((k, n), jnp.bfloat16), jnp.ones((k, n),
                                                                              jnp.bfloat16))
    x = jnp.ones((4, k), jnp.bfloat16)
    cases = [
        (lambda: jax_swiglu.autotune(jnp.ones((4, 2 * k), jnp.bfloat16), packed), ValueError,
         "K"),
        (lambda: jax_swiglu.autotune(x.astype(jnp.float32), packed), TypeError, "float32"),
        (lambda: jax_swiglu.autotune(x, packed, activation="bogus"), ValueError,
         "activation must be one of"),
        (lambda: jax_swiglu.autotune(x, packed, activation=jax.nn.relu), ValueError,
         "nothing to tune"),
        (lambda: jax_swiglu.autotune(x, packed, activaton="gelu_tanh"), TypeError,
         "not activaton"),
        (lambda: jax_swiglu.autotune(x, packed, samples=0), ValueError, "samples must be"),
        (lambda: jax_swiglu.autotune(problems=[(1, 12, 64)]), ValueError, "multiples of"),
        (lambda: jax_swiglu.autotune(problems=[(-1, 64, 64)]), ValueError, "m must be >= 0"),
        (lambda: jax_swiglu.autotune(problems=[(1, 64)]), ValueError, "(m, n, k) ints"),
        (lambda: jax_swiglu.autotune(problems=[(1, 64, 64)], dtype=jnp.float8_e4m3fn),
         TypeError, "bfloat16 or float16"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=re.escape(match)):
            call()


GEMV = config(103, family="gemv", schedule="cuda-cores", m_side="weights", tile_m=8,
              tile_n=256, tile_k=8, scheduler="cluster-split-k", max_m=8)
FEW_TOKENS_GEMV = config(104, family="gemv", schedule="cuda-cores", m_side="weights", tile_m=1,
                         tile_n=256, tile_k=8, scheduler="cluster-split-k", max_m=1,
                         ctas_per_sm=2)


def test_stream_k_fixup_is_a_chain():
    """The CTA that finishes a stream-K tile adds its peers' partial sums one after another:
    split-K has splits - 1 peers, stream-K on fewer tiles than SMs about SMs / tiles - 1 (at
    most one per k tile), a persistent config none; each peer costs the call latency."""
    small, large = _model.Problem(16, 3072, 1024), _model.Problem(16, 29568, 8192)
    assert _model.stream_k_peers(DECODE, 4, large, 132) == 3
    assert _model.stream_k_peers(PREFILL, 1, small, 132) == 0
    few, many = (_model.stream_k_peers(DECODE, 1, p, 132) for p in (small, large))
    assert few > many >= 0
    four, two = (_model.launch_us(DECODE, s, large, 132, 4.8e12, CONSTANTS) for s in (4, 2))
    assert four - two >= 2 * CONSTANTS.stream_k_peer_us * 0.99  # same rounds, two more peers


@requires_kernels
def test_gemv_rows_come_from_the_extension():
    """The gemv rows run at most their tokens and split K over clusters of 1-8 CTAs (each at
    least one step of K: 8 rows on the CUDA cores, a 64-row stage on the tensor cores); the
    CUDA-core ones hold two CTAs an SM up to 4 tokens, the tensor-core ones always (their
    stages sized for it; on e4m3 operands too, in builds with every config): the extension
    says so."""
    gemv = [row for row in _native.kernel_configs().values() if row.is_gemv]
    cuda_cores = {row.tile_m: row for row in gemv if row.schedule == "cuda-cores"}
    tensor_cores = [row for row in gemv if row.schedule == "tensor-cores"]
    assert sorted(cuda_cores) == [1, 2, 4, 8]
    assert all(row.operands == "16bit" for row in cuda_cores.values())
    for operands in {row.operands for row in tensor_cores}:
        assert sorted(row.tile_n for row in tensor_cores if row.operands == operands) == [128, 256]
    assert all(row.tile_k * (2 if row.operands == "16bit" else 1) == 128 for row in tensor_cores)
    for row in gemv:
        assert row.runs(row.tile_m) and not row.runs(row.tile_m + 1) and row.takes_splits
        assert row.ctas_per_sm == (2 if row.schedule == "tensor-cores" or row.tile_m <= 4 else 1)
        assert _native.split_choices(row.id, 4096) == (1, 2, 4, 8)
        assert _native.split_choices(row.id, 2 * row.tile_k) == (1, 2)
    assert all(row.tile_m == 16 and row.runs(1) for row in tensor_cores)
    stream_k = [row for row in _native.kernel_configs().values() if row.scheduler == "stream-k"]
    assert all(_native.split_choices(row.id, 4096) == (1, 2, 4) for row in stream_k)
    assert all(_native.split_choices(row.id, 64) == (1,) for row in stream_k)


def test_gemv_model():
    """The model streams the gemv kernel's weights in waves of the CTAs the SMs hold: where
    the unsplit CTAs leave SMs idle, a split fills them; where a split's CTAs overflow the
    resident ones by a few, the extra wave costs more than the split gains; no prediction
    beats the DRAM stream."""
    def times(config, m, n, k):
        return {s: _model.launch_us(config, s, _model.Problem(m, n, k), 132, 4.8e12, CONSTANTS)
                for s in (1, 2, 4, 8)}

    small = times(FEW_TOKENS_GEMV, 1, 3072, 1024)  # 24 CTAs unsplit
    assert min(small, key=small.get) > 1
    wide = times(FEW_TOKENS_GEMV, 1, 17408, 5120)  # 136 CTAs: 272 split in two, on 264 slots
    assert wide[1] < wide[2]
    for t, shape in ((small, _model.Problem(1, 3072, 1024)),
                     (wide, _model.Problem(1, 17408, 5120))):
        assert min(t.values()) >= 1e6 * shape.dram_bytes / 4.8e12
    # More tokens, more FMAs: at M = 8 the FMA issue can bound a small-K call.
    assert (_model.launch_us(GEMV, 4, _model.Problem(8, 11008, 4096), 132, 4.8e12, CONSTANTS)
            >= _model.launch_us(GEMV, 4, _model.Problem(1, 11008, 4096), 132, 4.8e12, CONSTANTS))


def test_a_tensor_core_gemv_cta_pulls_less_than_a_cuda_core_sm():
    """The tensor-core form's CTA streams through a ring of shared-memory stages, which bounds
    its bytes in flight below what an SM of the CUDA-core form's 16-byte loads reaches: a grid
    of fewer CTAs than SMs is priced at gemv_tma_sm_bandwidth_factor times an SM's even
    share of the DRAM, not at the DRAM's rate."""
    cuda_cores = dataclasses.replace(FEW_TOKENS_GEMV, tile_n=128)
    tensor_cores = dataclasses.replace(cuda_cores, schedule="tensor-cores", tile_k=64)
    problem = _model.Problem(1, 4096, 2048)  # 64 CTAs of 128 packed columns on 132 SMs
    cta_bytes = 2 * 128 * 2048
    assert CONSTANTS.gemv_tma_sm_bandwidth_factor < CONSTANTS.gemv_sm_bandwidth_factor
    us = _model.launch_us(tensor_cores, 1, problem, 132, 4.8e12, CONSTANTS)
    floor_us = 1e6 * cta_bytes / (CONSTANTS.gemv_tma_sm_bandwidth_factor * 4.8e12 / 132)
    assert us >= floor_us > 1e6 * problem.dram_bytes / 4.8e12
    assert us > _model.launch_us(cuda_cores, 1, problem, 132, 4.8e12, CONSTANTS)


# --- the fp8 rule ------------------------------------------------------------------------------

FP8_RULE = MODEL["heuristics"]["e4m3"]


def _fp8_rows(accumulation="promoted"):
    """The e4m3 rows a call of ``accumulation`` chooses among (selection.candidates')."""
    return [row for row in _native.kernel_configs().values() if row.operands == "e4m3"
            and (accumulation == "fast" or not row.fast_accumulation)]


def _fp8_row(accumulation="promoted", **fields):
    """The one row every build compiles of ``accumulation`` with ``fields``."""
    [row] = [row for row in _fp8_rows(accumulation) if not row.optional
             and row.fast_accumulation == (accumulation == "fast")
             and all(getattr(row, k) == v for k, v in fields.items())]
    return row


@requires_kernels
def test_fp8_rule_follows_tokens_waves_and_the_sm_count():
    """Up to 16 tokens the 16-token swap-AB tile, up to 64 the 64-token one; then 128 x 128
    or 128 x 192 tiles, persistent on 2x1 clusters where the last wave is full (or there are
    many waves), stream-K where a few waves end ragged, as the SM count makes them."""
    rows = _fp8_rows()
    swap16 = _fp8_row(m_side="weights", tile_m=16, is_gemv=False)
    swap64 = _fp8_row(m_side="weights", tile_m=64)
    persistent = _fp8_row(m_side="tokens", scheduler="persistent", tile_n=128, tile_k=128)
    wide = _fp8_row(m_side="tokens", scheduler="persistent", tile_n=192)
    stream_k = _fp8_row(m_side="tokens", scheduler="stream-k")
    rule = lambda m, sms: _heuristic.waves_rule(m, 4096, 4096, sms, rows, FP8_RULE)[0]  # noqa: E731
    assert [rule(m, 132) for m in (1, 5, 16)] == [swap16] * 3
    assert [rule(m, 132) for m in (17, 40, 64)] == [swap64] * 3
    # 256 tokens: 2 x 64 = 128 tiles, 0.97 of a wave; 384: 192 tiles, a 45 % last wave.
    assert rule(256, 132) == persistent and rule(384, 132) == stream_k
    # 8192: 64 x 64 = 4096 tiles of 128 x 128 are 32 waves, 64 x 43 of 128 x 192 21 (1.6 %
    # less work): many waves either way, and the wider tile drains its promotions less often
    # a product.
    assert rule(8192, 132) == wide
    assert rule(512, 114) == stream_k and rule(1792, 114) == persistent


@pytest.fixture
def no_fp8_data(monkeypatch):
    """The shipped data of the H200 alone, which measured no fp8 calls (on any GPU here)."""
    h200_data = _data.shipped(H200.kind)
    monkeypatch.setattr(_data, "shipped_kinds", lambda: (H200.kind,))
    monkeypatch.setattr(_data, "shipped", lambda kind: h200_data if kind == H200.kind else None)


@requires_kernels
def test_fp8_calls_follow_the_rule_without_fp8_data(no_fp8_data):
    """Where no shipped data measured fp8 calls, the engine's heuristic step decides every
    fp8 call, among the rows every build compiles (N = 4096: 64 columns of 128 x 128
    tiles)."""
    swap64 = _fp8_row(m_side="weights", tile_m=64)
    persistent = _fp8_row(m_side="tokens", scheduler="persistent", tile_n=128, tile_k=128)
    wide = _fp8_row(m_side="tokens", scheduler="persistent", tile_n=192)
    stream_k = _fp8_row(m_side="tokens", scheduler="stream-k")
    swap160 = _fp8_row(m_side="weights", tile_m=160)
    gemv = {row.id for row in _fp8_rows() if row.is_gemv and not row.optional}
    for m in (1, 16):  # decode: the e4m3 gemv rows (test_fp8_decode_streams_through_the_gemv)
        choice = selection.choose(selection.Problem(m, 4096, 4096, "bfloat16", "e4m3"))
        assert choice.launch.config in gemv and choice.source == "heuristic", m
    expected = {64: swap64,
                300: swap160,      # 2 x 64 swap-AB tiles of 160 tokens: one wave
                384: stream_k,     # 3 x 64 tiles: 1.45 waves, the last 45 % full
                2048: persistent,  # 16 x 64 tiles: 7.8 waves
                8192: wide}        # 64 x 43 tiles of 128 x 192: 20.8 waves
    for m, row in expected.items():
        choice = selection.choose(selection.Problem(m, 4096, 4096, "bfloat16", "e4m3"))
        assert choice.launch == _launch.Launch(row.id) and choice.source == "heuristic", m


@requires_kernels
def test_fp8_decode_streams_through_the_gemv(no_fp8_data):
    """With no fp8 data, up to 16 tokens an e4m3 call runs the tensor-core gemv row that the
    cost model predicts fastest from its CTAs' waves and bytes, K unsplit: on a 72B-sized
    shape (K = 8192, N = 29568) the 256-column tile (231 CTAs, each streaming twice the
    columns of the 128-column tile's 462); on a short one (K = 1024, N = 2816) too the grid is
    not split, though it leaves SMs idle. 17 tokens leave the gemv rows."""
    wide = _fp8_row(is_gemv=True, tile_n=256)
    device = _engine.target_device()
    constants = _data.any_sm90().constants
    gemv_rows = [row for row in _fp8_rows() if row.is_gemv and not row.optional]
    assert {row.tile_n for row in gemv_rows} == {128, 256}
    for (n, k) in ((29568, 8192), (2816, 1024), (4096, 4096)):
        predicted = {key: us for (key, splits), us in _heuristic.model_alone(
            gemv_rows, _model.Problem(1, n, k, 1), device, constants,
            _engine.split_choices).items() if splits == 1}
        for m in (1, 5, 16):
            choice = selection.choose(selection.Problem(m, n, k, "bfloat16", "e4m3"))
            row = _native.kernel_configs()[choice.launch.config]
            assert row.is_gemv and row.operands == "e4m3", (n, k, m)
            assert choice.launch.splits == 1 and choice.source == "heuristic", (n, k, m)
            if m == 1:
                assert predicted[row.key] == min(predicted.values()), (n, k)
            assert "gemv" in choice.reason and "K unsplit" in choice.reason
    big = selection.choose(selection.Problem(1, 29568, 8192, "bfloat16", "e4m3"))
    assert big.launch == _launch.Launch(wide.id)
    past = selection.choose(selection.Problem(17, 4096, 4096, "bfloat16", "e4m3"))
    assert not _native.kernel_configs()[past.launch.config].is_gemv


@requires_kernels
def test_fp8_promoted_rule_weighs_the_promotion_drain():
    """Each promotion drains the tensor cores for as long as some more packed columns of the
    tile would take (the default tiles promote in halves: their measured columns per tile
    width): where the whole waves of 128 x 192 and 128 x 128 tiles compute alike, a promoted
    call takes the wider tile, a call without promotions the narrower (K = 4096, N = 14336,
    M = 2048). On CUTLASS's loop the drain is promotion_drain_n columns whatever the width."""
    rows = _fp8_rows()
    narrow = _fp8_row(m_side="tokens", scheduler="persistent", tile_n=128, tile_k=128)
    wide = _fp8_row(m_side="tokens", scheduler="persistent", tile_n=192)
    assert narrow.accumulation == wide.accumulation == "promoted-in-halves"
    rule = lambda rows, promoted=True: _heuristic.waves_rule(  # noqa: E731
        2048, 14336, 4096, 132, rows, FP8_RULE, promoted=promoted)[0]
    # 16 x 224 tiles of 128 x 128 are 28 waves, 16 x 150 of 128 x 192 19: 1.8 % more work
    # in the wider tile's waves, against drains of 11 / 128 = 9 % and 4 / 192 = 2 %.
    assert rule(rows) == wide and rule(rows, promoted=False) == narrow
    # On CUTLASS's loop (17 / 128 = 13 % against 17 / 192 = 9 %) the wider tile still wins.
    cutlass = [dataclasses.replace(row, accumulation="promoted")
               if row.accumulation == "promoted-in-halves" else row for row in rows]
    assert rule(cutlass).id == wide.id and rule(cutlass, promoted=False).id == narrow.id
    halves = functools.partial(_heuristic._promotion_drain_n, narrow, constants=FP8_RULE)
    assert halves(width=128) == 11 and halves(width=192) == 4 and halves(width=160) == 4
    assert halves(width=64) == 11 and _heuristic._promotion_drain_n(
        dataclasses.replace(narrow, accumulation="promoted"), 128,
        FP8_RULE) == FP8_RULE["promotion_drain_n"]


@requires_kernels
def test_fp8_rule_runs_160_token_swap_ab_tiles_where_128_row_tiles_pad():
    """A few hundred tokens: 128-row tiles rounded up to their 2x1 cluster pad 300 tokens to
    512 rows, 160-token swap-AB tiles to 320, which outweighs their epilogue's pairing through
    shared memory (swap_ab_epilogue_k); where 128-row tiles fit M (256) or the waves are many
    (2048) the tokens-side tiles stay (N = K = 4096). A swap-AB pick stays persistent where a
    tokens-side tile's ragged last wave would be spread by stream-K."""
    swap160 = _fp8_row(m_side="weights", tile_m=160)
    assert (swap160.scheduler, swap160.schedule, swap160.cluster_n) == (
        "persistent", "cooperative", 2)
    for accumulation in ("promoted", "fast"):
        rows = _fp8_rows(accumulation)
        rule = lambda m, sms=132: _heuristic.waves_rule(  # noqa: E731
            m, 4096, 4096, sms, rows, FP8_RULE, promoted=accumulation == "promoted")[0]
        assert rule(300) == swap160 and rule(320) == swap160
        assert rule(256) != swap160 and rule(2048) != swap160
    # 128 tokens, N = 14336: 1 x 224 swap-AB tiles are 1.70 waves on 132 SMs, the last 70 %
    # full, and stay persistent.
    config, reason = _heuristic.waves_rule(128, 14336, 4096, 132, _fp8_rows(), FP8_RULE)
    assert config == swap160 and reason.endswith("1.70 waves on 132 SMs: persistent")


@requires_kernels
def test_fp8_fast_rule_weighs_whole_waves_and_the_cooperative_epilogue():
    """Under fast accumulation the 128 x 256 cooperative and 128 x 192 pingpong
    fast-accumulation tiles join the 128 x 128 ones, ranked by the work of their whole waves,
    the cooperative ones' times (K + cooperative_epilogue_k) / K (N = K = 4096)."""
    rows = _fp8_rows("fast")
    wide = _fp8_row("fast", m_side="tokens", scheduler="persistent", tile_n=256)
    pingpong = _fp8_row("fast", m_side="tokens", scheduler="persistent", tile_n=192)
    narrow = _fp8_row(m_side="tokens", scheduler="persistent", tile_n=128, tile_k=128)
    assert (wide.schedule, pingpong.schedule) == ("cooperative", "pingpong")
    rule = lambda m, k=4096: _heuristic.waves_rule(m, 4096, k, 132, rows, FP8_RULE)[0]  # noqa: E731
    # 2048 tokens: 16 x 43 tiles of 128 x 192 are 6 whole waves of 24576 products a tile;
    # 16 x 32 of 128 x 256 are 4 of 32768, and 16 x 64 of 128 x 128 8 of 16384: 11 % less
    # work, but their epilogue adds 683 / 4096 = 17 % to it.
    assert rule(8192) == pingpong and rule(2048) == pingpong
    # 128 tiles of 128 x 128 fill one wave: less work than a wave of the wider tiles.
    assert rule(256) == narrow
    # 512 tokens: one wave of 4 x 32 tiles of 128 x 256 (as much work as two of 128 x 128,
    # the tie going to the larger tile) against two of 4 x 43 of 128 x 192 (28 % more) ...
    assert rule(512) == wide
    # ... which the cooperative epilogue outweighs where K is short.
    assert rule(512, k=683 // 2) == pingpong
    # The promoted rows never see the fast ones.
    for fast in (wide, pingpong):
        assert fast not in _fp8_rows() and fast in selection.candidates(
            selection.Problem(8192, 4096, 4096, "bfloat16", "e4m3", accumulation="fast"))
        assert fast not in selection.candidates(
            selection.Problem(8192, 4096, 4096, "bfloat16", "e4m3"))
