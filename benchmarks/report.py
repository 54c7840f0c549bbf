"""Reports of recorded runs: markdown tables, the issue's targets, plots.

    python benchmarks/report.py RESULT.json [...]          # RESULT.md (+ RESULT.png) next to it
    python benchmarks/report.py --out-dir DIR RESULT.json   # ... into DIR instead

RESULT.json is what bench_swiglu.py or calibrate.py saved. A benchmark run gets a markdown
table, the targets summary and a plot (matplotlib); a calibration run gets its table. No GPU
and no jax needed. A markdown file that this script did not write (a hand-annotated record)
is left alone unless --force; put such annotations in the JSON's "notes" list instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys

# Timed variants that are not a fused kernel (see bench_swiglu.py): the XLA reference (a),
# XLA on stacked weights (b), the bare GEMM (c) and the selection table's choice (e).
BASELINES = ("xla", "xla_stack", "gemm", "auto")
GENERATED = "<!-- written by benchmarks/report.py from {json}; regenerate, do not edit -->"

# The targets of issue 4, on the Qwen2.5 MLP shapes (ratios of GPU times; (a) = xla, (c) = gemm).
MIN_SPEEDUP_EVERY = 0.98        # 1: (a)/auto on every configuration
MAX_GEMM_RATIO_MEAN = 1.00      # 2: auto/(c), geometric mean over the configurations ...
MAX_GEMM_RATIO_EVERY = 1.03     #    ... and on each
SMALL_MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b")
MIN_SMALL_SPEEDUP_MEAN = 1.35   # 3: geometric mean of (a)/auto over the small models' configs
LARGE_MODEL, LARGE_MIN_M = "qwen2.5-72b", 2048
MIN_GEMM_FRACTION = 0.90        # 4: auto's TFLOP/s over (c)'s, 72B at M >= 2048


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
    """(a)/name: how many times faster than the XLA reference."""
    return row["gpu_us"]["xla"] / row["gpu_us"][name]


def gemm_ratio(row) -> float:
    """auto/(c): the fused call's time over the bare GEMM's."""
    return row["gpu_us"]["auto"] / row["gpu_us"]["gemm"]


def fused_kernels(result) -> list[str]:
    """The forced fused kernels that were timed, in the order of the JSON."""
    names = []
    for row in result["rows"]:
        names += [k for k in row["gpu_us"] if k not in BASELINES and k not in names]
    return names


def is_calibration(result) -> bool:
    return result.get("kind") == "calibration" or "peak_tflops" not in result


def _notes(result) -> list[str]:
    notes = result.get("notes") or []
    return [notes] if isinstance(notes, str) else list(notes)


def _iterations(result):
    """Timed iterations per variant: recorded, else read from the recorded command line."""
    if "iterations" in result:
        return result["iterations"]
    found = re.search(r"--iterations[ =](\d+)", result["environment"].get("command", ""))
    return int(found.group(1)) if found else None


def _median_words(result) -> str:
    """'median of N' (with the interleaved rounds, where the run recorded them)."""
    iterations = _iterations(result)
    if not iterations:
        return "median"
    rounds = result.get("rounds")
    if not rounds:
        return f"median of {iterations}"
    per_round = -(-iterations // rounds)
    return f"median of {per_round * rounds} in {rounds} interleaved rounds"


def _command_line(env) -> str:
    commit = f" (commit {env['git']})" if env.get("git") else ""
    return f"Command: `{env['command']}`{commit}."


def _gpu_line(env) -> str:
    host = (f", one of {env['gpus_on_host']} GPUs on the host (the others idle)"
            if env.get("gpus_on_host", 1) > 1 else "")
    return (f"GPU: {env['device']} ({env.get('nvidia_smi')}{host}); jax {env['jax']}, "
            f"jaxlib {env['jaxlib']}; {env['date']}")


# --- targets -------------------------------------------------------------------------------

@dataclasses.dataclass
class Target:
    number: int
    text: str
    holds: bool | None  # None: no configuration of this run is concerned
    measured: str  # what this run shows
    misses: list[str]  # configurations that miss (for 3: those below the mean's bound)


def _fmt_misses(pairs, fmt="{:.3f}") -> list[str]:
    return [f"{label(row)} ({fmt.format(value)})" for row, value in pairs]


def check_targets(rows) -> list[Target]:
    """The four targets of issue 4, judged on the configurations of one run."""
    targets = []

    ratios = [(row, speedup(row)) for row in rows]
    low = min(ratios, key=lambda p: p[1]) if ratios else None
    targets.append(Target(
        1, f"(a)/auto >= {MIN_SPEEDUP_EVERY:.2f} on every configuration",
        all(r >= MIN_SPEEDUP_EVERY for _, r in ratios) if ratios else None,
        f"min {low[1]:.2f} ({label(low[0])})" if low else "-",
        _fmt_misses([(row, r) for row, r in ratios if r < MIN_SPEEDUP_EVERY])))

    ratios = [(row, gemm_ratio(row)) for row in rows]
    mean = geomean(r for _, r in ratios) if ratios else None
    high = max(ratios, key=lambda p: p[1]) if ratios else None
    misses = [(row, r) for row, r in ratios if r > MAX_GEMM_RATIO_EVERY]
    targets.append(Target(
        2, f"auto/(c) <= {MAX_GEMM_RATIO_MEAN:.2f} as geometric mean, "
           f"<= {MAX_GEMM_RATIO_EVERY:.2f} on each configuration",
        (mean <= MAX_GEMM_RATIO_MEAN and not misses) if ratios else None,
        f"geomean {mean:.3f}, max {high[1]:.2f} ({label(high[0])})" if ratios else "-",
        _fmt_misses(misses)))

    small = [(row, speedup(row)) for row in rows if row["model"] in SMALL_MODELS]
    absent = [m for m in SMALL_MODELS if not any(row["model"] == m for row, _ in small)]
    mean = geomean(r for _, r in small) if small else None
    per_model = [f"{m.split('-')[-1]} {geomean(r for row, r in small if row['model'] == m):.2f}x"
                 for m in SMALL_MODELS if m not in absent]
    measured = "-" if not small else (
        f"geomean {mean:.2f}x over {len(small)} configurations (" + ", ".join(per_model) + ")"
        + (f"; {', '.join(absent)} not in this run" if absent else ""))
    targets.append(Target(
        3, f"geometric mean of (a)/auto >= {MIN_SMALL_SPEEDUP_MEAN:.2f}x over the "
           + ", ".join(SMALL_MODELS) + " configurations",
        (mean >= MIN_SMALL_SPEEDUP_MEAN) if small else None, measured,
        _fmt_misses([(row, r) for row, r in small if r < MIN_SMALL_SPEEDUP_MEAN], "{:.3f}x")))

    large = [(row, row["gpu_us"]["gemm"] / row["gpu_us"]["auto"]) for row in rows
             if row["model"] == LARGE_MODEL and row["m"] >= LARGE_MIN_M]
    low = min(large, key=lambda p: p[1]) if large else None
    targets.append(Target(
        4, f"{LARGE_MODEL} at M >= {LARGE_MIN_M}: auto reaches >= {MIN_GEMM_FRACTION:.0%} of "
           "(c)'s TFLOP/s",
        all(f >= MIN_GEMM_FRACTION for _, f in large) if large else None,
        f"min {low[1]:.1%} ({label(low[0])})" if large else "-",
        _fmt_misses([(row, f) for row, f in large if f < MIN_GEMM_FRACTION], "{:.1%}")))
    return targets


def targets_markdown(targets, n_configs) -> str:
    verdict = {True: "yes", False: "**no**", None: "not measured"}
    lines = [f"Targets (issue 4), judged on the {n_configs} configurations of this run; for 3, "
             "the configurations listed are those below the bound on their own:",
             "",
             "| # | target | this run | holds | configurations that miss |",
             "|---|---|---|---|---|"]
    for t in targets:
        lines.append(f"| {t.number} | {t.text} | {t.measured} | {verdict[t.holds]} | "
                     f"{', '.join(t.misses) or '-'} |")
    return "\n".join(lines) + "\n"


# --- markdown ------------------------------------------------------------------------------

def benchmark_markdown(result) -> str:
    env = result["environment"]
    rows = result["rows"]
    fused = fused_kernels(result)
    median = _median_words(result)
    lines = _notes(result) + ([""] if _notes(result) else []) + [
        f"{_gpu_line(env)}; measured bf16 GEMM peak {result['peak_tflops']:.0f} TFLOP/s.",
        f"{_command_line(env)} GPU time (CUPTI), microseconds per call, {median}.",
    ]
    if result.get("complete") is False:
        lines.append(f"**Cut short**: {len(rows)} configurations recorded.")
    lines += [
        "",
        "| model | M | xla (a) | xla_stack (b) | gemm (c) | " + " | ".join(fused)
        + " | auto (e) | a/auto | auto/c | auto TFLOP/s | gemm TFLOP/s |",
        "|---|---|---|---|---|" + "---|" * len(fused) + "---|---|---|---|---|",
    ]
    for row in rows:
        t = row["gpu_us"]
        lines.append(
            f"| {row['model']} | {row['m']} | {t['xla']:.1f} | {t['xla_stack']:.1f} | "
            f"{t['gemm']:.1f} | " + " | ".join(f"{t[k]:.1f}" if k in t else "-" for k in fused)
            + f" | {t['auto']:.1f} | {speedup(row):.2f} | {gemm_ratio(row):.2f} | "
            f"{tflops(row, 'auto'):.0f} | {tflops(row, 'gemm'):.0f} |")
    return "\n".join(lines) + "\n\n" + targets_markdown(check_targets(rows), len(rows))


def _config_text(c) -> str:
    return (f"{c['schedule']} {c['tile_m']}x{c['tile_n']}x{c['tile_k']} "
            f"cluster {c['cluster_m']}x{c['cluster_n']}"
            + (" stream-K" if c.get("scheduler") == "stream-k" else "")
            # split tail, or an experiment's scheduler as its JSON names it
            + (f" {c['scheduler'].replace('-', ' ')}"
               if c.get("scheduler") not in (None, "persistent", "stream-k") else "")
            + (" direct store" if c.get("store") == "direct" else "")
            # experiments' rows
            + (f" silu-tail {c['silu_tail']}" if c.get("silu_tail") else "")
            + (f" staggered start {c['stagger']}" if c.get("stagger") else "")
            + (f" M in {c['m_bands']} bands" if c.get("m_bands", 1) > 1 else ""))


def _calibration_configs(result, kernels):
    """(kernel -> {id: description}, where it came from): the JSON's, else this checkout's."""
    if result.get("configs"):
        return {k: {int(i): _config_text(c) for i, c in v.items()}
                for k, v in result["configs"].items() if k in kernels}, "as run"
    try:  # older records: the table compiled in this checkout (ids may have moved since)
        import jax_swiglu
        table = {k: {i: _config_text(dataclasses.asdict(c)) for i, c in v.items()}
                 for k, v in jax_swiglu.kernel_configs().items() if k in kernels}
    except Exception:  # noqa: BLE001  (no jax here, or no extension: leave the line out)
        return {}, None
    return table, "this checkout's build; the JSON does not record them"


def calibration_markdown(result) -> str:
    env = result["environment"]
    columns = []
    for row in result["rows"]:
        columns += [k for k in row["gpu_us"] if k not in ("xla", "gemm") and k not in columns]
    gemm = any("gemm" in row["gpu_us"] for row in result["rows"])
    kernels = list(dict.fromkeys(c.split(":", 1)[0] for c in columns))
    configs, source = _calibration_configs(result, kernels)
    every = bool(configs) and all(
        f"{k}:{i}" in columns for k in kernels for i in configs.get(k, {})) and all(
        re.fullmatch(r"[^:]+:\d+", c) for c in columns)
    forced = (f"every {', '.join(kernels)} tile config forced" if every
              else "the tile configs in the columns forced (KERNEL:LAUNCH)")
    median = _median_words(result)
    lines = _notes(result) + ([""] if _notes(result) else []) + [
        f"Calibration run: {forced}, GPU time (CUPTI, {median}, rotated weights), "
        "microseconds per call.",
        f"{_gpu_line(env)}.",
        _command_line(env),
    ]
    if result.get("complete") is False:
        lines.append(f"**Cut short**: {len(result['rows'])} configurations recorded.")
    if configs:
        lines.append(f"Configs (ffi/kernel_configs.h, {source}): " + "; ".join(
            ", ".join(f"{i} = {text}" for i, text in sorted(table.items()))
            if len(configs) == 1 else f"{k}: " + ", ".join(
                f"{i} = {text}" for i, text in sorted(table.items()))
            for k, table in configs.items()) + ".")
    # With --gemm, the bare GEMM (c) too, and the best launch's time over it (target 2).
    lines += ["",
              "| model | M | xla | " + ("gemm (c) | " if gemm else "") + " | ".join(columns)
              + " | best | best vs xla |" + (" best/(c) |" if gemm else ""),
              "|---|---|---|" + "---|" * (len(columns) + 2 * gemm) + "---|---|"]
    for row in result["rows"]:
        t = row["gpu_us"]
        fused = {c: t[c] for c in columns if c in t}
        best = min(fused, key=fused.get)
        gemm_us = t.get("gemm")
        lines.append(f"| {row['model']} | {row['m']} | {t['xla']:.1f} | "
                     + ((f"{gemm_us:.1f} | " if gemm_us else "- | ") if gemm else "")
                     + " | ".join(f"{t[c]:.1f}" if c in t else "-" for c in columns)
                     + f" | {best} | {t['xla'] / t[best]:.2f}x |"
                     + ((f" {t[best] / gemm_us:.3f} |" if gemm_us else " - |") if gemm else ""))
    return "\n".join(lines) + "\n"


def markdown(result) -> str:
    return calibration_markdown(result) if is_calibration(result) else benchmark_markdown(result)


# --- plot ----------------------------------------------------------------------------------

def plot_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_benchmark(result, path) -> None:
    """Two panels per configuration: speedup over (a); TFLOP/s of auto and (c) against the peak."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    env = result["environment"]
    fused = fused_kernels(result)
    x = list(range(len(rows)))
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(max(8.0, 0.6 * len(rows) + 3), 8.5))

    def bars(ax, series):
        width = 0.8 / len(series)
        for j, (name, values, color) in enumerate(series):
            offset = (j - (len(series) - 1) / 2) * width
            drawn = ax.bar([i + offset for i in x], [v if v is not None else 0 for v in values],
                           width, label=name, color=color)
            if name.startswith("auto"):
                ax.bar_label(drawn, labels=[f"{v:.2f}" if v < 10 else f"{v:.0f}" for v in values],
                             fontsize=7, padding=1, rotation=90 if len(rows) > 12 else 0)

    palette = plt.get_cmap("tab10").colors
    speedups = [(f"{k} (forced)", [speedup(r, k) if k in r["gpu_us"] else None for r in rows],
                 palette[2 + j % 8]) for j, k in enumerate(fused)]
    speedups.append(("auto", [speedup(r) for r in rows], palette[0]))
    bars(ax1, speedups)
    ax1.axhline(1.0, color="black", linewidth=0.8, label="XLA reference (a)")
    ax1.axhline(MIN_SPEEDUP_EVERY, color="black", linewidth=0.8, linestyle=":",
                label=f"target 1: {MIN_SPEEDUP_EVERY}")
    ax1.set_ylabel("speedup over XLA (a)  [(a) time / time]")
    top = max(v for _, values, _ in speedups for v in values if v is not None)
    ax1.set_ylim(0, max(1.2, top) * 1.25)
    ax1.legend(fontsize=8, loc="upper right", ncol=2)

    bars(ax2, [("auto", [tflops(r, "auto") for r in rows], palette[0]),
               ("gemm (c): bare [M,K]x[K,2N]", [tflops(r, "gemm") for r in rows], palette[7])])
    peak = result["peak_tflops"]
    ax2.axhline(peak, color="tab:red", linewidth=1, linestyle="--",
                label=f"measured bf16 GEMM peak, 8192^3 ({peak:.0f} TFLOP/s)")
    ax2.set_ylabel("TFLOP/s  (2·M·K·2N flops / GPU time)")
    ax2.set_ylim(0, peak * 1.3)
    ax2.legend(fontsize=8, loc="upper left", ncol=3)

    for ax in (ax1, ax2):  # a faint line between models
        for i in range(1, len(rows)):
            if rows[i]["model"] != rows[i - 1]["model"]:
                ax.axvline(i - 0.5, color="0.85", linewidth=0.8, zorder=0)
        ax.grid(axis="y", color="0.92")
        ax.set_axisbelow(True)
    ax2.set_xticks(x, [f"{r['model'].removeprefix('qwen2.5-')}\nM={r['m']}" for r in rows],
                   fontsize=8)
    ax2.set_xlabel("Qwen2.5 MLP shape, tokens M")
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
        else:  # a GPU machine without matplotlib still gets its tables
            print("no plot: matplotlib is not installed (pip install 'jax_swiglu[bench]')",
                  file=sys.stderr)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="JSON files from bench_swiglu.py/calibrate.py")
    parser.add_argument("--out-dir", default=None, help="default: next to each JSON")
    parser.add_argument("--force", action="store_true",
                        help="overwrite markdown files that report.py did not write")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    for path in args.results:
        with open(path) as f:
            result = json.load(f)
        stem = os.path.splitext(path)[0]
        if args.out_dir:
            os.makedirs(args.out_dir, exist_ok=True)
            stem = os.path.join(args.out_dir, os.path.basename(stem))
        for written in write_report(result, stem, source=path, force=args.force,
                                    plot=not args.no_plot):
            print(f"wrote {written}")


if __name__ == "__main__":
    main()
