"""Reports of recorded runs: markdown tables, the targets they are judged by, plots.

    python -m benchmarks.report RESULT.json [...]          # RESULT.md (+ RESULT.png) next to it
    python -m benchmarks.report --out-dir DIR RESULT.json   # ... into DIR instead
    python -m benchmarks.report --readme RESULT.json        # the README's performance table
    python -m benchmarks.report --performance docs/performance.md RUN.json ...

RESULT.json is what bench_swiglu.py or calibrate.py saved. A benchmark run gets its table, the
targets of its rows and a plot (matplotlib); a calibration run gets a summary table. No GPU
and no jax needed. A markdown file that this script did not write is left alone unless
--force; put annotations in the JSON's "notes" list instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys

GENERATED = "<!-- written by benchmarks/report.py from {json}; regenerate, do not edit -->"
# Columns beside xla, gemm and auto, where a run has them: the peers, and auto with SiLU in a
# run of another activation (bench_swiglu.py --activation).
PEERS = ("tokamax", "torch_eager", "torch_graph", "auto_silu")

# Prefill targets, on the Qwen2.5 shapes (ratios of GPU times; xla = the reference).
MIN_SPEEDUP_EVERY = 0.98        # P1: xla/auto on every row
MAX_GEMM_RATIO_MEAN = 1.00      # P2: auto/gemm, geometric mean over the rows ...
MAX_GEMM_RATIO_EVERY = 1.03     #     ... and on each
SMALL_MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b")
MIN_SMALL_SPEEDUP_MEAN = 1.35   # P3: geometric mean of xla/auto over the small models' rows
LARGE_MODEL, LARGE_MIN_M = "qwen2.5-72b", 2048
MIN_GEMM_FRACTION = 0.90        # P4: auto's TFLOP/s over gemm's, 72B at M >= 2048
# Decode targets (M <= 256) and held-out targets.
DECODE_MAX_M = 256
DECODE_MAX_GEMM_RATIO = 1.02    # D1: auto/gemm on every row
DECODE_MIN_SPEEDUP = 1.00       # D2: xla/auto on every row (M = 1 included)
STREAM_MAX_M, STREAM_MIN_BYTES = 16, 100e6
MIN_STREAM_TB_PER_S = 4.0       # D3: weight stream at M <= 16 on shapes of >= 100 MB
# D4: the fixed cost per call, the intercept of a line through (packed weight bytes, GPU time)
# over the rows of M <= FIXED_COST_MAX_M and at least FIXED_COST_MIN_BYTES: auto's may exceed
# the GEMM's by this much.
FIXED_COST_MAX_M, FIXED_COST_MIN_BYTES = 8, 50e6
MAX_FIXED_COST_EXCESS_US = 0.5
HELD_OUT_MAX_GEMM_RATIO = 1.02  # H2: auto/gemm on every row
HELD_OUT_MAX_GEMM_MEAN = 0.99   # H3: ... as a geometric mean


# --- helpers -------------------------------------------------------------------------------

def label(row) -> str:
    return f"{row['model']} M={row['m']}"


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def tflops(row, name) -> float:
    flops = row.get("flops", 2 * row["m"] * row["k"] * 2 * row["n"])
    return flops / (row["gpu_us"][name] * 1e-6) / 1e12


def speedup(row, name="auto") -> float:
    """xla/name: how many times faster than the XLA reference."""
    return row["gpu_us"]["xla"] / row["gpu_us"][name]


def gemm_ratio(row) -> float:
    """auto/gemm: the fused call's time over the bare GEMM's."""
    return row["gpu_us"]["auto"] / row["gpu_us"]["gemm"]


def weight_bytes(row) -> int:
    return row.get("weight_bytes", 2 * row["k"] * 2 * row["n"])


def stream_tb_per_s(row, name="auto") -> float:
    """The packed weights (K * 2N * 2 bytes) over the time: how fast the call streams them."""
    return weight_bytes(row) / (row["gpu_us"][name] * 1e-6) / 1e12


def is_calibration(result) -> bool:
    return result.get("kind") == "calibration"


def _notes(result) -> list[str]:
    notes = result.get("notes") or []
    return [notes] if isinstance(notes, str) else list(notes)


def _median_words(result) -> str:
    iterations, rounds = result.get("iterations"), result.get("rounds")
    if not iterations:
        return "median"
    if not rounds:
        return f"median of {iterations}"
    return f"median of {-(-iterations // rounds) * rounds} in {rounds} interleaved rounds"


def _command_line(env) -> str:
    commit = f" (commit {env['git']})" if env.get("git") else ""
    return f"Command: `{env['command']}`{commit}."


def _gpu_line(env) -> str:
    return (f"GPU: {env['device']} ({env.get('nvidia_smi')}); jax {env['jax']}, "
            f"jaxlib {env['jaxlib']}, CUTLASS {env.get('cutlass')}; {env['date']}")


def _launch(row) -> str:
    """The launch auto ran, short: 'config 18, split-K 2 (tuning data (measured))'."""
    text = row.get("auto_choice", "")
    found = re.search(r"config (\d+)(?::[^,\]]*)?", text)
    if " xla (" in text or text.split(": ", 1)[-1].startswith("xla"):
        name = "xla"
    elif found:
        name = f"config {found.group(1)}"
        split = re.search(r"split-K (\d+)\]", text)
        name += f", split-K {split.group(1)}" if split else ""
    else:
        name = "?"
    source = re.search(r"\((tuning data \(\w+\)|heuristic|autotune cache|override)", text)
    return f"{name} ({source.group(1)})" if source else name


# --- targets -------------------------------------------------------------------------------

@dataclasses.dataclass
class Target:
    name: str
    text: str
    holds: bool | None  # None: no row of this run is concerned
    measured: str
    misses: list[str]


def _fmt_misses(pairs, fmt="{:.3f}") -> list[str]:
    return [f"{label(row)} ({fmt.format(value)})" for row, value in pairs]


def _every(name, text, pairs, ok, fmt="{:.3f}", worst=min) -> Target:
    if not pairs:
        return Target(name, text, None, "-", [])
    low = worst(pairs, key=lambda p: p[1])
    return Target(name, text, all(ok(v) for _, v in pairs),
                  f"{'min' if worst is min else 'max'} {fmt.format(low[1])} ({label(low[0])})",
                  _fmt_misses([(r, v) for r, v in pairs if not ok(v)], fmt))


def prefill_targets(rows) -> list[Target]:
    rows = [r for r in rows if r["model"].startswith("qwen2.5-") and r["m"] >= 128]
    targets = [_every("P1", f"xla/auto >= {MIN_SPEEDUP_EVERY:.2f} on every Qwen2.5 row",
                      [(r, speedup(r)) for r in rows], lambda v: v >= MIN_SPEEDUP_EVERY)]
    ratios = [(r, gemm_ratio(r)) for r in rows]
    mean = geomean(v for _, v in ratios) if ratios else None
    every = _every("P2", "", ratios, lambda v: v <= MAX_GEMM_RATIO_EVERY, worst=max)
    targets.append(Target(
        "P2", f"auto/gemm <= {MAX_GEMM_RATIO_MEAN:.2f} as geometric mean, "
              f"<= {MAX_GEMM_RATIO_EVERY:.2f} on each row",
        None if mean is None else (mean <= MAX_GEMM_RATIO_MEAN and every.holds),
        "-" if mean is None else f"geomean {mean:.3f}, {every.measured}", every.misses))
    small = [(r, speedup(r)) for r in rows if r["model"] in SMALL_MODELS]
    mean = geomean(v for _, v in small) if small else None
    targets.append(Target(
        "P3", f"geometric mean of xla/auto >= {MIN_SMALL_SPEEDUP_MEAN:.2f}x over "
              + ", ".join(SMALL_MODELS),
        None if mean is None else mean >= MIN_SMALL_SPEEDUP_MEAN,
        "-" if mean is None else f"{mean:.2f}x over {len(small)} rows", []))
    large = [(r, r["gpu_us"]["gemm"] / r["gpu_us"]["auto"]) for r in rows
             if r["model"] == LARGE_MODEL and r["m"] >= LARGE_MIN_M]
    targets.append(_every("P4", f"{LARGE_MODEL} at M >= {LARGE_MIN_M}: auto reaches >= "
                                f"{MIN_GEMM_FRACTION:.0%} of gemm's TFLOP/s", large,
                          lambda v: v >= MIN_GEMM_FRACTION, "{:.1%}"))
    return targets


def decode_targets(rows) -> list[Target]:
    rows = [r for r in rows if r["m"] <= DECODE_MAX_M]
    stream = [(r, stream_tb_per_s(r)) for r in rows
              if r["m"] <= STREAM_MAX_M and weight_bytes(r) >= STREAM_MIN_BYTES]
    return [
        _every("D1", f"M <= {DECODE_MAX_M}: auto/gemm <= {DECODE_MAX_GEMM_RATIO:.2f} on every row",
               [(r, gemm_ratio(r)) for r in rows], lambda v: v <= DECODE_MAX_GEMM_RATIO,
               worst=max),
        _every("D2", f"M <= {DECODE_MAX_M}: xla/auto >= {DECODE_MIN_SPEEDUP:.2f} on every row "
                     "(M = 1 slower than XLA on no shape)",
               [(r, speedup(r)) for r in rows], lambda v: v >= DECODE_MIN_SPEEDUP),
        _every("D3", f"M <= {STREAM_MAX_M}, packed weights >= {STREAM_MIN_BYTES / 1e6:.0f} MB: "
                     f"weight stream >= {MIN_STREAM_TB_PER_S:.1f} TB/s", stream,
               lambda v: v >= MIN_STREAM_TB_PER_S, "{:.2f} TB/s"),
    ] + fixed_cost_target(rows)


def fixed_cost_fit(rows, name):
    """(intercept us, slope TB/s) of the least-squares line of ``name``'s GPU time against the
    packed weight bytes over the rows of M <= FIXED_COST_MAX_M with at least
    FIXED_COST_MIN_BYTES of weights; None where fewer than two distinct sizes qualify."""
    points = [(weight_bytes(r), r["gpu_us"][name]) for r in rows
              if r["m"] <= FIXED_COST_MAX_M and weight_bytes(r) >= FIXED_COST_MIN_BYTES
              and isinstance(r["gpu_us"].get(name), (int, float))]
    if len({b for b, _ in points}) < 2:
        return None
    mean_b = sum(b for b, _ in points) / len(points)
    mean_t = sum(t for _, t in points) / len(points)
    slope = (sum((b - mean_b) * (t - mean_t) for b, t in points)
             / sum((b - mean_b) ** 2 for b, _ in points))
    return mean_t - slope * mean_b, 1e-6 / slope  # us per byte -> TB/s


def fixed_cost_target(rows) -> list[Target]:
    """D4, where the rows have decode M and large enough weights."""
    auto, gemm = fixed_cost_fit(rows, "auto"), fixed_cost_fit(rows, "gemm")
    if auto is None or gemm is None:
        return []
    excess = auto[0] - gemm[0]
    return [Target(
        "D4", f"fixed cost per call (intercept of time against weight bytes, M <= "
              f"{FIXED_COST_MAX_M}, >= {FIXED_COST_MIN_BYTES / 1e6:.0f} MB) <= gemm's + "
              f"{MAX_FIXED_COST_EXCESS_US} us",
        excess <= MAX_FIXED_COST_EXCESS_US,
        f"auto {auto[0]:.2f} us + bytes / {auto[1]:.2f} TB/s; gemm {gemm[0]:.2f} us + bytes / "
        f"{gemm[1]:.2f} TB/s", [])]


def held_out_targets(rows) -> list[Target]:
    ratios = [(r, gemm_ratio(r)) for r in rows]
    mean = geomean(v for _, v in ratios) if ratios else None
    return [
        _every("H1", "xla/auto >= 1.00 on every row", [(r, speedup(r)) for r in rows],
               lambda v: v >= 1.0),
        _every("H2", f"auto/gemm <= {HELD_OUT_MAX_GEMM_RATIO:.2f} on every row", ratios,
               lambda v: v <= HELD_OUT_MAX_GEMM_RATIO, worst=max),
        Target("H3", f"auto/gemm geometric mean <= {HELD_OUT_MAX_GEMM_MEAN:.2f}",
               None if mean is None else mean <= HELD_OUT_MAX_GEMM_MEAN,
               "-" if mean is None else f"{mean:.3f}", []),
    ] + fixed_cost_target(rows)


def targets_for(result) -> list[Target]:
    suite = result.get("suite", "prefill")
    rows = result["rows"]
    if suite == "decode":
        return decode_targets(rows)
    if suite == "held-out":
        return held_out_targets(rows)
    if suite == "prefill":
        return prefill_targets(rows)
    return decode_targets(rows) + prefill_targets(rows)


def targets_markdown(targets, n_rows) -> str:
    verdict = {True: "yes", False: "**no**", None: "not measured"}
    lines = [f"Targets, judged on the {n_rows} rows of this run:", "",
             "| | target | this run | holds | rows that miss |", "|---|---|---|---|---|"]
    for t in targets:
        lines.append(f"| {t.name} | {t.text} | {t.measured} | {verdict[t.holds]} | "
                     f"{', '.join(t.misses) or '-'} |")
    return "\n".join(lines) + "\n"


# --- markdown ------------------------------------------------------------------------------

def _peer_columns(result) -> list[str]:
    present = []
    for row in result["rows"]:
        times = {**row["gpu_us"], **row.get("events_us", {})}
        present += [p for p in PEERS if p in times and p not in present]
        if "tokamax" in row.get("unsupported", {}) and "tokamax" not in present:
            present.append("tokamax")
    return [p for p in PEERS if p in present]


def _cell(row, name) -> str:
    times = {**row["gpu_us"], **row.get("events_us", {})}
    if name in times:
        return f"{times[name]:.1f}"
    return "refused" if name in row.get("unsupported", {}) else "-"


def benchmark_markdown(result) -> str:
    env = result["environment"]
    rows = result["rows"]
    peers = _peer_columns(result)
    lines = _notes(result) + ([""] if _notes(result) else []) + [
        f"{_gpu_line(env)}; measured bf16 GEMM peak {result['peak_tflops']:.0f} TFLOP/s, copy "
        f"{result.get('copy_tb_per_s', float('nan')):.2f} TB/s.",
        f"{_command_line(env)} GPU time in microseconds per call, {_median_words(result)}: "
        "CUPTI for XLA, the GEMM, auto and tokamax; CUDA events for PyTorch (eager, and a "
        "replayed CUDA graph).",
    ]
    if result.get("activation", "silu") != "silu":
        lines.append(f"Activation {result['activation']}: xla and auto compute it; auto_silu is "
                     "auto with SiLU, for what the activation costs.")
    if result.get("complete") is False:
        lines.append(f"**Cut short**: {len(rows)} rows recorded.")
    lines += ["", "| model | M | xla | gemm | auto | " + "".join(f"{p} | " for p in peers)
              + "auto/gemm | xla/auto | TB/s | auto ran |",
              "|---|---|---|---|---|" + "---|" * len(peers) + "---|---|---|---|"]
    for row in rows:
        t = row["gpu_us"]
        lines.append(f"| {row['model']} | {row['m']} | {t['xla']:.1f} | {t['gemm']:.1f} | "
                     f"{t['auto']:.1f} | " + "".join(f"{_cell(row, p)} | " for p in peers)
                     + f"{gemm_ratio(row):.3f} | {speedup(row):.2f} | "
                     f"{stream_tb_per_s(row):.2f} | {_launch(row)} |")
    refusals = sorted({why for row in rows for why in row.get("unsupported", {}).values()})
    if refusals:
        lines += ["", "Peers that did not run a row, and why: " + "; ".join(refusals) + "."]
    return "\n".join(lines) + "\n\n" + targets_markdown(targets_for(result), len(rows))


def calibration_markdown(result) -> str:
    env = result["environment"]
    rows = result["rows"]
    lines = _notes(result) + ([""] if _notes(result) else []) + [
        f"Calibration ({result.get('method')}): every candidate launch of each row timed "
        "side by side; microseconds per launch.", f"{_gpu_line(env)}.", _command_line(env)]
    if result.get("complete") is False:
        lines.append(f"**Cut short**: {len(rows)} rows recorded.")
    lines += ["", "| model | M | launches | fastest | us | second | us | xla (JAX) | failed |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        ranked = sorted(row["launch_us"].items(), key=lambda item: item[1])
        first = ranked[0] if ranked else ("-", float("nan"))
        second = ranked[1] if len(ranked) > 1 else ("-", float("nan"))
        xla = f"{row['xla_us']:.1f}" if row.get("xla_us") else "-"
        lines.append(f"| {row['model']} | {row['m']} | {len(ranked)} | {first[0]} | "
                     f"{first[1]:.1f} | {second[0]} | {second[1]:.1f} | {xla} | "
                     f"{len(row.get('errors', {}))} |")
    return "\n".join(lines) + "\n"


def markdown(result) -> str:
    return calibration_markdown(result) if is_calibration(result) else benchmark_markdown(result)


def readme_table(result, source: str) -> str:
    """The README's performance table: auto against XLA and the bare GEMM, per row."""
    lines = [f"<!-- performance table: written by benchmarks/report.py --readme from {source} -->",
             "| model | M | XLA (us) | bare GEMM (us) | jax_swiglu (us) | vs XLA | vs GEMM |",
             "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        t = row["gpu_us"]
        lines.append(f"| {row['model']} | {row['m']} | {t['xla']:.1f} | {t['gemm']:.1f} | "
                     f"{t['auto']:.1f} | {speedup(row):.2f}x | {gemm_ratio(row):.3f} |")
    return "\n".join(lines) + "\n"


# --- plot ----------------------------------------------------------------------------------

def plot_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_benchmark(result, path) -> None:
    """Per row: speedup over XLA (auto, and the peers), and auto's time over the bare GEMM."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    env = result["environment"]
    x = list(range(len(rows)))
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(max(8.0, 0.28 * len(rows) + 3), 8))
    palette = plt.get_cmap("tab10").colors
    series = [("auto", [speedup(r) for r in rows], palette[0])]
    for j, peer in enumerate(PEERS):
        values = [r["gpu_us"]["xla"] / {**r["gpu_us"], **r.get("events_us", {})}[peer]
                  if peer in {**r["gpu_us"], **r.get("events_us", {})} else None for r in rows]
        if any(v is not None for v in values):
            series.append((peer, values, palette[2 + j]))
    width = 0.8 / len(series)
    for j, (name, values, color) in enumerate(series):
        offset = (j - (len(series) - 1) / 2) * width
        ax1.bar([i + offset for i in x], [v or 0 for v in values], width, label=name, color=color)
    ax1.axhline(1.0, color="black", linewidth=0.8, label="XLA reference")
    ax1.set_ylabel("speedup over XLA")
    ax1.legend(fontsize=8, loc="upper right", ncol=4)
    ax2.bar(x, [gemm_ratio(r) for r in rows], 0.6, color=palette[0], label="auto / bare GEMM")
    ax2.axhline(1.0, color="black", linewidth=0.8)
    ax2.axhline(DECODE_MAX_GEMM_RATIO, color="tab:red", linewidth=0.8, linestyle="--",
                label=f"{DECODE_MAX_GEMM_RATIO}")
    ax2.set_ylim(0.8, max(1.1, max(gemm_ratio(r) for r in rows) * 1.05))
    ax2.set_ylabel("auto time / bare GEMM time")
    ax2.legend(fontsize=8, loc="upper right")
    for ax in (ax1, ax2):
        for i in range(1, len(rows)):
            if rows[i]["model"] != rows[i - 1]["model"]:
                ax.axvline(i - 0.5, color="0.85", linewidth=0.8, zorder=0)
        ax.grid(axis="y", color="0.92")
        ax.set_axisbelow(True)
    ax2.set_xticks(x, [f"{r['model']}\nM={r['m']}" for r in rows], fontsize=6, rotation=90)
    cut = " (cut short)" if result.get("complete") is False else ""
    fig.suptitle(f"SwiGLU, bf16: {env['device']}, jax {env['jax']}, {env['date']}{cut}\n"
                 f"{env['command']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- files ---------------------------------------------------------------------------------

def _ours(md_path) -> bool:
    """True if the markdown file is absent or was written by this script."""
    if not os.path.exists(md_path):
        return True
    with open(md_path) as f:
        return f.readline().startswith("<!-- written by benchmarks/report.py")


def write_report(result, stem, source=None, force=False, plot=True) -> list[str]:
    """Writes stem.md and, for a benchmark run, stem.png; returns the paths written."""
    written = []
    md_path = stem + ".md"
    if force or _ours(md_path):
        header = GENERATED.format(json=os.path.basename(source or stem + ".json"))
        with open(md_path, "w") as f:
            f.write(header + "\n" + markdown(result))
        written.append(md_path)
    else:
        print(f"left {md_path} alone: not written by report.py (--force overwrites it)",
              file=sys.stderr)
    if plot and not is_calibration(result) and result["rows"]:
        if plot_available():
            plot_benchmark(result, stem + ".png")
            written.append(stem + ".png")
        else:
            print("no plot: matplotlib is not installed (pip install 'jax_swiglu[bench]')",
                  file=sys.stderr)
    return written


def performance_markdown(results: list[tuple[str, dict]], out_path: str) -> str:
    """docs/performance.md: every given benchmark run's table, targets and plot, in order
    (bench_swiglu runs, bench_moe's grouped runs and bench_fp8's runs)."""
    out_dir = os.path.dirname(os.path.abspath(out_path))
    lines = ["<!-- written by benchmarks/report.py --performance; regenerate, do not edit -->",
             "# Performance", "",
             "The latest recorded benchmark runs on the H200, generated from their JSON "
             "(benchmarks/results/NVIDIA_H200/INDEX.md says how each was run and what it showed).",
             ""]
    for path, result in results:
        rel = os.path.relpath(os.path.abspath(path), out_dir)
        if result.get("rows") and "experts" in result["rows"][0]:
            # A grouped (mixture-of-experts) run: bench_moe's own table, under this heading.
            from . import bench_moe
            suite = "moe"
            body = bench_moe.markdown(result).split("\n", 2)[2]
        elif result.get("suite") == "fp8":
            from . import bench_fp8
            suite = "fp8"
            body = bench_fp8.markdown(result).split("\n", 2)[2]
        else:
            suite = result.get("suite", "prefill")
            body = markdown(result)
        lines += [f"## {suite}: `{os.path.basename(path)}`", "",
                  f"From [{os.path.basename(path)}]({rel}).", "", body.rstrip(), ""]
        png = os.path.splitext(path)[0] + ".png"
        if os.path.exists(png):
            lines += [f"![{suite}]({os.path.relpath(os.path.abspath(png), out_dir)})", ""]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="JSON files from bench_swiglu/calibrate")
    parser.add_argument("--out-dir", default=None, help="default: next to each JSON")
    parser.add_argument("--force", action="store_true",
                        help="overwrite markdown files that report.py did not write")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--readme", action="store_true",
                        help="print the README's performance table of each benchmark run")
    parser.add_argument("--performance", default=None,
                        help="write docs/performance.md here from the given benchmark runs")
    args = parser.parse_args(argv)
    if args.performance:
        runs = []
        for path in args.results:
            with open(path) as f:
                runs.append((path, json.load(f)))
        with open(args.performance, "w") as f:
            f.write(performance_markdown(runs, args.performance))
        print(f"wrote {args.performance}")
        return
    for path in args.results:
        with open(path) as f:
            result = json.load(f)
        if args.readme:
            print(readme_table(result, path), end="")
            continue
        stem = os.path.splitext(path)[0]
        if args.out_dir:
            os.makedirs(args.out_dir, exist_ok=True)
            stem = os.path.join(args.out_dir, os.path.basename(stem))
        for written in write_report(result, stem, source=path, force=args.force,
                                    plot=not args.no_plot):
            print(f"wrote {written}")


if __name__ == "__main__":
    main()
