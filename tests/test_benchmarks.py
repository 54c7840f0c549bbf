"""benchmarks/: the targets on hand-made numbers, the reports and files from a result."""

import json
import os
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import report  # noqa: E402

ENV = {"date": "2026-01-02T03:04:05+00:00", "command": "python bench_swiglu.py --quick",
       "device": "NVIDIA H200", "jax": "0.11.2", "jaxlib": "0.11.2", "nvidia_smi": "smi line",
       "git": "abc1234"}
SHAPES = {"qwen2.5-0.5b": (896, 4864), "qwen2.5-1.5b": (1536, 8960),
          "qwen2.5-3b": (2048, 11008), "qwen2.5-72b": (8192, 29568)}


def row(model, m, xla, gemm, auto, interleaved=None):
    k, n = SHAPES[model]
    return {"model": model, "m": m, "k": k, "n": n, "flops": 2 * m * k * 2 * n,
            "gpu_us": {"xla": xla, "xla_stack": xla, "gemm": gemm,
                       "interleaved": auto if interleaved is None else interleaved, "auto": auto}}


def result(rows):
    return {"environment": ENV, "iterations": 20, "notes": ["why this run"], "complete": True,
            "peak_tflops": 800.0, "rows": rows}


def passing_rows():
    # (a)/auto = 1.4 on the small shapes, auto/(c) = 0.99 everywhere, 72B at 0.99 of (c).
    return [row("qwen2.5-0.5b", 128, 14.0, 10.1, 10.0), row("qwen2.5-1.5b", 512, 70.0, 50.5, 50.0),
            row("qwen2.5-3b", 2048, 280.0, 202.0, 200.0),
            row("qwen2.5-72b", 2048, 2000.0, 1990.0, 1970.0),
            row("qwen2.5-72b", 8192, 8000.0, 7900.0, 7850.0)]


def holds(rows):
    return {t.number: t.holds for t in report.check_targets(rows)}


def misses(rows, number):
    return next(t.misses for t in report.check_targets(rows) if t.number == number)


def test_targets_all_hold():
    assert holds(passing_rows()) == {1: True, 2: True, 3: True, 4: True}


def test_target_1_every_configuration():
    rows = passing_rows()
    rows[3] = row("qwen2.5-72b", 2048, 2000.0, 2000.0, 2050.0)  # (a)/auto = 0.976 < 0.98
    assert holds(rows)[1] is False
    assert misses(rows, 1) == ["qwen2.5-72b M=2048 (0.976)"]
    rows[3] = row("qwen2.5-72b", 2048, 2000.0, 2000.0, 2040.0)  # 0.9804: holds
    assert holds(rows)[1] is True


def test_target_2_mean_and_each():
    rows = passing_rows()
    rows[0] = row("qwen2.5-0.5b", 128, 14.0, 10.0, 10.4)  # 1.04 > 1.03 on one configuration
    assert holds(rows)[2] is False and misses(rows, 2) == ["qwen2.5-0.5b M=128 (1.040)"]
    # Each within 1.03 but the geometric mean above 1.00.
    rows = [row(r["model"], r["m"], r["gpu_us"]["xla"], r["gpu_us"]["auto"] / 1.02,
                r["gpu_us"]["auto"]) for r in passing_rows()]
    assert holds(rows)[2] is False and misses(rows, 2) == []


def test_target_3_geometric_mean_of_small_shapes():
    rows = passing_rows()
    # 1.2x on one small configuration: geomean (1.4 * 1.4 * 1.2)^(1/3) = 1.33 < 1.35.
    rows[0] = row("qwen2.5-0.5b", 128, 12.0, 10.1, 10.0)
    assert holds(rows)[3] is False
    assert misses(rows, 3) == ["qwen2.5-0.5b M=128 (1.200x)"]
    # 1.3x on one and 1.4x on the others: geomean 1.366 holds; the 1.3x one is still listed.
    rows[0] = row("qwen2.5-0.5b", 128, 13.0, 10.1, 10.0)
    assert holds(rows)[3] is True and misses(rows, 3) == ["qwen2.5-0.5b M=128 (1.300x)"]
    # The 72B rows do not count, however slow.
    rows[4] = row("qwen2.5-72b", 8192, 8000.0, 7900.0, 7850.0 * 1.5)
    assert holds(rows)[3] is True


def test_target_4_large_shape_fraction_of_gemm():
    rows = passing_rows()
    rows[4] = row("qwen2.5-72b", 8192, 9000.0, 7900.0, 8800.0)  # 89.8% of (c)'s TFLOP/s
    assert holds(rows)[4] is False and misses(rows, 4) == ["qwen2.5-72b M=8192 (89.8%)"]
    rows[4] = row("qwen2.5-72b", 8192, 9000.0, 7900.0, 8770.0)  # 90.1%
    assert holds(rows)[4] is True
    # M < 2048 on 72B is not concerned.
    rows = [row("qwen2.5-72b", 512, 600.0, 400.0, 590.0)]
    assert holds(rows)[4] is None


def test_targets_not_measured():
    rows = [row("qwen2.5-72b", 512, 600.0, 590.0, 595.0)]
    assert holds(rows) == {1: True, 2: False, 3: None, 4: None}
    assert holds([]) == {1: None, 2: None, 3: None, 4: None}


def test_benchmark_report_files(tmp_path):
    pytest.importorskip("matplotlib")
    res = result(passing_rows())
    path = tmp_path / "2026-01-02-quick.json"
    path.write_text(json.dumps(res))
    report.main([str(path)])
    md = (tmp_path / "2026-01-02-quick.md").read_text()
    png = (tmp_path / "2026-01-02-quick.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    lines = md.splitlines()
    assert lines[0].startswith("<!-- written by benchmarks/report.py from 2026-01-02-quick.json")
    assert lines[1] == "why this run"
    assert "Command: `python bench_swiglu.py --quick` (commit abc1234)." in md
    assert "median of 20" in md and "peak 800 TFLOP/s" in md
    assert ("| model | M | xla (a) | xla_stack (b) | gemm (c) | interleaved | auto (e) | a/auto "
            "| auto/c | auto TFLOP/s | gemm TFLOP/s |") in md
    assert ("| qwen2.5-0.5b | 128 | 14.0 | 14.0 | 10.1 | 10.0 | 10.0 | 1.40 | 0.99 | 223 | 221 |"
            in md)
    assert md.count("| yes |") == 4 and "**no**" not in md


def test_hand_edited_markdown_is_kept(tmp_path):
    stem = str(tmp_path / "run")
    with open(stem + ".md", "w") as f:
        f.write("Provenance written by hand.\n")
    assert report.write_report(result(passing_rows()), stem, plot=False) == []
    assert open(stem + ".md").read() == "Provenance written by hand.\n"
    forced = report.write_report(result(passing_rows()), stem, plot=False, force=True)
    assert forced == [stem + ".md"]
    # Its own files it rewrites.
    assert report.write_report(result(passing_rows()), stem, plot=False) == [stem + ".md"]


def test_calibration_markdown_reproduces_the_recorded_table():
    """The hand-made 2026-11-29 calibration table, regenerated from its JSON (but its header)."""
    recorded = REPO / "benchmarks" / "results" / "NVIDIA_H200"
    res = json.loads((recorded / "2026-11-29-calibration.json").read_text())
    def config(schedule, tile_m, tile_n, cluster_m):
        return dict(schedule=schedule, tile_m=tile_m, tile_n=tile_n, tile_k=64,
                    cluster_m=cluster_m, cluster_n=1)
    res["configs"] = {"interleaved": {
        "0": config("cooperative", 128, 256, 2), "1": config("pingpong", 64, 256, 1),
        "2": config("cooperative", 128, 256, 1), "3": config("cooperative", 128, 128, 1)}}
    ours = report.markdown(res).splitlines()
    theirs = (recorded / "2026-11-29-calibration.md").read_text().splitlines()
    assert ours[0] == theirs[0] and ours[1] == theirs[1]  # what was run; GPU and versions
    assert ours[3].startswith("Configs (ffi/kernel_configs.h, as run): 0 = cooperative 128x256x64 "
                              "cluster 2x1, 1 = pingpong 64x256x64 cluster 1x1")
    assert ours[4:] == theirs[4:]  # the table


def test_variants_are_timed_in_interleaved_rounds(monkeypatch):
    import bench_swiglu
    calls = []
    monkeypatch.setattr(bench_swiglu, "_warm_up", lambda fn, args: calls.append(("warm", fn)))
    monkeypatch.setattr(bench_swiglu, "_gpu_samples_ms",
                        lambda fn, args, n: calls.append(("gpu", fn, n)) or [fn * 1.0] * n)
    monkeypatch.setattr(bench_swiglu, "_wall_samples_ms",
                        lambda fn, args, n: calls.append(("wall", fn, n)) or [fn * 2.0] * n)
    gpu, wall = bench_swiglu.measure_side_by_side({"a": 1, "b": 2}, (), iterations=5, rounds=2)
    assert gpu == {"a": 1.0, "b": 2.0} and wall == {"a": 2.0, "b": 4.0}
    # Everything warmed up first, then every variant once per round: drift over the run
    # is shared.
    orders = bench_swiglu.round_orders(["a", "b"], 2)
    assert calls == [("warm", 1), ("warm", 2)] + [
        (kind, {"a": 1, "b": 2}[name], 3) for order in orders for name in order
        for kind in ("gpu", "wall")]
    # The first round in the given order, later ones shuffled (each variant once), so no
    # variant always follows the same one.
    names = list("abcdef")
    orders = bench_swiglu.round_orders(names, 3)
    assert orders[0] == names and all(sorted(o) == names for o in orders)
    assert len({tuple(o) for o in orders}) == 3
    assert orders == bench_swiglu.round_orders(names, 3)  # reproducible
    calls.clear()  # GPU time only (calibrate.py): no wall-time calls
    assert bench_swiglu.measure_side_by_side({"a": 1}, (), 2, 2, wall=False) == ({"a": 1.0}, None)
    assert [c[0] for c in calls] == ["warm", "gpu", "gpu"]
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        bench_swiglu.measure_side_by_side({"a": 1}, (), 2, 0)


def test_remaining_time_estimate():
    import bench_swiglu
    assert bench_swiglu.estimate_remaining_s([], [1e9]) == 0.0
    assert bench_swiglu.estimate_remaining_s([(1e9, 10.0)], [1e9, 5e9]) == 20.0  # one point: mean
    # 2 s per configuration plus 1 s per 1e12 flops, recovered from three points.
    done = [(w, 2.0 + w / 1e12) for w in (1e11, 1e12, 4e12)]
    assert bench_swiglu.estimate_remaining_s(done, [8e12]) == pytest.approx(10.0)
    assert bench_swiglu._hms(3725.4) == "1:02:05"


def test_output_stem_does_not_overwrite(tmp_path):
    import bench_swiglu
    assert bench_swiglu.output_stem(str(tmp_path), "2026-01-02", "-quick") == os.path.join(
        tmp_path, "2026-01-02-quick")
    (tmp_path / "2026-01-02-quick.json").write_text("{}")
    assert bench_swiglu.output_stem(str(tmp_path), "2026-01-02", "-quick").endswith("-quick-2")


def test_benchmark_main_writes_the_run(tmp_path, monkeypatch, capsys):
    """bench_swiglu.main's bookkeeping (files, progress), with the GPU measurements faked."""
    import bench_swiglu
    fake = {("qwen2.5-0.5b", 128): row("qwen2.5-0.5b", 128, 14.0, 10.1, 10.0),
            ("qwen2.5-0.5b", 2048): row("qwen2.5-0.5b", 2048, 70.0, 50.0, 50.0),
            ("qwen2.5-72b", 128): row("qwen2.5-72b", 128, 240.0, 230.0, 235.0),
            ("qwen2.5-72b", 2048): row("qwen2.5-72b", 2048, 2000.0, 1990.0, 1970.0)}
    monkeypatch.setattr(bench_swiglu.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(bench_swiglu, "environment", lambda: dict(ENV))
    monkeypatch.setattr(bench_swiglu, "measure_peak_tflops", lambda: 800.0)
    monkeypatch.setattr(bench_swiglu, "bench_one", lambda model, m, *_: fake[model, m])
    argv = ["--models", "qwen2.5-0.5b", "qwen2.5-72b", "--m", "128", "2048", "--out-dir",
            str(tmp_path), "--tag", "test", "--note", "a note"]
    bench_swiglu.main(argv)
    out = capsys.readouterr().out
    assert re.search(r"\[2/4\] qwen2.5-0.5b M=2048: .*; \d+ s, elapsed \d+:\d\d:\d\d, "
                     r"about \d+:\d\d:\d\d left", out)
    saved = json.loads((tmp_path / "2026-01-02-test.json").read_text())
    assert saved["complete"] and saved["notes"] == ["a note"] and len(saved["rows"]) == 4
    assert (tmp_path / "2026-01-02-test.md").read_text().splitlines()[1] == "a note"
    if report.plot_available():
        assert (tmp_path / "2026-01-02-test.png").exists()


def test_calibrate_main_writes_the_run(tmp_path, monkeypatch):
    """calibrate.main's bookkeeping, with the GPU measurements faked."""
    import calibrate
    import jax_swiglu

    rounds_seen = []

    def fake(model, m, iterations, key, launches, rounds, gemm):
        rounds_seen.append(rounds)
        k, n = SHAPES[model]
        return {"model": model, "m": m, "k": k, "n": n,
                "gpu_us": {"xla": 10.0, **({"gemm": 8.0} if gemm else {}),
                           **{f"{kernel}:{launch}": 9.0 + j
                              for j, (kernel, launch) in enumerate(launches)}}}
    monkeypatch.setattr(calibrate.bench_swiglu, "environment", lambda: dict(ENV))
    monkeypatch.setattr(calibrate, "calibrate", fake)
    out = tmp_path / "calibration.json"
    calibrate.main(["--models", "qwen2.5-0.5b", "qwen2.5-3b", "--m", "128", "--iterations", "3",
                    "--rounds", "2",
                    "--launches", "interleaved:0,swizzle=4", "interleaved:2", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["kind"] == "calibration" and saved["complete"] and len(saved["rows"]) == 2
    assert rounds_seen == [2, 2] and saved["rounds"] == 2
    md = (tmp_path / "calibration.md").read_text()
    assert "the tile configs in the columns forced (KERNEL:LAUNCH)" in md and "median of 4 in 2 interleaved rounds" in md
    assert "| qwen2.5-3b | 128 | 10.0 | 9.0 | 10.0 | interleaved:0,swizzle=4 | 1.11x |" in md
    # --gemm: the bare GEMM beside them, never the best, and the best launch over it.
    calibrate.main(["--models", "qwen2.5-3b", "--m", "128", "--gemm", "--launches",
                    "interleaved:2", "interleaved:3", "--out", str(out)])
    md = (tmp_path / "calibration.md").read_text()
    assert "| model | M | xla | gemm (c) | interleaved:2 | interleaved:3 | best | best vs xla | best/(c) |" in md
    assert "| qwen2.5-3b | 128 | 10.0 | 8.0 | 9.0 | 10.0 | interleaved:2 | 1.11x | 1.125 |" in md
    if jax_swiglu.kernel_configs():  # the extension is built: every config by default
        assert "Configs (ffi/kernel_configs.h, as run): 0 = " in md
        calibrate.main(["--models", "qwen2.5-0.5b", "--m", "128", "--out", str(out)])
        md = (tmp_path / "calibration.md").read_text()
        kernels = ", ".join(jax_swiglu.kernel_configs())
        assert f"Calibration run: every {kernels} tile config forced" in md


def test_tensor_parallel_script_on_host_devices(tmp_path):
    """benchmarks/tensor_parallel.py end to end on 4 CPU host devices (2 x 2 mesh): the
    checks against one device and fp32 pass and the files are written (no CUPTI here)."""
    import subprocess
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "tensor_parallel.py"), "--tp", "2", "--data",
         "2", "--shape", "256,512", "--m", "64", "--iterations", "2", "--out-dir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    [json_path] = tmp_path.glob("*-tp2x2.json")
    result = json.loads(json_path.read_text())
    assert result["complete"] and result["nccl_nvls_enable"] == "0"
    assert result["mesh"] == {"data": 2, "model": 2}
    [row] = result["rows"]
    assert row["check"]["tp_vs_one_gpu"]["mismatches"] == 0
    assert row["check"]["tp_vs_fp32"]["mismatches"] == 0
    assert row["check"]["tp_fp32_reduce_vs_one_gpu"]["mismatches"] == 0
    assert row["check"]["tp_fp32_reduce_vs_fp32"]["mismatches"] == 0
    assert set(row) >= {"fused", "fused_fp32_reduce", "xla"}
    assert row["all_reduces_in_hlo"] >= 1  # the row-parallel down projection's reduction
    assert "custom | 64 | 0 (" in json_path.with_suffix(".md").read_text()


def test_profile_script_brackets_one_call_per_launch(monkeypatch, capsys):
    """benchmarks/profile_kernels.py: a KERNEL:LAUNCH launch compiles with its forcing variables
    set, and unset afterwards; exactly one call of each launch sits between profiler
    start/stop (what ncu --profile-from-start off records)."""
    import profile_kernels
    from jax_swiglu import _selection

    events = []

    class Recorder:
        def start(self):
            events.append("start")

        def stop(self):
            events.append("stop")

    seen = []
    real_jit = profile_kernels.jax.jit

    def spying_jit(fn):
        seen.append((os.environ.get(_selection.ENV_VAR), os.environ.get(_selection.CONFIG_ENV_VAR)))
        return real_jit(fn)

    monkeypatch.delenv(_selection.CONFIG_ENV_VAR, raising=False)
    monkeypatch.delenv(_selection.ENV_VAR, raising=False)
    monkeypatch.setattr(profile_kernels, "_DriverProfiler", Recorder)
    monkeypatch.setattr(profile_kernels.jax, "jit", spying_jit)
    profile_kernels.main(["--rows", "qwen2.5-0.5b:16", "--launches", "gemm", "auto",
                          "interleaved:1,swizzle=2"])
    assert events == ["start", "stop"] * 3
    assert seen == [(None, None), (None, None), ("interleaved", "1,swizzle=2")]
    assert _selection.ENV_VAR not in os.environ and _selection.CONFIG_ENV_VAR not in os.environ
    assert capsys.readouterr().out.count("profiling qwen2.5-0.5b M=16") == 3


def _trace_report():
    sys.path.insert(0, str(REPO / "benchmarks" / "gemm_probe"))
    import trace_report
    return trace_report


def test_trace_report_reads_the_config_table():
    """The tile-timeline report's tiles are ffi/kernel_configs.h's, as the extension compiled."""
    tiles = _trace_report().interleaved_tiles()
    assert tiles[1] == ("Pingpong", 128, 128, "DirectStore")
    assert tiles[5] == ("Cooperative", 128, 128, "TmaStore")  # stream-K keeps the TMA store
    assert tiles[6] == ("Pingpong", 128, 192, "DirectStore")
    from jax_swiglu import _native
    compiled = _native.kernel_configs().get("interleaved")
    if not compiled:
        pytest.skip(_native.unavailable_reason() or "no interleaved configs compiled")
    assert {i: (c.schedule.capitalize(), c.tile_m, c.tile_n,
                "DirectStore" if c.store == "direct" else "TmaStore")
            for i, c in compiled.items()} == tiles


def test_trace_report_periods_and_hand_offs(tmp_path):
    """Two math warpgroups taking turns: period, issue, hand-off, drain, store are read off
    the slots as traced_kernel.cuh writes them."""
    trace_report = _trace_report()
    path = tmp_path / "trace.csv"
    header = "config,variant,model,m,k,n,us,cublas_us,cta,role,tile," + ",".join(
        f"s{i}" for i in range(13))
    lines = [header]
    for cta in range(2):
        start = 1000
        for tile in range(8):  # alternating warpgroups: period 10,000 = issue 9,500 + 500
            e0 = start + 10_000 * tile
            slots = [e0, e0 + 9_500, e0 + 10_200, e0 + 10_300, e0 + 12_300, e0 + 12_400, 0, cta,
                     0, 0, 0, 0, 0]
            lines.append(f"6,as-built,qwen2.5-0.5b,8192,896,4864,190.0,180.0,{cta},{tile % 2},"
                         f"{tile // 2}," + ",".join(map(str, slots)))
            loads = [e0 - 3_000, e0 - 100] + [0] * 5 + [cta] + [0] * 5
            lines.append(f"6,as-built,qwen2.5-0.5b,8192,896,4864,190.0,180.0,{cta},2,{tile},"
                         + ",".join(map(str, loads)))
    path.write_text("\n".join(lines) + "\n")
    table = trace_report.summarize(trace_report.read(path), trace_report.interleaved_tiles())
    row = table.splitlines()[2].split("|")[1:-1]
    cells = dict(zip([h.strip() for h in table.splitlines()[0].split("|")[1:-1]],
                     [c.strip() for c in row]))
    assert cells["config"] == "6 (Pingpong 128x192)" and cells["epilogue"] == "DirectStore"
    assert cells["ideal"] == "10,752"  # 2 * 128 * 192 * 896 / 4096
    assert cells["period"] == "10,000" and cells["issue"] == "9,500"
    assert cells["hand-off"] == "500" and cells["drain"] == "700"
    assert cells["store"] == "2,000" and cells["producer per tile"] == "10,000"
    assert cells["tiles/CTA max"] == "8"
