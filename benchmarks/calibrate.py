"""Calibrate the selection: time every candidate launch over a grid of shapes and M.

    python -m benchmarks.calibrate --shapes fit --m grid --budget-s 300 --out calibration.json
    python -m benchmarks.calibrate --shapes held-out --m grid held-out --out held-out.json
    python -m benchmarks.calibrate --shapes 4096x14336 --m 1 8 300

For each (shape, M) it times every compiled launch that can run it (each config at each of
its split choices) through the extension's own launchers (jax_swiglu/tuning/measure.py:
CUDA-graph replay on inputs rotated past the L2, outputs checked),
and at the M values of --jax-m also the XLA path and the fastest few launches through JAX,
as a model runs them (CUPTI). Rows go to the JSON after each one, so a run cut short by
--budget-s keeps what it measured; benchmarks/tuning_data.py merges runs into the shipped
tuning data. Shapes are names of benchmarks/shapes.py's PUBLIC_MLPS, KxN, or the groups
"fit" and "held-out"; M values are numbers or "grid", "held-out", "decode". --operands e4m3
calibrates the fp8 kernel's rows instead (weights quantized per channel), promoted unless
--accumulation fast.
At large M the candidates the cost model puts far behind are not timed (--prune).
``--configs`` times only those rows' launches (a new or changed kernel row): the merge adds
them to the entries the data already holds, which keep their other launches and XLA times
(problems the data holds no entry for are left out before timing: choose its M).
Beside them it times --anchors of the shipped entry's fastest other launches again
(``anchor_us``), and the merge scales the new times by the entry's over the run's times of
those, so rows timed on different days compare as if timed together.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp

import jax_swiglu
from jax_swiglu import selection
from jax_swiglu.selection import _data, _engine, _model
from jax_swiglu.tuning import measure

from . import environment as environment_lib
from . import shapes as shapes_lib

M_GROUPS = {"grid": shapes_lib.GRID_M, "held-out": shapes_lib.HELD_OUT_M,
            "decode": shapes_lib.DECODE_M}
SHAPE_GROUPS = {"fit": shapes_lib.FIT, "held-out": shapes_lib.HELD_OUT,
                "all": tuple(shapes_lib.PUBLIC_MLPS)}


def expand(items, groups):
    out = []
    for item in items:
        out += list(groups.get(item, (item,)))
    return list(dict.fromkeys(out))


BANDS = (16, 256, 2048)  # rows are measured band by band of M, small M first


def plan(shapes, ms):
    """(name, M) rows: decode and small M first (what the selection needs most), band by band
    of M (BANDS); within a band shape by shape, so a shape's weights are made once."""
    def band(m):
        return sum(m > edge for edge in BANDS)
    return sorted(((name, m) for m in ms for name in shapes),
                  key=lambda row: (band(row[1]), shapes.index(row[0]), row[1]))


def joinable(rows, shipped, data_dtype):
    """(the rows a --configs run can merge, the M values left out): such a run times only
    some rows' launches, and the merge adds them to the shipped entry at the same problem
    (tuning_data.py), so a problem the data has no entry for would be timed for nothing."""
    keep, left_out = [], set()
    for name, m in rows:
        k, n = shapes_lib.mlp_shape(name)
        if shipped is not None and shipped.exact(data_dtype, m, n, k) is not None:
            keep.append((name, m))
        else:
            left_out.add(m)
    return keep, sorted(left_out)


def pruned(launches, problem, device, factor: float, keep: int, prune_above_m: int):
    """The launches worth timing: all at M <= prune_above_m, else those the cost model puts
    within ``factor`` of its best (and at least ``keep``)."""
    if problem.m <= prune_above_m:
        return launches
    model = _model.Problem(problem.m, problem.n, problem.k,
                           1 if problem.operands == "e4m3" else 2)
    constants = (_data.shipped(device.kind) or _data.any_sm90()).constants
    scored = sorted(((_model.launch_us(launch.row, launch.splits, model, device.sm_count,
                                       device.dram_bytes_per_s, constants,
                                       device.cluster_slots), i)
                     for i, launch in enumerate(launches)))
    best = scored[0][0]
    chosen = {i for rank, (us, i) in enumerate(scored) if rank < keep or us <= factor * best}
    return [launch for i, launch in enumerate(launches) if i in chosen]


def anchor_launches(previous, launches, configs, count):
    """Of ``launches`` (this build's candidates), the ``count`` that ``previous`` (the shipped
    entry at the row's problem, or None) timed fastest, leaving out the rows of ``configs``
    (the ones the run measures anew): the anchors a --configs run times again."""
    if previous is None or count <= 0:
        return []
    others = {measure.launch_id(launch): launch for launch in launches
              if launch.row.id not in configs}
    timed = sorted((us, launch) for launch, us in previous.launch_us.items() if launch in others)
    return [others[launch] for _, launch in timed[:count]]


_weights_cache: dict = {}


def _weights(name, problem, key):
    """The weight sets of a shape, kept while its rows run (one shape at a time)."""
    cached = (name, problem.dtype, problem.operands)
    if cached not in _weights_cache:
        _weights_cache.clear()
        one_token = dataclasses.replace(problem, m=1)
        _weights_cache[cached] = measure.make_weights(key, problem,
                                                      measure.rotation_sets(one_token))
    return _weights_cache[cached]


def calibrate_row(name, m, dtype, args, device, key):
    k, n = shapes_lib.mlp_shape(name)
    problem = selection.Problem(m, n, k, jnp.dtype(dtype).name, args.operands,
                                accumulation=args.accumulation)
    launches = measure.candidate_launches(problem)
    anchors = []
    if args.configs:
        shipped = _data.shipped(device.kind)
        previous = shipped.exact(problem.data_dtype, m, n, k) if shipped is not None else None
        anchors = anchor_launches(previous, launches, args.configs, args.anchors)
        launches = [launch for launch in launches if launch.row.id in args.configs]
    launches = pruned(launches, problem, device, args.prune, args.keep, args.prune_above_m)
    inputs = measure.make_inputs(key, problem, 0, weights=_weights(name, problem, key))
    native = measure.time_launches(problem, launches + anchors, samples=args.samples, key=key,
                                   inputs=inputs)
    anchor_ids = {measure.launch_id(launch) for launch in anchors}
    timed = {launch: r["us"] for launch, r in native.items() if r["error"] is None and r["us"]}
    row = {"model": name, "dtype": problem.data_dtype, "output_dtype": problem.dtype,
           "m": m, "n": n, "k": k,
           "launch_us": {launch: us for launch, us in timed.items() if launch not in anchor_ids},
           "errors": {launch: r["error"] for launch, r in native.items() if r["error"]}}
    if anchors:
        row["anchor_us"] = {launch: us for launch, us in timed.items() if launch in anchor_ids}
    if m in args.jax_m and row["launch_us"] and not args.configs:
        by_id = {measure.launch_id(launch): launch for launch in launches}
        fastest = sorted(row["launch_us"], key=row["launch_us"].get)[:args.jax_finalists]
        timed = measure.time_through_jax(problem, [by_id[f] for f in fastest], key=key)
        row["xla_us"] = timed.pop("xla")
        row["cupti_us"] = timed
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["fit"])
    parser.add_argument("--m", nargs="+", default=["grid"])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"),
                        help="x's and the output's dtype")
    parser.add_argument("--operands", default="16bit", choices=("16bit", "e4m3"),
                        help="the rows to time: 16-bit operands, or e4m3 ones (fp8 weights)")
    parser.add_argument("--accumulation", default="promoted", choices=("promoted", "fast"),
                        help="e4m3: the calls' accumulation (fast: the fast-accumulation rows "
                             "join and the promoted rows run without promotions; its own "
                             "entries in the data)")
    parser.add_argument("--samples", type=int, default=3, help="timed graph replays per launch")
    parser.add_argument("--jax-m", nargs="*", type=int, default=[1, 4, 16, 64],
                        help="M values at which the XLA path and the fastest launches are "
                             "also timed through JAX")
    parser.add_argument("--jax-finalists", type=int, default=2)
    parser.add_argument("--prune", type=float, default=3.0,
                        help="above --prune-above-m, skip launches the cost model puts this "
                             "many times behind its best")
    parser.add_argument("--keep", type=int, default=8, help="... but keep at least this many")
    parser.add_argument("--prune-above-m", type=int, default=512)
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no new row after this many seconds")
    parser.add_argument("--configs", nargs="*", type=int, default=None,
                        help="time only these rows' launches (merged into the existing entries)")
    parser.add_argument("--anchors", type=int, default=2,
                        help="with --configs: the shipped entry's fastest other launches timed "
                             "again, which scale the new times to the entry's run")
    parser.add_argument("--out", default="calibration.json")
    parser.add_argument("--note", action="append", default=[])
    args = parser.parse_args(argv)
    if args.accumulation == "fast" and args.operands != "e4m3":
        parser.error("--accumulation fast needs --operands e4m3")
    if jax.default_backend() != "gpu":
        raise SystemExit("calibration needs a GPU")
    shapes = expand(args.shapes, SHAPE_GROUPS)
    ms = [int(m) for m in expand(args.m, {g: tuple(map(str, v)) for g, v in M_GROUPS.items()})]
    device = _engine.target_device()
    env = environment_lib.environment()
    env["device_facts"] = device.as_dict()
    result = {"kind": "calibration",
              "method": "CUDA-graph replay (jax_swiglu.tuning.measure)",
              "environment": env, "notes": args.note,
              "held_out_shapes": list(shapes_lib.HELD_OUT),
              "held_out_m": list(shapes_lib.HELD_OUT_M),
              "configs": {c.key: dataclasses.asdict(c)
                          for c in jax_swiglu.kernel_configs().values()},
              "complete": False, "rows": []}
    if args.configs:
        result["only_configs"] = sorted(args.configs)
    rows = plan(shapes, ms)
    if args.configs:
        data_dtype = selection.Problem(1, 128, 128, jnp.dtype(args.dtype).name, args.operands,
                                       accumulation=args.accumulation).data_dtype
        rows, left_out = joinable(rows, _data.shipped(device.kind), data_dtype)
        if left_out:
            print(f"--configs: no shipped {data_dtype} entry to join at M = "
                  f"{', '.join(map(str, left_out))} on some or all shapes; those rows are not "
                  "timed (calibrate without --configs there)", flush=True)
    start = time.perf_counter()
    key = jax.random.key(0)
    for i, (name, m) in enumerate(rows):
        if args.budget_s is not None and time.perf_counter() - start > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent after {i} of {len(rows)} rows",
                  flush=True)
            break
        began = time.perf_counter()
        row = calibrate_row(name, m, args.dtype, args, device, jax.random.fold_in(key, i))
        result["rows"].append(row)
        result["complete"] = i + 1 == len(rows)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        times = row["launch_us"]
        best = min(times, key=times.get) if times else None
        extra = (f", xla {row['xla_us']:.1f}" if "xla_us" in row else "")
        print(f"[{i + 1}/{len(rows)}] {name} M={m}: {len(times)} launches, best "
              f"{best} {times.get(best, float('nan')):.1f} us{extra}"
              + (f"; {len(row['errors'])} failed" if row["errors"] else "")
              + f" ({time.perf_counter() - began:.1f} s)", flush=True)
    print(f"wrote {args.out}: {len(result['rows'])} rows in "
          f"{time.perf_counter() - start:.0f} s")
    return result


if __name__ == "__main__":
    main()
