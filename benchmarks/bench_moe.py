"""Benchmark the grouped (mixture-of-experts) fused SwiGLU against XLA and tokamax (GPU).

    python -m benchmarks.bench_moe                          # every expert shape and routing
    python -m benchmarks.bench_moe --models mixtral-8x7b --tokens 8 4096 --routing skewed

Every row (an expert shape of benchmarks/shapes.py's MOE_MLPS, a token count, a routing)
times, side by side in one run, on the same inputs (x [T, K] with T = tokens * top-k rows
sorted by expert, int32 group sizes):
  xla         act(g) * u after one jax.lax.ragged_dot over the [gate | up] concatenation
              [E, K, 2F] (bf16 result, as a model writes it)
  xla_two     the same with two ragged_dots, gate and up apart (MaxText's wi_0 / wi_1)
  tokamax     tokamax.ragged_dot (Pallas Mosaic GPU) over the concatenation, then the
              activation, where tokamax installs and runs the shape (else its refusal)
  grouped     jax_swiglu.grouped_swiglu: the grouped kernel the selection picks
  gemm        the dense bare GEMM of equal FLOPs, x [T, K] x [K, 2F] of one expert: a
              ceiling (it streams one expert's weights where the grouped call streams
              every active expert's)
  grouped:<c> with --launches: grouped row c forced, for each given (what the selection's
              rule is checked and fitted against)
Per row also the HBM floor: every active expert's weights, x and the output read or written
once at the part's DRAM peak, the least time any kernel needs (where the call is bound by
bytes, as at few tokens per expert, no kernel is faster than it).
Routings: "balanced" (every expert an equal share of the rows, within one; with fewer rows
than experts, a random subset of experts one row each) and "skewed" (one expert takes half
the rows, a quarter of the experts none, the rest an equal share). Several routings of the
same kind, over differently permuted experts, rotate from call to call, so that the weights
a call streams were not left in the L2 by the call before.

GPU time by CUPTI (the sum of a call's kernel times), medians over interleaved rounds.
Writes benchmarks/results/<gpu>/<date>-moe.{json,md} after every row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_swiglu
from jax_swiglu.selection import _engine

from . import environment as environment_lib
from . import peers
from . import shapes as shapes_lib
from .bench_swiglu import L2_BYTES, measure_side_by_side, output_stem
from .tuning_data import GROUPED_METHOD

ROUTINGS = ("balanced", "skewed")
MAX_SETS = 8
ROUNDS = 3


def group_sizes(routing: str, rows: int, experts: int, rng: np.random.Generator) -> np.ndarray:
    """Rows per expert for ``routing`` (module docstring), over a random permutation of the
    experts; sums to ``rows``."""
    sizes = np.zeros(experts, np.int64)
    order = rng.permutation(experts)
    if routing == "balanced":
        share, extra = divmod(rows, experts)
        sizes[order] = share
        sizes[order[:extra]] += 1
    elif routing == "skewed":
        empty = experts // 4
        heavy = rows // 2 if experts > 1 else rows
        sizes[order[0]] = heavy
        rest = order[1 + empty:] if experts > 1 + empty else order[:1]
        share, extra = divmod(rows - heavy, len(rest))
        sizes[rest] += share
        sizes[rest[:extra]] += 1
    else:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
    assert sizes.sum() == rows
    return sizes.astype(np.int32)


def _normal_experts(key, experts, k, f, scale):
    """[E, K, F] bf16 normals times ``scale``, drawn an expert at a time, so that no fp32
    temporary of every expert's size exists (DeepSeek-V3's 256 experts on an 80 GB part)."""
    draw = lambda one: (jax.random.normal(one, (k, f), jnp.float32) * scale).astype(  # noqa: E731
        jnp.bfloat16)
    return jax.jit(lambda keys: jax.lax.map(draw, keys))(jax.random.split(key, experts))


def make_weights(key, k, f, experts, concatenated=True):
    """Every expert's gate and up weights [E, K, F] (bf16, unit-scale products), the packed
    experts, one expert's [K, 2F] for the GEMM, and with ``concatenated`` (XLA's ragged_dot
    and tokamax's read it) their concatenation [E, K, 2F]."""
    kg, ku = jax.random.split(key)
    scale = 1 / math.sqrt(k)
    w_gate = _normal_experts(kg, experts, k, f, scale)
    w_up = _normal_experts(ku, experts, k, f, scale)
    weights = {"gate": w_gate, "up": w_up,
               "packed": jax_swiglu.pack_expert_weights(w_gate, w_up),
               "dense": jnp.concatenate([w_gate[0], w_up[0]], axis=1)}
    if concatenated:
        weights["concatenated"] = jnp.concatenate([w_gate, w_up], axis=2)
    return weights


def _xla(x, sizes, w):
    h = jax.lax.ragged_dot(x, w["concatenated"], sizes)
    f = w["gate"].shape[2]
    return jax.nn.silu(h[:, :f]) * h[:, f:]


def _xla_two(x, sizes, w):
    return (jax.nn.silu(jax.lax.ragged_dot(x, w["gate"], sizes))
            * jax.lax.ragged_dot(x, w["up"], sizes))


def _grouped(x, sizes, w):
    return jax_swiglu.grouped_swiglu(x, w["packed"], sizes)


def _gemm(x, sizes, w):
    del sizes
    return x @ w["dense"]


def _forced(config):
    def run(x, sizes, w):
        return jax_swiglu.grouped_swiglu(x, w["packed"], sizes, launch=config)
    return run


def _tokamax_variant():
    try:
        tokamax = peers._tokamax()  # noqa: SLF001 (the peers module's own import helper)
        # tokamax reads absl flags, which would parse this script's own arguments.
        from absl import flags
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
    except Exception as error:  # noqa: BLE001 (any import failure is the result)
        return f"tokamax does not import: {type(error).__name__}: {error}"

    def run(x, sizes, w):
        h = tokamax.ragged_dot(x, w["concatenated"], sizes, implementation="mosaic")
        f = w["gate"].shape[2]
        return jax.nn.silu(h[:, :f]) * h[:, f:]
    return run


# XLA's ragged_dot runs as one dense dot over x spread to [rows, E * K] (and its autotuner
# allocates that again): the fp32 spec checks a random sample of rows where all of them
# would not fit in this many bytes.
SPEC_BYTES = 4e9


def _spec_sample(x, y, sizes, experts, f, rng):
    """(x, y, sizes) on a random sample of rows, sorted, with the sample's own group sizes, so
    that the spec's ragged_dot fits in SPEC_BYTES; all rows where they fit."""
    rows = x.shape[0]
    limit = max(1, int(SPEC_BYTES // (experts * max(x.shape[1], 2 * f) * 4)))
    if rows <= limit:
        return x, y, sizes
    picked = np.sort(rng.choice(rows, limit, replace=False))
    bounds = np.cumsum(np.maximum(np.asarray(sizes), 0))
    # A row's expert: how many group ends lie at or before it (E: past the sum, zero).
    expert = np.searchsorted(bounds, picked, side="right")
    sample_sizes = np.bincount(expert, minlength=experts + 1)[:experts].astype(np.int32)
    picked = jnp.asarray(picked)
    return x[picked], y[picked], jnp.asarray(sample_sizes)


def _spec_reference(x, sizes, w):
    """The fp32 spec of a grouped call, a block of experts at a time (their rows are
    contiguous), so that no block's fp32 weights pass SPEC_BYTES: every expert's at once
    would not fit beside the bf16 ones on an 80 GB part at DeepSeek-V3's 256 experts."""
    experts, k, f = w["gate"].shape
    block = max(1, int(SPEC_BYTES // (2 * k * f * 4)))
    ends = np.concatenate([[0], np.cumsum(np.maximum(np.asarray(sizes), 0))])
    rows = x.shape[0]
    f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
    parts = []
    for first in range(0, experts, block):
        last = min(experts, first + block)
        start, stop = int(min(ends[first], rows)), int(min(ends[last], rows))
        if stop > start:
            with jax.default_matmul_precision("highest"):
                parts.append(jax_swiglu.grouped_swiglu_reference(
                    f32(x[start:stop]), f32(w["gate"][first:last]), f32(w["up"][first:last]),
                    sizes[first:last]))
    covered = sum(part.shape[0] for part in parts)
    parts.append(jnp.zeros((rows - covered, f), jnp.float32))  # rows past the sum: zero
    return jnp.concatenate(parts)


def _spec_errors(y, x, sizes, w, rng):
    """Elements off the fp32 spec by more than 1 % + 1e-3, the relative Frobenius error, and
    how many rows were checked."""
    experts, _, f = w["gate"].shape
    x, y, sizes = _spec_sample(x, y, sizes, experts, f, rng)
    r = _spec_reference(x, sizes, w)
    y = y.astype(jnp.float32)
    off = jnp.sum(~(jnp.abs(y - r) <= 0.01 * jnp.abs(r) + 1e-3))
    rel = jnp.linalg.norm(y - r) / jnp.maximum(jnp.linalg.norm(r), 1e-30)
    return int(off), float(rel), int(x.shape[0])


def bench_one(model, tokens, routing, weights, iterations, rounds, seed, with_peers=True,
              launches=(), with_xla=True):
    k, f, experts, top_k = shapes_lib.MOE_MLPS[model]
    rows = tokens * top_k
    rng = np.random.default_rng(seed)
    active = min(experts, rows)
    active_bytes = 2 * active * k * 2 * f
    count = max(1, min(MAX_SETS, math.ceil(3 * L2_BYTES / active_bytes)))
    sizes = [jnp.asarray(group_sizes(routing, rows, experts, rng)) for _ in range(count)]
    xs = [jax.random.normal(jax.random.key(seed * 97 + i), (rows, k), jnp.bfloat16)
          for i in range(count)]
    row = {"model": model, "tokens": tokens, "rows": rows, "routing": routing, "k": k, "f": f,
           "experts": experts, "top_k": top_k, "rotation_sets": count,
           "active_experts": [int(jnp.sum(s > 0)) for s in sizes[:1]][0],
           "flops": 2 * rows * k * 2 * f, "gpu_us": {}, "unsupported": {}, "mismatches": {},
           "rel_err": {}, "spec_rows": {}}
    named = {"xla": _xla, "xla_two": _xla_two} if with_xla else {}
    named.update({"grouped": _grouped, "gemm": _gemm})
    named.update({f"grouped:{c}": _forced(c) for c in launches})
    if with_peers:
        tokamax = _tokamax_variant()
        if isinstance(tokamax, str):
            row["unsupported"]["tokamax"] = tokamax
        else:
            named["tokamax"] = tokamax
    # A variant that does not compile or run here (XLA's ragged_dot runs out of memory on
    # many experts and rows) is the row's result for it, recorded with its message.
    for name in list(named):
        try:
            jax.block_until_ready(jax.jit(named[name])(xs[0], sizes[0], weights))
        except Exception as error:  # noqa: BLE001 (a refusal is the row's result)
            row["unsupported"][name] = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
            del named[name]
    if "grouped" not in named:
        raise RuntimeError(f"the grouped call failed: {row['unsupported']['grouped']}")
    fns = {name: jax.jit(lambda xs, ss, w, variant=variant:
                         [variant(x, s, w) for x, s in zip(xs, ss)])
           for name, variant in named.items()}
    gpu_ms, _ = measure_side_by_side(fns, (xs, sizes, weights), iterations, rounds, wall=False)
    for name in named:
        row["gpu_us"][name] = gpu_ms[name] * 1e3 / count
        if name != "gemm" and not name.startswith("grouped:"):
            y = jax.jit(named[name])(xs[0], sizes[0], weights)
            (row["mismatches"][name], row["rel_err"][name],
             row["spec_rows"][name]) = _spec_errors(y, xs[0], sizes[0], weights, rng)
    x0 = jax.ShapeDtypeStruct((rows, k), jnp.bfloat16)
    row["grouped_choice"] = jax_swiglu.explain_grouped(x0, weights["packed"], sizes[0])
    return row


def _geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def targets(rows) -> list[tuple[str, str, bool]]:
    """Issue 46's targets on the recorded rows: (target, measured, met)."""
    found = []

    def xla_best(row):
        return min(row["gpu_us"].get("xla", math.inf), row["gpu_us"].get("xla_two", math.inf))

    for name, low, high, bar in (("grouped >= 1.5x XLA's ragged_dot path, 512-16384 tokens",
                                  512, 16384, 1.5),
                                 ("grouped >= 1.2x XLA's ragged_dot path, 1-64 tokens",
                                  1, 64, 1.2)):
        ratios = [xla_best(r) / r["gpu_us"]["grouped"] for r in rows
                  if low <= r["tokens"] <= high and xla_best(r) < math.inf]
        failed = sum(1 for r in rows if low <= r["tokens"] <= high and "xla" in r["unsupported"])
        if ratios:
            found.append((name, f"min {min(ratios):.2f}x, geomean {_geomean(ratios):.2f}x "
                          f"({len(ratios)} rows" + (f"; XLA failed on {failed} more" if failed
                                                    else "") + ")", min(ratios) >= bar))
    ratios = [r["gpu_us"]["tokamax"] / r["gpu_us"]["grouped"] for r in rows
              if "tokamax" in r["gpu_us"]]
    if ratios:
        found.append(("grouped >= 1.1x tokamax's ragged_dot + activation",
                      f"min {min(ratios):.2f}x ({len(ratios)} rows)", min(ratios) >= 1.1))
    ratios = [r["gpu_us"]["grouped"] / r["gpu_us"]["gemm"] for r in rows
              if r["routing"] == "balanced" and r["tokens"] >= 4096]
    if ratios:
        found.append(("grouped within 1.10x of the dense GEMM, balanced, >= 4096 tokens",
                      f"max {max(ratios):.3f}x ({len(ratios)} rows)", max(ratios) <= 1.10))
    off = sum(r["mismatches"].get("grouped", 0) for r in rows)
    found.append(("0 elements off the fp32 spec (grouped)", f"{off}", off == 0))
    return found


def hbm_floor_us(row, device_facts) -> float | None:
    """The least time any kernel needs for ``row``'s bytes at the part's DRAM peak: every active
    expert's gate and up weights, x and the output once each (bf16). None without the part's
    facts."""
    if not device_facts or not device_facts.get("dram_bytes_per_s"):
        return None
    weights = row["active_experts"] * row["k"] * 2 * row["f"]
    return 2 * (weights + row["rows"] * (row["k"] + row["f"])) / device_facts[
        "dram_bytes_per_s"] * 1e6


def markdown(result) -> str:
    env = result["environment"]
    lines = [f"# Grouped SwiGLU (mixture of experts) on {env['device']}", "",
             f"Command: `{env['command']}` (commit {env['git']}, jax {env['jax']}, "
             f"{env['date']}). GPU time in microseconds per call (CUPTI), median of "
             f"{result['iterations']} in {result['rounds']} interleaved rounds. Columns: "
             "benchmarks/bench_moe.py's docstring. `off`: elements past 1 % + 1e-3 of the fp32 "
             "spec.", ""]
    lines += [f"Skipped, out of this GPU's memory: {model} ({why})." for model, why in
              sorted(result.get("skipped_models", {}).items())]
    lines += [""] if result.get("skipped_models") else []
    facts = env.get("device_facts")
    lines += ["| model | tokens | rows | routing | xla | xla_two | tokamax | grouped | gemm | "
              "HBM floor | xla/grouped | tokamax/grouped | grouped/gemm | grouped/floor | "
              "off (grouped, xla) | grouped ran |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    def cell(r, name):
        t = r["gpu_us"]
        return f"{t[name]:.1f}" if name in t else "fails" if name in r["unsupported"] else "—"

    for r in result["rows"]:
        t = r["gpu_us"]
        best = min(t.get("xla", math.inf), t.get("xla_two", math.inf))
        tk_ratio = f"{t['tokamax'] / t['grouped']:.2f}" if "tokamax" in t else "—"
        ran = re.search(r"config (\d+)", r["grouped_choice"])
        ran = f"config {ran.group(1)}" if ran else "xla"
        floor = hbm_floor_us(r, facts)
        lines.append(
            f"| {r['model']} | {r['tokens']} | {r['rows']} | {r['routing']} | {cell(r, 'xla')} | "
            f"{cell(r, 'xla_two')} | {cell(r, 'tokamax')} | {t['grouped']:.1f} | {t['gemm']:.1f} | "
            + (f"{floor:.1f}" if floor else "—") + " | "
            + (f"{best / t['grouped']:.2f}" if best < math.inf
               else "XLA fails" if "xla" in r["unsupported"] else "—")
            + f" | {tk_ratio} | {t['grouped'] / t['gemm']:.3f} | "
            + (f"{t['grouped'] / floor:.2f}" if floor else "—")
            + f" | {r['mismatches'].get('grouped')}, {r['mismatches'].get('xla', '—')} | {ran} |")
    forced = sorted({name for r in result["rows"] for name in r["gpu_us"]
                     if name.startswith("grouped:")})
    if forced:
        lines += ["", "Every grouped row forced (us); the selection's pick in bold.", "",
                  "| model | tokens | routing | " + " | ".join(forced) + " | picked |",
                  "|---|---|---|" + "---|" * (len(forced) + 1)]
        for r in result["rows"]:
            if not any(n in r["gpu_us"] for n in forced):
                continue
            picked = re.search(r"config (\d+)", r["grouped_choice"])
            picked = f"grouped:{picked.group(1)}" if picked else "xla"
            cells = [(f"**{r['gpu_us'][n]:.1f}**" if n == picked else f"{r['gpu_us'][n]:.1f}")
                     if n in r["gpu_us"] else "—" for n in forced]
            best = min((r["gpu_us"][n], n) for n in forced if n in r["gpu_us"])
            lines.append(f"| {r['model']} | {r['tokens']} | {r['routing']} | "
                         + " | ".join(cells) + f" | {picked} ({r['gpu_us'].get(picked, 0) / best[0]:.3f}x the best) |")
    for name in ("xla", "xla_two", "tokamax"):
        refusals = {r["unsupported"].get(name) for r in result["rows"]} - {None}
        if refusals:
            lines += ["", f"{name} did not run (rows marked fails): "
                      + "; ".join(sorted(refusals))[:600]]
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {name} | {measured} | {'yes' if met else 'NO'} |"
              for name, measured, met in targets(result["rows"])]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(shapes_lib.MOE_MLPS),
                        choices=list(shapes_lib.MOE_MLPS))
    parser.add_argument("--tokens", nargs="*", type=int, default=list(shapes_lib.MOE_TOKENS))
    parser.add_argument("--routing", nargs="*", default=list(ROUTINGS), choices=ROUTINGS)
    parser.add_argument("--iterations", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--no-peers", action="store_true", help="skip tokamax")
    parser.add_argument("--no-xla", action="store_true",
                        help="skip XLA's ragged_dot paths (for timing the grouped rows alone)")
    parser.add_argument("--launches", nargs="*", type=int, default=[],
                        help="grouped rows to time forced beside the selection's pick")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no new row after this many seconds")
    parser.add_argument("--out-dir", default=None, help="default: benchmarks/results/<gpu>/")
    parser.add_argument("--tag", default="moe")
    args = parser.parse_args(argv)
    if jax.default_backend() != "gpu":
        raise SystemExit("the benchmark needs a GPU")
    env = environment_lib.environment()
    device = _engine.target_device()
    if device is not None:
        env["device_facts"] = device.as_dict()
    out_dir = args.out_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                           env["device"].replace(" ", "_"))
    os.makedirs(out_dir, exist_ok=True)
    stem = output_stem(out_dir, env["date"][:10], "-" + args.tag)
    # The forced rows by their definitions (what tuning data keys them by: a row's id is only
    # its place in this build's table), so benchmarks/tuning_data.py --grouped can merge them.
    table = jax_swiglu.kernel_configs()
    result = {"environment": env, "iterations": args.iterations, "rounds": args.rounds,
              "method": GROUPED_METHOD,
              "peers": peers.versions(), "held_out_models": list(shapes_lib.MOE_HELD_OUT),
              "configs": {f"grouped:{c}": dataclasses.asdict(table[c]) | {"key": table[c].key}
                          for c in args.launches if c in table},
              "complete": False, "rows": []}
    start = time.perf_counter()
    todo = [(m, t, r) for m in args.models for t in sorted(args.tokens) for r in args.routing]
    skipped = {}

    def skip(model, error):
        skipped[model] = " ".join(str(error).split())[:300]
        result["skipped_models"] = skipped
        print(f"{model}: skipped, out of this GPU's memory: {skipped[model]}", flush=True)

    for i, (model, tokens, routing) in enumerate(todo):
        if args.budget_s is not None and time.perf_counter() - start > args.budget_s:
            print(f"budget spent after {i} of {len(todo)} rows", flush=True)
            break
        if model in skipped:
            continue
        if i == 0 or todo[i - 1][0] != model:
            weights = None  # free the previous model's weights first
            k, f, experts, _ = shapes_lib.MOE_MLPS[model]
            try:
                weights = make_weights(jax.random.key(i), k, f, experts,
                                       concatenated=not (args.no_xla and args.no_peers))
            except jax.errors.JaxRuntimeError as error:  # its experts do not fit this GPU
                skip(model, error)
                continue
        try:
            row = bench_one(model, tokens, routing, weights, args.iterations, args.rounds,
                            seed=i, with_peers=not args.no_peers, launches=args.launches,
                            with_xla=not args.no_xla)
        except RuntimeError as error:  # the grouped call failed; out of memory: skip the model
            if "RESOURCE_EXHAUSTED" not in str(error):
                raise
            weights = None
            skip(model, error)
            continue
        result["rows"].append(row)
        result["complete"] = i + 1 == len(todo)
        with open(stem + ".json", "w") as f:
            json.dump(result, f, indent=1)
        t = row["gpu_us"]
        print(f"[{i + 1}/{len(todo)}] {model} tokens={tokens} {routing}: "
              + ", ".join(f"{name} {us:.1f}" for name, us in t.items())
              + f" us; off {row['mismatches']}", flush=True)
    text = markdown(result)
    with open(stem + ".md", "w") as f:
        f.write(text)
    print(text)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
