"""Autotune from the command line: ``python -m jax_swiglu.tune --shapes KxN ... --m ...``.

    python -m jax_swiglu.tune --shapes 4096x14336 5120x13824 --m 1 8 64 300 2048
    python -m jax_swiglu.tune --shapes 4096x14336 --m 1 16 --dtype float16

Times the candidates of every (shape, M) on this GPU (jax_swiglu.autotune) and stores the
winners in the autotune cache (JAX_SWIGLU_CACHE_DIR, by default the user cache directory),
where every later lowering on this GPU finds them.
"""

from __future__ import annotations

import argparse
import sys

import jax.numpy as jnp

from .tuning import autotune


def _shape(text: str) -> tuple[int, int]:
    """K and N of a ``KxN`` argument (hidden size x intermediate size)."""
    k, sep, n = text.lower().partition("x")
    if not sep or not k.isdigit() or not n.isdigit() or not int(k) or not int(n):
        raise ValueError(f"{text!r} is not KxN (hidden x intermediate size), e.g. 4096x14336")
    return int(k), int(n)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jax_swiglu.tune",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", required=True,
                        help="KxN: the MLP's hidden size x intermediate size, e.g. 4096x14336")
    parser.add_argument("--m", nargs="+", type=int, required=True, help="tokens per call")
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--kernel", choices=("interleaved", "gate_then_up", "gemv"), default=None,
                        help="only this fused family's configs (default: all, and XLA)")
    args = parser.parse_args(argv)
    problems = []
    for shape in args.shapes:
        try:
            k, n = _shape(shape)
        except ValueError as error:
            parser.error(str(error))
        problems += [(m, n, k) for m in args.m]
    try:
        records = autotune.autotune(problems=problems, dtype=jnp.dtype(args.dtype),
                                    kernel=args.kernel)
    except (RuntimeError, ValueError, TypeError) as error:
        print(f"jax_swiglu.tune: {error}", file=sys.stderr)
        return 1
    for r in records:
        print(f"M={r['m']} N={r['n']} K={r['k']} {r['dtype']}: {r['launch']} "
              f"{r['us']:.1f} us" + ("" if r["cached"] else " (not written: see the warning)"))
    if records:
        print(f"autotune cache: {records[0]['cache_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
