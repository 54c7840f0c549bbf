"""Summarize a tile-timeline trace (trace.cu) per row and variant, in SM clock cycles.

Per CTA the math warpgroups' tiles are taken in the order their mainloops started. With
E0..E5 the slots of traced_kernel.cuh (mma entry, mma exit, mma_tail exit, store entry,
store exit, store_tail exit):
- GHz: the longest CTA's span (its producer's first load entry to its last store_tail exit,
  in cycles) over the timed microseconds per launch: the SM clock the launches ran at,
  roughly (the span leaves out the launch and the CTA's set-up);
- period: E0 of the next tile (the other warpgroup) - E0 of this one. In the pingpong
  schedule the mainloops run one after another, so the periods add up to the kernel's time
  and period - ideal is the per-tile cost (ideal = 2 tile_m tile_n K / 4096, the SM's dense
  bf16 flops per clock);
- issue: E1 - E0, the warpgroup's k-loop until its last wgmma is issued (with every wait
  for TMA data); hand-off: E0 of the next tile - E1, the other warpgroup's start;
- drain: E2 - E1, the last wgmmas finishing; epilogue wait: E3 - E2; store: E4 - E3;
  store tail: E5 - E4;
- with the probe's own k-loop (variants stepped1/2): data wait and wgmma wait, the cycles
  the sampled tiles' k-loops spent in each; per tile, from mma entry to k-tile 0's data
  wait ending, its issue, and the tensor cores' idle time before it (its completion less
  one ideal k-tile, after the other warpgroup's previous tile completed: E2); and from the steps file, for each warpgroup's sampled
  tile, the spacing of its k-tiles' wgmma completions (the k-loop's pace; the ideal is
  2 tile_m tile_n tile_k / 4096).
Columns are medians over all tiles but each warpgroup's first (start-up), with the
period's spread (p10-p90).

    python benchmarks/research/gemm_probe/trace_report.py trace.csv[.gz] [trace-steps.csv[.gz]] [--json F]
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

CONFIGS_HEADER = Path(__file__).resolve().parents[2] / "ffi" / "kernel_configs.h"
FLOPS_PER_CLOCK = 4096  # an SM's dense bf16 tensor-core flops per clock (H100/H200)


def interleaved_tiles():
    """Config id -> (schedule, tile_m, tile_n, store) from ffi/kernel_configs.h's interleaved
    table."""
    text = CONFIGS_HEADER.read_text()
    table = text[text.index("#define JAX_SWIGLU_INTERLEAVED_CONFIGS"):]
    tiles = {}
    for match in re.finditer(r"X\((\d+), (\w+), (\d+), (\d+), \d+, \d+, \d+, \w+, (\w+), \d+\)",
                             table):
        config = int(match.group(1))
        if config in tiles:  # the next table (Kernel-1's) starts again from 0
            break
        tiles[config] = (match.group(2), int(match.group(3)), int(match.group(4)), match.group(5))
    return tiles


def read(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return list(csv.DictReader(f))


def pct(values, q):
    return float(np.percentile(values, q)) if len(values) else float("nan")


def summarize(rows, tiles, records=None):
    """The markdown table; with `records` (a list), also each line's numbers as a dict."""
    groups = defaultdict(list)
    for r in rows:
        groups[(int(r["config"]), r["variant"], r["model"], int(r["m"]))].append(r)
    lines = [
        "| row | config | epilogue | us (cuBLAS) | GHz | tiles/CTA max | ideal | period | period p10-p90 "
        "| issue | hand-off | drain | epi wait | store | store tail | "
        "producer per tile | data wait | wgmma wait | entry to k-tile 0 wait | entry to k-tile 0 data "
        "| k-tile 0 issue "
        "| tensor idle before k-tile 0 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (config, variant, model, m), group in sorted(groups.items(), key=lambda g: (g[0][2], g[0][3], g[0][0], g[0][1])):
        schedule, tile_m, tile_n, built_store = tiles[config]
        other = {"TmaStore": "DirectStore", "DirectStore": "TmaStore"}[built_store]
        epilogue = {"as-built": built_store, "other-store": other, "skip": "sum only",
                    "stepped1": f"{built_store}, k-loop 1 in flight",
                    "stepped2": f"{built_store}, k-loop 2 in flight",
                    "early2": f"{built_store}, k-loop exits with 2 in flight",
                    "early3": f"{built_store}, k-loop exits with 3 in flight",
                    "spin1": f"{built_store}, k-loop 1 in flight, polling"}[variant]
        k = int(group[0]["k"])
        ideal = 2 * tile_m * tile_n * k / FLOPS_PER_CLOCK
        per_cta = defaultdict(lambda: defaultdict(list))
        for r in group:
            per_cta[int(r["cta"])][int(r["role"])].append(r)
        period, issue, handoff, drain, epi_wait, store, tail = ([] for _ in range(7))
        data_wait, mma_wait, to_data0, to_issued0, idle0, to_wait0 = [], [], [], [], [], []
        k_tile_ideal = 2 * tile_m * tile_n * 64 / FLOPS_PER_CLOCK
        producer, spans = [], []
        most_tiles = 0
        for roles in per_cta.values():
            math = []
            for role in (0, 1):
                ordered = sorted(roles.get(role, []), key=lambda r: int(r["tile"]))
                # interior tiles: not the first of a warpgroup (start-up)
                for i, r in enumerate(ordered):
                    s = [int(r.get(f"s{j}") or 0) for j in range(13)]
                    math.append((s[0], s[1], s[2], s[3], s[4], s[5], s[6],
                                 i > 0, s[8], s[9], s[10], s[11], s[12]))
            math.sort()
            most_tiles = max(most_tiles, len(math))
            for i, (e0, e1, e2, e3, e4, e5, data0, interior, waited_data, waited_mma, issued0,
                    done0, wait0) in enumerate(math):
                if not interior:
                    continue
                if i + 1 < len(math):
                    period.append(math[i + 1][0] - e0)
                    handoff.append(math[i + 1][0] - e1)
                issue.append(e1 - e0)
                drain.append(e2 - e1)
                epi_wait.append(e3 - e2)
                store.append(e4 - e3)
                tail.append(e5 - e4)
                if variant != "as-built" and waited_data:
                    data_wait.append(waited_data)
                    mma_wait.append(waited_mma)
                if variant != "as-built" and done0:
                    to_data0.append(data0 - e0)
                    to_wait0.append(wait0 - e0)
                    to_issued0.append(issued0 - data0)
                    # idle tensor cycles before this tile's first k-tile: its completion, less
                    # one k-tile, after the previous tile's (other warpgroup's) completion
                    if i > 0:
                        idle0.append(done0 - k_tile_ideal - math[i - 1][2])
            loads = sorted(roles.get(2, []), key=lambda r: int(r["tile"]))
            if loads and math:
                spans.append(max(e[5] for e in math) - int(loads[0]["s0"]))
            producer += [int(b["s0"]) - int(a["s0"]) for a, b in zip(loads[1:-1], loads[2:])]
        us, cublas_us = float(group[0]["us"]), float(group[0]["cublas_us"])
        record = {
            "model": model, "m": m, "config": config, "variant": variant,
            "tile": f"{schedule} {tile_m}x{tile_n}", "epilogue": epilogue, "us": us,
            "cublas_us": cublas_us, "ghz": max(spans) / us / 1e3 if spans else float("nan"),
            "tiles_per_cta_max": most_tiles, "ideal": ideal, "period": pct(period, 50),
            "period_p10": pct(period, 10), "period_p90": pct(period, 90),
            "issue": pct(issue, 50), "hand_off": pct(handoff, 50), "drain": pct(drain, 50),
            "epilogue_wait": pct(epi_wait, 50), "store": pct(store, 50),
            "store_tail": pct(tail, 50), "producer_per_tile": pct(producer, 50),
            "data_wait": pct(data_wait, 50), "wgmma_wait": pct(mma_wait, 50),
            "entry_to_first_wait": pct(to_wait0, 50), "entry_to_first_data": pct(to_data0, 50),
            "first_issue": pct(to_issued0, 50), "idle_before_first": pct(idle0, 50)}
        if records is not None:
            records.append(record)
        r = record
        lines.append(
            f"| {model} M={m} | {config} ({r['tile']}) | {epilogue} | {us:.1f} ({cublas_us:.1f}) | "
            f"{r['ghz']:.2f} | {most_tiles} | {ideal:,.0f} | {r['period']:,.0f} | "
            f"{r['period_p10']:,.0f}-{r['period_p90']:,.0f} | " + " | ".join(
                f"{r[key]:,.0f}" for key in (
                    "issue", "hand_off", "drain", "epilogue_wait", "store", "store_tail",
                    "producer_per_tile", "data_wait", "wgmma_wait", "entry_to_first_wait",
                    "entry_to_first_data", "first_issue", "idle_before_first")) + " |")
    return "\n".join(lines)


def summarize_steps(rows, tiles):
    """Per row and k-loop variant: the median spacing of consecutive k-tiles' wgmma
    completions in the sampled tiles, by k-tile, and the median data wait per k-tile."""
    groups = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[(int(r["config"]), r["variant"], r["model"], int(r["m"]))][
            (int(r["cta"]), int(r["role"]))].append(r)
    lines = ["| row | config | k-loop | ideal per k-tile | completion spacing by k-tile (median) "
             "| spacing from k-tile 3 on (median, p90) |", "|---|---|---|---|---|---|"]
    for (config, variant, model, m), tiles_of in sorted(groups.items(), key=lambda g: (g[0][2], g[0][3], g[0][0], g[0][1])):
        _, tile_m, tile_n, _ = tiles[config]
        ideal = 2 * tile_m * tile_n * 64 / FLOPS_PER_CLOCK
        by_k = defaultdict(list)
        for steps in tiles_of.values():
            done = [int(r["mma_done"]) for r in sorted(steps, key=lambda r: int(r["k_tile"]))]
            for k in range(1, len(done)):
                by_k[k].append(done[k] - done[k - 1])
        first = ", ".join(f"{pct(by_k[k], 50):,.0f}" for k in sorted(by_k)[:6])
        later = [v for k, values in by_k.items() if k >= 3 for v in values]
        lines.append(f"| {model} M={m} | {config} | {variant} | {ideal:,.0f} | {first}, ... | "
                     f"{pct(later, 50):,.0f}, {pct(later, 90):,.0f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", help="trace.csv[.gz] from trace.cu")
    parser.add_argument("steps", nargs="?", help="trace-steps.csv[.gz] from trace.cu")
    parser.add_argument("--json", help="also write the table's numbers here")
    args = parser.parse_args(argv)
    tiles = interleaved_tiles()
    records = []
    print(summarize(read(args.trace), tiles, records))
    steps = read(args.steps) if args.steps else []
    if steps:
        print()
        print(summarize_steps(steps, tiles))
    if args.json:
        clean = [{k: None if isinstance(v, float) and np.isnan(v) else v for k, v in r.items()}
                 for r in records]  # no NaN in JSON: null where a column does not apply
        Path(args.json).write_text(json.dumps({"rows": clean}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
