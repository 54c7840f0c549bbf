"""Bit-level digests of every compiled launch's output on a fixed grid, to show that a change
to the code around the kernels leaves what they compute exactly as it was.

    python scripts/output_digests.py record --out digests.json   # on an SM90 GPU
    python scripts/output_digests.py plan                        # anywhere: lowers every case
    python scripts/output_digests.py compare before.json after.json [--report out.md]  # or .json.gz

``record`` runs every compiled (family, config, split, dtype, activation) of
``jax_swiglu.kernel_configs()`` on a grid of shapes, forcing each launch, and stores the
SHA-256 of each output's bytes, with a digest of its inputs. ``plan`` lowers the same cases
for CUDA (no GPU needed) and checks that each lowered call names the forced launch.
``compare`` matches two records case by case by what a launch *is* (its tiles, cluster,
schedule, scheduler, store, bands and split, the operand and output dtypes, the activation and
the shape), not by row ids, so the table may be reordered or a family renamed between them.

Inputs are drawn from numpy's generator with a fixed seed per shape, so two trees (and two
runs) see the same bits; the fp8 cases quantize them with the package's own functions.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import inspect
import json
import os
import sys
import time

import numpy as np

# Shapes (K, N): every dtype and activation on the first; the second, whose N = 1000 is not a
# multiple of the gate/up block (padding), in bfloat16 and SiLU. K a multiple of 16 (the fp8
# rows' TMA rows). M runs from one token to many tiles.
SHAPES = [(1024, 2816), (512, 1000)]
M_TOKENS = [1, 77, 2048]
DTYPES = ["bfloat16", "float16"]
# Families renamed since a record was made: old name -> current name.
RENAMED = {"pingpong": "gate_then_up"}


def _jax():
    import jax
    import jax.numpy as jnp
    import jax_swiglu
    return jax, jnp, jax_swiglu


def _families(jax_swiglu) -> dict:
    """family -> {id -> config} of every compiled dense row, the e4m3 rows as family "fp8"
    (grouped rows run expert calls, which this grid does not make)."""
    from jax_swiglu import _native
    configs = _native.kernel_configs()
    if configs and not isinstance(next(iter(configs.values())), dict):  # one table of rows
        families = {}
        for config_id, row in configs.items():
            if getattr(row, "grouped", False):
                continue
            family = "fp8" if row.operands == "e4m3" else row.family
            families.setdefault(family, {})[config_id] = row
        return families
    # Before the one table: a table per family, and the fp8 kernel's apart.
    families = {name: dict(table) for name, table in configs.items()}
    if hasattr(_native, "fp8_configs") and _native.fp8_configs():
        families["fp8"] = dict(_native.fp8_configs())
    return families


def _signature(family: str, config) -> dict:
    fields = ("schedule", "m_side", "tile_m", "tile_n", "tile_k", "cluster_m", "cluster_n",
              "scheduler", "store", "m_bands")
    operands = "float8_e4m3fn" if family == "fp8" or getattr(config, "operands", "") == "fp8" \
        else "16-bit"
    family = RENAMED.get(family, family)
    return {"family": "interleaved" if family == "fp8" else family, "operands": operands,
            **{f: getattr(config, f) for f in fields}}


def _cases(jax_swiglu):
    """Every (family, config, splits, dtype, activation, m, k, n) to record."""
    activations = list(jax_swiglu.ACTIVATIONS)
    for family, table in sorted(_families(jax_swiglu).items()):
        for config_id, config in sorted(table.items()):
            for shape_index, (k, n) in enumerate(SHAPES):
                ms = [m for m in M_TOKENS if config.runs(m)]
                if config.max_m:  # None (or 0, since the one table) for any M
                    ms = sorted({m for m in (1, max(1, config.max_m // 2), config.max_m)
                                 if config.runs(m)})
                if config.m_bands > 1:
                    ms = [config.m_multiple]
                splits = (1,)
                if config.is_gemv:
                    choices = (config.split_choices(k) if hasattr(config, "split_choices")
                               else jax_swiglu._native.split_choices(config_id, k))
                    splits = (choices[0], choices[-1])
                elif config.scheduler == "stream-k" and family != "fp8":
                    splits = (1, 2)  # (the fp8 rows could not be forced to split-K before)
                combos = [(d, a) for d in DTYPES for a in activations]
                if shape_index:  # the odd shape: one dtype and activation, one M
                    combos, ms = combos[:1], ms[1:2] or ms[:1]
                for dtype, activation in combos:
                    for m in ms:
                        for s in dict.fromkeys(splits):
                            yield family, config_id, config, s, dtype, activation, m, k, n


def _inputs(jnp, jax_swiglu, m, k, n, dtype, fp8: bool):
    rng = np.random.default_rng(1000003 * k + n)
    x = rng.standard_normal((max(M_TOKENS), k), np.float32)
    w_gate = rng.standard_normal((k, n), np.float32) / np.sqrt(k)
    w_up = rng.standard_normal((k, n), np.float32) / np.sqrt(k)
    x = jnp.asarray(x[:m], jnp.float32).astype(dtype)
    w_gate, w_up = (jnp.asarray(w, jnp.float32).astype(dtype) for w in (w_gate, w_up))
    weights = (jax_swiglu.quantize_weights(w_gate, w_up) if fp8
               else jax_swiglu.pack_weights(w_gate, w_up))
    return x, weights


def _digest(array) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(array)).view(np.uint8)).hexdigest()


def _launch_call(jax, jax_swiglu, family, config_id, splits, activation):
    """A new jitted function forcing one launch, and the environment it must lower under."""
    launch = f"{config_id}" + (f",splits={splits}" if splits > 1 else "")
    if "launch" in inspect.signature(jax_swiglu.swiglu).parameters:
        return (jax.jit(lambda x, w: jax_swiglu.swiglu(x, w, launch=launch,
                                                       activation=activation)), {})
    # Before `launch=`: the family and the config were forced through the environment.
    # (splits=1 named too: unnamed, a gemv row took the selection's split.)
    env = {"JAX_SWIGLU_KERNEL": "interleaved" if family == "fp8" else family,
           "JAX_SWIGLU_CONFIG": f"{config_id},splits={splits}"}
    return jax.jit(lambda x, w: jax_swiglu.swiglu(x, w, activation=activation)), env


def _with_env(env, fn):
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        return fn()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _check_lowered(text: str, family: str, config_id: int, splits: int) -> str | None:
    """Why the lowered module does not run the forced launch, or None."""
    if "jax_swiglu_" not in text or "custom_call" not in text:
        return "no jax_swiglu custom call in the lowered module"
    if f"config = {config_id} : i64" not in text:
        return f"the custom call does not carry config {config_id}"
    if f"splits = {splits} : i64" not in text:
        return f"the custom call does not carry splits {splits}"
    return None


def plan(args) -> int:
    jax, jnp, jax_swiglu = _jax()
    problems = 0
    count = 0
    for family, config_id, config, s, dtype, activation, m, k, n in _cases(jax_swiglu):
        count += 1
        x, weights = _inputs(jnp, jax_swiglu, m, k, n, dtype, family == "fp8")
        fn, env = _launch_call(jax, jax_swiglu, family, config_id, s, activation)
        try:
            text = _with_env(env, lambda: fn.trace(x, weights).lower(
                lowering_platforms=("cuda",)).as_text())
            why = _check_lowered(text, family, config_id, s)
        except Exception as error:  # noqa: BLE001 - reported per case
            why = f"{type(error).__name__}: {error}"
        if why:
            problems += 1
            print(f"{family}:{config_id} splits={s} {dtype} {activation} M={m} K={k} N={n}: {why}")
    print(f"{count} cases, {problems} that do not lower to their forced launch")
    return 1 if problems else 0


def record(args) -> int:
    jax, jnp, jax_swiglu = _jax()
    rows = []
    start = time.time()
    inputs = {}
    for family, config_id, config, s, dtype, activation, m, k, n in _cases(jax_swiglu):
        key = (m, k, n, dtype, family == "fp8")
        if key not in inputs:
            x, weights = _inputs(jnp, jax_swiglu, m, k, n, dtype, family == "fp8")
            leaves = jax.tree_util.tree_leaves(weights)
            inputs[key] = (x, weights, _digest(x) + ":" + ":".join(_digest(l) for l in leaves))
        x, weights, input_digest = inputs[key]
        fn, env = _launch_call(jax, jax_swiglu, family, config_id, s, activation)
        row = {**_signature(family, config), "splits": s, "dtype": dtype,
               "activation": activation, "m": m, "k": k, "n": n, "inputs": input_digest,
               "launch": f"{family}:{config_id}"}
        try:
            lowered = _with_env(env, lambda: fn.lower(x, weights))
            why = _check_lowered(lowered.as_text(), family, config_id, s)
            y = lowered.compile()(x, weights)
            y = np.asarray(jax.block_until_ready(y))
            row.update(output=_digest(y), nans=int(np.isnan(y.astype(np.float32)).sum()),
                       error=why)
        except Exception as error:  # noqa: BLE001 - recorded per case
            row.update(output=None, error=f"{type(error).__name__}: {error}"[:300])
        rows.append(row)
    document = {"commit": os.environ.get("GIT_COMMIT", ""), "jax": jax.__version__,
                "device": str(jax.devices()[0].device_kind), "seconds": round(time.time() - start),
                "grid": {"shapes_kn": SHAPES, "m": M_TOKENS, "dtypes": DTYPES}, "cases": rows}
    with open(args.out, "w") as f:
        json.dump(document, f, indent=0)
    errors = sum(r["error"] is not None for r in rows)
    print(f"{len(rows)} cases in {document['seconds']} s, {errors} errors -> {args.out}")
    return 0


def _match_key(row) -> tuple:
    ignore = {"output", "nans", "error", "launch", "inputs"}
    return tuple(sorted((k, str(v)) for k, v in row.items() if k not in ignore))


def compare(args) -> int:
    def load(path):  # a record as written, or gzipped (as tests/results/ keeps them)
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            return json.load(f)
    before, after = (load(path) for path in (args.before, args.after))
    old = {_match_key(r): r for r in before["cases"]}
    new = {_match_key(r): r for r in after["cases"]}
    same = [k for k in old if k in new and old[k]["output"] and old[k]["output"] == new[k]["output"]]
    differ = [k for k in old if k in new and old[k]["output"] != new[k]["output"]]
    inputs_differ = [k for k in old if k in new and old[k]["inputs"] != new[k]["inputs"]]
    only_old = [k for k in old if k not in new]
    only_new = [k for k in new if k not in old]
    errors = [k for k in new if new[k]["error"]]
    lines = [f"# Output digests: {args.before} against {args.after}", "",
             f"- before: commit {before.get('commit')}, {before.get('device')}, "
             f"{len(old)} cases; after: commit {after.get('commit')}, {len(new)} cases",
             f"- grid: {after.get('grid')}",
             f"- bit-identical: {len(same)}; different: {len(differ)}; inputs different: "
             f"{len(inputs_differ)}; only before: {len(only_old)}; only after: {len(only_new)}; "
             f"errors after: {len(errors)}", ""]
    for title, keys, table in (("Different outputs", differ, new), ("Only before", only_old, old),
                               ("Only after", only_new, new), ("Errors after", errors, new)):
        if keys:
            lines.append(f"## {title}")
            lines += [f"- {table[k]['launch']} {dict(k)} {table[k].get('error') or ''}"
                      for k in keys[:200]]
            lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text + "\n")
    return 0 if not differ and not errors and not inputs_differ else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("record")
    p.add_argument("--out", required=True)
    sub.add_parser("plan")
    p = sub.add_parser("compare")
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--report")
    args = parser.parse_args(argv)
    return {"record": record, "plan": plan, "compare": compare}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
