"""``jax_swiglu.autotune``: measure the candidates for your shapes on your GPU, once.

The shipped tuning data covers the shapes and M it was calibrated on and predicts the rest;
autotune measures instead. For each problem it times every compiled candidate launch
through the extension (no compilation per candidate), then the fastest few and the XLA path
through JAX as a model would run them, and stores the winner in the autotune cache
(``JAX_SWIGLU_CACHE_DIR``), which the lowering consults before anything else. The FFI handler
never tunes: only this function, and ``python -m jax_swiglu.tune``, do.
"""

from __future__ import annotations

import datetime

import jax
import jax.numpy as jnp

from . import _layout, _primitive, _tuning, selection
from .selection import _cache, _data, _device


def _problems_of_function(fn, *args, **kwargs) -> list[tuple[int, int, int, str]]:
    """(M, N, K, dtype) of every jax_swiglu call ``fn(*args, **kwargs)`` makes, as traced."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive is _primitive.swiglu_p:
                x = eqn.invars[0].aval
                found.append((x.shape[0], eqn.params["n"], x.shape[1], jnp.dtype(x.dtype).name))
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(*args, **kwargs).jaxpr)
    return list(dict.fromkeys(found))


def autotune(*args, problems=None, dtype=jnp.bfloat16, kernel: str | None = None,
             samples: int = 5, finalists: int = 3, **kwargs) -> list[dict]:
    """Times the candidates for some calls on this GPU and caches the fastest.

        jax_swiglu.autotune(x, packed)                 # one call (arrays or ShapeDtypeStructs)
        jax_swiglu.autotune(model_fn, params, x)       # every swiglu call model_fn makes
        jax_swiglu.autotune(problems=[(m, n, k), ...], dtype=jnp.bfloat16)

    ``kernel`` restricts the candidates to one fused family ("interleaved" or "pingpong").
    Returns one record per problem: its launch ("xla" or a tuning-data launch id), the
    times measured, and whether the cache file was written. Needs a local SM90 GPU.
    """
    why = selection.kernels_unusable_reason()
    if why is not None:
        raise RuntimeError(f"jax_swiglu.autotune needs an SM90 GPU and the kernels: {why}")
    todo = []
    if problems is not None:
        if args:
            raise TypeError("autotune takes either calls (positional) or problems=, not both")
        todo = [(int(m), int(n), int(k), jnp.dtype(dtype).name) for m, n, k in problems]
    elif args and callable(args[0]):
        todo = _problems_of_function(args[0], *args[1:], **kwargs)
    elif len(args) == 2:
        x, packed = args
        packed = _layout.as_packed(packed, "packed")
        m = 1
        for d in x.shape[:-1]:
            m *= d
        todo = [(m, packed.n, packed.k, jnp.dtype(x.dtype).name)]
    else:
        raise TypeError("autotune(x, packed), autotune(fn, *args) or autotune(problems=[...])")

    from . import __version__
    device = _device.local_device()
    cache = _cache.cache(__version__)
    records = []
    for m, n, k, dtype_name in todo:
        if m == 0:
            continue
        launches = _tuning.candidate_launches(m, n, k, kernel=kernel)
        native = _tuning.time_launches(m, n, k, dtype_name, launches, samples=samples)
        valid = sorted((r["us"], name) for name, r in native.items()
                       if r["error"] is None and r["us"])
        if not valid:
            raise RuntimeError(f"no candidate ran M={m} N={n} K={k} {dtype_name}: "
                               + "; ".join(f"{name}: {r['error']}" for name, r in native.items()))
        by_id = {_data.launch_id(c.key, s): (c, s) for c, s in launches}
        best = [by_id[name] for _, name in valid[:finalists]]
        through_jax = _tuning.time_through_jax(m, n, k, dtype_name, best, xla=kernel is None)
        winner = min(through_jax, key=through_jax.get)
        record = {"launch": winner, "us": through_jax[winner],
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                      timespec="seconds"),
                  "native_us": {name: r["us"] for name, r in native.items()},
                  "cupti_us": through_jax}
        written = cache.store(device.fingerprint, dtype_name, m, n, k, record)
        records.append({"m": m, "n": n, "k": k, "dtype": dtype_name, **record,
                        "cached": written, "cache_dir": cache.directory})
    return records
