"""The implementations a user would pick instead of jax_swiglu, timed beside it.

* tokamax's ``gated_linear_unit`` with its Pallas Mosaic GPU kernel (the closest JAX peer),
  where tokamax installs: on the GPU machine it is carried as wheels (scripts/gpu_check.sh).
  Its import pulls in a profiler package (xprof) that only its own benchmarking helpers use;
  where xprof is missing, an empty stand-in module lets the op import. A shape it refuses
  is the row's result, recorded with its message.
* PyTorch eager, ``F.silu(x @ wg) * (x @ wu)``, and the same call replayed as a CUDA graph,
  on the same inputs (copied from JAX through DLPack), timed with CUDA events.
"""

from __future__ import annotations

import functools
import importlib.metadata
import statistics
import sys
import types

import jax


def versions() -> dict:
    found = {}
    for package in ("tokamax", "torch"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


@functools.cache
def _tokamax():
    try:
        import xprof  # noqa: F401
    except ImportError:
        for name in ("xprof", "xprof.cli", "xprof.cli.tools"):
            sys.modules.setdefault(name, types.ModuleType(name))
        sys.modules["xprof.cli.tools"].get_kernel_stats_tool = None
    import tokamax
    return tokamax


def tokamax_variant():
    """f(x, weights) running tokamax's Mosaic GPU kernel, or why it is not available."""
    try:
        tokamax = _tokamax()
    except Exception as error:  # noqa: BLE001 (any import failure is the result)
        return f"tokamax does not import: {type(error).__name__}: {error}"

    def run(x, w):
        return tokamax.gated_linear_unit(x, (w[0], w[1]), activation=jax.nn.silu,
                                         implementation="mosaic")
    run.__name__ = "tokamax"
    return run


def tokamax_refuses(variant, x, w) -> str | None:
    """None if the variant compiles for these shapes, else its refusal (a result)."""
    try:
        jax.jit(variant).lower(x, w).compile()
    except Exception as error:  # noqa: BLE001
        # tokamax wraps each implementation's refusal in an ExceptionGroup: report those.
        causes = getattr(error, "exceptions", None) or [error]
        return "; ".join(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
                         for e in causes)[:300]
    return None


def torch_times_us(sets, iterations: int):
    """{"torch_eager": us, "torch_graph": us} per call on the rotated sets, or why not."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as error:
        return f"torch does not import: {error}"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    tensors = [(torch.from_dlpack(x), torch.from_dlpack(w[0]), torch.from_dlpack(w[1]))
               for x, w in sets]

    def step():
        for x, wg, wu in tensors:
            F.silu(x @ wg) * (x @ wu)

    def timed(run) -> float:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(iterations):
            start.record()
            run()
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop) * 1e3 / len(tensors))
        return statistics.median(samples)

    with torch.no_grad():
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        eager = timed(step)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
        replayed = timed(graph.replay)
    return {"torch_eager": eager, "torch_graph": replayed}
