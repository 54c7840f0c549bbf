"""Kernel selection: which launch (or the XLA path) runs a call of a given static shape.

``choose`` is what the primitive's partitioning step calls with each device's local shapes
(and ``explain`` with the shapes it is given). A forced ``launch`` wins; then ``kernel``
(the argument, or ``JAX_SWIGLU_KERNEL``, which the public functions resolve at trace time);
then the checks that force the XLA path (no extension, a non-CUDA platform, a non-SM90
GPU); then the engine (_engine.py) over the candidates: the compiled rows of the call's
operands (16-bit or e4m3) that can run it, of one family if ``kernel`` names one, and the
XLA path.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings

import jax
import jax.numpy as jnp

from .. import _launch, _native
from .._version import __version__
from . import _data, _device, _engine, _model

# Public names of the implementations: the kernel families and the plain XLA path. The
# gate-then-up kernel is also called "pingpong" (the paper's name for its Kernel-1).
KERNELS = ("interleaved", "gate_then_up", "gemv", "xla")
ALIASES = {"pingpong": "gate_then_up"}
KERNEL_CHOICES = ("auto",) + KERNELS + tuple(ALIASES)
ENV_VAR = "JAX_SWIGLU_KERNEL"


@dataclasses.dataclass(frozen=True)
class Problem:
    """One call on one device: ``[m, k] x [k, 2n]`` with ``operands`` ("16bit": x and the
    weights in ``dtype``; "e4m3": both in fp8 with fp32 scales), output ``dtype``."""

    m: int
    n: int
    k: int
    dtype: str  # the output's: "bfloat16" or "float16"
    operands: str = "16bit"
    activation: str = "silu"
    # "promoted" or, for e4m3 operands, "fast": the fast-accumulation rows join the candidates
    # and the promoted rows run with promotion 0
    accumulation: str = "promoted"

    @property
    def data_dtype(self) -> str:
        """How tuning data and the autotune cache name the problem's operands. bfloat16 and
        float16 run the same tiles at the same tensor-core rate and bytes, so they share one
        set of measurements; fp8 fast accumulation has its own."""
        if self.operands == "16bit":
            return "bfloat16"
        return "float8_e4m3fn" + ("/fast" if self.accumulation == "fast" else "")


@dataclasses.dataclass(frozen=True)
class Choice:
    """What a call runs: a launch, or the XLA path (``launch`` None), and why."""

    launch: _launch.Launch | None
    reason: str
    source: str = ""  # which step of the selection decided

    def in_words(self) -> str:
        """What runs and why, in plain words: explain's first line."""
        if self.launch is None:
            what = "runs plain XLA"
            why = _WHY_XLA.get(self.source.rsplit(", then ", 1)[-1], f"since {self.reason}")
        else:
            what = (f"runs the fused kernel {self.launch.family} config {self.launch.config} "
                    f"({self.launch.row.in_words()})")
            why = (f"forced by {self.source}" if self.source.startswith("launch=") else
                   _WHY_LAUNCH.get(self.source.rsplit(", then ", 1)[-1], self.source))
        asked = self.source.rsplit(", then ", 1)[0] if ", then " in self.source else ""
        return f"{what}, {asked + ' asked for, then ' if asked else ''}{why}"

    def describe(self, problem: Problem | None = None, platform: str = "cuda") -> str:
        by = f"{self.source}: " if self.source else ""
        if self.launch is None:
            what = ""
            if problem is not None and problem.operands != "16bit":
                what = (f" fp8 GEMM ({problem.accumulation} sums)"
                        if xla_runs_fp8_gemm(problem.operands, problem.k, platform)
                        else " on the dequantized inputs")
            return f"xla{what} ({by}{self.reason})"
        target = (f"{self.launch.target(problem.activation, problem.dtype)}, "
                  if problem is not None else "")
        return f"{self.launch.family} [{target}{self.launch.describe()}] ({by}{self.reason})"


# Each selection step (Choice.source) in plain words, for a fused pick and for XLA.
OTHER_GPU_DATA = _engine.OTHER_GPU_DATA
_WHY_LAUNCH = {
    "autotune cache": "the fastest when autotuned on this GPU",
    "tuning data (measured)": "the fastest measured at this shape on this kind of GPU",
    "tuning data (learned rule)": "predicted fastest from this kind of GPU's measurements nearby",
    OTHER_GPU_DATA: "predicted fastest by this GPU's cost model, corrected by another GPU's "
                    "measurements nearby",
    "heuristic": "predicted fastest by the cost model alone (no measurement near)",
}
_WHY_XLA = {
    "autotune cache": "the fastest when autotuned on this GPU",
    "tuning data (measured)": "measured faster than every fused launch at this shape",
    "tuning data (learned rule)": "predicted faster than every fused launch here",
    OTHER_GPU_DATA: "predicted faster than every fused launch from another GPU's measurements",
    "heuristic": "predicted faster than every fused launch by the cost model alone",
    "override": "as asked (kernel='xla')",
}


def canonical_kernel(kernel: str) -> str:
    """The family name of a ``kernel=`` value (aliases resolved), or a ValueError."""
    if kernel not in KERNEL_CHOICES:
        raise ValueError(f"kernel must be one of {KERNEL_CHOICES}, got {kernel!r}")
    return ALIASES.get(kernel, kernel)


def check_kernel_name(kernel: str) -> None:
    """A ValueError unless ``kernel`` is a ``kernel=`` value (KERNEL_CHOICES)."""
    canonical_kernel(kernel)


def requested_kernel(kernel: str) -> str:
    """The kernel asked for: the argument, or where it is "auto", ``JAX_SWIGLU_KERNEL``
    (read when a call is traced, so it is part of the traced program)."""
    kernel = canonical_kernel(kernel)
    if kernel != "auto":
        return kernel
    env = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if env not in KERNEL_CHOICES:
        raise ValueError(f"{ENV_VAR}={env!r}: must be one of {KERNEL_CHOICES}")
    return ALIASES.get(env, env)


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def local_gpu_is_sm90() -> bool | None:
    """True/False for the local CUDA GPU; None when there is none (cross-lowering)."""
    device = _device.local_device()
    return None if device is None else device.compute_capability == 90


def xla_runs_fp8_gemm(operands: str, k: int, platform: str) -> bool:
    """Whether an fp8 call's XLA path is XLA's own fp8 GEMM (``swiglu_xla_quantized``'s, in
    the call's accumulation) rather than the spec's fp32 math on the dequantized values: e4m3
    operands with K a multiple of 16 on CUDA, for a GPU with fp8 tensor cores (SM89 on; with
    no GPU here, the shipped data's part). Its promoted sums are as far from the spec as the
    fused kernel's default, and it streams the fp8 weights, where the spec widens them to
    fp32 on every call."""
    if platform != "cuda" or operands != "e4m3" or k % 16:
        return False
    device = _engine.target_device()
    return device is not None and device.compute_capability >= 89


def kernels_unusable_reason() -> str | None:
    """Why the fused kernels cannot run on this machine's GPU, or None if they can."""
    if not _native.kernels_available():
        return _native.unavailable_reason()
    sm90 = local_gpu_is_sm90()
    if sm90 is None:
        return "JAX sees no CUDA GPU"
    if not sm90:
        capability = getattr(jax.devices("cuda")[0], "compute_capability", "?")
        return f"the GPU has compute capability {capability}; the kernels need SM90 (Hopper)"
    return None


def candidates(problem: Problem, family: str | None = None) -> list[_native.KernelConfig]:
    """The compiled dense rows of ``problem``'s operands (of ``family`` if given) that can
    run it with their default launch attributes (under fast accumulation, promotion 0; the
    fast-accumulation rows only there); none where the build has no kernels of its output
    dtype and activation (_native.kernels_compiled_for)."""
    fast = problem.accumulation == "fast"
    if not _native.kernels_compiled_for(problem.dtype, problem.activation):
        return []
    return [row for row in _native.kernel_configs().values()
            if row.operands == problem.operands and (family is None or row.family == family)
            and not row.grouped
            and (fast or not row.fast_accumulation)
            and row.runs(problem.m)
            and not _native.can_implement(
                row.id, m=problem.m, n=problem.n, k=problem.k,
                promotion=(_launch.FAST_ACCUMULATION if fast
                           else _launch.Launch(row.id).promotion_interval))]


def check_forced_launch(launch: _launch.Launch, problem: Problem, kernel: str = "auto") -> None:
    """A clear ValueError where a forced launch cannot run the problem."""
    row = launch.row
    if not row.compiled:
        raise ValueError(f"launch={launch}: config {row.id} is not compiled in this build "
                         "(install with JAX_SWIGLU_ALL_CONFIGS=1)")
    if row.operands != problem.operands:
        have = ("16-bit (PackedWeights)" if problem.operands == "16bit"
                else f"{problem.operands} fp8 (QuantizedWeights)")
        raise ValueError(f"launch={launch}: config {row.id} runs {row.operands} operands, but "
                         f"the weights are {have}")
    if kernel not in ("auto", row.family):
        raise ValueError(f"launch={launch} is a {row.family} row, but kernel={kernel!r}")
    why = launch.cannot_run(problem.m, problem.n, problem.k)
    if why:
        raise ValueError(f"launch={launch}: {why}")



def _no_kernel_of(problem: Problem | GroupedProblem, kernel: str, launch) -> Choice | None:
    """The XLA path's Choice where this build compiled no kernel with ``problem``'s output
    dtype and activation (float16 GELU outside a JAX_SWIGLU_ALL_CONFIGS build), else None;
    a forced kernel or launch is then an error."""
    if _native.kernels_compiled_for(problem.dtype, problem.activation):
        return None
    why = (f"this build compiled no {problem.dtype} {problem.activation} kernels (install with "
           "JAX_SWIGLU_ALL_CONFIGS=1)")
    if kernel != "auto" or launch is not None:
        what = f"launch={launch}" if launch is not None else f"kernel={kernel!r}"
        raise ValueError(f"{what} was requested, but {why}")
    _warn_once(f"jax_swiglu: {why}; using the XLA path")
    return Choice(None, why)


def _no_fused_kernel(kernel: str, launch, platform: str) -> Choice | None:
    """The XLA path's Choice where no fused kernel can run the call (kernel='xla', another
    platform, no extension, no SM90 GPU), None where one can. A forced kernel or launch that
    cannot run on CUDA is an error; elsewhere the reference is the only path."""
    if kernel == "xla":
        return Choice(None, "kernel='xla'", "override")
    forced = kernel != "auto" or launch is not None
    what = f"launch={launch}" if launch is not None else f"kernel={kernel!r}"
    if platform != "cuda":
        if forced:
            return Choice(None, f"{what} ignored on platform {platform!r}: no fused kernel there")
        return Choice(None, f"platform {platform!r} has no fused kernel")
    if not _native.kernels_available():
        why = _native.unavailable_reason()
        if forced:
            raise RuntimeError(f"{what} was requested, but {why}")
        _warn_once(f"jax_swiglu: {why}")
        return Choice(None, "the CUDA extension is not built")
    if local_gpu_is_sm90() is False:
        why = "the fused kernels need an SM90 (Hopper) GPU and this GPU is not one"
        if forced:
            raise RuntimeError(f"{what} was requested, but {why}")
        _warn_once(f"jax_swiglu: {why}; using the XLA path")
        return Choice(None, "GPU is not SM90")
    return None

def choose(problem: Problem, *, kernel: str = "auto", launch: _launch.Launch | None = None,
           platform: str = "cuda") -> Choice:
    """Picks what runs ``problem`` on ``platform``: a forced ``launch``, or a family's best
    candidate (``kernel``, already resolved by ``requested_kernel``), or the engine's pick
    among every candidate and the XLA path."""

    kernel = canonical_kernel(kernel)
    no_kernel = _no_fused_kernel(kernel, launch, platform) or _no_kernel_of(problem, kernel,
                                                                            launch)
    if no_kernel is not None:
        return no_kernel

    if launch is not None:
        check_forced_launch(launch, problem, kernel)
        return Choice(launch, "forced", f"launch={launch}")
    family = None if kernel == "auto" else kernel
    found = candidates(problem, family)
    if family is not None and not found:
        rows = sorted((row for row in _native.kernel_configs().values()
                       if row.family == family and row.operands == problem.operands),
                      key=lambda row: -(row.max_m or 1 << 30))
        if not rows:
            raise ValueError(f"kernel={kernel!r} was requested, but this build has no "
                             f"{family} kernel on {problem.operands} operands")
        why = _native.can_implement(rows[0].id, m=problem.m, n=problem.n, k=problem.k,
                                    promotion=_launch.Launch(rows[0].id).promotion_interval)
        raise ValueError(f"kernel={kernel!r} was requested, but no compiled {family} config "
                         f"runs M={problem.m} N={problem.n} K={problem.k}: {why}")
    decision = _engine.decide(problem, found, xla_allowed=family is None, version=__version__)
    source = decision.source if family is None else f"kernel={kernel!r}, then {decision.source}"
    return Choice(decision.launch, decision.reason, source)


# --- the decode form's plain projection (fused_mlp's fp8 down projection) -------------------

# The token counts at which the e4m3 down projection runs on a gemv row rather than XLA's
# scaled fp8 dot. At one token XLA turns the dot into a reduction that streams the weights at
# about the HBM rate; from two tokens it runs a GEMM kernel, which the gemv row's stream beats
# while its token tile stays small (benchmarks/research/down_projection.py measures both).
PROJECTION_TOKENS = range(2, 9)


def choose_projection(m: int, n_out: int, k: int, dtype: str, *, operands: str = "e4m3",
                      accumulation: str = "promoted", platform: str = "cuda") -> Choice:
    """What runs a plain projection ``[m, k] x [k, n_out]`` (a block's down projection on
    ``operands``, output ``dtype``): a gemv row at M in PROJECTION_TOKENS, the row and the
    split of K the cost model picks (_heuristic.projection_gemv; no tuning data measures
    projections yet); else XLA's dot."""
    no_kernel = _no_fused_kernel("auto", None, platform)
    if no_kernel is not None:
        return no_kernel
    if m not in PROJECTION_TOKENS:
        return Choice(None, f"M={m} tokens: XLA's dot (the gemv projection runs "
                      f"{PROJECTION_TOKENS.start}-{PROJECTION_TOKENS.stop - 1})", "heuristic")
    if n_out % 2:
        return Choice(None, f"N={n_out} output columns are odd", "heuristic")
    problem = Problem(m, n_out // 2, k, dtype, operands, "silu", accumulation)
    picked = _engine.decide_projection(m, n_out, k, candidates(problem, "gemv"),
                                       1 if operands == "e4m3" else 2)
    if picked is None:
        return Choice(None, f"no compiled gemv row runs M={m} N={n_out} K={k}", "heuristic")
    launch, reason = picked
    if accumulation == "fast":
        launch = dataclasses.replace(launch, promotion=_launch.FAST_ACCUMULATION)
    why = _native.can_implement_projection(launch.config, m=m, n=n_out, k=k,
                                            splits=launch.splits,
                                            promotion=launch.promotion_interval)
    if why:
        return Choice(None, f"the gemv row cannot run the projection: {why}", "heuristic")
    return Choice(launch, reason, "heuristic")


# --- grouped (mixture-of-experts) calls ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GroupedProblem:
    """One grouped call: ``m`` rows of x sorted by expert over ``experts`` packed ``[k, 2n]``
    weight matrices, output ``dtype``; the routing (group sizes) is known only on the
    device."""

    m: int
    n: int
    k: int
    experts: int
    dtype: str
    activation: str = "silu"
    operands: str = "16bit"


def grouped_candidates(problem: GroupedProblem) -> list[_native.KernelConfig]:
    """The compiled grouped rows that can run ``problem``."""
    return [row for row in _native.kernel_configs().values()
            if row.grouped and row.operands == problem.operands
            and not _native.can_implement(row.id, m=problem.m, n=problem.n, k=problem.k,
                                          experts=problem.experts)]


def check_forced_grouped_launch(launch: _launch.Launch, problem: GroupedProblem) -> None:
    """A clear ValueError where a forced launch cannot run the grouped problem."""
    row = launch.row
    if not row.compiled:
        raise ValueError(f"launch={launch}: config {row.id} is not compiled in this build "
                         "(install with JAX_SWIGLU_ALL_CONFIGS=1)")
    if not row.grouped:
        grouped = sorted(r.id for r in _native.kernel_configs().values() if r.grouped)
        raise ValueError(f"launch={launch}: config {row.id} is a dense row; grouped calls run "
                         f"the grouped rows ({', '.join(map(str, grouped)) or 'none compiled'})")
    why = launch.cannot_run(problem.m, problem.n, problem.k, problem.experts)
    if why:
        raise ValueError(f"launch={launch}: {why}")


def choose_grouped(problem: GroupedProblem, *, kernel: str = "auto",
                   launch: _launch.Launch | None = None, platform: str = "cuda",
                   data: _data.TuningData | None = None) -> Choice:
    """What runs a grouped call on ``platform``: a forced ``launch``, the XLA path
    (``kernel="xla"``, no CUDA, no extension, no SM90 GPU), or the grouped row the cost model
    (_model.grouped_us: tiles of each expert's rows, rounds over the SMs, each active
    expert's weights streamed once, rereads) predicts closest to the best under both a
    balanced and a skewed routing (_model.routings), since the routing is not known when
    the call is compiled; each prediction corrected by the grouped measurements of the
    shipped tuning data (or ``data``) nearby."""
    no_kernel = _no_fused_kernel(kernel, launch, platform) or _no_kernel_of(problem, kernel,
                                                                            launch)
    if no_kernel is not None:
        return no_kernel
    if launch is not None:
        check_forced_grouped_launch(launch, problem)
        return Choice(launch, "forced", f"launch={launch}")
    found = grouped_candidates(problem)
    if not found:
        if kernel != "auto":
            raise ValueError(f"kernel={kernel!r} was requested, but no compiled grouped config "
                             f"runs T={problem.m} N={problem.n} K={problem.k} over "
                             f"{problem.experts} experts")
        return Choice(None, "no compiled grouped config runs it", "heuristic")
    device, _ = _engine.device_and_data(data)
    data = data or _data.corrections_for(device.kind, "bfloat16", grouped=True)
    model = _model.Problem(problem.m, problem.n, problem.k)
    # The routing is on the device: weigh a balanced and a skewed one, and take the row whose
    # worse ratio to the best of that routing is least (ties: the faster balanced). Each
    # prediction is corrected by the row's grouped measurements nearby (another SM90 part's
    # where this one has none, as for dense calls: the model carries this part's SMs).
    scenarios = _model.routings(problem.m, problem.experts)
    corrected = set()

    def predicted(row, name, groups):
        us = _model.grouped_us(row, model, groups, device.sm_count, device.dram_bytes_per_s,
                               data.constants)
        factor = data.grouped_correction(row.key, name, "bfloat16", problem.m, problem.n,
                                         problem.k, problem.experts)
        if factor is not None:
            corrected.add(row.id)
        return us * (factor or 1.0)

    times = {row.id: {name: predicted(row, name, groups) for name, groups in scenarios.items()}
             for row in found}
    best = {name: min(t[name] for t in times.values()) for name in scenarios}
    regret = {i: max(t[name] / best[name] for name in scenarios) for i, t in times.items()}
    ranked = sorted(times, key=lambda i: (round(regret[i], 3), times[i]["balanced"], i))
    pick = ranked[0]

    def said(i):
        return (f"config {i} {times[i]['balanced']:.1f} us balanced, "
                f"{times[i]['skewed']:.1f} us skewed")
    runner_up = f"; next {said(ranked[1])}" if len(ranked) > 1 else ""
    rule = ("heuristic" if not corrected else "tuning data (learned rule)"
            if data.device["kind"] == device.kind else OTHER_GPU_DATA)
    source = rule if kernel == "auto" else f"kernel={kernel!r}, then {rule}"
    basis = (f"the cost model on {device.sm_count} SMs, corrected by the grouped measurements "
             f"of {data.device['kind']} in {data.source.rsplit('/', 1)[-1]}" if corrected
             else f"the cost model on {device.sm_count} SMs")
    return Choice(_launch.Launch(pick), f"predicted {said(pick)} (within "
                  f"{regret[pick]:.2f}x of the best of either routing){runner_up} ({basis})",
                  source)
