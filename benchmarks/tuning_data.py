"""Turn calibration runs into the shipped tuning data, and report how well it generalizes.

    python -m benchmarks.tuning_data calibration.json [more.json ...]
    python -m benchmarks.tuning_data held-out.json --report-only --report fit-report.md
    python -m benchmarks.tuning_data --cross-validate --data jax_swiglu/data/NVIDIA_H200.json
    python -m benchmarks.tuning_data --cross-validate m --data <file> --report cv-m-report.md

Merges each calibration (benchmarks/calibrate.py) into jax_swiglu/data/<device kind>.json:
the file is the union of the runs, each entry (one dtype, M, N, K) from the newest run that
measured it, pointing at that run's provenance (date, commit, GPU, driver, CUDA, jax,
CUTLASS, command). Rows of the held-out shapes and M (benchmarks/shapes.py) never enter
it: the report instead asks the selection's learned rule what it would pick there, from the
data alone, and compares that launch's measured time with the fastest measured.

``--cross-validate`` asks the same of the data's own shapes, one at a time: each measured
(N, K) is left out, and the rule learned from the others picks a launch at each of its
measured M (leave one shape out). It judges changes to the cost model and the learned rule on
every shape the data holds, not only the held-out ones. ``--cross-validate m`` leaves each
measured M out instead: the rule between measured M, where the held-out M fall.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys

from jax_swiglu.selection import _data, _device, _engine, _heuristic, _model

from . import shapes as shapes_lib


def _provenance(calibration: dict) -> dict:
    env = calibration["environment"]
    return {"date": env.get("date"), "commit": env.get("git"), "gpu": env.get("device"),
            "driver": env.get("driver"), "cuda": env.get("nvcc"), "jax": env.get("jax"),
            "jaxlib": env.get("jaxlib"), "cutlass": env.get("cutlass"),
            "jax_swiglu": env.get("jax_swiglu"), "command": env.get("command"),
            "method": calibration.get("method")}


def _provenance_with_cutlass(run: dict) -> dict:
    provenance = _provenance(run)
    if not provenance["cutlass"]:
        # A run on a carried prebuilt extension finds no nvidia-cutlass installed; its kernels
        # were built against the build requirement's pinned headers.
        provenance["cutlass"] = f"{_pinned_cutlass()} (the build requirement; not recorded)"
    return provenance


def _calibration_id(calibration: dict, existing: dict) -> str:
    env = calibration["environment"]
    base = f"{(env.get('date') or 'undated')[:10]}-{env.get('git') or 'nogit'}"
    name, n = base, 1
    while name in existing and existing[name] != _provenance_with_cutlass(calibration):
        n += 1
        name = f"{base}-{n}"
    return name


# Wave-1 calibrations (benchmarks/results history): every launch timed through JAX by CUPTI in
# interleaved rounds, on the Qwen2.5 shapes. Only what the current kernels still run the same
# way is imported: launches of configs whose definition is a current row's, plain launches
# (no forced tile order), not the stream-K config (its decomposition changed since), and, on
# trees before the edge-tile loads (812e0a3), only M that fill whole 256-row tiles.
LEGACY_METHOD = "CUPTI through JAX, interleaved rounds (wave-1 calibrate.py)"
_LEGACY_EDGE_TILE_COMMITS = ("034c9c4", "2808682")  # trees that had the edge-tile loads
_LEGACY_CONFIG_FIELDS = {"kernel", "id", "schedule", "tile_m", "tile_n", "tile_k", "cluster_m",
                         "cluster_n", "scheduler", "store", "m_bands", "m_side", "optional"}


def legacy_calibration(old: dict, current_configs: dict, device_facts: dict) -> dict:
    """A wave-1 calibration JSON as a calibration of today's format (see LEGACY_METHOD)."""
    from jax_swiglu import _native

    env = dict(old["environment"])
    commit = (env.get("git") or "").rstrip("+")
    edge_tiles = commit in _LEGACY_EDGE_TILE_COMMITS
    keys = {}
    for kernel, table in old.get("configs", {}).items():
        for config_id, fields in table.items():
            if set(fields) - _LEGACY_CONFIG_FIELDS:
                continue  # an experiment's config (a field the product has no longer)
            key = _native.config_key(kernel, "16bit", fields["schedule"],
                                     fields.get("m_side", "tokens"),
                                     fields["tile_m"], fields["tile_n"], fields["tile_k"],
                                     fields["cluster_m"], fields["cluster_n"],
                                     fields.get("scheduler", "persistent"),
                                     fields.get("store", "tma"), fields.get("m_bands", 1))
            if key in current_configs and fields.get("scheduler") != "stream-k":
                keys[f"{kernel}:{config_id}"] = key
    rows = []
    for row in old["rows"]:
        if not edge_tiles and row["m"] % 256:
            continue
        launch_us = {keys[name]: us for name, us in row["gpu_us"].items() if name in keys}
        if launch_us:
            rows.append({"model": row["model"], "dtype": "bfloat16", "m": row["m"],
                         "n": row["n"], "k": row["k"], "launch_us": launch_us, "errors": {}})
    smi = env.get("nvidia_smi") or ""
    env.update(device_facts=device_facts, cutlass=env.get("cutlass") or "4.2.0.0 (pinned)",
               driver=env.get("driver") or (smi.split(",")[1].strip() if "," in smi else None))
    return {"kind": "calibration", "method": LEGACY_METHOD, "environment": env,
            "held_out_shapes": [], "held_out_m": [],
            "configs": {key: current_configs[key] for key in set(keys.values())}, "rows": rows}


def held_out(row: dict, calibration: dict) -> bool:
    return (row["model"] in calibration.get("held_out_shapes", ())
            or row["m"] in calibration.get("held_out_m", ()))


def empty_document(device: dict) -> dict:
    """A data file for a device nobody measured yet: its model constants are another shipped
    SM90 part's until --fit-model fits its own."""
    source = _data.any_sm90()
    if source is None:
        raise ValueError("no shipped tuning data to take the model constants from")
    with open(source.source) as f:
        model = json.load(f)["model"]
    model = dict(model, provenance=f"copied from {source.device['kind']}'s data "
                                   f"({os.path.basename(source.source)})")
    return {"format": _data.FORMAT, "device": device, "model": model, "calibrations": {},
            "configs": {}, "entries": []}


def anchor_scale(row: dict, previous: dict | None) -> float:
    """What a --configs run's times are multiplied by to join an entry timed on another day:
    the geometric mean of the entry's times of the row's anchors (launches the run timed
    again beside its own rows, ``anchor_us``) over the run's times of them. Runs on different
    days (another machine, its clocks) differ by a few percent as a whole; the learned rule
    compares launches within an entry, so a new row joins at the entry's day. 1 without
    anchors the entry also holds."""
    if previous is None:
        return 1.0
    ratios = [previous["launch_us"][launch] / us
              for launch, us in (row.get("anchor_us") or {}).items()
              if us > 0 and previous["launch_us"].get(launch)]
    if not ratios:
        return 1.0
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def merge(document: dict, calibration: dict, *, include_held_out: bool = False) -> int:
    """Adds a calibration's rows to ``document`` (in place); returns the entries written."""
    facts = calibration["environment"]["device_facts"]
    device = {"kind": facts["kind"], "compute_capability": facts["compute_capability"],
              "sm_count": facts["sm_count"], "dram_bytes_per_s": facts["dram_bytes_per_s"]}
    known = document["device"]
    if (known["kind"], known["sm_count"], known["compute_capability"]) != (
            device["kind"], device["sm_count"], device["compute_capability"]):
        raise ValueError(f"calibration on {device} cannot join tuning data of {known}")
    if facts.get("cluster_slots"):  # measured on the part: the cost model's rounds use it
        known["cluster_slots"] = facts["cluster_slots"]
    name = _calibration_id(calibration, document["calibrations"])
    document["calibrations"][name] = _provenance_with_cutlass(calibration)
    document["configs"].update(calibration["configs"])
    entries = {(e["dtype"], e["m"], e["n"], e["k"]): e for e in document["entries"]}
    written = 0
    scales = []
    unjoined = set()
    for row in calibration["rows"]:
        if not row["launch_us"] or (held_out(row, calibration) and not include_held_out):
            continue
        key = (row["dtype"], row["m"], row["n"], row["k"])
        previous = entries.get(key)
        partial_run = bool(calibration.get("only_configs"))
        if partial_run and previous is None:
            unjoined.add(row["m"])
            continue  # some rows' launches alone do not say which launch is fastest there
        scale = anchor_scale(row, previous) if partial_run else 1.0
        if scale != 1.0:
            scales.append(scale)
        launch_us = {k: round(v * scale, 3) for k, v in sorted(row["launch_us"].items())}
        entry = {"dtype": row["dtype"], "m": row["m"], "n": row["n"], "k": row["k"],
                 "launch_us": launch_us, "calibration": name}
        legacy = (calibration.get("method") == LEGACY_METHOD and previous is not None
                  and document["calibrations"][previous["calibration"]]["method"]
                  == LEGACY_METHOD)
        if legacy or partial_run:
            # Wave-1 runs each timed a few launches, and a --configs run times some rows':
            # their union, each launch from the newest run that timed it, each with its run.
            sources = previous.get("launch_calibration") or {
                launch: previous["calibration"] for launch in previous["launch_us"]}
            entry["launch_us"] = {**previous["launch_us"], **launch_us}
            entry["launch_calibration"] = {**sources, **{launch: name for launch in launch_us}}
            if partial_run:
                entry["calibration"] = previous["calibration"]
                for field in ("xla_us", "cupti_us"):
                    if field in previous:
                        entry[field] = previous[field]
        if row.get("xla_us"):
            entry["xla_us"] = round(row["xla_us"], 3)
            entry["cupti_us"] = {k: round(v, 3) for k, v in row.get("cupti_us", {}).items()}
        elif previous is not None and previous.get("xla_us") and not partial_run:
            # A run that timed no XLA here keeps the earlier run's XLA time (and its launches
            # through JAX, the pair the XLA ratio compares), naming that run.
            entry["xla_us"] = previous["xla_us"]
            entry["cupti_us"] = previous.get("cupti_us") or {}
            entry["xla_calibration"] = previous.get("xla_calibration") or previous["calibration"]
        entries[key] = entry
        written += 1
    document["entries"] = [entries[key] for key in sorted(entries)]
    if unjoined:
        print(f"{name}: rows at M = {', '.join(map(str, sorted(unjoined)))} left out: a "
              "--configs run joins existing entries, and there were none")
    if scales:
        print(f"{name}: {len(scales)} rows joined their entries' days through anchors, "
              f"times x{min(scales):.3f}-{max(scales):.3f} (geomean "
              f"{math.exp(sum(map(math.log, scales)) / len(scales)):.3f})")
    return written


def evaluate(data: _data.TuningData, rows) -> list[dict]:
    """For each measured row: the launch the learned rule picks from ``data`` (rows absent
    from it), that launch's measured time over the fastest measured, and over XLA's."""
    device = _device.device_from_dict(data.device, local=False)
    configs = {key: data.config(key) for key in data.configs}

    def measured_splits(config, k):
        # The data's configs need not be this build's rows: their splits are those measured.
        return tuple(sorted(data.measured_splits(config.key))) or (1,)

    results = []
    for row in rows:
        if not row["launch_us"]:
            continue
        m, n, k, dtype = row["m"], row["n"], row["k"], row["dtype"]
        candidates = [c for c in configs.values() if c is not None and c.runs(m)]
        model = _model.Problem(m, n, k, 1 if dtype.startswith("float8") else 2)
        predicted = _engine.predict(data, device, candidates, dtype, model, measured_splits)
        learned = bool(predicted)
        if not learned:
            predicted = _heuristic.model_alone(candidates, model, device, data.constants,
                                               measured_splits)
        measured = {_data.parse_launch_id(launch): us for launch, us in row["launch_us"].items()}
        timed = {key: us for key, us in predicted.items() if key in measured}
        if not timed:
            continue
        chosen = min(timed, key=timed.get)
        best = min(measured, key=measured.get)
        result = {"model": row["model"], "m": m, "n": n, "k": k,
                  "chosen": _data.launch_id(*chosen), "chosen_us": measured[chosen],
                  "best": _data.launch_id(*best), "best_us": measured[best],
                  "ratio": measured[chosen] / measured[best], "learned": learned}
        if row.get("xla_us"):
            result["xla_us"] = row["xla_us"]
            result["vs_xla"] = row["xla_us"] / row.get("cupti_us", {}).get(
                _data.launch_id(*chosen), measured[chosen])
            # The engine's other choice (selection/_engine.py): XLA's path where the data's
            # XLA ratio near the row says it is faster than the fastest fused launch.
            xla_ratio = data.xla_ratio(dtype, m, n, k)
            result["takes_xla"] = xla_ratio is not None and xla_ratio < 1.0
        results.append(result)
    return results


def cross_validate(document: dict, leave_out: str = "shape") -> list[dict]:
    """Leave one shape out (see the module docstring): ``evaluate`` on every entry of each
    measured (N, K), from the data without that shape. ``leave_out="m"``: the same with each
    measured M left out in turn (M between measured ones, as the held-out M are)."""
    names = {shape: name for name, shape in shapes_lib.PUBLIC_MLPS.items()}
    group = ((lambda e: (e["k"], e["n"])) if leave_out == "shape" else (lambda e: e["m"]))
    results = []
    for left_out in sorted({group(e) for e in document["entries"]}):
        rest = dict(document,
                    entries=[e for e in document["entries"] if group(e) != left_out])
        rows = [dict(e, model=names.get((e["k"], e["n"]), f"{e['k']}x{e['n']}"))
                for e in document["entries"] if group(e) == left_out]
        results += evaluate(_data.TuningData(rest), rows)
    return results


# Multiplicative steps tried on each cost constant, in the order tried.
_FIT_STEPS = (0.8, 1.25, 0.9, 1.1)


def _geomean(results) -> float:
    return math.exp(sum(math.log(r["ratio"]) for r in results) / len(results))


def fit_model(document: dict, rounds: int = 2, log=print) -> dict:
    """Refits the cost model's constants (``model.cost``) to the data: coordinate descent on
    the leave-one-shape-out geomean of chosen/fastest, one constant at a time, each stepped
    by the factors of _FIT_STEPS while a step improves it. Returns the new document (the
    constants, and a provenance that says what they reached)."""
    best = dict(document["model"]["cost"])
    score = _geomean(cross_validate(document))
    start = score
    for _ in range(rounds):
        improved = False
        for name in sorted(best):
            for step in _FIT_STEPS:
                trial = dict(best, **{name: best[name] * step})
                candidate = dict(document, model=dict(document["model"], cost=trial))
                value = _geomean(cross_validate(candidate))
                if value < score - 1e-5:
                    best, score, improved = trial, value, True
                    log(f"{name} x{step}: leave-one-shape-out geomean {value:.4f}")
                    break
        if not improved:
            break
    model = dict(document["model"], cost=best,
                 provenance=f"fitted by python -m benchmarks.tuning_data --fit-model: "
                            f"leave-one-shape-out geomean {start:.4f} -> {score:.4f} over "
                            f"{len(document['entries'])} entries")
    return dict(document, model=model)


def _cell(launch: str) -> str:
    """A launch id in a markdown table cell (its split's "|" escaped)."""
    return launch.replace("|", "\\|")


def _summary(results) -> str:
    ratios = [r["ratio"] for r in results]
    geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    within = sum(x <= 1.02 for x in ratios)
    return (f"{len(results)} rows; chosen/best geomean {geomean:.4f}, max {max(ratios):.3f}; "
            f"{within} within 2 %.")


def _xla_summary(results) -> str | None:
    """How the XLA ratio's choice fared on the rows that timed XLA: taken where the fused pick
    was faster, or left where XLA was."""
    timed = [r for r in results if "vs_xla" in r]
    if not timed:
        return None
    taken = [r["vs_xla"] for r in timed if r["takes_xla"]]
    slower = [x for x in taken if x > 1.0]
    missed = [x for x in (r["vs_xla"] for r in timed if not r["takes_xla"]) if x < 1.0]
    return (f"XLA's path on the {len(timed)} rows that timed it: taken on {len(taken)}, "
            f"{len(slower)} of them slower than the fused pick"
            + (f" (up to {max(slower):.3f}x)" if slower else "")
            + f"; left on {len(missed)} where it was faster"
            + (f" (the fused pick up to {1 / min(missed):.3f}x its time)" if missed else "")
            + ".")


def cross_validation_markdown(results, data_path: str, leave_out: str = "shape") -> str:
    """The summary, by M, and every row more than 2 % from the fastest."""
    if not results:
        return "No entries to cross-validate.\n"
    what = ("each shape's entries judged by the learned rule of the other shapes' data"
            if leave_out == "shape" else
            "each M's entries judged by the learned rule of the other M's data")
    lines = [f"Leave one {leave_out} out over {data_path}: {what}, against the fastest "
             f"measured launch.", "",
             f"- {_summary(results)}",
             *([f"- {xla}"] if (xla := _xla_summary(results)) else []),
             "", "| M | rows | geomean | max | within 2 % |",
             "|---|---|---|---|---|"]
    for m in sorted({r["m"] for r in results}):
        ratios = [r["ratio"] for r in results if r["m"] == m]
        lines.append(f"| {m} | {len(ratios)} | "
                     f"{math.exp(sum(math.log(x) for x in ratios) / len(ratios)):.4f} | "
                     f"{max(ratios):.3f} | {sum(x <= 1.02 for x in ratios)} |")
    lines += ["", "Rows more than 2 % from the fastest:", "",
              "| model | M | chosen | us | fastest | us | chosen/fastest |",
              "|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r["model"], r["m"])):
        if r["ratio"] > 1.02:
            lines.append(f"| {r['model']} | {r['m']} | {_cell(r['chosen'])} | "
                         f"{r['chosen_us']:.1f} | {_cell(r['best'])} | {r['best_us']:.1f} | "
                         f"{r['ratio']:.3f} |")
    return "\n".join(lines) + "\n"


def report_markdown(results, data_path: str, sources) -> str:
    if not results:
        return "No held-out rows to evaluate.\n"
    lines = [
        f"Held-out rows (shapes and M never fitted), the learned rule of {data_path} against "
        f"the fastest measured launch, from {', '.join(sources)}:",
        "",
        f"- {_summary(results)}",
        *([f"- {xla}"] if (xla := _xla_summary(results)) else []),
        "",
        "| model | M | chosen | us | fastest | us | chosen/fastest | XLA/chosen |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: (r["model"], r["m"])):
        vs = (f"{r['vs_xla']:.2f}" + (" (XLA taken)" if r["takes_xla"] else "")
              if "vs_xla" in r else "-")
        lines.append(f"| {r['model']} | {r['m']} | {_cell(r['chosen'])} | {r['chosen_us']:.1f} | "
                     f"{_cell(r['best'])} | {r['best_us']:.1f} | {r['ratio']:.3f} | {vs} |")
    return "\n".join(lines) + "\n"


def _pinned_cutlass() -> str:
    """The nvidia-cutlass version pyproject.toml's build requires."""
    import tomllib

    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "pyproject.toml"), "rb") as f:
        requires = tomllib.load(f)["build-system"]["requires"]
    return next(r.split("==", 1)[1] for r in requires if r.startswith("nvidia-cutlass=="))


GROUPED_METHOD = "CUPTI through JAX, interleaved rounds (benchmarks/bench_moe.py --launches)"


def _grouped_launch_keys(run: dict) -> tuple[dict, dict]:
    """A bench_moe run's forced launches: ``grouped:<id>`` -> config key, and key -> the
    config's fields. Runs that did not record them (before the run's ``configs``) are read with
    this build's table: the row ids of the tree that measured them."""
    from jax_swiglu import _native

    recorded = run.get("configs") or {}
    if recorded:
        names = {name: fields["key"] for name, fields in recorded.items()}
        fields = {fields["key"]: {k: v for k, v in fields.items() if k != "key"}
                  for fields in recorded.values()}
        return names, fields
    table = _native.kernel_configs()
    names, fields = {}, {}
    for row in run["rows"]:
        for name in row["gpu_us"]:
            if name.startswith("grouped:") and int(name.split(":")[1]) in table:
                config = table[int(name.split(":")[1])]
                names[name] = config.key
                fields[config.key] = dataclasses.asdict(config)
    return names, fields


def merge_grouped(document: dict, run: dict, *, include_held_out: bool = False) -> int:
    """Adds a bench_moe run's forced grouped launches (``--launches``) to ``document``'s
    ``grouped_entries`` (in place), one entry per (dtype, rows, F, K, experts, routing), the
    newest run's; the held-out MoE shapes stay out. Returns the entries written."""
    env = run["environment"]
    if env.get("device") != document["device"]["kind"]:
        raise ValueError(f"a run on {env.get('device')} cannot join tuning data of "
                         f"{document['device']['kind']}")
    names, fields = _grouped_launch_keys(run)
    method = GROUPED_METHOD + ("" if run.get("configs")
                               else "; row ids read with the merging tree's table")
    run = dict(run, method=run.get("method") or method)
    name = _calibration_id(run, document["calibrations"])
    provenance = _provenance_with_cutlass(run)
    held = set(run.get("held_out_models", shapes_lib.MOE_HELD_OUT))
    entries = {(e["dtype"], e["m"], e["n"], e["k"], e["experts"], e["routing"]): e
               for e in document.get("grouped_entries", [])}
    written = 0
    for row in run["rows"]:
        launch_us = {names[n]: round(us, 3) for n, us in sorted(row["gpu_us"].items())
                     if n in names}
        if not launch_us or (row["model"] in held and not include_held_out):
            continue
        entry = {"dtype": "bfloat16", "m": row["rows"], "n": row["f"], "k": row["k"],
                 "experts": row["experts"], "routing": row["routing"], "launch_us": launch_us,
                 "calibration": name}
        entries[tuple(entry[f] for f in ("dtype", "m", "n", "k", "experts", "routing"))] = entry
        written += 1
    if written:
        document["calibrations"][name] = provenance
        document["configs"].update({key: fields[key] for key in names.values()})
        document["grouped_entries"] = [entries[key] for key in sorted(entries)]
    return written


def grouped_report(data: _data.TuningData, runs) -> str:
    """What the grouped choice picks on the runs' held-out models, from the data alone: per
    (model, tokens), the pick's measured time over the fastest forced row's, under each
    routing (markdown)."""
    from jax_swiglu import selection

    lines = ["## Grouped choice on held-out MoE shapes", "",
             "| model | tokens | pick | balanced: pick / best | skewed: pick / best |",
             "|---|---|---|---|---|"]
    worst = []
    for run in runs:
        names, _ = _grouped_launch_keys(run)
        held = set(run.get("held_out_models", shapes_lib.MOE_HELD_OUT))
        by_call: dict = {}
        for row in run["rows"]:
            if row["model"] in held:
                by_call.setdefault((row["model"], row["tokens"]), {})[row["routing"]] = row
        for (model, tokens), routed in sorted(by_call.items()):
            row = next(iter(routed.values()))
            problem = selection.GroupedProblem(row["rows"], row["f"], row["k"], row["experts"],
                                               "bfloat16")
            choice = selection.choose_grouped(problem, platform="cuda", data=data)
            pick_key = choice.launch.row.key
            cells = []
            for routing in ("balanced", "skewed"):
                r = routed.get(routing)
                times = {names[n]: us for n, us in (r or {}).get("gpu_us", {}).items()
                         if n in names}
                if not times or pick_key not in times:
                    cells.append("—")
                    continue
                ratio = times[pick_key] / min(times.values())
                worst.append(ratio)
                cells.append(f"{ratio:.3f}")
            lines.append(f"| {model} | {tokens} | config {choice.launch.config} | "
                         + " | ".join(cells) + " |")
    if worst:
        geomean = math.exp(sum(math.log(r) for r in worst) / len(worst))
        lines += ["", f"pick / best: geomean {geomean:.4f}, worst {max(worst):.3f} "
                      f"({len(worst)} routed calls)"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calibrations", nargs="*")
    parser.add_argument("--data", default=None,
                        help="the tuning data file (default: jax_swiglu/data/<device kind>.json)")
    parser.add_argument("--include-held-out", action="store_true",
                        help="merge the held-out rows too (then nothing is left to report on)")
    parser.add_argument("--report-only", action="store_true", help="merge nothing")
    parser.add_argument("--report", default=None, help="write the report here")
    parser.add_argument("--cross-validate", nargs="?", const="shape", choices=("shape", "m"),
                        default=None,
                        help="add the leave-one-shape-out (or with 'm' leave-one-M-out) report "
                             "on the data file (after any merge; with no calibrations, the "
                             "shipped file of the one shipped device or --data)")
    parser.add_argument("--fit-model", action="store_true",
                        help="refit the cost model's constants to the data (after any merge) "
                             "and write them to the data file")
    parser.add_argument("--grouped", nargs="*", default=[],
                        help="bench_moe runs with forced grouped rows (--launches) to merge into "
                             "the grouped entries; the report covers their held-out MoE shapes")
    parser.add_argument("--legacy", nargs="*", default=[],
                        help="wave-1 calibration JSONs to import first (see LEGACY_METHOD)")
    args = parser.parse_args(argv)
    if (not args.calibrations and not args.cross_validate and not args.fit_model
            and not args.grouped):
        parser.error("give calibration JSONs, or --grouped, --cross-validate or --fit-model")
    grouped_runs = []
    for path in args.grouped:
        with open(path) as f:
            grouped_runs.append(json.load(f))
    calibrations = []
    for path in args.calibrations:
        with open(path) as f:
            calibrations.append(json.load(f))
    if args.legacy:
        facts = calibrations[0]["environment"]["device_facts"]
        current = calibrations[-1]["configs"]
        legacy = []
        for path in args.legacy:
            with open(path) as f:
                legacy.append((legacy_calibration(json.load(f), current, facts), path))
        legacy.sort(key=lambda pair: pair[0]["environment"].get("date") or "")
        calibrations = [c for c, _ in legacy] + calibrations
        args.calibrations = [path for _, path in legacy] + args.calibrations
    if calibrations:
        kind = calibrations[0]["environment"]["device_facts"]["kind"]
        path = args.data or _data.data_path(kind)
    elif args.data:
        path = args.data
    else:
        kinds = _data.shipped_kinds()
        if len(kinds) != 1:
            parser.error(f"{len(kinds)} shipped data files: name one with --data")
        path = _data.data_path(kinds[0])
    if not calibrations and not os.path.exists(path):
        parser.error(f"no tuning data file {path}")
    if os.path.exists(path):
        with open(path) as f:
            document = json.load(f)
    else:
        facts = calibrations[0]["environment"]["device_facts"]
        document = empty_document({key: facts[key] for key in
                                   ("kind", "compute_capability", "sm_count", "dram_bytes_per_s")})
    if calibrations and not args.report_only:
        for calibration, source in zip(calibrations, args.calibrations):
            written = merge(document, calibration, include_held_out=args.include_held_out)
            print(f"{source}: {written} entries")
    if grouped_runs and not args.report_only:
        for run, source in zip(grouped_runs, args.grouped):
            written = merge_grouped(document, run, include_held_out=args.include_held_out)
            print(f"{source}: {written} grouped entries")
    if args.fit_model:
        document = fit_model(document)
        print(document["model"]["provenance"])
    if ((calibrations or grouped_runs) and not args.report_only) or args.fit_model:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(document, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {path}: {len(document['entries'])} entries from "
              f"{len(document['calibrations'])} calibrations")
    sections = []
    if calibrations:
        data = _data.TuningData(document, source=path)
        rows = [row for c in calibrations for row in c["rows"] if held_out(row, c)]
        sections.append(report_markdown(evaluate(data, rows), os.path.basename(path),
                                        args.calibrations))
    if grouped_runs:
        sections.append(grouped_report(_data.TuningData(document, source=path), grouped_runs))
    if args.cross_validate:
        sections.append(cross_validation_markdown(
            cross_validate(document, args.cross_validate), os.path.basename(path),
            args.cross_validate))
    markdown = "\n".join(sections)
    print(markdown)
    if args.report:
        command = " ".join(["python -m benchmarks.tuning_data", *(argv if argv is not None
                                                                   else sys.argv[1:])])
        with open(args.report, "w") as f:
            f.write(f"<!-- written by `{command}`; regenerate, do not edit -->\n{markdown}")


if __name__ == "__main__":
    main()
