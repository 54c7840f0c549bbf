"""The fused SwiGLU MLP in a Flax model, end to end: ``python -m jax_swiglu.demo``.

Builds the MLP half of a Qwen2.5-0.5B decoder in ``flax.nnx`` (24 pre-norm residual blocks
``x + mlp(rms_norm(x))``, hidden 896, intermediate 4864, random bf16 weights) twice: with
the plain XLA reference block and with :class:`jax_swiglu.nn.FusedSwiGLUMLP`, converted from
the first. It runs a prefill-sized batch and decode batches (1 and 8 sequences) through
both and prints, per call, the kernel chosen, the error against the reference and, on an SM90
GPU, the time of each. Without such a GPU everything runs on the XLA reference path, and the demo says so.

Needs flax (``pip install 'jax_swiglu[flax]'``). ``--help`` lists the options.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import jax_swiglu
from jax_swiglu import selection

try:
    from flax import nnx

    from jax_swiglu.nn import FusedSwiGLUMLP, SwiGLUMLP
except ImportError as error:
    sys.exit(f"the demo needs flax: pip install 'jax_swiglu[flax]' ({error})")

GPU_PREFILL_TOKENS = 2048
CPU_PREFILL_TOKENS = 256  # the reference path on a small CPU: about a second per forward


def rms_norm(x):
    """Parameter-free RMSNorm in fp32, so every block sees unit-scale inputs as in a real model."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype)


class MLPStack(nnx.Module):
    """The MLP half of a pre-norm decoder: ``x = x + block(rms_norm(x))`` for each block."""

    def __init__(self, blocks):
        self.blocks = nnx.List(blocks)

    def __call__(self, x):
        for block in self.blocks:
            x = x + block(rms_norm(x))
        return x


def progress(items, label: str):
    """Yields ``items`` while drawing ``label [#####.....] i/n`` (the last state only off a tty)."""
    items = list(items)
    start = time.perf_counter()
    live = sys.stdout.isatty()

    def draw(done):
        bar = "#" * round(24 * done / len(items))
        line = f"{label:<34} [{bar:<24}] {done}/{len(items)}"
        redraw = "\r" if live else ""
        if done == len(items):
            print(f"{redraw}{line}  {time.perf_counter() - start:.1f} s", flush=True)
        elif live:
            print(f"{redraw}{line}", end="", flush=True)

    for done, item in enumerate(items):
        draw(done)
        yield item
    draw(len(items))


class JittedModel:
    """``model(x)`` under ``jax.jit``, the weights passed as a flat list (the quickest dispatch)."""

    def __init__(self, model: nnx.Module):
        self.leaves, treedef = jax.tree.flatten(model)
        self.forward = jax.jit(lambda leaves, x: jax.tree.unflatten(treedef, leaves)(x))

    def __call__(self, x):
        return self.forward(self.leaves, x)

    def cuda_hlo(self, x) -> str:
        """The StableHLO lowered for CUDA, which needs no GPU: what a GPU would run."""
        return self.forward.trace(self.leaves, x).lower(lowering_platforms=("cuda",)).as_text()


def median_ms(model: JittedModel, x, runs: int) -> float:
    for _ in range(3):  # compile, then warm up
        jax.block_until_ready(model(x))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(model(x))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def custom_calls(hlo: str) -> list[str]:
    """``target (config n)`` of each jax_swiglu custom call in StableHLO text."""
    calls = re.findall(r"stablehlo\.custom_call @(jax_swiglu_\w+)\(.*?config = (\d+)", hlo)
    return [f"{target} (config {config})" for target, config in calls]


def run_call(name: str, x, fused: JittedModel, reference: JittedModel, *, explain: str,
             blocks: int, timed: bool, runs: int) -> None:
    print(f"\n{name}: x {list(x.shape)}, M = {x.size // x.shape[-1]} tokens per block")
    print(f"  kernel: {explain}")
    calls = custom_calls(fused.cuda_hlo(x))
    if calls:
        print(f"  HLO lowered for CUDA: {len(calls)} custom calls, "
              f"{', '.join(sorted(set(calls)))}")
    elif jax_swiglu.kernels_available():
        print("  HLO lowered for CUDA: no jax_swiglu custom call (the selection table picks "
              "the XLA path at this M)")
    y, r = fused(x).astype(jnp.float32), reference(x).astype(jnp.float32)
    max_err = float(jnp.max(jnp.abs(y - r)))
    rel_fro = float(jnp.linalg.norm(y - r) / jnp.linalg.norm(r))
    print(f"  fused vs reference model output: max |error| = {max_err:.3g} (max |reference| = "
          f"{float(jnp.max(jnp.abs(r))):.3g}), relative Frobenius error {rel_fro:.2e}")
    if timed:
        ours, xla = median_ms(fused, x, runs), median_ms(reference, x, runs)
        print(f"  time per forward ({blocks} blocks, median of {runs}): "
              f"jax_swiglu {ours:.3f} ms, XLA reference {xla:.3f} ms -> {xla / ours:.2f}x")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jax_swiglu.demo", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="896x4864",
                        help="the MLP's hidden x intermediate size (default: %(default)s, "
                             "Qwen2.5-0.5B's)")
    parser.add_argument("--layers", type=int, default=24, help="blocks (default: %(default)s)")
    parser.add_argument("--prefill-tokens", type=int, default=None,
                        help=f"tokens of the prefill call (default: {GPU_PREFILL_TOKENS} on a GPU, "
                             f"{CPU_PREFILL_TOKENS} on the reference path)")
    parser.add_argument("--decode-tokens", type=int, nargs="+", default=[1, 8],
                        help="sequences of each decode call, one token each (default: 1 8)")
    parser.add_argument("--runs", type=int, default=20,
                        help="timed runs per call on a GPU (default: %(default)s)")
    args = parser.parse_args(argv)

    hidden, sep, intermediate = args.shape.lower().partition("x")
    if not (sep and hidden.isdigit() and intermediate.isdigit()):
        parser.error(f"--shape {args.shape!r} is not KxN (hidden x intermediate size)")
    hidden, intermediate = int(hidden), int(intermediate)
    missing = selection.kernels_unusable_reason()
    print(f"jax_swiglu demo: {args.layers} SwiGLU MLP blocks (hidden {hidden}, intermediate "
          f"{intermediate}), bfloat16, random weights")
    print(f"jax {jax.__version__}, devices {jax.devices()}")
    prefill_tokens = args.prefill_tokens
    if missing is None:
        print("fused kernels: available (SM90 GPU); timing jax_swiglu against the XLA reference")
        prefill_tokens = GPU_PREFILL_TOKENS if prefill_tokens is None else prefill_tokens
    else:
        print(f"NO SM90 GPU, REFERENCE PATH: {missing}. Every call runs the XLA reference, so "
              "fused and reference agree exactly and nothing is timed.")
        if prefill_tokens is None:
            prefill_tokens = CPU_PREFILL_TOKENS
            print(f"(prefill uses {CPU_PREFILL_TOKENS} tokens here instead of "
                  f"{GPU_PREFILL_TOKENS}, to stay quick; --prefill-tokens changes it)")
    print()

    rngs = nnx.Rngs(0)
    reference = MLPStack([SwiGLUMLP(hidden, intermediate, rngs=rngs)
                          for _ in progress(range(args.layers), "reference model (XLA, unfused)")])
    fused = MLPStack([FusedSwiGLUMLP.from_unfused(block)
                      for block in progress(reference.blocks, "fused model (packed once)")])

    key_prefill, key_decode = jax.random.split(jax.random.key(1))
    calls = [  # [batch, sequence, hidden]
        ("prefill", jax.random.normal(key_prefill, (1, prefill_tokens, hidden), jnp.bfloat16))]
    calls += [(f"decode, batch {batch}",
               jax.random.normal(jax.random.fold_in(key_decode, batch), (batch, 1, hidden),
                                 jnp.bfloat16))
              for batch in args.decode_tokens]
    fused_jit, reference_jit = JittedModel(fused), JittedModel(reference)
    for name, x in calls:
        run_call(name, x, fused_jit, reference_jit, explain=fused.blocks[0].explain(
                     x, platform="cuda" if jax_swiglu.kernels_available() else None),
                 blocks=args.layers, timed=missing is None, runs=args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
