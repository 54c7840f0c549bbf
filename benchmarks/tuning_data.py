"""Turn calibration runs into the shipped tuning data, and report how well it generalizes.

    python -m benchmarks.tuning_data calibration.json [more.json ...]
    python -m benchmarks.tuning_data held-out.json --report-only --report fit-report.md

Merges each calibration (benchmarks/calibrate.py) into jax_swiglu/data/<device kind>.json:
the file is the union of the runs, each entry (one dtype, M, N, K) from the newest run that
measured it, pointing at that run's provenance (date, commit, GPU, driver, CUDA, jax,
CUTLASS, command). Rows of the held-out shapes and M (jax_swiglu/_shapes.py) never enter
it: the report instead asks the selection's learned rule what it would pick there, from the
data alone, and compares that launch's measured time with the fastest measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os

from jax_swiglu.selection import _data, _device, _engine


def _provenance(calibration: dict) -> dict:
    env = calibration["environment"]
    return {"date": env.get("date"), "commit": env.get("git"), "gpu": env.get("device"),
            "driver": env.get("driver"), "cuda": env.get("nvcc"), "jax": env.get("jax"),
            "jaxlib": env.get("jaxlib"), "cutlass": env.get("cutlass"),
            "jax_swiglu": env.get("jax_swiglu"), "command": env.get("command"),
            "method": calibration.get("method")}


def _calibration_id(calibration: dict, existing: dict) -> str:
    env = calibration["environment"]
    base = f"{(env.get('date') or 'undated')[:10]}-{env.get('git') or 'nogit'}"
    name, n = base, 1
    while name in existing and existing[name] != _provenance(calibration):
        n += 1
        name = f"{base}-{n}"
    return name


def held_out(row: dict, calibration: dict) -> bool:
    return (row["model"] in calibration.get("held_out_shapes", ())
            or row["m"] in calibration.get("held_out_m", ()))


def empty_document(device: dict) -> dict:
    return {"format": _data.FORMAT, "device": device, "calibrations": {}, "configs": {},
            "entries": []}


def merge(document: dict, calibration: dict, *, include_held_out: bool = False) -> int:
    """Adds a calibration's rows to ``document`` (in place); returns the entries written."""
    facts = calibration["environment"]["device_facts"]
    device = {"kind": facts["kind"], "compute_capability": facts["compute_capability"],
              "sm_count": facts["sm_count"], "dram_bytes_per_s": facts["dram_bytes_per_s"]}
    known = document["device"]
    if (known["kind"], known["sm_count"], known["compute_capability"]) != (
            device["kind"], device["sm_count"], device["compute_capability"]):
        raise ValueError(f"calibration on {device} cannot join tuning data of {known}")
    name = _calibration_id(calibration, document["calibrations"])
    document["calibrations"][name] = _provenance(calibration)
    document["configs"].update(calibration["configs"])
    entries = {(e["dtype"], e["m"], e["n"], e["k"]): e for e in document["entries"]}
    written = 0
    for row in calibration["rows"]:
        if not row["launch_us"] or (held_out(row, calibration) and not include_held_out):
            continue
        entry = {"dtype": row["dtype"], "m": row["m"], "n": row["n"], "k": row["k"],
                 "launch_us": {k: round(v, 3) for k, v in sorted(row["launch_us"].items())},
                 "calibration": name}
        if row.get("xla_us"):
            entry["xla_us"] = round(row["xla_us"], 3)
            entry["cupti_us"] = {k: round(v, 3) for k, v in row.get("cupti_us", {}).items()}
        entries[(row["dtype"], row["m"], row["n"], row["k"])] = entry
        written += 1
    document["entries"] = [entries[key] for key in sorted(entries)]
    return written


def evaluate(data: _data.TuningData, rows) -> list[dict]:
    """For each measured row: the launch the learned rule picks from ``data`` (rows absent
    from it), that launch's measured time over the fastest measured, and over XLA's."""
    device = _device.device_from_dict(data.device, local=False)
    configs = {key: data.config(key) for key in data.configs}
    results = []
    for row in rows:
        if not row["launch_us"]:
            continue
        m, n, k, dtype = row["m"], row["n"], row["k"], row["dtype"]
        candidates = [c for c in configs.values() if c is not None and m % c.m_multiple == 0]
        predicted, learned = _engine.predict(data, device, candidates, dtype, m, n, k)
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
        results.append(result)
    return results


def report_markdown(results, data_path: str, sources) -> str:
    if not results:
        return "No held-out rows to evaluate.\n"
    ratios = [r["ratio"] for r in results]
    geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    within = sum(x <= 1.02 for x in ratios)
    lines = [
        f"Held-out rows (shapes and M never fitted), the learned rule of {data_path} against "
        f"the fastest measured launch, from {', '.join(sources)}:",
        "",
        f"- {len(results)} rows; chosen/best geomean {geomean:.4f}, max {max(ratios):.3f}; "
        f"{within} within 2 %.",
        "",
        "| model | M | chosen | us | fastest | us | chosen/fastest | XLA/chosen |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: (r["model"], r["m"])):
        vs = f"{r['vs_xla']:.2f}" if "vs_xla" in r else "-"
        lines.append(f"| {r['model']} | {r['m']} | {r['chosen']} | {r['chosen_us']:.1f} | "
                     f"{r['best']} | {r['best_us']:.1f} | {r['ratio']:.3f} | {vs} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calibrations", nargs="+")
    parser.add_argument("--data", default=None,
                        help="the tuning data file (default: jax_swiglu/data/<device kind>.json)")
    parser.add_argument("--include-held-out", action="store_true",
                        help="merge the held-out rows too (then nothing is left to report on)")
    parser.add_argument("--report-only", action="store_true", help="merge nothing")
    parser.add_argument("--report", default=None, help="write the held-out report here")
    args = parser.parse_args(argv)
    calibrations = []
    for path in args.calibrations:
        with open(path) as f:
            calibrations.append(json.load(f))
    kind = calibrations[0]["environment"]["device_facts"]["kind"]
    path = args.data or _data.data_path(kind)
    if os.path.exists(path):
        with open(path) as f:
            document = json.load(f)
    else:
        facts = calibrations[0]["environment"]["device_facts"]
        document = empty_document({key: facts[key] for key in
                                   ("kind", "compute_capability", "sm_count", "dram_bytes_per_s")})
    if not args.report_only:
        for calibration, source in zip(calibrations, args.calibrations):
            print(f"{source}: {merge(document, calibration, include_held_out=args.include_held_out)}"
                  f" entries")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(document, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {path}: {len(document['entries'])} entries from "
              f"{len(document['calibrations'])} calibrations")
    data = _data.TuningData(document, source=path)
    rows = [row for c in calibrations for row in c["rows"] if held_out(row, c)]
    markdown = report_markdown(evaluate(data, rows), os.path.basename(path), args.calibrations)
    print(markdown)
    if args.report:
        with open(args.report, "w") as f:
            f.write(markdown)


if __name__ == "__main__":
    main()
