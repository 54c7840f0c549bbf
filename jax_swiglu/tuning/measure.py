"""Timing the selection's candidates on the local GPU: what autotune and calibration share.

Two clocks, used for what each does best:
  * ``time_launches``: every candidate launch through the extension's own launchers on
    buffers made once per problem (ffi/timing.h: CUDA-graph replay, weights rotated past the
    L2), with no compilation, so a broad grid of candidates costs seconds, not hours;
  * ``time_through_jax``: jitted calls timed by CUPTI (the sum of their kernels' GPU time),
    as the benchmarks time them, for the XLA path and for the few fused launches it is
    compared with (each forced with ``swiglu(..., launch=...)``).
Each timed launch's output starts as NaN and is checked afterwards: every element written,
and its magnitude the same as the other candidates' (a candidate computing garbage is
reported, never chosen). A problem is a ``selection.Problem``: 16-bit or e4m3 operands.
"""

from __future__ import annotations

import math
import random
import statistics

import jax
import jax.numpy as jnp

from .. import _launch, _layout, _native, _quantize, selection
from ..selection import _data, _engine, _model

# Per-launch replays: enough launches in a graph that its launch latency is a small share,
# few enough that a large problem stays quick.
_GRAPH_US = 1000.0
_MAX_CALLS = 64
_MAX_SETS = 8
_DEFAULT_L2_BYTES = 60 * 2**20


def candidate_launches(problem: selection.Problem, *, kernel: str | None = None,
                       include_optional: bool = True) -> list[_launch.Launch]:
    """Every compiled launch that can run ``problem``, each row at each of its split choices;
    ``kernel`` restricts them to one family."""
    launches = []
    # Under fast accumulation the promoted e4m3 rows run with promotion 0.
    promotion = (_launch.FAST_ACCUMULATION if problem.accumulation == "fast" else None)
    for row in selection.candidates(problem, kernel):
        if row.optional and not include_optional:
            continue
        launches += [_launch.Launch(row.id, s, promotion=None if row.fast_accumulation
                                    else promotion)
                     for s in _native.split_choices(row.id, problem.k)]
    return launches


def launch_id(launch: _launch.Launch) -> str:
    """How tuning data and the autotune cache name a launch (by the row's key, not its id)."""
    return _data.launch_id(launch.row.key, launch.splits)


def _element_bytes(problem) -> int:
    return 1 if problem.operands == "e4m3" else 2


def rotation_sets(problem) -> int:
    """Input sets to rotate through so that the weights stream from DRAM, not the L2."""
    l2 = _native.device_facts().get("l2_bytes") or _DEFAULT_L2_BYTES
    per_set = _element_bytes(problem) * (problem.m * problem.k
                                         + 2 * problem.k * _layout.padded_n(problem.n))
    return max(1, min(_MAX_SETS, math.ceil(3 * l2 / per_set)))


@jax.jit
def _output_stats(out):
    return jnp.isnan(out).sum(), jnp.abs(out.astype(jnp.float32)).mean()


def make_weights(key, problem, sets: int):
    """``sets`` random weights of ``problem``'s shape: PackedWeights (16-bit, in its dtype) or
    QuantizedWeights (e4m3), scaled for unit-scale outputs."""
    weights = []
    for i in range(sets):
        kg, ku = jax.random.split(jax.random.fold_in(key, 1000 + i))
        shape = (problem.k, problem.n)
        w_gate = jax.random.normal(kg, shape, jnp.float32) / math.sqrt(problem.k)
        w_up = jax.random.normal(ku, shape, jnp.float32) / math.sqrt(problem.k)
        if problem.operands == "e4m3":
            weights.append(_quantize.quantize_weights(w_gate, w_up))
        else:
            dtype = jnp.dtype(problem.dtype)
            weights.append(_layout.pack_weights(w_gate.astype(dtype), w_up.astype(dtype)))
    return weights


def make_inputs(key, problem, sets: int, weights=None):
    """``sets`` random (x, weights) of ``problem``: x [M, K] in the output dtype, with
    ``weights`` (make_weights; made here when not given) in turn."""
    weights = weights or make_weights(key, problem, sets)
    xs = [jax.random.normal(jax.random.fold_in(key, i), (problem.m, problem.k),
                            jnp.float32).astype(jnp.dtype(problem.dtype))
          for i in range(len(weights))]
    return list(zip(xs, weights))


def time_launches(problem: selection.Problem, launches, *, samples: int = 3, key=None,
                  device=None, inputs=None) -> dict[str, dict]:
    """GPU time of each launch on this GPU: launch id -> {"us": median per launch over
    ``samples`` interleaved rounds, "samples", "error" (None, or why the launch failed or wrote
    wrong values), "launch"}. ``inputs``: (x, weights) sets to rotate through (make_inputs),
    made here when not given. Each launch's output is checked after its last round."""
    key = jax.random.key(0) if key is None else key
    sets = inputs or make_inputs(key, problem, rotation_sets(problem))
    fp8 = problem.operands == "e4m3"
    if fp8:
        quantized = [_quantize.quantize_tokens(x) for x, _ in sets]
        xs = [x_q for x_q, _ in quantized]
        # One set of token scales for every set: scales do not change a launch's time.
        x_scale, w_scale = quantized[0][1], sets[0][1].scales
    else:
        xs, x_scale, w_scale = [x for x, _ in sets], None, None
    packed = [weights.data for _, weights in sets]
    out = jnp.zeros((problem.m, problem.n), jnp.dtype(problem.dtype))
    jax.block_until_ready((xs, packed, out, x_scale, w_scale))
    facts = device or _engine.target_device()
    constants = (_data.shipped(facts.kind) or _data.any_sm90()).constants
    model = _model.Problem(problem.m, problem.n, problem.k, _element_bytes(problem))
    plans = []
    results = {}
    for launch in launches:
        row = launch.row
        estimate = _model.launch_us(row, launch.splits, model, facts.sm_count,
                                    facts.dram_bytes_per_s, constants, facts.cluster_slots)
        calls = max(len(sets), min(_MAX_CALLS, math.ceil(_GRAPH_US / estimate)))
        nbytes = _native.workspace_bytes(launch.config, problem.dtype, m=problem.m,
                                         n=problem.n, k=problem.k, splits=launch.splits,
                                         promotion=launch.promotion_interval,
                                         activation=problem.activation)
        workspace = jnp.zeros((nbytes,), jnp.uint8) if nbytes else None
        if workspace is not None:
            workspace.block_until_ready()
        name = launch_id(launch)
        plans.append((launch, name, -(-calls // len(sets)) * len(sets), workspace))
        results[name] = {"us": None, "samples": [], "error": None, "launch": str(launch)}
    # Interleaved rounds: each round times every launch once, in a shuffled order, so the
    # clock's drift at the power limit over a long problem is shared by all of them.
    for round_index in range(samples):
        order = list(plans) if round_index == 0 else random.Random(round_index).sample(
            plans, len(plans))
        for launch, name, calls, workspace in order:
            if results[name]["error"] is not None:
                continue
            try:
                results[name]["samples"] += _native.time_launches(
                    launch.config, problem.dtype, m=problem.m, n=problem.n, k=problem.k,
                    splits=launch.splits, xs=xs, packed=packed, out=out, workspace=workspace,
                    calls=calls, samples=1, swizzle=launch.swizzle,
                    raster=_launch.RASTER_ORDERS[launch.raster],
                    promotion=launch.promotion_interval, x_scale=x_scale, w_scale=w_scale,
                    activation=problem.activation)
            except (RuntimeError, ValueError) as error:
                results[name]["error"] = str(error)
                continue
            if round_index == samples - 1:
                nans, mean_abs = (float(v) for v in _output_stats(out))
                results[name]["mean_abs"] = mean_abs
                if nans:
                    results[name]["error"] = f"{int(nans)} output elements not written"
    for result in results.values():
        if result["error"] is None and result["samples"]:
            result["us"] = statistics.median(result["samples"])
    _flag_outliers(results)
    return results


def _flag_outliers(results: dict) -> None:
    """Every candidate computes the same values up to rounding: one whose mean |output|
    differs from the others' median by more than 1 % is wrong."""
    magnitudes = [r["mean_abs"] for r in results.values() if r.get("error") is None
                  and r.get("mean_abs") is not None]
    if len(magnitudes) < 2:
        return
    typical = statistics.median(magnitudes)
    for r in results.values():
        if r.get("error") is None and abs(r["mean_abs"] - typical) > 0.01 * typical:
            r["error"] = f"mean |output| {r['mean_abs']:.6g}, the others' {typical:.6g}"


def cupti_us(fn, args_list, iterations: int = 5) -> float:
    """Median GPU time (us) of ``fn`` (jitted here unless already compiled) over calls on each
    argument set of ``args_list`` in turn, by CUPTI: the sum of its kernels' times per call."""
    from jax.experimental.mosaic.gpu import profiler

    if not isinstance(fn, jax.stages.Compiled):
        fn = jax.jit(fn)
    samples = []
    for args in args_list:
        _, ms = profiler.measure(fn, iterations=iterations)(*args)
        if ms is None:
            raise RuntimeError("CUPTI recorded no GPU kernel for the measured call")
        samples += list(ms) if iterations > 1 else [ms]
    return 1e3 * statistics.median(samples)


def time_through_jax(problem: selection.Problem, launches, *, xla: bool = True, key=None,
                     iterations: int = 5) -> dict[str, float]:
    """CUPTI times of the XLA path ("xla", in the call's accumulation) and of the given fused
    launches (each forced with ``launch=``), on rotated inputs: launch id -> us."""
    from .. import _api

    key = jax.random.key(1) if key is None else key
    args_list = make_inputs(key, problem, rotation_sets(problem))
    activation = problem.activation
    results = {}
    if xla:
        results["xla"] = cupti_us(
            lambda x, w: _api.swiglu(x, w, kernel="xla", activation=activation,
                                     accumulation=problem.accumulation), args_list,
            iterations)
    for launch in launches:
        compiled = jax.jit(lambda x, w, launch=launch: _api.swiglu(
            x, w, launch=launch, activation=activation,
            accumulation=problem.accumulation)).lower(*args_list[0]).compile()
        results[launch_id(launch)] = cupti_us(compiled, args_list, iterations)
    return results
