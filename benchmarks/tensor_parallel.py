"""Tensor-parallel SwiGLU MLP on several GPUs: jax_swiglu's fused_mlp against the same
sharded MLP in plain XLA, checked against one GPU.

    python -m benchmarks.tensor_parallel                       # all local GPUs, 7B and 72B, M 2048 8192
    python -m benchmarks.tensor_parallel --tp 2 --m 2048       # 2-way tensor parallel
    python -m benchmarks.tensor_parallel --tp 2 --data 2       # 2 x 2: tokens sharded too

The Megatron layout on a ("data", "model") mesh: the packed gate/up weights split along N
in whole gate/up pairs over "model" (column parallel), w_down split along its rows over
"model" (row parallel), tokens split over "data" (replicated when --data is 1). Each
device runs the fused kernel on its own [M/data, N/tp] block; the one communication is the
all-reduce of the down projection's partial sums.

Per (shape, M) it reports:
  * correctness: the tensor-parallel result against the same MLP on one GPU (the kernel's
    criterion: no element with |y - y1| > 0.01 |y1| + 1e-3), and both against an fp32
    reference of the down projection taken from the spec's SwiGLU output;
  * GPU time through CUPTI (jax.experimental.mosaic.gpu.profiler.measure), median over
    iterations, split into compute kernels and NCCL kernels, per device (kernel time summed
    over the devices / device count). NCCL kernel time includes the wait for the slowest
    peer, so it bounds the all-reduce from above;
  * wall time of the jitted call.
for fused_mlp (auto kernel choice, from the local shapes) as called by default (bf16 partial
sums into the all-reduce), for fused_mlp with reduce_dtype=float32 (fp32 partial sums: the
one-GPU result up to the order of summation), and for the plain XLA MLP on the same weights.
NVLink SHARP (NCCL_NVLS_ENABLE) is switched off before JAX starts.

Writes benchmarks/results/<gpu>/<date>-tp<T>x<D>.json and .md. Without CUDA GPUs (CPU
host devices, for testing the script) only the checks and wall times are produced.
"""

from __future__ import annotations

import os

# NVLink multicast must stay off on the lent machines; NCCL reads this when it starts.
os.environ["NCCL_NVLS_ENABLE"] = "0"

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jax_swiglu  # noqa: E402
from benchmarks.shapes import QWEN25_MLPS  # noqa: E402

from . import bench_swiglu, environment as environment_lib  # noqa: E402

MODELS = ("qwen2.5-7b", "qwen2.5-72b")
M_VALUES = (2048, 8192)
RELATIVE_TOLERANCE, ABSOLUTE_TOLERANCE = 0.01, 1e-3  # the kernel tests' criterion
DEFAULT_REDUCE_REL_FRO = 1e-2  # bf16 partial sums: relative Frobenius error bound vs one GPU


def xla_mlp(x, w_gate, w_up, w_down):
    """The same MLP block in plain XLA, as a model would write it."""
    return (jax.nn.silu(x @ w_gate) * (x @ w_up)) @ w_down


def make_weights(key, k, n, dtype=jnp.bfloat16):
    kg, ku, kd = jax.random.split(key, 3)
    w_gate = (jax.random.normal(kg, (k, n), jnp.float32) / math.sqrt(k)).astype(dtype)
    w_up = (jax.random.normal(ku, (k, n), jnp.float32) / math.sqrt(k)).astype(dtype)
    w_down = (jax.random.normal(kd, (n, k), jnp.float32) / math.sqrt(n)).astype(dtype)
    return w_gate, w_up, w_down


def compare(y, reference) -> dict:
    """Elements off by more than the kernel tolerance, and the relative Frobenius error."""
    y, reference = (np.asarray(a, np.float32) for a in (y, reference))
    off = np.abs(y - reference) > RELATIVE_TOLERANCE * np.abs(reference) + ABSOLUTE_TOLERANCE
    rel = float(np.linalg.norm(y - reference) / max(np.linalg.norm(reference), 1e-30))
    return {"mismatches": int(off.sum()), "rel_fro": rel,
            "max_abs": float(np.max(np.abs(y - reference))), "nan": int(np.isnan(y).sum())}


def measure(fn, args, iterations, devices, cupti: bool) -> dict:
    """Median GPU kernel time per device, compute and NCCL apart (ms), and the wall time."""
    jax.block_until_ready(fn(*args))  # compile
    bench_swiglu._warm_up(fn, args)
    result = {"wall_ms": statistics.median(bench_swiglu._wall_samples_ms(fn, args, iterations))}
    if not cupti:
        return result
    from jax.experimental.mosaic.gpu import profiler
    compute, comm, kernels = [], [], None
    for _ in range(iterations):
        # One call per measurement: with several devices the order in which their kernels
        # finish varies between calls, which measure(iterations=n) would reject.
        _, timings = profiler.measure(fn, aggregate=False)(*args)
        nccl = [t for name, t in timings if "nccl" in name.lower()]
        compute.append((sum(t for _, t in timings) - sum(nccl)) / devices)
        comm.append(sum(nccl) / devices)
        kernels = kernels or sorted({name[:80] for name, _ in timings})
    result.update(compute_ms=statistics.median(compute), nccl_ms=statistics.median(comm),
                  gpu_ms=statistics.median(c + a for c, a in zip(compute, comm)),
                  kernels=kernels)
    return result


def run_case(model, k, n, m, mesh, iterations, cupti, key):
    devices = mesh.devices.size
    put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))  # noqa: E731
    one = jax.devices()[0]
    kx, kw = jax.random.split(key)
    with jax.default_device(one):
        x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
        w_gate, w_up, w_down = make_weights(kw, k, n)
        packed_one = jax_swiglu.pack_weights(w_gate, w_up)
        # One GPU: the same fused MLP, and the fp32 reference of the down projection of the
        # spec's SwiGLU output (so the only differences left are the down projection's order
        # of summation and its rounding).
        y_one = jax.jit(jax_swiglu.fused_mlp)(x, packed_one, w_down)
        h = jax_swiglu.swiglu_reference(x, w_gate, w_up)
        reference = jnp.matmul(h.astype(jnp.float32), w_down.astype(jnp.float32),
                               precision=jax.lax.Precision.HIGHEST)

    xs = put(x, "data", None)
    w_gate_s = put(w_gate, None, "model")  # column parallel
    w_up_s = put(w_up, None, "model")
    w_down_s = put(w_down, "model", None)  # row parallel
    packed = jax_swiglu.pack_weights(w_gate_s, w_up_s)  # shard-local packing, no communication
    out = NamedSharding(mesh, P("data", None))
    fused = jax.jit(jax_swiglu.fused_mlp, out_shardings=out)
    fused_wide = jax.jit(functools.partial(jax_swiglu.fused_mlp, reduce_dtype=jnp.float32),
                         out_shardings=out)
    plain = jax.jit(xla_mlp, out_shardings=out)

    y_tp = fused(xs, packed, w_down_s)
    y_tp_wide = fused_wide(xs, packed, w_down_s)
    y_xla = plain(xs, w_gate_s, w_up_s, w_down_s)
    # After SPMD partitioning: one kernel call per device, one all-reduce.
    hlo = fused.lower(xs, packed, w_down_s).compile().as_text()
    local_call = jax_swiglu.explain(
        jax.ShapeDtypeStruct((m // mesh.shape["data"], k), jnp.bfloat16),
        jax_swiglu.PackedWeights.from_packed_data(packed.data.addressable_shards[0].data, n // mesh.shape["model"]),
        platform="cuda")
    row = {
        "model": model, "m": m, "k": k, "n": n, "devices": devices,
        "mesh": dict(mesh.shape), "local_call": local_call,
        "kernel_calls_in_hlo": len(re.findall(r'custom_call_target="jax_swiglu_', hlo)),
        "all_reduces_in_hlo": len(re.findall(r"= \S+ all-reduce(?:-start)?\(", hlo)),
        "check": {
            "tp_vs_one_gpu": compare(y_tp, y_one),
            "tp_vs_fp32": compare(y_tp, reference),
            "tp_fp32_reduce_vs_one_gpu": compare(y_tp_wide, y_one),
            "tp_fp32_reduce_vs_fp32": compare(y_tp_wide, reference),
            "one_gpu_vs_fp32": compare(y_one, reference),
            "xla_tp_vs_fp32": compare(y_xla, reference),
        },
    }
    row["fused"] = measure(fused, (xs, packed, w_down_s), iterations, devices, cupti)
    row["fused_fp32_reduce"] = measure(fused_wide, (xs, packed, w_down_s), iterations, devices,
                                       cupti)
    row["xla"] = measure(plain, (xs, w_gate_s, w_up_s, w_down_s), iterations, devices, cupti)
    return row


def markdown(result) -> str:
    env = result["environment"]
    lines = [
        "<!-- written by benchmarks/tensor_parallel.py; the JSON next to it has every number -->",
        f"Tensor-parallel SwiGLU MLP (fused_mlp vs the same sharded MLP in plain XLA), mesh "
        f"{result['mesh']} over {result['devices']} x {env['device']}; jax {env['jax']}, "
        f"jaxlib {env['jaxlib']}; {env['date']}; NCCL_NVLS_ENABLE={result['nccl_nvls_enable']}.",
        f"Command: `{env['command']}` (commit {env.get('git')}). Times per device, median of "
        f"{result['iterations']}: GPU compute kernels / NCCL kernels (CUPTI), and wall time.",
        *result.get("notes", []),
        "",
        "`fused` is fused_mlp as called by default (bf16 partial sums into the all-reduce, as "
        "the XLA MLP does); `fused f32` passes reduce_dtype=float32 (fp32 partial sums, one "
        "rounding after the all-reduce). Mismatches: elements off by more than the kernel "
        "tolerance (1% + 1e-3), against the same MLP on one GPU and against an fp32 reference.",
        "",
        "| model | M | fused vs 1 GPU: mismatches (rel) | fused f32 vs 1 GPU | fused f32 vs fp32 "
        "| fused compute / NCCL ms | fused f32 compute / NCCL ms | XLA compute / NCCL ms | "
        "compute speedup | fused / fused f32 / XLA wall ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        c, f, w, x = row["check"], row["fused"], row["fused_fp32_reduce"], row["xla"]
        times = lambda d: (f"{d['compute_ms']:.3f} / {d['nccl_ms']:.3f}"  # noqa: E731
                           if "compute_ms" in d else "-")
        checked = lambda name: f"{c[name]['mismatches']} ({c[name]['rel_fro']:.1e})"  # noqa: E731
        speedup = (f"{x['compute_ms'] / f['compute_ms']:.2f}x" if "compute_ms" in f else "-")
        lines.append(
            f"| {row['model']} | {row['m']} | {checked('tp_vs_one_gpu')} | "
            f"{checked('tp_fp32_reduce_vs_one_gpu')} | {checked('tp_fp32_reduce_vs_fp32')} | "
            f"{times(f)} | {times(w)} | {times(x)} | {speedup} | "
            f"{f['wall_ms']:.3f} / {w['wall_ms']:.3f} / {x['wall_ms']:.3f} |")
    if result["rows"]:
        lines += ["", f"Local kernel call (first row): {result['rows'][0]['local_call']}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=None,
                        help="tensor-parallel ways (default: all devices / --data)")
    parser.add_argument("--data", type=int, default=1, help="data-parallel ways (default 1)")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--shape", default=None,
                        help="K,N instead of --models (for testing the script)")
    parser.add_argument("--m", nargs="*", type=int, default=list(M_VALUES))
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--out-dir", default=None, help="default: benchmarks/results/<gpu>/")
    args = parser.parse_args(argv)

    devices = jax.devices()
    tp = args.tp or len(devices) // args.data
    if tp < 1 or tp * args.data > len(devices):
        parser.error(f"--tp {tp} x --data {args.data} needs more than the {len(devices)} "
                     "devices here")
    # Automatic axes: the plain XLA MLP is written as a model would, with no sharding
    # annotations inside; the partitioner places the all-reduce.
    mesh = jax.make_mesh((args.data, tp), ("data", "model"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=devices[:tp * args.data])
    cupti = devices[0].platform == "gpu"
    if not cupti:
        print(f"no CUDA GPU ({devices[0].platform}): checks and wall times only", flush=True)
    shapes = ([("custom", *map(int, args.shape.split(",")))] if args.shape
              else [(model, *QWEN25_MLPS[model]) for model in args.models])

    env = environment_lib.environment()
    result = {"kind": "tensor_parallel", "environment": env, "iterations": args.iterations,
              "devices": tp * args.data, "mesh": dict(mesh.shape),
              "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"), "complete": False,
              "rows": []}
    out_dir = args.out_dir or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", env["device"].replace(" ", "_"))
    os.makedirs(out_dir, exist_ok=True)
    stem = bench_swiglu.output_stem(out_dir, env["date"][:10], f"-tp{tp}x{args.data}")
    key = jax.random.key(0)
    cases = [(shape, m) for shape in shapes for m in args.m]
    failed = 0
    for i, ((model, k, n), m) in enumerate(cases):
        row = run_case(model, k, n, m, mesh, args.iterations, cupti, jax.random.fold_in(key, i))
        result["rows"].append(row)
        result["complete"] = i + 1 == len(cases)
        with open(stem + ".json", "w") as f:
            json.dump(result, f, indent=1)
        check = row["check"]
        exact, default = check["tp_fp32_reduce_vs_one_gpu"], check["tp_vs_one_gpu"]
        # fp32 partial sums must give the one-GPU result within the kernel tolerance; bf16
        # ones (the default, as in the XLA MLP) only within their rounding, element-wise
        # a few percent where partial sums cancel, so they are held to the norm.
        failed += (exact["mismatches"] + exact["nan"] + default["nan"] > 0
                   or default["rel_fro"] > DEFAULT_REDUCE_REL_FRO)
        f, w, x = row["fused"], row["fused_fp32_reduce"], row["xla"]
        timing = (f"fused {f['compute_ms']:.3f} + nccl {f['nccl_ms']:.3f} ms, with fp32 sums "
                  f"{w['compute_ms']:.3f} + {w['nccl_ms']:.3f} ms, xla {x['compute_ms']:.3f} + "
                  f"nccl {x['nccl_ms']:.3f} ms" if cupti else
                  f"wall: fused {f['wall_ms']:.2f} ms, with fp32 sums {w['wall_ms']:.2f} ms, "
                  f"xla {x['wall_ms']:.2f} ms")
        print(f"[{i + 1}/{len(cases)}] {model} M={m} on {dict(mesh.shape)}: vs one GPU, fp32 "
              f"sums {exact['mismatches']} mismatches (rel {exact['rel_fro']:.1e}), bf16 sums "
              f"{default['mismatches']} (rel {default['rel_fro']:.1e}); {timing}", flush=True)
    with open(stem + ".md", "w") as f:
        f.write(markdown(result))
    print(f"wrote {stem}.json, {stem}.md")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
