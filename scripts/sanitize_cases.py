#!/usr/bin/env python3
"""The fused kernels on edge shapes, for compute-sanitizer (driven by scripts/sanitize.sh).

    python scripts/sanitize_cases.py plan                  # every tool's cases
    python scripts/sanitize_cases.py run --tool memcheck   # run one tool's cases (under the tool)
    python scripts/sanitize_cases.py report --tool memcheck LOG   # one summary line; exit status

``run`` calls every compiled row of the config table (forced with ``swiglu(..., launch=...)``)
at each of its split choices on the cases of ``PLANS``: partial tiles in M on the smallest and
the largest Qwen2.5 MLP. Grouped rows run ``grouped_swiglu`` over three experts (the MLP's
weights, an empty expert of zeros, the weights again) with a row past the groups where M > 1.
It prints ``CASE ...`` before each call and ``OK``/``WRONG`` after it, then ``DONE``. Each result is also checked against a host fp32 reference (the criterion of
tests/kernels/criterion.py; the fp8 rows against the fp8 spec),
so a hazard that corrupts the output shows up even when the tool says nothing. Inputs are
made on the host and copied over, and the reference is computed on the host, so the only
device work is the kernel, one fill (the NaN poison the output is written into) and copies:
no XLA GEMM (cuBLAS kernels can be named ``cutlass*`` too) runs under the tool.

``report`` reads the tool's output (compute-sanitizer's ``=========`` lines mixed with the
driver's) and sorts every finding: *ours* when the kernel it names contains ``jax_swiglu``,
``SwiGluEpilogue``, ``GemmUniversal`` or ``cutlass`` (or, for a failing CUDA call, when our
launcher is in its host backtrace); *other* otherwise (XLA's own kernels, runtime calls that
XLA expects to fail). Exit status: 0 clean (findings in other code are listed, not failed),
1 a finding in our kernels or a wrong result, 2 incomplete (the run did not finish, the
tool failed, or errors went unprinted) with nothing found.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time

# compute-sanitizer tracks each device allocation: keep XLA from preallocating most of the
# GPU (the tool needs room for its shadow memory) and give every buffer its own allocation
# (XLA's BFC allocator carves buffers out of large blocks, so an overrun into a neighbouring
# buffer would be invisible to memcheck). No autotuning (it would run and check many
# kernels that are not ours) and no command buffers (direct launches, simpler backtraces).
# Read when the backend starts, so set before jax is imported.
SANITIZER_ENV = {
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "XLA_PYTHON_CLIENT_ALLOCATOR": "platform",
}
SANITIZER_XLA_FLAGS = ("--xla_gpu_autotune_level=0", "--xla_gpu_enable_command_buffer=")

EDGE_M = (1, 63, 65, 129)  # one row; around the 64-row (pingpong) and 128-row tiles
GEMV_M = (1, 2, 3, 4, 7, 8, 11, 16)  # the gemv rows' tokens: each row's most, one below it
SMALL, LARGE = "qwen2.5-0.5b", "qwen2.5-72b"  # (896, 4864) and (8192, 29568)


@dataclasses.dataclass(frozen=True)
class Plan:
    m_values: tuple[int, ...]
    models: tuple[str, ...]
    why: str


PLANS = {
    "memcheck": Plan(EDGE_M, (SMALL, LARGE), "out-of-bounds and misaligned accesses"),
    "synccheck": Plan(EDGE_M, (SMALL, LARGE), "invalid use of barriers"),
    "initcheck": Plan((1, 65), (SMALL, LARGE), "reads of uninitialized global memory"),
    # racecheck instruments every shared-memory access and is by far the slowest tool:
    # one partial and one single-row tile, small shape only.
    "racecheck": Plan((1, 65), (SMALL,), "shared-memory hazards (slowest tool: fewest cases)"),
}

OURS = re.compile(r"jax_swiglu|SwiGluEpilogue|GemmUniversal|cutlass", re.IGNORECASE)
OUR_LAUNCHER = re.compile(r"jax_swiglu::|/jax_swiglu/_kernels")
PREFIX = "========="


# --- run ------------------------------------------------------------------------------------

def _set_sanitizer_env() -> None:
    for name, value in SANITIZER_ENV.items():
        os.environ.setdefault(name, value)
    flags = os.environ.get("XLA_FLAGS", "").split()
    for flag in SANITIZER_XLA_FLAGS:
        if not any(f.split("=")[0] == flag.split("=")[0] for f in flags):
            flags.append(flag)
    os.environ["XLA_FLAGS"] = " ".join(flags)


def _host_inputs(k: int, n: int, m_max: int, seed: int):
    """x [m_max, K] and packed [K, 2 N_pad] (bf16, unit-variance products), and the fp32
    reference SiLU(x @ Wg) * (x @ Wu) [m_max, N] from the same rounded values."""
    import ml_dtypes
    import numpy as np

    from jax_swiglu import _layout

    rng = np.random.default_rng(seed)
    n_pad = _layout.padded_n(n)

    def uniform(shape, scale):  # unit variance before scaling; faster than normal
        a = rng.random(shape, dtype=np.float32)
        a -= 0.5
        a *= np.float32(np.sqrt(12.0) * scale)
        return a.astype(ml_dtypes.bfloat16)

    x = uniform((m_max, k), 1.0)
    packed = uniform((k, 2 * n_pad), 1.0 / np.sqrt(k))
    if n % _layout.GATE_UP_BLOCK:  # padded columns are zero, as pack_weights makes them
        padding = np.arange(n_pad) >= n
        packed[:, np.asarray(_layout.interleave_gate_up(padding, padding))] = 0
    acc = x.astype(np.float32) @ packed.astype(np.float32)  # [m_max, 2 N_pad]
    gate, up = _layout.split_gate_up(acc, n)
    with np.errstate(over="ignore"):
        reference = gate / (1.0 + np.exp(-gate)) * up
    return x, packed, reference


def check(y, reference):
    """(elements off, relative Frobenius error): the criterion of tests/kernels/criterion.py."""
    import numpy as np

    y = np.asarray(y, np.float32)
    diff = np.abs(y - reference)
    ok = diff <= 0.01 * np.abs(reference) + 1e-3  # False for NaN: unwritten elements count
    rel_fro = float(np.linalg.norm(np.nan_to_num(y - reference, nan=np.inf))
                    / np.linalg.norm(reference))
    return int(np.sum(~ok)), rel_fro


def lowered_config(text: str) -> int | None:
    """The tile config of the (one) fused custom call in StableHLO text, None if none."""
    calls = [line for line in text.splitlines() if "custom_call @jax_swiglu_" in line]
    found = [re.search(r"\bconfig = (\d+) : i64", line) for line in calls]
    configs = {int(f.group(1)) for f in found if f}
    if len(configs) > 1:
        raise AssertionError(f"several configs in one function: {sorted(configs)}")
    return configs.pop() if configs else None


def run(tool: str, m_values, models, allow_reference: bool) -> int:
    _set_sanitizer_env()
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_swiglu
    from jax_swiglu import selection

    # The kernel suite's criterion module (imported after the environment above is set): the
    # outputs per million an e4m3 row may put past the line, at least one.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                    "tests", "kernels"))
    from criterion import FAST_OFF_PER_MILLION, FEW_OFF_PER_MILLION

    print(f"jax {jax.__version__}, devices {jax.devices()}, " + ", ".join(
        f"{name}={os.environ.get(name, '')!r}" for name in (*SANITIZER_ENV, "XLA_FLAGS")))
    unusable = selection.kernels_unusable_reason()
    if unusable and not allow_reference:
        print(f"SETUP the fused kernels cannot run here: {unusable}")
        return 2
    configs = jax_swiglu.kernel_configs()
    if not configs:
        print(f"SETUP no compiled tile configs: {jax_swiglu.unavailable_reason()}")
        return 2
    if unusable:
        print(f"NOTE reference path only ({unusable}); configs are checked in the CUDA lowering")

    def fused(launch, weights):
        # The NaN-filled first argument is donated and aliased to the output, so an element
        # the kernel skips stays NaN (see tests/kernels/criterion.py). A fast-accumulation row
        # runs as accumulation="fast" asks for it.
        accumulation = "fast" if launch.row.fast_accumulation else "promoted"
        return jax.jit(lambda poison, x, w: jax_swiglu.swiglu(x, weights(w), launch=launch,
                                                              accumulation=accumulation),
                       donate_argnums=0, keep_unused=True)

    def grouped_fused(launch, n):
        return jax.jit(lambda poison, x, data, sizes: jax_swiglu.grouped_swiglu(
            x, jax_swiglu.PackedExperts.from_packed_data(data, n), sizes, launch=launch),
            donate_argnums=0, keep_unused=True)

    shapes = {"qwen2.5-0.5b": (896, 4864), "qwen2.5-72b": (8192, 29568)}
    data = {}
    for model in models:
        k, n = shapes[model]
        start = time.time()
        x, packed, reference = _host_inputs(k, n, max(*m_values, *GEMV_M), seed=len(data))
        data[model] = (k, n, x, jax.device_put(packed), reference)
        print(f"inputs {model} K={k} N={n}: {time.time() - start:.1f} s")

    # A row that runs M in bands runs only multiples of its bands (none of the M here); a
    # gemv row runs at most its few tokens, and its M here are its own (GEMV_M).
    def ms(row):
        return [m for m in (GEMV_M if row.max_m else m_values) if row.runs(m)]
    for row in configs.values():
        if not ms(row):
            print(f"NOTE config {row.id} runs M in bands of {row.m_multiple} rows: no case here")
    # Stream-K rows also run as split-K (their workspace and fixed-order reduction), gemv rows
    # at every cluster size. SANITIZE_CONFIGS="18 19" limits the run to those rows.
    only = {int(c) for c in os.environ.get("SANITIZE_CONFIGS", "").split()}
    min_k = min(shapes[model][0] for model in models)
    launches = [jax_swiglu.Launch(row.id, splits) for row in configs.values()
                if not only or row.id in only
                for splits in jax_swiglu._native.split_choices(row.id, min_k)]
    planned = sum(len(ms(launch.row)) for launch in launches) * len(models)
    print(f"PLAN tool={tool} cases={planned}")
    cases = wrong = 0
    quantized, quantized_reference = {}, {}
    for launch in launches:
        row = launch.row
        fp8 = row.operands == "e4m3"
        for model in models:
            k, n, x_all, packed, reference = data[model]
            if fp8 and model not in quantized:
                gate, up = jax_swiglu._layout.split_gate_up(packed.astype(jnp.float32), n)
                quantized[model] = jax_swiglu.quantize_weights(gate, up)
            weights = quantized[model] if fp8 else packed
            fn = fused(launch, (lambda w: w) if fp8
                       else (lambda data, n=n: jax_swiglu.PackedWeights.from_packed_data(data, n)))
            if row.grouped:
                # Three experts: the packed weights, zeros (an expert with no rows: a row
                # given to it would come out 0) and the packed weights again; the last row
                # of x is past the groups (zeros) where M > 1.
                weights = jnp.stack([packed, jnp.zeros_like(packed), packed])
                fn = grouped_fused(launch, n)
            for m in ms(row):
                cases += 1
                label = (f"tool={tool} kernel={row.family}{'-fp8' if fp8 else ''}"
                         f"{'-grouped' if row.grouped else ''} config={row.id} "
                         f"splits={launch.splits} {model} m={m} k={k} n={n}")
                print(f"CASE {label}")
                start = time.time()
                try:
                    x = jax.device_put(x_all[:m])
                    poison = jnp.full((m, n), jnp.nan, x.dtype)
                    args = (poison, x, weights)
                    expected = reference[:m]
                    if row.grouped:
                        first = max(1, m // 3)
                        sizes = jnp.array([first, 0, max(0, m - 1 - first)], jnp.int32)
                        args += (sizes,)
                        expected = np.where(np.arange(m)[:, None] < int(sizes.sum()),
                                            reference[:m], 0.0)
                    lowered = lowered_config(fn.trace(*args).lower(
                        lowering_platforms=("cuda",)).as_text())
                    if lowered != row.id:
                        raise AssertionError(f"the CUDA lowering uses config {lowered}")
                    y = jax.block_until_ready(fn(*args))
                    if fp8:
                        # Once per shape at the most rows (x is quantized per row, so the
                        # first m rows are each case's): its fp32 weights are large, and a
                        # copy per case can exhaust the GPU's memory under memcheck.
                        if model not in quantized_reference:
                            quantized_reference[model] = np.asarray(
                                jax_swiglu.swiglu_reference_quantized(
                                    jax.device_put(x_all), weights), np.float32)
                        expected = quantized_reference[model][:m]
                    off, rel_fro = check(y, expected)
                    # The kernel suite's allowances.
                    allowed = (0 if not fp8 else max(1.0, y.size / 1e6 * (
                        FAST_OFF_PER_MILLION if row.fast_accumulation else FEW_OFF_PER_MILLION)))
                    verdict = "OK" if off <= allowed and rel_fro < 1e-2 else "WRONG"
                    detail = f"off={off} rel_fro={rel_fro:.3g}"
                except Exception as error:  # noqa: BLE001 (reported, counted, carried on)
                    message = " ".join(str(error).split())[:500]  # one line
                    verdict, detail = "WRONG", f"{type(error).__name__}: {message}"
                wrong += verdict == "WRONG"
                print(f"{verdict} {label} {detail} ({time.time() - start:.1f} s)")
    print(f"DONE tool={tool} cases={cases} wrong={wrong}")
    return 1 if wrong else 0


# --- report ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Finding:
    kind: str  # "device", "race", "api"
    header: str
    lines: list[str]
    case: str  # the last CASE line printed before it
    severity: str = "error"  # racecheck: "error" or "warning"

    @property
    def text(self) -> str:
        # Host frames name the libraries that launched a kernel, not the kernel: a frame of
        # XLA's would not make a finding XLA's, nor one of ours make it ours.
        return "\n".join(line for line in [self.header, *self.lines]
                         if "Host Frame" not in line and "host backtrace" not in line)

    @property
    def count(self) -> int:
        """How many errors the tool may count for it (racecheck's analysis merges hazards)."""
        match = re.search(r"\[(\d+) hazards?\]", "\n".join([self.header, *self.lines]))
        return int(match.group(1)) if match else 1

    @property
    def ours(self) -> bool:
        if self.kind == "api":  # a failing CUDA call: ours if our launcher made it
            return bool(OUR_LAUNCHER.search("\n".join(self.lines)))
        return bool(OURS.search(self.text))


@dataclasses.dataclass
class Report:
    findings: list[Finding] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # tool-level messages
    summary_errors: int | None = None  # "ERROR SUMMARY: N errors"
    summaries: list[str] = dataclasses.field(default_factory=list)  # the tool's own
    unprinted: int = 0
    planned: int | None = None  # "PLAN ... cases=N"
    cases: int = 0
    ok: int = 0
    wrong: list[str] = dataclasses.field(default_factory=list)
    done: str | None = None
    setup: str | None = None


TOOL_MESSAGES = re.compile(
    r"^(COMPUTE-SANITIZER|RACECHECK SUMMARY|LEAK SUMMARY|Target application|"
    r"Internal Sanitizer Error|Error:|Warning:|Cuda-sanitizer|Note:)")


def parse(text: str) -> Report:
    report = Report()
    case = ""
    block: Finding | None = None

    def close():
        nonlocal block
        if block is not None:
            report.findings.append(block)
        block = None

    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.startswith(PREFIX):
            close()  # the driver's output ends a block
            if line.startswith("CASE "):
                case = line[5:]
                report.cases += 1
            elif line.startswith("OK "):
                report.ok += 1
            elif line.startswith("WRONG "):
                report.wrong.append(line[6:])
            elif line.startswith("PLAN ") and (match := re.search(r"cases=(\d+)", line)):
                report.planned = int(match.group(1))
            elif line.startswith("DONE "):
                report.done = line[5:]
            elif line.startswith("SETUP "):
                report.setup = line[6:]
            continue
        body = line[len(PREFIX):]
        if not body.strip():
            close()
            continue
        if body.startswith("  ") and block is not None:  # continuation of a finding
            block.lines.append(body.strip())
            continue
        close()
        message = body.strip()
        if match := re.search(r"(\d+) errors? (were|was) not printed", message):
            report.unprinted += int(match.group(1))
        elif match := re.match(r"ERROR SUMMARY: (\d+) error", message):
            report.summary_errors = int(match.group(1))
            report.summaries.append(message)
        elif message.startswith("RACECHECK SUMMARY"):
            report.summaries.append(message)
        elif match := re.match(r"(Error|Warning): Race reported", message):
            block = Finding("race", message, [], case, severity=match.group(1).lower())
        elif match := re.match(r"(ERROR|WARNING|INFO): Potential \w+ hazard", message):
            # racecheck's per-hazard report (--racecheck-report hazard|all)
            severity = "error" if match.group(1) == "ERROR" else "warning"
            block = Finding("race", message, [], case, severity=severity)
        elif message.startswith("Program hit"):
            block = Finding("api", message, [], case)
        elif TOOL_MESSAGES.match(message):
            if not message.startswith("COMPUTE-SANITIZER"):
                report.notes.append(message)
        else:  # a device-side finding: "Invalid __global__ read ...", "Barrier error ..."
            block = Finding("device", message, [], case)
    close()
    return report


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def summarize(tool: str, report: Report, exit_code: int | None = None,
              seconds: float | None = None) -> tuple[str, int]:
    """One summary line for the tool, and the exit status (see the module docstring)."""
    errors = [f for f in report.findings if f.severity == "error"]
    ours = [f for f in errors if f.ours]
    other = [f for f in errors if not f.ours]
    warnings = [f for f in report.findings if f.severity == "warning"]
    planned = report.planned

    problems = []
    if report.setup:
        problems.append(f"setup: {report.setup}")
    timed_out = exit_code in (124, 137)  # timeout(1): TERM, then KILL
    if report.done is None:
        how = f"exit {exit_code}" + (" (timed out)" if timed_out else "")
        problems.append(f"did not finish ({how}; {report.ok + len(report.wrong)} of "
                        f"{planned if planned is not None else '?'} cases ran)")
    elif timed_out:
        problems.append("the cases ran, but the tool timed out before its summary")
    if not report.summaries and not report.setup:
        # The tool prints its summary last; without it, reports may be missing too.
        problems.append("the tool printed no ERROR SUMMARY")
    if report.unprinted:
        problems.append(f"{report.unprinted} errors not printed (raise PRINT_LIMIT)")
    elif (report.summary_errors is not None
          and report.summary_errors > sum(f.count for f in report.findings)):
        # A finding in a form this parser does not know must not pass for a clean run.
        problems.append(f"the tool counted {report.summary_errors} errors but "
                        f"{len(report.findings)} were recognized: read the log")
    problems += [n for n in report.notes if n.startswith("Internal Sanitizer Error")]

    if ours or report.wrong:
        verdict, status = "FAIL", 1
    elif problems:
        verdict, status = "INCOMPLETE", 2
    else:
        verdict, status = "PASS", 0
    parts = [f"{tool}: {verdict}",
             f"cases {report.ok} ok / {len(report.wrong)} wrong"
             + (f" of {planned}" if planned is not None else ""),
             f"findings in our kernels {len(ours)}",
             f"elsewhere {len(other)} (XLA/runtime, not failed)"]
    if warnings:
        ours_w = sum(f.ours for f in warnings)
        parts.append(f"racecheck warnings {len(warnings)} ({ours_w} ours, not failed)")
    if report.summaries:
        parts.append("the tool says: " + ", ".join(report.summaries))
    if seconds is not None:
        parts.append(f"{seconds:.0f} s")
    line = "; ".join(parts)
    for finding in ours[:3]:
        where = next((f" | {_short(l, 100)}" for l in finding.lines if l.startswith("at ")), "")
        line += (f"\n  ours: {_short(finding.header)}{where} | after CASE "
                 f"{finding.case or '(none yet)'}")
    if other:
        line += f"\n  first elsewhere: {_short(other[0].header)}"
    for wrong in report.wrong[:3]:
        line += f"\n  wrong: {_short(wrong, 240)}"
    for problem in problems:
        line += f"\n  {problem}"
    return line, status


def _planned_cases(tool: str):
    import jax_swiglu

    plan = PLANS[tool]
    for config in jax_swiglu.kernel_configs():
        for model in plan.models:
            for m in plan.m_values:
                yield config, model, m


# --- command line ---------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("plan", help="print every tool's cases")
    run_parser = sub.add_parser("run", help="run one tool's cases (under compute-sanitizer)")
    run_parser.add_argument("--tool", choices=sorted(PLANS), required=True)
    run_parser.add_argument("--m", help="override the M values, e.g. 1,65")
    run_parser.add_argument("--models", help="override the models, e.g. qwen2.5-0.5b")
    run_parser.add_argument("--allow-reference", action="store_true",
                            help="run without an SM90 GPU (the XLA path; for testing this script)")
    report_parser = sub.add_parser("report", help="summarize a tool's log")
    report_parser.add_argument("--tool", choices=sorted(PLANS), required=True)
    report_parser.add_argument("--exit-code", type=int, help="the tool's exit status")
    report_parser.add_argument("--seconds", type=float)
    report_parser.add_argument("log")
    args = parser.parse_args(argv)

    if args.command == "plan":
        for tool, plan in PLANS.items():
            cases = list(_planned_cases(tool))
            print(f"{tool}: {plan.why}; M {list(plan.m_values)} x {list(plan.models)} x every "
                  f"compiled config: {len(cases)} calls")
        return 0
    if args.command == "run":
        plan = PLANS[args.tool]
        m_values = tuple(int(m) for m in args.m.split(",")) if args.m else plan.m_values
        models = tuple(args.models.split(",")) if args.models else plan.models
        return run(args.tool, m_values, models, args.allow_reference)
    with open(args.log, errors="replace") as f:
        report = parse(f.read())
    line, status = summarize(args.tool, report, args.exit_code, args.seconds)
    print(line)
    return status


if __name__ == "__main__":
    sys.exit(main())
