"""The launch the selection picks on the benchmark grids, for comparing two trees (no GPU needed).

    python scripts/selection_picks.py record --out picks.json     # in each tree
    python scripts/selection_picks.py compare before.json after.json [--report out.md]

``record`` asks the selection, for CUDA on the shipped data's GPU, which launch runs every
(shape, M, dtype) of the benchmark suites (benchmarks/shapes.py: the prefill, decode and held-out
grids, bfloat16 and float16, and the fp8 suite's shapes on e4m3 weights), and stores each pick by
what it is (the row's key and the split), so trees with other row ids compare. ``compare`` lists
every pick that changed; ``measure`` (on an SM90 GPU) times a spread of the changed ones, the
pick before and after side by side through JAX (CUPTI), with the XLA path beside them.

    python scripts/selection_picks.py measure before.json after.json --limit 24 --out m.md

A record of picks stands in for a build of its tree: ``measure`` takes it as ``before``
(issue 41's, the picks of f48e24c, is in git history:
benchmarks/results/NVIDIA_H200/2026-12-02-changed-picks.md says where).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _grid():
    try:
        from benchmarks import shapes
    except ImportError:  # before the shapes moved to benchmarks/
        from jax_swiglu import _shapes as shapes
    names = list(dict.fromkeys([*shapes.QWEN25_MLPS, *shapes.PUBLIC_MLPS]))
    ms = sorted({*shapes.DECODE_M, *shapes.DECODE_RAGGED_M, *shapes.HELD_OUT_M,
                 128, 512, 2048, 8192, 17, 24, 33, 48, 100, 200, 300, 777, 1000, 1500, 3000})
    for name in names:
        k, n = shapes.PUBLIC_MLPS[name]
        for m in ms:
            for dtype in ("bfloat16", "float16"):
                yield name, k, n, m, dtype, "16bit"
            if m in (1, 4, 16, 64, 300, 1024, 2048, 4096, 8192):
                yield name, k, n, m, "bfloat16", "e4m3"


def _pick(m, n, k, dtype, operands):
    """(row key and split, or "xla", and the source) under either tree's API."""
    import jax.numpy as jnp

    from jax_swiglu import selection
    if hasattr(selection, "Problem"):  # one engine over every operand type
        choice = selection.choose(selection.Problem(m, n, k, dtype, operands))
        if choice.launch is None:
            return "xla", choice.source
        return f"{choice.launch.row.key}|splits={choice.launch.splits}", choice.source
    if operands == "e4m3":
        from jax_swiglu.selection import _fp8
        choice = _fp8.choose_fp8(m, n, k, jnp.dtype(dtype))
        if choice.config is None:
            return "xla", choice.source
        key = choice.config.key.replace("fp8/", "interleaved/e4m3/", 1)
        return f"{key}|splits={choice.splits}", choice.source
    choice = selection.choose(m, n, k, jnp.dtype(dtype))
    if choice.config is None:
        return "xla", choice.source
    key = choice.config.key.replace("pingpong/pingpong/", "gate_then_up/pingpong/", 1)
    return f"{key}|splits={choice.splits}", choice.source


def record(args) -> int:
    picks = []
    for name, k, n, m, dtype, operands in _grid():
        launch, source = _pick(m, n, k, dtype, operands)
        picks.append({"model": name, "m": m, "k": k, "n": n, "dtype": dtype,
                      "operands": operands, "launch": launch, "source": source})
    with open(args.out, "w") as f:
        json.dump({"picks": picks}, f, indent=0)
    print(f"{len(picks)} picks -> {args.out}")
    return 0


def _load(path: str) -> list[dict]:
    """The picks of a record (.json, or .json.gz as kept under benchmarks/results/)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["picks"]


def compare(args) -> int:
    before, after = (_load(path) for path in (args.before, args.after))
    key = lambda p: (p["model"], p["m"], p["dtype"], p["operands"])  # noqa: E731
    old = {key(p): p for p in before}
    changed = [(old[key(p)], p) for p in after if key(p) in old and old[key(p)]["launch"] != p["launch"]]
    by_kind = {}
    for a, b in changed:
        by_kind.setdefault((b["dtype"], b["operands"]), []).append((a, b))
    lines = [f"# Selection picks: {args.before} against {args.after}", "",
             f"{len(after)} picks; {len(changed)} changed "
             + (", ".join(f"{d} {o}: {len(v)}" for (d, o), v in sorted(by_kind.items()))
                if changed else ""), ""]
    if changed:
        lines += ["| model | M | dtype | operands | before | (source) | after | (source) |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {b['model']} | {b['m']} | {b['dtype']} | {b['operands']} | "
                  f"{a['launch'].replace('|', '/')} | {a['source']} | "
                  f"{b['launch'].replace('|', '/')} | {b['source']} |" for a, b in changed]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    return 0


def measure(args) -> int:
    import jax.numpy as jnp

    from jax_swiglu import _launch, _native, selection
    from jax_swiglu.tuning import measure as timing

    before, after = (_load(path) for path in (args.before, args.after))
    key = lambda p: (p["model"], p["m"], p["dtype"], p["operands"])  # noqa: E731
    old = {key(p): p for p in before}
    changed = [(old[key(p)], p) for p in after if key(p) in old
               and old[key(p)]["launch"] != p["launch"]]
    step = max(1, len(changed) // args.limit)
    rows = {row.key: row for row in _native.kernel_configs().values()}

    def as_launch(text):
        if text == "xla":
            return None
        row_key, _, splits = text.partition("|splits=")
        row = rows.get(row_key)
        return None if row is None else _launch.Launch(row.id, int(splits or 1))

    lines = [f"# Changed picks, timed: {args.before} against {args.after}", "",
             f"{len(changed)} changed; every {step}th timed through JAX (CUPTI, median us).", "",
             "| model | M | dtype | before | us | after | us | XLA us | after / before |",
             "|---|---|---|---|---|---|---|---|---|"]
    for a, b in changed[::step][:args.limit]:
        problem = selection.Problem(b["m"], b["n"], b["k"], b["dtype"], b["operands"])
        launches = [l for l in (as_launch(a["launch"]), as_launch(b["launch"])) if l]
        times = timing.time_through_jax(problem, launches)
        def us(text):
            if text == "xla":
                return times["xla"]
            launch = as_launch(text)
            return None if launch is None else times[timing.launch_id(launch)]
        t_a, t_b = us(a["launch"]), us(b["launch"])
        ratio = f"{t_b / t_a:.3f}" if t_a and t_b else "-"
        fmt = lambda t: f"{t:.1f}" if t else "(row removed)"  # noqa: E731
        lines.append(f"| {b['model']} | {b['m']} | {b['dtype']} | "
                     f"{a['launch'].replace('|', '/')} | {fmt(t_a)} | "
                     f"{b['launch'].replace('|', '/')} | {fmt(t_b)} | {times['xla']:.1f} | "
                     f"{ratio} |")
        print(lines[-1], flush=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("record")
    p.add_argument("--out", required=True)
    p = sub.add_parser("compare")
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--report")
    p = sub.add_parser("measure")
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--limit", type=int, default=24)
    p.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    return {"record": record, "compare": compare, "measure": measure}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
