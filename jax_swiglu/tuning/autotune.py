"""``jax_swiglu.autotune``: measure the candidates for your shapes on your GPU, once.

The shipped tuning data covers the shapes and M it was calibrated on and predicts the rest;
autotune measures instead. For each problem it times every compiled candidate launch
through the extension (no compilation per candidate), then the fastest few and the XLA path
through JAX as a model would run them, and stores the winner in the autotune cache
(``JAX_SWIGLU_CACHE_DIR``), which the selection consults before anything else. Calls on
16-bit and on fp8 (e4m3) weights alike. The FFI handler never tunes: only this function,
and ``python -m jax_swiglu.tune``, do.
"""

from __future__ import annotations

import datetime
import math

import jax
import jax.numpy as jnp

from .. import _layout, _primitive, _quantize, _reference, selection
from .._version import __version__
from ..selection import _cache, _device
from . import measure


def _problems_of_function(fn, *args, **kwargs) -> list[selection.Problem]:
    """The problem of every jax_swiglu call ``fn(*args, **kwargs)`` makes, as traced."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive is _primitive.swiglu_p:
                params = eqn.params
                x = eqn.invars[0].aval
                weights = eqn.invars[1 if params["weights"] == "packed" else 2].aval
                found.append(selection.Problem(
                    x.shape[0], params["n"], x.shape[1], params["out_dtype"],
                    _primitive.operands_of(params["weights"], weights.dtype),
                    params["activation"], params["accumulation"]))
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(*args, **kwargs).jaxpr)
    return list(dict.fromkeys(found))


def _problem_of_call(x, weights, activation, accumulation: str) -> selection.Problem:
    """The problem of ``swiglu(x, weights, activation=..., accumulation=...)``, checked as
    that call checks it."""
    from .. import _api
    activation = _reference.resolve_activation(activation)
    if not isinstance(activation, str):
        raise ValueError(f"autotune times the kernels, which compile the activations "
                         f"{tuple(_reference.ACTIVATIONS)}; a callable activation runs on "
                         "XLA's path only, with nothing to tune")
    _primitive.check_accumulation(accumulation,
                                  isinstance(weights, _quantize.QuantizedWeights))
    if isinstance(weights, _quantize.QuantizedWeights):
        fp8_x = hasattr(x, "dtype") and jnp.dtype(x.dtype) in _quantize.FP8_DTYPES
        _api._check_fp8_call(x, weights, jax.ShapeDtypeStruct(x.shape[:-1], jnp.float32)
                             if fp8_x else None)
    else:
        _api._check_x(x, _layout.as_packed(weights, "packed"))
    m = math.prod(x.shape[:-1])
    if isinstance(weights, _quantize.QuantizedWeights):
        return selection.Problem(m, weights.n, weights.k,
                                 _reference.fp8_output_dtype(x.dtype).name,
                                 _primitive.operands_of("fp8", weights.dtype), activation,
                                 accumulation)
    weights = _layout.as_packed(weights, "packed")
    return selection.Problem(m, weights.n, weights.k, jnp.dtype(x.dtype).name, "16bit",
                             activation)


def _checked_problem(problem, dtype) -> selection.Problem:
    """One ``(m, n, k)`` of ``problems=`` as a 16-bit Problem, checked as a call would be."""
    dtype = jnp.dtype(dtype)
    if dtype not in _layout.KERNEL_DTYPES:
        raise TypeError(f"autotune(problems=...) times 16-bit calls: dtype must be bfloat16 or "
                        f"float16, got {dtype} (fp8 calls: autotune(x, quantized_weights))")
    if not (isinstance(problem, (tuple, list)) and len(problem) == 3
            and all(hasattr(v, "__index__") and not isinstance(v, bool) for v in problem)):
        raise ValueError(f"each problem must be (m, n, k) ints, got {problem!r}")
    m, n, k = (int(v) for v in problem)
    if m < 0 or n < 1 or k < 1:
        raise ValueError(f"problem (m, n, k) = {(m, n, k)}: m must be >= 0, n and k >= 1")
    _layout.check_alignment(k, n)
    return selection.Problem(m, n, k, dtype.name)


def autotune(*args, problems=None, dtype=jnp.bfloat16, kernel: str | None = None,
             samples: int = 5, finalists: int = 3, **kwargs) -> list[dict]:
    """Times the candidates for some calls on this GPU and caches the fastest.

        jax_swiglu.autotune(x, weights)                # one call (arrays or ShapeDtypeStructs;
                                                       # PackedWeights or QuantizedWeights;
                                                       # activation=, accumulation= as passed
                                                       # to swiglu)
        jax_swiglu.autotune(model_fn, params, x)       # every swiglu call model_fn makes
        jax_swiglu.autotune(problems=[(m, n, k), ...], dtype=jnp.bfloat16)

    ``kernel`` restricts the candidates to one fused family ("interleaved",
    "gate_then_up" or "gemv"). Returns one record per problem: its launch ("xla" or a
    tuning-data launch id), the times measured, and whether the cache file was written.
    Needs a local SM90 GPU.
    """
    for name, value in (("samples", samples), ("finalists", finalists)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    family = None if kernel is None else selection.canonical_kernel(kernel)
    if family in ("auto", "xla"):
        family = None
    function_form = bool(args) and callable(args[0])
    if problems is not None:
        if args:
            raise TypeError("autotune takes either calls (positional) or problems=, not both")
        if kwargs:
            raise TypeError(f"autotune(problems=...) takes no {', '.join(kwargs)}")
        todo = [_checked_problem(problem, dtype) for problem in problems]
    elif len(args) == 2 and not function_form:
        unknown = set(kwargs) - {"activation", "accumulation"}
        if unknown:
            raise TypeError(f"autotune(x, weights) takes activation= and accumulation= (as "
                            f"swiglu does), not {', '.join(sorted(unknown))}")
        todo = [_problem_of_call(*args, kwargs.get("activation", "silu"),
                                 kwargs.get("accumulation", "promoted"))]
    elif not function_form:
        raise TypeError("autotune(x, weights), autotune(fn, *args) or autotune(problems=[...])")
    why = selection.kernels_unusable_reason()
    if why is not None:
        raise RuntimeError(f"jax_swiglu.autotune needs an SM90 GPU and the kernels: {why}")
    if function_form:
        todo = _problems_of_function(args[0], *args[1:], **kwargs)

    device = _device.local_device()
    cache = _cache.cache(__version__)
    records = []
    for problem in todo:
        if problem.m == 0:
            continue
        launches = measure.candidate_launches(problem, kernel=family)
        if not launches:
            raise RuntimeError(f"no compiled candidate runs {problem}")
        native = measure.time_launches(problem, launches, samples=samples)
        valid = sorted((r["us"], name) for name, r in native.items()
                       if r["error"] is None and r["us"])
        if not valid:
            raise RuntimeError(f"no candidate ran {problem}: "
                               + "; ".join(f"{name}: {r['error']}" for name, r in native.items()))
        by_id = {measure.launch_id(launch): launch for launch in launches}
        best = [by_id[name] for _, name in valid[:finalists]]
        through_jax = measure.time_through_jax(problem, best, xla=family is None)
        winner = min(through_jax, key=through_jax.get)
        record = {"launch": winner, "us": through_jax[winner],
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                      timespec="seconds"),
                  "native_us": {name: r["us"] for name, r in native.items()},
                  "cupti_us": through_jax}
        written = cache.store(device.fingerprint, problem.data_dtype, problem.m, problem.n,
                              problem.k, record)
        records.append({"m": problem.m, "n": problem.n, "k": problem.k,
                        "dtype": problem.dtype, "operands": problem.operands, **record,
                        "cached": written, "cache_dir": cache.directory})
    return records
