"""How fast can the XLA path be? Formulations of the exact SwiGLU, side by side (SM90 GPU).

    python -m benchmarks.research.xla_fallback --rows 4096x12800:200 7168x20480:777 --out x.md

When the selection picks XLA (or a user asks for kernel="xla"), jax_swiglu runs the spec on
the packed weights: one [M, K] x [K, 2 N_pad] product with fp32 output, the packed columns
split into gate and up, act(g) * u in fp32, one rounding. XLA's own expression on separate
weights, act(x @ Wg) * (x @ Wu), rounds both products to the input dtype first, so it
writes and reads half the bytes between its GEMMs and the elementwise fusion (and is not the
spec). This probe times, through JAX on the same rotation of inputs as the benchmark:

  xla_own         act(x @ Wg) * (x @ Wu), separate weights (what the benchmark calls xla)
  packed_now      swiglu(x, packed, kernel="xla"): the product on the packed weights in fp32
  exact_separate  act(x @f32 Wg) * (x @f32 Wu) on separate weights: two fp32-output GEMMs
  exact_stacked   x @f32 [Wg | Wu], then the two contiguous halves
  packed_rounded  x @ packed rounded to the input dtype (as XLA's own rounds its products),
                  the packed columns split, act(g) * u in fp32, rounded again
  stacked_rounded x @ [Wg | Wu] rounded to the input dtype, then the two contiguous halves
  gemm_f32        the packed product alone, fp32 output
  gemm            the bare [M, K] x [K, 2N] GEMM in the input dtype (the benchmark's gemm)
  auto            swiglu(x, packed): the selection's launch

and reports each against xla_own, with each formulation's error against the fp32 reference.
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp

import jax_swiglu
from jax_swiglu import _layout

from .. import bench_swiglu


def _f32(a, b):
    return jnp.matmul(a, b, preferred_element_type=jnp.float32)


def variants() -> dict:
    silu = jax.nn.silu
    return {
        "xla_own": lambda x, w: silu(x @ w[0]) * (x @ w[1]),
        "packed_now": lambda x, w: jax_swiglu.swiglu(x, w[3], kernel="xla"),
        "exact_separate": lambda x, w: (silu(_f32(x, w[0])) * _f32(x, w[1])).astype(x.dtype),
        "exact_stacked": lambda x, w: _exact_stacked(x, w[2]),
        "packed_rounded": lambda x, w: _rounded_packed(x, w[3]),
        "stacked_rounded": lambda x, w: _rounded_stacked(x, w[2]),
        "gemm_f32": lambda x, w: _f32(x, w[3].data),
        "gemm": lambda x, w: x @ w[2],
        "auto": lambda x, w: jax_swiglu.swiglu(x, w[3]),
    }


def _exact_stacked(x, stacked):
    n = stacked.shape[1] // 2
    y = _f32(x, stacked)
    return (jax.nn.silu(y[:, :n]) * y[:, n:]).astype(x.dtype)


def _rounded_packed(x, packed):
    gate, up = _layout.split_gate_up(x @ packed.data, packed.n)
    return (jax.nn.silu(gate.astype(jnp.float32)) * up.astype(jnp.float32)).astype(x.dtype)


def _rounded_stacked(x, stacked):
    n = stacked.shape[1] // 2
    y = (x @ stacked).astype(jnp.float32)
    return (jax.nn.silu(y[:, :n]) * y[:, n:]).astype(x.dtype)


def _parse(row: str):
    shape, _, m = row.partition(":")
    k, n = (int(v) for v in shape.split("x"))
    return k, n, int(m)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", required=True, help="KxN:M")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    fns = {name: jax.jit(fn) for name, fn in variants().items()}
    lines = ["# The XLA path's formulations, side by side (CUPTI, median us)", "",
             f"`python -m benchmarks.research.xla_fallback {' '.join(sys.argv[1:] if argv is None else argv)}`",
             "", "| K x N | M | " + " | ".join(fns) + " | packed_now / xla_own | best exact / xla_own |",
             "|---|---|" + "---|" * (len(fns) + 2)]
    errors = []
    for i, row in enumerate(args.rows):
        k, n, m = _parse(row)
        # Enough distinct input sets that one pass overflows the L2, as the benchmark does:
        # one jitted call over every set, its time divided by the sets.
        sets = bench_swiglu.make_rotation(jax.random.PRNGKey(i), m, k, n)
        xs, ws = [s[0] for s in sets], [s[1] for s in sets]
        over_sets = {name: jax.jit(lambda xs, ws, fn=fn: [fn(x, w) for x, w in zip(xs, ws)])
                     for name, fn in fns.items()}
        gpu, _ = bench_swiglu.measure_side_by_side(over_sets, (xs, ws), args.iterations,
                                                   args.rounds, wall=False)
        us = {name: 1e3 * t / len(sets) for name, t in gpu.items()}
        exact = min(us["packed_now"], us["exact_separate"], us["exact_stacked"],
                    us["packed_rounded"], us["stacked_rounded"])
        lines.append(f"| {k} x {n} | {m} | " + " | ".join(f"{us[v]:.1f}" for v in fns)
                     + f" | {us['packed_now'] / us['xla_own']:.3f} | {exact / us['xla_own']:.3f} |")
        print(lines[-1], flush=True)
        x, w = sets[0]
        ref = jax.nn.silu(_f32(x, w[0])) * _f32(x, w[1])  # fp32, unrounded
        names = ("xla_own", "packed_now", "exact_separate", "exact_stacked", "packed_rounded",
                 "stacked_rounded")
        outs = {name: fns[name](x, w).astype(jnp.float32) for name in names}
        err = {name: float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))
               for name, y in outs.items()}
        # The project's bound: no element more than 1 % + 1e-3 off the fp32 reference.
        off = {name: int(jnp.sum(jnp.abs(y - ref) > 0.01 * jnp.abs(ref) + 1e-3))
               for name, y in outs.items()}
        errors.append(f"- {k} x {n}, M = {m}: relative Frobenius error (elements off) "
                      + ", ".join(f"{name} {err[name]:.2e} ({off[name]})" for name in names))
    lines += ["", *errors]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
