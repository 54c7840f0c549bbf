"""benchmarks/: the targets on hand-made numbers, the reports, the runs' bookkeeping (GPU
measurements faked), and the calibration -> tuning data merge."""

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_swiglu, calibrate, report, shapes, tensor_parallel, tuning_data
from helpers import requires_kernels

REPO = Path(__file__).resolve().parents[1]
ENV = {"date": "2026-01-02T03:04:05+00:00", "command": "python -m benchmarks.bench_swiglu",
       "device": "NVIDIA H200", "jax": "0.11.2", "jaxlib": "0.11.2", "nvidia_smi": "smi line",
       "git": "abc1234", "cutlass": "4.2.0.0"}
SHAPES = {"qwen2.5-0.5b": (896, 4864), "qwen2.5-1.5b": (1536, 8960),
          "qwen2.5-3b": (2048, 11008), "qwen2.5-72b": (8192, 29568), "llama-3-8b": (4096, 14336)}


def row(model, m, xla, gemm, auto, **extra):
    k, n = SHAPES[model]
    return {"model": model, "m": m, "k": k, "n": n, "flops": 2 * m * k * 2 * n,
            "weight_bytes": 2 * k * 2 * n, "gpu_us": {"xla": xla, "gemm": gemm, "auto": auto},
            "auto_choice": "M=1 ...: interleaved [jax_swiglu_interleaved_silu_bf16, config 18: x] "
                           "(tuning data (measured): measured 1.0 us)", **extra}


def result(rows, suite="prefill"):
    return {"suite": suite, "environment": ENV, "iterations": 20, "rounds": 4,
            "notes": ["why this run"], "complete": True, "peak_tflops": 800.0,
            "copy_tb_per_s": 4.3, "rows": rows}


def passing_prefill():
    # xla/auto = 1.4 on the small shapes, auto/gemm = 0.99 everywhere, 72B at 0.99 of gemm.
    return [row("qwen2.5-0.5b", 128, 14.0, 10.1, 10.0), row("qwen2.5-1.5b", 512, 70.0, 50.5, 50.0),
            row("qwen2.5-3b", 2048, 280.0, 202.0, 200.0),
            row("qwen2.5-72b", 2048, 2000.0, 1990.0, 1970.0),
            row("qwen2.5-72b", 8192, 8000.0, 7900.0, 7850.0)]


def verdicts(targets):
    return {t.name: t.holds for t in targets}


def test_prefill_targets():
    rows = passing_prefill()
    assert verdicts(report.prefill_targets(rows)) == {"P1": True, "P2": True, "P3": True,
                                                      "P4": True}
    rows[3] = row("qwen2.5-72b", 2048, 2000.0, 2000.0, 2050.0)  # xla/auto = 0.976 < 0.98
    targets = {t.name: t for t in report.prefill_targets(rows)}
    assert targets["P1"].holds is False and targets["P1"].misses == ["qwen2.5-72b M=2048 (0.976)"]
    assert verdicts(report.prefill_targets([])) == {"P1": None, "P2": None, "P3": None, "P4": None}


def test_decode_targets():
    # 235 MB of packed weights at M = 1: 60 us is 3.9 TB/s, 55 us 4.27 TB/s.
    rows = [row("llama-3-8b", 1, 61.0, 56.0, 55.0), row("llama-3-8b", 64, 70.0, 66.0, 67.0),
            row("qwen2.5-0.5b", 1, 8.0, 7.0, 7.1)]
    assert verdicts(report.decode_targets(rows)) == {"D1": True, "D2": True, "D3": True}
    slow = rows + [row("llama-3-8b", 8, 59.0, 56.0, 60.0)]  # slower than XLA; 1.07x gemm
    targets = {t.name: t for t in report.decode_targets(slow)}
    assert targets["D1"].holds is False and targets["D1"].misses == ["llama-3-8b M=8 (1.071)"]
    assert targets["D2"].holds is False and targets["D3"].holds is False
    assert targets["D3"].misses == ["llama-3-8b M=8 (3.91 TB/s)"]
    # Rows above M = 256 and small shapes do not count for D3.
    assert verdicts(report.decode_targets([row("qwen2.5-0.5b", 8, 8.0, 7.0, 7.1)]))["D3"] is None


def test_fixed_cost_is_the_intercept_of_time_against_bytes():
    # Exact lines: gemm 3 us + bytes / 4.5 TB/s, auto 3.4 us + the same stream; the 0.5B shape
    # (under 50 MB) and M = 64 stay out of the fit.
    def at(model, m, fixed):
        k, n = SHAPES[model]
        t = fixed + 2 * k * 2 * n / 4.5e6
        return row(model, m, t + 5, t - fixed + 3.0, t)
    rows = [at(model, m, 3.4) for model in ("qwen2.5-3b", "llama-3-8b", "qwen2.5-72b")
            for m in (1, 8)] + [at("qwen2.5-0.5b", 1, 9.0), at("llama-3-8b", 64, 30.0)]
    auto, gemm = report.fixed_cost_fit(rows, "auto"), report.fixed_cost_fit(rows, "gemm")
    assert auto == pytest.approx((3.4, 4.5)) and gemm == pytest.approx((3.0, 4.5))
    assert verdicts(report.decode_targets(rows))["D4"] is True
    late = [at(r["model"], r["m"], 3.6) if r["m"] <= 8 else r for r in rows]
    assert verdicts(report.held_out_targets(late))["D4"] is False  # 0.6 us over gemm's
    assert report.fixed_cost_fit(rows[:2], "auto") is None  # one size: no line


def test_held_out_targets():
    rows = [row("llama-3-8b", 300, 100.0, 99.0, 97.0), row("qwen2.5-3b", 5, 20.0, 20.0, 19.7)]
    assert verdicts(report.held_out_targets(rows)) == {"H1": True, "H2": True, "H3": True}
    rows.append(row("qwen2.5-3b", 7, 20.0, 19.0, 19.8))  # 1.042x gemm
    assert verdicts(report.held_out_targets(rows)) == {"H1": True, "H2": False, "H3": False}


def test_benchmark_report_files(tmp_path):
    pytest.importorskip("matplotlib")
    rows = passing_prefill()
    rows[0]["events_us"] = {"torch_eager": 30.0, "torch_graph": 20.0}
    rows[1]["unsupported"] = {"tokamax": "NotImplementedError: M must be a multiple of 128"}
    path = tmp_path / "2026-01-02-prefill.json"
    path.write_text(json.dumps(result(rows)))
    report.main([str(path)])
    md = (tmp_path / "2026-01-02-prefill.md").read_text()
    png = (tmp_path / "2026-01-02-prefill.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    lines = md.splitlines()
    assert lines[0].startswith("<!-- written by benchmarks/report.py from 2026-01-02-prefill.json")
    assert lines[1] == "why this run"
    assert "Command: `python -m benchmarks.bench_swiglu` (commit abc1234)." in md
    assert "median of 20 in 4 interleaved rounds" in md and "copy 4.30 TB/s" in md
    assert ("| model | M | xla | gemm | auto | tokamax | torch_eager | torch_graph | auto/gemm | "
            "xla/auto | TB/s | auto ran |") in md
    assert ("| qwen2.5-0.5b | 128 | 14.0 | 10.1 | 10.0 | - | 30.0 | 20.0 | 0.990 | 1.40 | 1.74 | "
            "config 18 (tuning data (measured)) |") in md
    assert "| qwen2.5-1.5b | 512 | 70.0 | 50.5 | 50.0 | refused |" in md
    assert "M must be a multiple of 128" in md
    assert md.count("| yes |") == 4 and "**no**" not in md
    assert report.readme_table(result(rows), "x.json").splitlines()[3] == (
        "| qwen2.5-0.5b | 128 | 14.0 | 10.1 | 10.0 | 1.40x | 0.990 |")


def test_hand_edited_markdown_is_kept(tmp_path):
    stem = str(tmp_path / "run")
    with open(stem + ".md", "w") as f:
        f.write("Provenance written by hand.\n")
    assert report.write_report(result(passing_prefill()), stem, plot=False) == []
    assert open(stem + ".md").read() == "Provenance written by hand.\n"
    forced = report.write_report(result(passing_prefill()), stem, plot=False, force=True)
    assert forced == [stem + ".md"]
    assert report.write_report(result(passing_prefill()), stem, plot=False) == [stem + ".md"]


def test_variants_are_timed_in_interleaved_rounds(monkeypatch):
    calls = []
    monkeypatch.setattr(bench_swiglu, "_warm_up", lambda fn, args: calls.append(("warm", fn)))
    monkeypatch.setattr(bench_swiglu, "_gpu_samples_ms",
                        lambda fn, args, n: calls.append(("gpu", fn, n)) or [fn * 1.0] * n)
    monkeypatch.setattr(bench_swiglu, "_wall_samples_ms",
                        lambda fn, args, n: calls.append(("wall", fn, n)) or [fn * 2.0] * n)
    gpu, wall = bench_swiglu.measure_side_by_side({"a": 1, "b": 2}, (), iterations=5, rounds=2)
    assert gpu == {"a": 1.0, "b": 2.0} and wall == {"a": 2.0, "b": 4.0}
    orders = bench_swiglu.round_orders(["a", "b"], 2)
    assert calls == [("warm", 1), ("warm", 2)] + [
        (kind, {"a": 1, "b": 2}[name], 3) for order in orders for name in order
        for kind in ("gpu", "wall")]
    names = list("abcdef")
    orders = bench_swiglu.round_orders(names, 3)
    assert orders[0] == names and all(sorted(o) == names for o in orders)
    assert len({tuple(o) for o in orders}) == 3
    assert orders == bench_swiglu.round_orders(names, 3)  # reproducible
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        bench_swiglu.measure_side_by_side({"a": 1}, (), 2, 0)


def test_kernel_names_are_each_kernel_once_in_launch_order(monkeypatch):
    profiler = pytest.importorskip("jax.experimental.mosaic.gpu.profiler")
    timings = [("nvjet_sm90_tst_128x152", 0.2), ("loop_convert_fusion", 0.01),
               ("nvjet_sm90_tst_128x152", 0.2)]
    seen = []
    monkeypatch.setattr(profiler, "measure", lambda fn, aggregate: seen.append(aggregate) or (
        lambda *args: (fn(*args), timings)))
    assert bench_swiglu.kernel_names(lambda x: x, (1,)) == [
        "nvjet_sm90_tst_128x152", "loop_convert_fusion"]
    assert seen == [False]
    timings = None  # a call that launched nothing
    assert bench_swiglu.kernel_names(lambda x: x, (1,)) == []


def test_remaining_time_estimate():
    assert bench_swiglu.estimate_remaining_s([], [1e9]) == 0.0
    assert bench_swiglu.estimate_remaining_s([(1e9, 10.0)], [1e9, 5e9]) == 20.0
    done = [(w, 2.0 + w / 1e12) for w in (1e11, 1e12, 4e12)]
    assert bench_swiglu.estimate_remaining_s(done, [8e12]) == pytest.approx(10.0)
    assert bench_swiglu._hms(3725.4) == "1:02:05"


def test_output_stem_does_not_overwrite(tmp_path):
    assert bench_swiglu.output_stem(str(tmp_path), "2026-01-02", "-quick") == os.path.join(
        tmp_path, "2026-01-02-quick")
    (tmp_path / "2026-01-02-quick.json").write_text("{}")
    assert bench_swiglu.output_stem(str(tmp_path), "2026-01-02", "-quick").endswith("-quick-2")


def test_suites_cover_what_the_issues_ask():
    models, ms = bench_swiglu.SUITES["decode"]
    assert len(models) >= 12 and {1, 2, 4, 8, 16, 32, 64, 128, 256, 3, 48, 200, 300} <= set(ms)
    held_models, held_ms = bench_swiglu.SUITES["held-out"]
    assert len(held_models) >= 5 and len(held_ms) >= 5


def test_benchmark_main_writes_the_run(tmp_path, monkeypatch, capsys):
    fake = {("qwen2.5-0.5b", 128): row("qwen2.5-0.5b", 128, 14.0, 10.1, 10.0),
            ("qwen2.5-0.5b", 2048): row("qwen2.5-0.5b", 2048, 70.0, 50.0, 50.0),
            ("qwen2.5-72b", 128): row("qwen2.5-72b", 128, 240.0, 230.0, 235.0),
            ("qwen2.5-72b", 2048): row("qwen2.5-72b", 2048, 2000.0, 1990.0, 1970.0)}
    monkeypatch.setattr(bench_swiglu.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(bench_swiglu.environment_lib, "environment", lambda: dict(ENV))
    monkeypatch.setattr(bench_swiglu, "measure_peak_tflops", lambda: 800.0)
    monkeypatch.setattr(bench_swiglu, "measure_copy_tb_per_s", lambda: 4.3)
    monkeypatch.setattr(bench_swiglu, "bench_one", lambda model, m, *_, **__: fake[model, m])
    argv = ["--models", "qwen2.5-0.5b", "qwen2.5-72b", "--m", "128", "2048", "--out-dir",
            str(tmp_path), "--tag", "test", "--note", "a note"]
    bench_swiglu.main(argv)
    out = capsys.readouterr().out
    assert re.search(r"\[2/4\] qwen2.5-72b M=128: .*; \d+ s, about \d+:\d\d:\d\d left", out)
    saved = json.loads((tmp_path / "2026-01-02-test.json").read_text())
    assert saved["complete"] and saved["notes"] == ["a note"] and len(saved["rows"]) == 4
    assert saved["suite"] == "custom" and saved["copy_tb_per_s"] == 4.3
    assert (tmp_path / "2026-01-02-test.md").read_text().splitlines()[1] == "a note"


# --- calibration and the tuning data -------------------------------------------------------

def _config(**fields):
    base = dict(family="interleaved", operands="16bit", id=0, schedule="cooperative",
                m_side="tokens", tile_m=128, tile_n=256, tile_k=64, cluster_m=1, cluster_n=1,
                scheduler="persistent", store="direct", m_bands=1, optional=False,
                compiled=True, max_m=0, m_multiple=1, ctas_per_sm=1, takes_splits=False)
    return {**base, **fields}


CONFIGS = {"a": _config(id=2), "b": _config(id=18, m_side="weights", tile_m=16, tile_n=128,
                                              scheduler="stream-k", takes_splits=True)}


def _key(fields):
    return "interleaved/{schedule}/{m_side}/{tile_m}x{tile_n}x{tile_k}/{cluster_m}x{cluster_n}/" \
           "{scheduler}/{store}".format(**fields)


def _calibration(rows, git="abc1234"):
    return {"kind": "calibration", "method": "CUDA-graph replay",
            "environment": {**ENV, "git": git, "driver": "580", "nvcc": "cuda 13.0",
                            "device_facts": {"kind": "NVIDIA H200", "compute_capability": 90,
                                             "sm_count": 132, "dram_bytes_per_s": 4.9e12}},
            "held_out_shapes": ["qwen2.5-3b"], "held_out_m": [5],
            "configs": {_key(c): c for c in CONFIGS.values()}, "complete": True, "rows": rows}


def _cal_row(model, m, a_us, b_us, **extra):
    k, n = SHAPES[model]
    return {"model": model, "dtype": "bfloat16", "m": m, "n": n, "k": k,
            "launch_us": {_key(CONFIGS["a"]): a_us, _key(CONFIGS["b"]): b_us}, "errors": {},
            **extra}


def _merged(tmp_path, *calibrations, extra=()):
    """The tuning data file ``tuning_data`` writes from ``calibrations`` (oldest first)."""
    paths = []
    for i, calibration in enumerate(calibrations):
        paths.append(tmp_path / f"c{i}.json")
        paths[-1].write_text(json.dumps(calibration))
    data = tmp_path / "data.json"
    tuning_data.main([str(p) for p in paths] + ["--data", str(data), *extra])
    return json.loads(data.read_text())


def test_tuning_data_merges_runs_and_keeps_held_out_rows_out(tmp_path):
    first = _calibration([_cal_row("llama-3-8b", 1, 80.0, 55.0),
                          _cal_row("llama-3-8b", 5, 80.0, 56.0),  # a held-out M
                          _cal_row("qwen2.5-3b", 1, 20.0, 10.0)])  # a held-out shape
    second = _calibration([_cal_row("llama-3-8b", 1, 79.0, 54.0, xla_us=60.0,
                                    cupti_us={_key(CONFIGS["b"]): 53.0}),
                           _cal_row("llama-3-8b", 2048, 600.0, 900.0)], git="def5678")
    document = _merged(tmp_path, first, second, extra=("--report", str(tmp_path / "r.md")))
    assert document["format"] == "jax_swiglu-tuning/1"
    assert sorted(document["calibrations"]) == ["2026-01-02-abc1234", "2026-01-02-def5678"]
    assert document["calibrations"]["2026-01-02-def5678"]["cutlass"] == "4.2.0.0"
    entries = {(e["m"], e["n"]): e for e in document["entries"]}
    assert sorted(entries) == [(1, 14336), (2048, 14336)]  # no held-out shape or M
    assert entries[1, 14336]["calibration"] == "2026-01-02-def5678"  # the newer run's entry
    assert entries[1, 14336]["xla_us"] == 60.0
    report_md = (tmp_path / "r.md").read_text()
    assert "| llama-3-8b | 5 |" in report_md and "| qwen2.5-3b | 1 |" in report_md


def test_the_report_scores_the_choice_of_xlas_path():
    """On held-out rows that timed XLA, the report says where the data's XLA ratio takes XLA's
    path and whether XLA was faster than the fused pick there."""
    document = tuning_data.empty_document(_calibration([])["environment"]["device_facts"])
    tuning_data.merge(document, _calibration([
        _cal_row("llama-3-8b", 1024, 300.0, 900.0, xla_us=250.0),  # XLA faster near 1024
        _cal_row("llama-3-8b", 1, 80.0, 55.0, xla_us=60.0)]))  # slower near 1
    from jax_swiglu.selection import _data
    results = tuning_data.evaluate(_data.TuningData(document), [
        _cal_row("llama-3-8b", 1100, 320.0, 950.0, xla_us=350.0),
        _cal_row("llama-3-8b", 2, 80.0, 55.0, xla_us=50.0)])
    by_m = {r["m"]: r for r in results}
    assert by_m[1100]["takes_xla"] and not by_m[2]["takes_xla"]
    summary = tuning_data._xla_summary(results)
    assert "taken on 1, 1 of them slower than the fused pick (up to 1.094x)" in summary
    assert "left on 1 where it was faster (the fused pick up to 1.100x its time)" in summary
    report_md = tuning_data.report_markdown(results, "data.json", ["held-out.json"])
    assert "1.09 (XLA taken)" in report_md and summary in report_md


def test_a_run_that_times_no_xla_keeps_the_entrys_earlier_xla_time(tmp_path):
    """A full run without XLA timings (calibrate --jax-m with no M) replaces an entry's
    launches; the XLA time and its launches through JAX stay, naming the run that timed them,
    so the XLA ratio near that entry does not lose its measurement."""
    first = _calibration([_cal_row("llama-3-8b", 192, 80.0, 55.0, xla_us=60.0,
                                   cupti_us={_key(CONFIGS["b"]): 53.0})])
    second = _calibration([_cal_row("llama-3-8b", 192, 78.0, 52.0)], git="def5678")
    third = _calibration([_cal_row("llama-3-8b", 192, 77.0, 51.0)], git="0a1b2c3")
    document = _merged(tmp_path, first, second, third)
    [entry] = document["entries"]
    assert entry["launch_us"] == {_key(CONFIGS["a"]): 77.0, _key(CONFIGS["b"]): 51.0}
    assert entry["calibration"] == "2026-01-02-0a1b2c3"
    assert entry["xla_us"] == 60.0 and entry["cupti_us"] == {_key(CONFIGS["b"]): 53.0}
    assert entry["xla_calibration"] == "2026-01-02-abc1234"  # through two later runs
    from jax_swiglu.selection import _data
    assert _data.TuningData(document).entries[0].xla_us == 60.0


def test_a_calibration_of_some_rows_joins_the_entries_it_measured(tmp_path):
    """A --configs run times some rows' launches: merged, they replace those launches' times
    and keep the entry's other launches and its XLA time; where no entry was, they make none
    (some rows alone do not say which launch is fastest)."""
    first = _calibration([_cal_row("llama-3-8b", 1, 80.0, 55.0, xla_us=60.0,
                                   cupti_us={_key(CONFIGS["b"]): 53.0})])
    b_only = _cal_row("llama-3-8b", 1, 0.0, 50.0)
    del b_only["launch_us"][_key(CONFIGS["a"])]
    second = {**_calibration([b_only, _cal_row("llama-3-8b", 2048, 600.0, 900.0)],
                             git="def5678"), "only_configs": [18]}
    entries = {(e["m"], e["n"]): e for e in _merged(tmp_path, first, second)["entries"]}
    joined = entries[1, 14336]
    assert joined["launch_us"] == {_key(CONFIGS["a"]): 80.0, _key(CONFIGS["b"]): 50.0}
    assert joined["launch_calibration"] == {_key(CONFIGS["a"]): "2026-01-02-abc1234",
                                            _key(CONFIGS["b"]): "2026-01-02-def5678"}
    assert joined["xla_us"] == 60.0 and joined["calibration"] == "2026-01-02-abc1234"
    assert sorted(entries) == [(1, 14336)]


def test_a_calibration_of_some_rows_joins_at_the_entrys_day_through_its_anchors(tmp_path):
    """A --configs run that timed the entry's launch a again (its anchor) 10 % faster than the
    entry's run did ran on a faster day: its new launch b joins at the entry's day, 10 % slower
    than timed; a's time stays the entry's. Without anchors the times join as timed."""
    first = _calibration([_cal_row("llama-3-8b", 1, 80.0, 55.0),
                          _cal_row("llama-3-8b", 2048, 600.0, 900.0)])
    anchored = _cal_row("llama-3-8b", 1, 0.0, 50.0, anchor_us={_key(CONFIGS["a"]): 80.0 / 1.1})
    del anchored["launch_us"][_key(CONFIGS["a"])]
    plain = _cal_row("llama-3-8b", 2048, 0.0, 880.0)
    del plain["launch_us"][_key(CONFIGS["a"])]
    second = {**_calibration([anchored, plain], git="def5678"), "only_configs": [18]}
    entries = {e["m"]: e for e in _merged(tmp_path, first, second)["entries"]}
    assert entries[1]["launch_us"] == {_key(CONFIGS["a"]): 80.0, _key(CONFIGS["b"]): 55.0}
    assert entries[2048]["launch_us"] == {_key(CONFIGS["a"]): 600.0, _key(CONFIGS["b"]): 880.0}
    # Anchors the entry never timed say nothing about its day.
    assert tuning_data.anchor_scale({"anchor_us": {"other": 1.0}}, entries[1]) == 1.0
    assert tuning_data.anchor_scale({"anchor_us": {"other": 1.0}}, None) == 1.0


def test_a_configs_run_times_only_problems_the_data_can_join():
    """calibrate --configs leaves out the (shape, M) rows with no shipped entry of the dtype
    (the merge would drop them), and says which M."""
    from types import SimpleNamespace

    k, n = shapes.mlp_shape("llama-3-8b")
    held = {("bfloat16", 176, n, k), ("bfloat16", 208, n, k)}
    shipped = SimpleNamespace(exact=lambda dtype, m, n_, k_: (
        object() if (dtype, m, n_, k_) in held else None))
    rows = calibrate.plan(["llama-3-8b"], [176, 240, 208])
    assert calibrate.joinable(rows, shipped, "bfloat16") == (
        [("llama-3-8b", 176), ("llama-3-8b", 208)], [240])
    assert calibrate.joinable(rows, shipped, "float8_e4m3fn") == ([], [176, 208, 240])
    assert calibrate.joinable(rows, None, "bfloat16") == ([], [176, 208, 240])


def test_calibrate_anchors_are_the_entrys_fastest_other_launches():
    """A --configs run's anchors: the shipped entry's fastest launches that this build can
    run, none of the rows the run measures anew; none without an entry."""
    from types import SimpleNamespace

    def launch(row_id, key, splits=1):
        return SimpleNamespace(row=SimpleNamespace(id=row_id, key=key), splits=splits)

    candidates = [launch(2, "k2"), launch(18, "k18"), launch(18, "k18", splits=2),
                  launch(40, "k40"), launch(44, "k44")]
    previous = SimpleNamespace(launch_us={"k2": 90.0, "k18": 50.0, "k18|splits=2": 45.0,
                                          "k44": 70.0, "gone": 10.0})
    chosen = calibrate.anchor_launches(previous, candidates, [18], 2)
    assert [(c.row.key, c.splits) for c in chosen] == [("k44", 1), ("k2", 1)]
    assert calibrate.anchor_launches(None, candidates, [18], 2) == []
    assert calibrate.anchor_launches(previous, candidates, [18], 0) == []


def test_cross_validation_leaves_each_shape_out(tmp_path, monkeypatch):
    """Leave one shape out: a shape's entries are judged by the rule learned from the others
    alone. Config b wins everywhere but on one shape, which no other shape predicts: that
    row, and only that one, is reported off the fastest."""
    # Times in proportion to the cost model's (the H200's constants, which the new file
    # copies), so each config's correction is the same on every shape but the one where the
    # order flips, which those constants alone do not foresee.
    from jax_swiglu._native import KernelConfig
    from jax_swiglu.selection import _data, _model
    shipped = _data.shipped("NVIDIA H200")
    monkeypatch.setattr(_data, "any_sm90", lambda: shipped)
    a, b = (KernelConfig(**CONFIGS[c]) for c in ("a", "b"))

    def model_us(config, model, m):
        k, n = SHAPES[model]
        return _model.launch_us(config, 1, _model.Problem(m, n, k), 132, 4.9e12,
                                shipped.constants)

    rows = [_cal_row(model, m, 1.4 * model_us(a, model, m), model_us(b, model, m))
            for model in ("qwen2.5-0.5b", "qwen2.5-1.5b", "llama-3-8b") for m in (1, 2)]
    rows.append(_cal_row("qwen2.5-72b", 1, model_us(a, "qwen2.5-72b", 1),
                         1.4 * model_us(b, "qwen2.5-72b", 1)))
    path, data = tmp_path / "c.json", tmp_path / "data.json"
    path.write_text(json.dumps(_calibration(rows)))
    tuning_data.main([str(path), "--data", str(data)])
    results = tuning_data.cross_validate(json.loads(data.read_text()))
    assert len(results) == 7 and all(r["learned"] for r in results)
    off = [(r["model"], r["m"]) for r in results if r["ratio"] > 1.0]
    assert off == [("qwen2.5-72b", 1)]
    tuning_data.main(["--cross-validate", "--data", str(data), "--report", str(tmp_path / "cv.md")])
    by_m = tuning_data.cross_validate(json.loads(data.read_text()), "m")
    assert len(by_m) == 7 and {r["m"] for r in by_m} == {1, 2}
    report_md = (tmp_path / "cv.md").read_text()
    assert report_md.startswith(
        "<!-- written by `python -m benchmarks.tuning_data --cross-validate")
    assert "7 rows" in report_md and "| qwen2.5-72b | 1 |" in report_md
    assert "| llama-3-8b | 1 |" not in report_md  # within 2 %: only in the summary
    with pytest.raises(SystemExit):  # a clear error, not a traceback
        tuning_data.main(["--cross-validate", "--data", str(tmp_path / "missing.json")])


def test_tuning_data_refuses_another_device(tmp_path):
    calibration = _calibration([_cal_row("llama-3-8b", 1, 80.0, 55.0)])
    document = tuning_data.empty_document({"kind": "NVIDIA H100 PCIe", "compute_capability": 90,
                                           "sm_count": 114, "dram_bytes_per_s": 2e12})
    with pytest.raises(ValueError, match="cannot join"):
        tuning_data.merge(document, calibration)


def _moe_run(times, git="abc1234"):
    """A bench_moe run with grouped rows 33 and 48 forced: ``times`` maps (model, tokens,
    routing) to their (33, 48) times."""
    from jax_swiglu import kernel_configs

    table = kernel_configs()
    configs = {f"grouped:{c}": {**dataclasses.asdict(table[c]), "key": table[c].key}
               for c in (33, 48)}
    rows = []
    for (model, tokens, routing), (t33, t48) in times.items():
        k, f, experts, top_k = shapes.MOE_MLPS[model]
        rows.append({"model": model, "tokens": tokens, "rows": tokens * top_k, "routing": routing,
                     "k": k, "f": f, "experts": experts, "top_k": top_k,
                     "gpu_us": {"grouped": t33, "gemm": 1.0, "grouped:33": t33,
                                "grouped:48": t48}})
    return {"environment": {**ENV, "git": git, "command": "python -m benchmarks.bench_moe"},
            "method": tuning_data.GROUPED_METHOD, "held_out_models": ["olmoe-1b-7b"],
            "configs": configs, "rows": rows}


@requires_kernels
def test_tuning_data_merges_grouped_runs_and_reports_held_out_models(tmp_path):
    """Forced grouped rows of a bench_moe run become grouped entries keyed by the rows'
    definitions (the held-out MoE shapes stay out); the newer run's entry wins; the grouped
    choice then follows the measured ratio, and the report judges it on the held-out shapes."""
    from jax_swiglu import kernel_configs, selection
    from jax_swiglu.selection import _data

    first = _moe_run({("qwen3-30b-a3b", 4096, "balanced"): (330.0, 300.0),
                      ("qwen3-30b-a3b", 4096, "skewed"): (390.0, 360.0),
                      ("olmoe-1b-7b", 4096, "balanced"): (400.0, 380.0)})
    second = _moe_run({("qwen3-30b-a3b", 4096, "balanced"): (331.0, 120.0),
                       ("qwen3-30b-a3b", 4096, "skewed"): (392.0, 150.0),
                       ("olmoe-1b-7b", 4096, "skewed"): (430.0, 500.0)}, git="def5678")
    paths = []
    for i, run in enumerate((first, second)):
        paths.append(tmp_path / f"moe{i}.json")
        paths[-1].write_text(json.dumps(run))
    data = tmp_path / "data.json"
    data.write_text(json.dumps(tuning_data.empty_document(
        {"kind": "NVIDIA H200", "compute_capability": 90, "sm_count": 132,
         "dram_bytes_per_s": 4.9e12})))
    tuning_data.main(["--grouped", *map(str, paths), "--data", str(data), "--report",
                      str(tmp_path / "r.md")])
    document = json.loads(data.read_text())
    entries = document["grouped_entries"]
    assert [(e["m"], e["routing"]) for e in entries] == [(32768, "balanced"), (32768, "skewed")]
    keys = {kernel_configs()[c].key for c in (33, 48)}
    assert all(set(e["launch_us"]) == keys for e in entries)
    assert {e["calibration"] for e in entries} == {"2026-01-02-def5678"}
    assert document["calibrations"]["2026-01-02-def5678"]["method"] == tuning_data.GROUPED_METHOD
    assert keys <= set(document["configs"])
    loaded = _data.TuningData(document)
    problem = selection.GroupedProblem(32768, 768, 2048, 128, "bfloat16")
    ratio = (loaded.grouped_correction(kernel_configs()[48].key, "balanced", "bfloat16",
                                       *(32768, 768, 2048, 128))
             / loaded.grouped_correction(kernel_configs()[33].key, "balanced", "bfloat16",
                                         *(32768, 768, 2048, 128)))
    # Each correction is measured / model at the one entry of its routing there.
    model_us = {c: selection._model.grouped_us(kernel_configs()[c], selection._model.Problem(
        32768, 768, 2048), [(256, 128)], 132, 4.9e12, loaded.constants) for c in (33, 48)}
    assert ratio * model_us[48] / model_us[33] == pytest.approx(120.0 / 331.0, rel=1e-3)
    choice = selection.choose_grouped(problem, platform="cuda", data=loaded)
    assert choice.launch.config == 48
    assert "corrected by the grouped measurements" in choice.reason
    report_md = (tmp_path / "r.md").read_text()
    assert "| olmoe-1b-7b | 4096 | config 48 | — | 1.163 |" in report_md, report_md
    assert "| qwen3-30b-a3b |" not in report_md


def test_grouped_runs_of_another_device_are_refused():
    run = {"environment": {**ENV, "device": "NVIDIA H100 PCIe"}, "rows": []}
    document = tuning_data.empty_document({"kind": "NVIDIA H200", "compute_capability": 90,
                                           "sm_count": 132, "dram_bytes_per_s": 4.9e12})
    with pytest.raises(ValueError, match="cannot join tuning data of NVIDIA H200"):
        tuning_data.merge_grouped(document, run)


def test_calibration_plan_and_groups():
    expanded = calibrate.expand(["fit", "llama-3-8b", "4096x128"], calibrate.SHAPE_GROUPS)
    assert expanded.count("llama-3-8b") == 1 and expanded[-1] == "4096x128"
    held = calibrate.expand(["held-out"], calibrate.SHAPE_GROUPS)
    assert held and not set(held) & set(calibrate.expand(["fit"], calibrate.SHAPE_GROUPS))
    rows = calibrate.plan(["a", "b"], [64, 1, 8, 4096])
    # Band by band of M (decode first), shape by shape inside a band.
    assert rows == [("a", 1), ("a", 8), ("b", 1), ("b", 8), ("a", 64), ("b", 64), ("a", 4096),
                    ("b", 4096)]


def test_calibrate_main_writes_the_run(tmp_path, monkeypatch):
    seen = []

    def fake(name, m, dtype, args, device, key):
        seen.append((name, m))
        k, n = SHAPES.get(name, (64, 64))
        return {"model": name, "dtype": dtype, "m": m, "n": n, "k": k,
                "launch_us": {"x": 1.0 + m}, "errors": {}}

    class Device:
        def as_dict(self):
            return {"kind": "NVIDIA H200", "compute_capability": 90, "sm_count": 132,
                    "dram_bytes_per_s": 4.9e12}

    monkeypatch.setattr(calibrate.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(calibrate.environment_lib, "environment", lambda: dict(ENV))
    monkeypatch.setattr(calibrate._engine, "target_device", lambda: Device())
    monkeypatch.setattr(calibrate, "calibrate_row", fake)
    out = tmp_path / "calibration.json"
    calibrate.main(["--shapes", "qwen2.5-0.5b", "llama-3-8b", "--m", "8", "1", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["kind"] == "calibration" and saved["complete"] and len(saved["rows"]) == 4
    assert seen == [("qwen2.5-0.5b", 1), ("qwen2.5-0.5b", 8), ("llama-3-8b", 1), ("llama-3-8b", 8)]
    assert saved["environment"]["device_facts"]["sm_count"] == 132
    assert "qwen2.5-0.5b" not in saved["held_out_shapes"]
    md = report.calibration_markdown(saved)
    assert "| llama-3-8b | 8 | 1 | x | 9.0 | - |" in md


def test_tensor_parallel_script_on_host_devices(tmp_path):
    """benchmarks/tensor_parallel.py end to end on 4 CPU host devices (2 x 2 mesh)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.tensor_parallel", "--tp", "2", "--data", "2",
         "--shape", "256,512", "--m", "64", "--iterations", "2", "--out-dir", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    [json_path] = tmp_path.glob("*-tp2x2.json")
    result_ = json.loads(json_path.read_text())
    assert result_["complete"] and result_["nccl_nvls_enable"] == "0"
    [row_] = result_["rows"]
    check = row_["check"]
    # fp32 partial sums reproduce one device within the kernel tolerance; bf16 ones (the
    # default, as XLA's MLP) round each partial, which newer XLA keeps on host devices too, so
    # they are held to the script's norm bound, and must not be worse than XLA's own TP MLP.
    assert check["tp_fp32_reduce_vs_one_gpu"]["mismatches"] == 0
    assert check["tp_fp32_reduce_vs_fp32"]["mismatches"] == 0
    assert check["tp_vs_one_gpu"]["rel_fro"] <= tensor_parallel.DEFAULT_REDUCE_REL_FRO
    assert check["tp_vs_fp32"]["rel_fro"] <= check["xla_tp_vs_fp32"]["rel_fro"]
    assert not any(c["nan"] for c in check.values())
    assert row_["all_reduces_in_hlo"] >= 1


def test_profile_script_brackets_one_call_per_launch(monkeypatch, capsys):
    """benchmarks/profile_kernels.py: a launch compiles with it forced (``swiglu(launch=...)``);
    exactly one call of each launch sits between profiler start and stop (what ncu
    --profile-from-start off records)."""
    from benchmarks import profile_kernels

    events, forced = [], []

    class Recorder:
        def start(self):
            events.append("start")

        def stop(self):
            events.append("stop")

    real_fused = profile_kernels.bench_swiglu.fused

    def spying_fused(kernel="auto", activation="silu", launch=None):
        forced.append(launch)
        return real_fused(kernel, activation, launch)

    monkeypatch.setattr(profile_kernels, "_DriverProfiler", Recorder)
    monkeypatch.setattr(profile_kernels.bench_swiglu, "fused", spying_fused)
    profile_kernels.main(["--rows", "qwen2.5-0.5b:16", "--launches", "gemm", "auto",
                          "1,swizzle=2"])
    assert events == ["start", "stop"] * 3
    assert forced == [None, "1,swizzle=2"]
    assert capsys.readouterr().out.count("profiling qwen2.5-0.5b M=16") == 3


def test_fp8_benchmark_targets_and_report():
    from benchmarks import bench_fp8
    from benchmarks.shapes import PUBLIC_MLPS

    def row(model, m, fp8, xla, bf16, off=0, fast=None, xla_promoted=None):
        k, n = PUBLIC_MLPS[model]
        times = {"fp8": fp8, "fp8_xq": fp8 - 3, "xla_fp8": xla, "bf16": bf16}
        if fast is not None:
            times.update(fp8_fast=fast, xla_fp8_promoted=xla_promoted)
        return {"model": model, "m": m, "k": k, "n": n, "fp8_weight_bytes": k * 2 * n,
                "bf16_weight_bytes": 4 * k * n, "gpu_us": times,
                "mismatches": {"fp8": off, "fp8_xq": off, "xla_fp8": 99},
                "fp8_choice": "M=1 ...: interleaved fp8 [config 2]"}
    # The first row as recorded before the fast mode (no fp8_fast / xla_fp8_promoted).
    rows = [row("qwen2.5-0.5b", 1, 10.0, 13.0, 9.0),
            row("qwen2.5-7b", 1, 36.0, 40.0, 70.0, fast=35.0, xla_promoted=44.0),
            row("qwen2.5-7b", 2048, 400.0, 420.0, 700.0, off=2, fast=380.0, xla_promoted=450.0)]
    met = {target: ok for target, _, ok in bench_fp8.targets(rows)}
    assert met == {"fp8 >= 1.7x bf16 auto at M >= 2048 on the 7B-72B shapes": True,
                   "fp8 >= 1.8x bf16 auto at M <= 16 on >= 100 MB of bf16 weights": True,
                   "fp8 (promoted) >= 1.00x XLA's promoted fp8 path on every row": True,
                   "fp8_fast >= 1.05x XLA's fp8 path (fast accumulation) on every row": True,
                   "fp8 (promoted) against XLA's default (fast) fp8 path, every row": True,
                   "0 mismatches, promoted (1 % + 1e-3 against the spec)": False}
    rows[2]["gpu_us"]["fp8_fast"] = 410.0  # 1.02x XLA's fast path: a miss
    assert not {t: ok for t, _, ok in bench_fp8.targets(rows)}[
        "fp8_fast >= 1.05x XLA's fp8 path (fast accumulation) on every row"]
    # The peers recorded since: the bare fp8 GEMM and the whole blocks.
    rows[2]["gpu_us"].update(fp8_fast_xq=370.0, xla_fp8_gemm=360.0, fp8_mlp=500.0,
                             bf16_mlp=800.0)
    rows[2]["fp8_mlp_rel_fro"] = 0.0123
    met = {target: ok for target, _, ok in bench_fp8.targets(rows)}
    assert met["whole fp8 MLP >= 1.5x our bf16 fused_mlp at M >= 2048"]  # 1.6x
    assert met["the fused kernel (fast, x in fp8) within 1.05x of the bare fp8 GEMM at M >= 1024"]
    assert not met["the fused kernel (promoted, x in fp8) within 1.05x of the bare fp8 GEMM at "
                   "M >= 1024"]  # 397 / 360 = 1.10
    rows[2]["gpu_us"]["fp8_mlp"] = 600.0
    assert not {t: ok for t, _, ok in bench_fp8.targets(rows)}[
        "whole fp8 MLP >= 1.5x our bf16 fused_mlp at M >= 2048"]
    text = bench_fp8.markdown({"environment": {"device": "GPU", "date": "2026-12-01", "git": "x"},
                               "iterations": 10, "rounds": 3, "rows": rows})
    assert "| qwen2.5-7b | 2048 | 400.0 | 410.0 |" in text and "| no |" in text
    assert "| 600.0 | 800.0 | 1.33 | 1.23e-02 |" in text and "| 2/—/2/—/99/— |" in text
    assert "| qwen2.5-0.5b | 1 | 10.0 | — |" in text
    # A row recorded when the block's elements off were counted says so.
    del rows[2]["fp8_mlp_rel_fro"]
    rows[2]["mismatches"]["fp8_mlp"] = 7052
    text = bench_fp8.markdown({"environment": {"device": "GPU", "date": "2026-12-01", "git": "x"},
                               "iterations": 10, "rounds": 3, "rows": rows})
    assert "| 600.0 | 800.0 | 1.33 | 7052 off |" in text and "| 2/—/2/—/99/— |" in text


def test_model_swap_runs_as_the_readme_writes_it():
    """`python -m benchmarks.model_swap`, with no arguments, writes where recorded runs live
    (the run itself needs tunix: tests/test_model_swap.py)."""
    from benchmarks import model_swap
    readme = (REPO / "README.md").read_text()
    command = re.search(r"`python -m benchmarks\.model_swap([^`]*)`", readme).group(1).split()
    args = model_swap.parse_args(command)
    assert args.out is None and args.models == list(model_swap.MODELS)
    assert model_swap.default_out_dir("NVIDIA H200") == str(
        REPO / "benchmarks" / "results" / "NVIDIA_H200")
    assert model_swap.parse_args(["--tiny", "--out", "somewhere"]).out == "somewhere"


# --- the grouped (mixture-of-experts) benchmark --------------------------------------------

def test_moe_routings_sum_to_the_rows_and_skew_as_described():
    import numpy as np

    from benchmarks import bench_moe
    rng = np.random.default_rng(0)
    for rows, experts in ((16, 8), (64, 128), (32768, 128), (5, 256)):
        balanced = bench_moe.group_sizes("balanced", rows, experts, rng)
        assert balanced.sum() == rows and balanced.dtype == np.int32
        assert balanced.max() - balanced.min() <= 1
        skewed = bench_moe.group_sizes("skewed", rows, experts, rng)
        assert skewed.sum() == rows and skewed.max() >= rows // 2
        assert (skewed == 0).sum() >= experts // 4
    with pytest.raises(ValueError, match="routing must be one of"):
        bench_moe.group_sizes("random", 8, 8, rng)


def test_moe_spec_by_blocks_of_experts_is_the_whole_spec(monkeypatch):
    """The benchmark's fp32 spec, a few experts at a time (so 256 large experts fit beside
    their bf16 weights), equals the reference over every expert at once, empty experts and
    rows past the groups included."""
    import numpy as np

    import jax
    import jax.numpy as jnp

    import jax_swiglu
    from benchmarks import bench_moe
    experts, k, f, rows = 6, 32, 64, 40
    keys = jax.random.split(jax.random.key(3), 3)
    x = jax.random.normal(keys[0], (rows, k), jnp.bfloat16)
    w = {"gate": jax.random.normal(keys[1], (experts, k, f), jnp.bfloat16),
         "up": jax.random.normal(keys[2], (experts, k, f), jnp.bfloat16)}
    sizes = jnp.asarray(np.array([7, 0, 12, 5, 0, 9], np.int32))  # 33 of 40 rows
    f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
    with jax.default_matmul_precision("highest"):
        whole = jax_swiglu.grouped_swiglu_reference(f32(x), f32(w["gate"]), f32(w["up"]), sizes)
    monkeypatch.setattr(bench_moe, "SPEC_BYTES", 2 * 2 * k * f * 4)  # two experts a block
    blocks = bench_moe._spec_reference(x, sizes, w)
    np.testing.assert_allclose(np.asarray(blocks), np.asarray(whole), rtol=1e-6, atol=1e-6)
    assert not np.asarray(blocks[33:]).any()


def test_moe_weights_and_a_model_that_does_not_fit():
    """The expert weights: unit-scale products, the GEMM's expert the first, the
    concatenation only where XLA's or tokamax's ragged_dot reads it; a model skipped for
    memory is said in the table's header."""
    import jax
    import numpy as np

    from benchmarks import bench_moe
    w = bench_moe.make_weights(jax.random.key(0), 256, 64, 3)
    gate, up = np.asarray(w["gate"], np.float32), np.asarray(w["up"], np.float32)
    assert gate.shape == up.shape == (3, 256, 64) and abs(gate.std() * 16 - 1) < 0.05
    assert not np.array_equal(gate, up) and not np.array_equal(gate[0], gate[1])
    np.testing.assert_array_equal(np.asarray(w["dense"], np.float32),
                                  np.concatenate([gate[0], up[0]], axis=1))
    np.testing.assert_array_equal(np.asarray(w["concatenated"], np.float32),
                                  np.concatenate([gate, up], axis=2))
    assert "concatenated" not in bench_moe.make_weights(jax.random.key(0), 256, 64, 3,
                                                        concatenated=False)
    text = bench_moe.markdown({"environment": ENV, "iterations": 9, "rounds": 3, "rows": [],
                               "skipped_models": {"deepseek-v3": "RESOURCE_EXHAUSTED: ..."}})
    assert "Skipped, out of this GPU's memory: deepseek-v3 (RESOURCE_EXHAUSTED: ...)." in text


def _moe_row(tokens, routing, xla, grouped, gemm, tokamax=None, off=0, forced=None):
    from benchmarks import shapes
    k, f, experts, top_k = shapes.MOE_MLPS["mixtral-8x7b"]
    times = {"xla": xla, "xla_two": xla * 1.1, "grouped": grouped, "gemm": gemm,
             **({"tokamax": tokamax} if tokamax else {}), **(forced or {})}
    return {"model": "mixtral-8x7b", "tokens": tokens, "rows": tokens * top_k, "routing": routing,
            "k": k, "f": f, "experts": experts, "top_k": top_k, "gpu_us": times,
            "active_experts": min(experts, tokens * top_k),
            "unsupported": {}, "mismatches": {"grouped": off, "xla": 9},
            "grouped_choice": "T=16 ...: runs the grouped fused kernel config 35 (...)\n  "
                              "details: interleaved [jax_swiglu_grouped_silu_bf16, config 35: x]"}


def test_moe_targets_and_report():
    from benchmarks import bench_moe
    rows = [_moe_row(8, "balanced", 420.0, 400.0, 50.0, tokamax=500.0,
                     forced={"grouped:35": 400.0, "grouped:33": 550.0}),
            _moe_row(4096, "balanced", 18000.0, 2600.0, 2450.0, tokamax=3100.0),
            _moe_row(512, "skewed", 2100.0, 450.0, 300.0, off=2)]
    met = {name: ok for name, _, ok in bench_moe.targets(rows)}
    assert met["grouped >= 1.5x XLA's ragged_dot path, 512-16384 tokens"]
    assert not met["grouped >= 1.2x XLA's ragged_dot path, 1-64 tokens"]  # 1.05x
    assert met["grouped >= 1.1x tokamax's ragged_dot + activation"]  # 1.19x at worst
    assert met["grouped within 1.10x of the dense GEMM, balanced, >= 4096 tokens"]  # 1.061
    assert not met["0 elements off the fp32 spec (grouped)"]
    text = bench_moe.markdown({"environment": ENV, "iterations": 9, "rounds": 3, "rows": rows})
    # Without the part's facts, no HBM floor.
    assert ("| mixtral-8x7b | 8 | 16 | balanced | 420.0 | 462.0 | 500.0 | 400.0 | 50.0 | — | "
            "1.05 | 1.25 | 8.000 | — |") in text
    # With them: 8 experts' 4096 x 2 x 14336 bf16 weights, x and out at 4.9 TB/s.
    floor = 2 * (8 * 4096 * 2 * 14336 + 16 * (4096 + 14336)) / 4.9e12 * 1e6
    assert bench_moe.hbm_floor_us(rows[0], {"dram_bytes_per_s": 4.9e12}) == pytest.approx(floor)
    facts = {**ENV, "device_facts": {"dram_bytes_per_s": 4.9e12}}
    text_with_floor = bench_moe.markdown({"environment": facts, "iterations": 9, "rounds": 3,
                                          "rows": rows})
    assert f"| 50.0 | {floor:.1f} | 1.05 | 1.25 | 8.000 | {400.0 / floor:.2f} |" in text_with_floor
    assert "| mixtral-8x7b | 8 | balanced | 550.0 | **400.0** | grouped:35 (1.000x the best) |" in text
    assert "| 0 elements off the fp32 spec (grouped) | 2 | NO |" in text


def test_performance_page_holds_dense_and_grouped_runs(tmp_path):
    """docs/performance.md (report.py --performance): each run under its own heading, a
    bench_moe run with bench_moe's table, a bench_fp8 run with bench_fp8's."""
    moe = tmp_path / "moe.json"
    moe.write_text(json.dumps({"environment": ENV, "iterations": 9, "rounds": 3,
                               "rows": [_moe_row(8, "balanced", 420.0, 400.0, 50.0)]}))
    dense = tmp_path / "prefill.json"
    dense.write_text(json.dumps(result([row("qwen2.5-0.5b", 128, 30.0, 25.0, 26.0)])))
    out = tmp_path / "docs" / "performance.md"
    out.parent.mkdir()
    fp8 = tmp_path / "fp8.json"
    k, n = 4096, 14336
    fp8.write_text(json.dumps({
        "suite": "fp8", "environment": ENV, "iterations": 10, "rounds": 3,
        "rows": [{"model": "llama-3-8b", "m": 2048, "k": k, "n": n,
                  "fp8_weight_bytes": 2 * k * n, "bf16_weight_bytes": 4 * k * n,
                  "gpu_us": {"fp8": 464.0, "fp8_xq": 447.0, "xla_fp8": 403.0, "bf16": 628.0},
                  "mismatches": {"fp8": 0, "fp8_xq": 0}, "fp8_choice": "M=2048 ...: config 27"}]}))
    report.main([str(dense), str(moe), str(fp8), "--performance", str(out)])
    text = out.read_text()
    assert "## prefill: `prefill.json`" in text and "## moe: `moe.json`" in text
    assert text.count("# Grouped SwiGLU") == 0  # bench_moe's title gives way to the heading
    assert "| mixtral-8x7b | 8 | 16 | balanced | 420.0 |" in text
    assert "## fp8: `fp8.json`" in text and "| llama-3-8b | 2048 | 464.0 |" in text
    assert text.count("# fp8 (e4m3) SwiGLU") == 0


def test_moe_spec_sample_keeps_each_row_with_its_expert(monkeypatch):
    """Where every row would not fit the spec's memory bound, the sampled rows keep their
    experts (the sample's group sizes) and rows past the sum stay past it: the spec on the
    sample equals the spec on all rows, restricted to the sample."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_swiglu
    from benchmarks import bench_moe
    experts, k, f, rows = 4, 16, 8, 40
    kx, kg, ku = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (rows, k), jnp.float32)
    w_gate = jax.random.normal(kg, (experts, k, f), jnp.float32)
    w_up = jax.random.normal(ku, (experts, k, f), jnp.float32)
    sizes = jnp.asarray([9, 0, 17, 10], jnp.int32)  # 4 rows past the sum
    full = jax_swiglu.grouped_swiglu_reference(x, w_gate, w_up, sizes)
    monkeypatch.setattr(bench_moe, "SPEC_BYTES", 12 * experts * 2 * f * 4)
    xs, ys, sample_sizes = bench_moe._spec_sample(x, full, sizes, experts, f,
                                                  np.random.default_rng(1))
    assert xs.shape == (12, k) and int(sample_sizes.sum()) <= 12
    np.testing.assert_allclose(
        jax_swiglu.grouped_swiglu_reference(xs, w_gate, w_up, sample_sizes), ys,
        rtol=1e-5, atol=1e-5)
    # Under the bound every row is checked.
    monkeypatch.setattr(bench_moe, "SPEC_BYTES", 1e12)
    assert bench_moe._spec_sample(x, full, sizes, experts, f, None)[0].shape == (rows, k)
