"""Timing the selection's candidates on the local GPU: what autotune and calibration share.

Two clocks, used for what each does best:
  * ``time_launches``: every candidate launch through the extension's own launchers on
    buffers made once per problem (ffi/timing.h: CUDA-graph replay, weights rotated past the
    L2), with no compilation, so a broad grid of candidates costs seconds, not hours;
  * ``time_through_jax``: jitted calls timed by CUPTI (the sum of their kernels' GPU time),
    as the benchmarks time them, for the XLA path and for the few fused launches it is
    compared with.
Each timed launch's output starts as NaN and is checked afterwards: every element written,
and its magnitude the same as the other candidates' (a candidate computing garbage is
reported, never chosen).
"""

from __future__ import annotations

import math
import os
import random
import statistics

import jax
import jax.numpy as jnp

from . import _layout, _native, selection
from .selection import _data, _model

# Per-launch replays: enough launches in a graph that its launch latency is a small share,
# few enough that a large problem stays quick.
_GRAPH_US = 1000.0
_MAX_CALLS = 64
_MAX_SETS = 8
_DEFAULT_L2_BYTES = 60 * 2**20


def candidate_launches(m: int, n: int, k: int, *, kernel: str | None = None,
                       splits=(1, 2, 4)) -> list[tuple[_native.KernelConfig, int]]:
    """Every compiled launch that can run the problem: (config, split-K factor); ``splits``
    are the stream-K factors to try (the gemv kernel tries its cluster sizes)."""
    launches = []
    for name, table in sorted(_native.kernel_configs().items()):
        if kernel is not None and name != kernel:
            continue
        for config in table.values():
            if config.runs(m):
                launches.extend((config, s) for s in config.split_choices(k, splits))
    return launches


def _rotation_sets(m: int, n: int, k: int, element_bytes: int = 2) -> int:
    l2 = _native.device_facts().get("l2_bytes") or _DEFAULT_L2_BYTES
    per_set = element_bytes * (m * k + 2 * k * _layout.padded_n(n))
    return max(1, min(_MAX_SETS, math.ceil(3 * l2 / per_set)))


@jax.jit
def _output_stats(out):
    return jnp.isnan(out).sum(), jnp.abs(out.astype(jnp.float32)).mean()


def make_weight_sets(key, n: int, k: int, dtype, sets: int):
    """``sets`` random packed weights ``[K, 2 N_pad]``, scaled for unit-scale products."""
    packed = []
    for i in range(sets):
        kg, ku = jax.random.split(jax.random.fold_in(key, 1000 + i))
        w_gate = (jax.random.normal(kg, (k, n), jnp.float32) / math.sqrt(k)).astype(dtype)
        w_up = (jax.random.normal(ku, (k, n), jnp.float32) / math.sqrt(k)).astype(dtype)
        packed.append(_layout.pack_weights(w_gate, w_up).data)
    return packed


def make_inputs(key, m: int, n: int, k: int, dtype, sets: int):
    """``sets`` random (x, w_gate, w_up, packed) sets, weights scaled for unit-scale outputs."""
    made = []
    for i in range(sets):
        kx, kg, ku = jax.random.split(jax.random.fold_in(key, i), 3)
        x = jax.random.normal(kx, (m, k), jnp.float32).astype(dtype)
        w_gate = (jax.random.normal(kg, (k, n), jnp.float32) / math.sqrt(k)).astype(dtype)
        w_up = (jax.random.normal(ku, (k, n), jnp.float32) / math.sqrt(k)).astype(dtype)
        made.append((x, w_gate, w_up, _layout.pack_weights(w_gate, w_up)))
    return made


def time_launches(m: int, n: int, k: int, dtype, launches, *, samples: int = 3, key=None,
                  device=None, weights=None) -> dict[str, dict]:
    """GPU time of each launch on this GPU: launch id -> {"us": median per launch over
    ``samples`` interleaved rounds, "samples", "error" (None, or why the launch failed or wrote
    wrong values)}. ``weights``: packed weight sets to rotate through (make_weight_sets), made
    here when not given. Each launch's output is checked after its last round."""
    dtype = jnp.dtype(dtype)
    key = jax.random.key(0) if key is None else key
    packed = weights or make_weight_sets(key, n, k, dtype, _rotation_sets(m, n, k, dtype.itemsize))
    xs = [jax.random.normal(jax.random.fold_in(key, i), (m, k), jnp.float32).astype(dtype)
          for i in range(len(packed))]
    out = jnp.zeros((m, n), dtype)
    sets = packed
    jax.block_until_ready((xs, packed, out))
    facts = device or selection._engine.target_device()
    problem = _model.Problem(m, n, k)
    plans = []
    results = {}
    for config, splits in launches:
        estimate = _model.launch_us(config, splits, problem, facts.sm_count,
                                    facts.dram_bytes_per_s)
        calls = max(len(sets), min(_MAX_CALLS, math.ceil(_GRAPH_US / estimate)))
        nbytes = _native.workspace_bytes(config.kernel, dtype.name, config.id, m=m, n=n,
                                         n_packed=_layout.padded_n(n), k=k, swizzle=1,
                                         raster=0, splits=splits)
        workspace = jnp.zeros((nbytes,), jnp.uint8) if nbytes else None
        if workspace is not None:
            workspace.block_until_ready()
        plans.append((config, splits, _data.launch_id(config.key, splits),
                      -(-calls // len(sets)) * len(sets), workspace))
        results[plans[-1][2]] = {"us": None, "samples": [], "error": None}
    # Interleaved rounds: each round times every launch once, in a shuffled order, so the
    # clock's drift at the power limit over a long problem is shared by all of them.
    for round_index in range(samples):
        order = list(plans) if round_index == 0 else random.Random(round_index).sample(
            plans, len(plans))
        for config, splits, name, calls, workspace in order:
            if results[name]["error"] is not None:
                continue
            try:
                results[name]["samples"] += _native.time_launches(
                    config.kernel, dtype.name, config.id, m=m, n=n,
                    n_packed=_layout.padded_n(n), k=k, swizzle=1, raster=0, splits=splits,
                    xs=xs, packed=packed, out=out, workspace=workspace, calls=calls, samples=1)
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


def time_through_jax(m: int, n: int, k: int, dtype, launches, *, xla: bool = True,
                     key=None, iterations: int = 5) -> dict[str, float]:
    """CUPTI times of the XLA path ("xla") and of the given fused launches (forced through
    JAX_SWIGLU_KERNEL/JAX_SWIGLU_CONFIG while they compile), on rotated inputs."""
    from . import _api

    dtype = jnp.dtype(dtype)
    key = jax.random.key(1) if key is None else key
    sets = make_inputs(key, m, n, k, dtype, _rotation_sets(m, n, k, dtype.itemsize))
    args_list = [(s[0], s[3]) for s in sets]
    results = {}
    if xla:
        results["xla"] = cupti_us(lambda x, p: _api.swiglu(x, p, kernel="xla"), args_list,
                                  iterations)
    for config, splits in launches:
        forcing = {selection.ENV_VAR: config.kernel,
                   selection.CONFIG_ENV_VAR: f"{config.id},splits={splits}"}
        saved = {name: os.environ.get(name) for name in forcing}
        os.environ.update(forcing)
        try:
            compiled = jax.jit(lambda x, p: _api.swiglu(x, p)).lower(*args_list[0]).compile()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        results[_data.launch_id(config.key, splits)] = cupti_us(compiled, args_list, iterations)
    return results
