"""A published model with its MLP swapped: tunix's Llama 3 against the same model running
jax_swiglu's fused MLP blocks (jax_swiglu.nn.swap_mlp_blocks).

    python -m benchmarks.model_swap                                    # GPU: Llama-3.2-1B, 3.1-8B
    python -m benchmarks.model_swap --models llama-3.1-8b --layers 8
    python -m benchmarks.model_swap --models llama-3.1-8b --layers 8 --fp8   # fp8 gate/up blocks
    python -m benchmarks.model_swap --models llama-3.1-8b --layers 8 --fp8 --fp8-down  # all fp8
    python -m benchmarks.model_swap --tiny --out DIR                   # a tiny Llama 3, any device

Needs google-tunix (``tunix.models.llama3``) and flax. Each model is built from tunix's
``ModelConfig`` with random bfloat16 weights (no checkpoint: variance-preserving normal
draws, so activations and logits are of unit scale as in a trained model), cloned (the
clone shares every array) and the clone's MLP blocks swapped. Then, side by side in one
run, on the same inputs:

  prefill   batch 1, --prefill-tokens tokens, causal, filling a fresh KV cache (all logits)
  decode    one new token for each of --decode-batch sequences, attending to a full KV cache
            of --context tokens; the cache is donated and fed back, as a sampler does

Times are wall-clock medians of jitted calls, each followed by block_until_ready, in
interleaved rounds whose order changes from round to round (bench_swiglu.round_orders), so
clock drift is not charged to one variant. The logits of the two are compared: relative
Frobenius error, max |difference| and how often the argmax agrees. For the prefill also
against the original computed in float32 (the same weights, cast; --no-f32-reference skips
it): the swapped model must be no farther from it than the bf16 original is (times
F32_MARGIN), the bf16 tolerance that does not depend on the depth. With --fp8 the swap
quantizes every block's gate and up to e4m3 per channel (swap_mlp_blocks(fp8=True): the fused
fp8 kernel, the down projection in bf16, or with --fp8-down in fp8 too: fp8_down=True), and
the error against the float32 model is stated, not held to that margin (fp8 weights and
tokens carry their own). Per call also: the kernel
the selection picks for one MLP block, and the jax_swiglu custom calls in the lowered HLO.
Writes <date>-model-swap[-fp8[-down]].json and .md to --out, by default
benchmarks/results/<device>/ as bench_swiglu does.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import math
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import jax_swiglu

from . import bench_swiglu, environment as environment_lib

MODELS = {"llama-3.2-1b": "llama3p2_1b", "llama-3.1-8b": "llama3p1_8b"}  # ModelConfig methods
# Small enough for a CPU, dims aligned as in real models (K a multiple of 8, N of 32).
TINY = dict(num_layers=2, vocab_size=512, embed_dim=128, hidden_dim=256, num_heads=4,
            head_dim=32, num_kv_heads=2, rope_theta=500_000, norm_eps=1e-5)
# The swap changes only where the MLP rounds (once in fp32 rather than after each dot and the
# activation), so the swapped model is no farther from the exact (float32) model than the
# bf16 original; the margin allows for the kernel's own summation order.
F32_MARGIN = 1.25


def llama3():
    """tunix's Llama 3 module, or SystemExit saying how to get it."""
    try:
        from tunix.models.llama3 import model
    except ImportError as error:
        raise SystemExit(f"needs google-tunix (pip install google-tunix): {error}") from error
    return model


# --- the model ------------------------------------------------------------------------------

def _fan_in(owner, name: str, shape) -> int:
    """The input size a weight's products sum over: unit-variance inputs give unit-variance
    outputs at std 1/sqrt(fan_in)."""
    if name == "input_embedding":  # [V, D], read by index and (tied) as the output head
        return shape[1]
    spec = getattr(owner, "einsum_str", None)  # tunix's Einsum: 'BTD,DNH->BTNH', ...
    if spec:
        x_spec, w_spec = spec.split("->")[0].split(",")
        return math.prod(size for size, axis in zip(shape, w_spec) if axis in x_spec)
    if len(shape) == 3:  # experts' weights, [E, in, out]
        return shape[1]
    return shape[0]  # nnx.Linear: [in, out]


def fill_random(model, *, seed: int, dtype, norm_scale: float = 1.0) -> None:
    """Draws every param of ``model`` (possibly abstract, from nnx.eval_shape) in place:
    norm scales (the 1-D params) ``norm_scale``, every weight normal with std 1/sqrt(fan-in),
    in ``dtype``. A norm that multiplies by its scale (Llama's) is the identity at 1, one that
    multiplies by ``1 + scale`` (Gemma's) at ``norm_scale=0``."""
    from flax import nnx

    nodes = dict(nnx.iter_graph(model))
    key = jax.random.key(seed)
    for index, (path, variable) in enumerate(nodes.items()):
        if not isinstance(variable, nnx.Param):
            continue
        shape = tuple(variable.shape)
        if len(shape) == 1:
            variable.value = jnp.full(shape, norm_scale, dtype)
            continue
        scale = 1.0 / math.sqrt(_fan_in(nodes[path[:-1]], path[-1], shape))
        variable.value = (scale * jax.random.normal(jax.random.fold_in(key, index), shape,
                                                     jnp.float32)).astype(dtype)


def cast_params(model, dtype):
    """A clone of ``model`` with every param cast to ``dtype`` (the model is left as it is)."""
    from flax import nnx

    copy = nnx.clone(model)
    for _, variable in nnx.iter_graph(copy):
        if isinstance(variable, nnx.Param):
            variable.value = variable.value.astype(dtype)
    return copy


def random_model(build, *, seed: int = 0, dtype=jnp.bfloat16, norm_scale: float = 1.0):
    """The nnx model ``build(rngs)`` returns (a tunix model: Llama 3, Gemma, ...), with random
    weights stored (and so computed) in ``dtype``, drawn by :func:`fill_random`.

    Built abstractly first: tunix draws float32 weights (zeros for the MLP), which for an 8B
    model would be 32 GB written only to be replaced."""
    from flax import nnx

    model = nnx.eval_shape(lambda: build(nnx.Rngs(seed)))
    fill_random(model, seed=seed, dtype=dtype, norm_scale=norm_scale)
    return model


def random_llama3(config, *, seed: int = 0, dtype=jnp.bfloat16):
    """tunix's Llama3 for ``config``, with random weights stored (and so computed) in ``dtype``."""
    return random_model(lambda rngs: llama3().Llama3(config, rngs=rngs), seed=seed, dtype=dtype)


def config_for(name: str, layers: int | None = None):
    """tunix's ModelConfig of a MODELS entry or "tiny", optionally with fewer layers."""
    model = llama3()
    if name == "tiny":
        config = model.ModelConfig(**TINY)
    else:
        config = getattr(model.ModelConfig, MODELS[name])()
    return config if layers is None else dataclasses.replace(config, num_layers=layers)


def empty_cache(config, batch: int, length: int, dtype, key=None) -> dict:
    """tunix's KV cache, ``{"layer_i": {"k", "v": [B, S, KV heads, head dim], "end_index"}}``:
    zeros, or random values (``key``) standing for a context already read."""
    shape = (batch, length, config.num_kv_heads, config.head_dim)
    cache = {}
    for i in range(config.num_layers):
        if key is None:
            k = v = jnp.zeros(shape, dtype)
        else:
            k, v = (jax.random.normal(jax.random.fold_in(key, 2 * i + j), shape, dtype)
                    for j in (0, 1))
        cache[f"layer_{i}"] = {"k": k, "v": v, "end_index": jnp.zeros((batch,), jnp.int32)}
    return cache


class Steps:
    """A model's prefill and decode calls under jax.jit, the weights passed as flat leaves
    (the quickest dispatch, as jax_swiglu.demo.JittedModel)."""

    def __init__(self, model):
        self.config = model.config
        self.dtype = model.embedder.input_embedding.dtype
        # An nnx module is a pytree: flatten/unflatten splits and merges it.
        self.leaves, treedef = jax.tree.flatten(model)
        rebuild = lambda leaves: jax.tree.unflatten(treedef, leaves)  # noqa: E731

        def prefill(leaves, tokens):
            batch, length = tokens.shape
            positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
            mask = jnp.broadcast_to(jnp.tril(jnp.ones((length, length), bool)),
                                    (batch, length, length))
            cache = empty_cache(self.config, batch, length, self.dtype)
            return rebuild(leaves)(tokens, positions, cache, mask)

        def decode(leaves, tokens, positions, cache, mask):
            return rebuild(leaves)(tokens, positions, cache, mask)

        self.prefill = jax.jit(prefill)
        self.decode = jax.jit(decode, donate_argnums=3)  # the cache, updated in place

    def hlo(self, call: str, *args) -> str:
        return getattr(self, call).lower(self.leaves, *args).as_text()


class Decoder:
    """Repeated decode steps on one cache, each call feeding back the cache it returns."""

    def __init__(self, steps: Steps, tokens, positions, cache, mask):
        self.steps, self.tokens, self.positions, self.mask = steps, tokens, positions, mask
        self.cache = cache

    def __call__(self):
        logits, self.cache = self.steps.decode(self.steps.leaves, self.tokens, self.positions,
                                               self.cache, self.mask)
        return jax.block_until_ready(logits)


def decode_inputs(config, batch: int, context: int, dtype, key):
    """One new token per sequence at position ``context - 1``, its slot the cache's last."""
    tokens = jax.random.randint(key, (batch, 1), 0, config.vocab_size, jnp.int32)
    positions = jnp.full((batch, 1), context - 1, jnp.int32)
    cache = empty_cache(config, batch, context, dtype, key=jax.random.fold_in(key, 1))
    for layer in cache.values():
        layer["end_index"] = jnp.full((batch,), context - 1, jnp.int32)
    mask = jnp.ones((batch, 1, context), bool)
    return tokens, positions, cache, mask


# --- measurement ----------------------------------------------------------------------------

def relative_fro(y, reference) -> float:
    y, reference = y.astype(jnp.float32), reference.astype(jnp.float32)
    return float(jnp.linalg.norm(y - reference) / jnp.linalg.norm(reference))


def compare_logits(swapped, original, exact=None) -> dict:
    """Swapped against original logits; with ``exact`` (the original in float32), both
    against it and whether the swapped model is within F32_MARGIN of the original's error."""
    difference = jnp.abs(swapped.astype(jnp.float32) - original.astype(jnp.float32))
    result = {"rel_fro": relative_fro(swapped, original),
              "max_abs_diff": float(jnp.max(difference)),
              "max_abs_logit": float(jnp.max(jnp.abs(original))),
              "argmax_agree": float(jnp.mean(jnp.argmax(swapped, -1) == jnp.argmax(original, -1)))}
    if exact is not None:
        result["original_vs_f32_rel_fro"] = relative_fro(original, exact)
        result["swapped_vs_f32_rel_fro"] = relative_fro(swapped, exact)
        result["within_bf16_tolerance"] = (
            result["swapped_vs_f32_rel_fro"] <= F32_MARGIN * result["original_vs_f32_rel_fro"])
    return result


def time_side_by_side(calls: dict, iterations: int, rounds: int) -> dict:
    """Median wall ms of each ``call()`` (which blocks until its result is ready), timed in
    interleaved rounds as bench_swiglu.measure_side_by_side times its variants."""
    for call in calls.values():
        call()  # compile
        call()
    per_round = math.ceil(iterations / rounds)
    samples = {name: [] for name in calls}
    for order in bench_swiglu.round_orders(list(calls), rounds):
        for name in order:
            for _ in range(per_round):
                start = time.perf_counter()
                calls[name]()
                samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(times) for name, times in samples.items()}


def _kernel_notes(swapped_model, steps: Steps, call: str, x_shape, *args) -> dict:
    from jax_swiglu import demo

    block = swapped_model.layers[0].mlp
    platform = "cuda" if jax_swiglu.kernels_available() else None
    calls = demo.custom_calls(steps.hlo(call, *args))
    return {"kernel": block.explain(jax.ShapeDtypeStruct(x_shape, block.dtype), platform=platform),
            "custom_calls": len(calls), "custom_call_targets": sorted(set(calls))}


def bench_model(name: str, args) -> dict:
    from flax import nnx

    from jax_swiglu.nn import swap_mlp_blocks

    config = config_for(name, args.layers)
    began = time.perf_counter()
    original = random_llama3(config, seed=args.seed)
    swapped = nnx.clone(original)  # shares every array until the swap packs gate and up
    swapped_blocks = swap_mlp_blocks(swapped, fp8=args.fp8,
                                     accumulation=args.accumulation if args.fp8 else "promoted",
                                     fp8_down=args.fp8 and args.fp8_down)
    steps = {"original": Steps(original), "swapped": Steps(swapped)}
    entry = {"model": name, "num_layers": config.num_layers, "embed_dim": config.embed_dim,
             "hidden_dim": config.hidden_dim, "vocab_size": config.vocab_size,
             "num_heads": config.num_heads, "num_kv_heads": config.num_kv_heads,
             "head_dim": config.head_dim, "weight_tying": config.weight_tying,
             "params": sum(x.size for x in jax.tree.leaves(nnx.state(original, nnx.Param))),
             "swapped_blocks": swapped_blocks, "build_s": time.perf_counter() - began,
             "calls": []}
    key = jax.random.key(args.seed + 1)

    tokens = jax.random.randint(key, (1, args.prefill_tokens), 0, config.vocab_size, jnp.int32)
    logits = {variant: s.prefill(s.leaves, tokens)[0] for variant, s in steps.items()}
    exact = None
    if args.f32_reference:
        exact_steps = Steps(cast_params(original, jnp.float32))
        with jax.default_matmul_precision("highest"):  # no TF32 or bf16 passes on a GPU
            exact = exact_steps.prefill(exact_steps.leaves, tokens)[0]
        del exact_steps
    times = time_side_by_side(
        {variant: (lambda s=s: jax.block_until_ready(s.prefill(s.leaves, tokens)))
         for variant, s in steps.items()}, args.iterations, args.rounds)
    entry["calls"].append({
        "call": "prefill", "batch": 1, "tokens": args.prefill_tokens, "wall_ms": times,
        "logits": compare_logits(logits["swapped"], logits["original"], exact),
        **_kernel_notes(swapped, steps["swapped"], "prefill",
                        (1, args.prefill_tokens, config.embed_dim), tokens)})
    del logits, exact

    for batch in args.decode_batch:
        inputs = decode_inputs(config, batch, args.context, steps["original"].dtype,
                               jax.random.fold_in(key, batch))
        notes = _kernel_notes(swapped, steps["swapped"], "decode", (batch, 1, config.embed_dim),
                              *inputs)
        decoders = {variant: Decoder(s, inputs[0], inputs[1],
                                     jax.tree.map(jnp.copy, inputs[2]), inputs[3])
                    for variant, s in steps.items()}
        first = {variant: decoder() for variant, decoder in decoders.items()}  # same cache
        times = time_side_by_side(decoders, args.iterations, args.rounds)
        entry["calls"].append({
            "call": "decode", "batch": batch, "tokens": batch, "context": args.context,
            "wall_ms": times, "logits": compare_logits(first["swapped"], first["original"]),
            **notes})
        del decoders, first, inputs
    for call in entry["calls"]:
        call["speedup"] = call["wall_ms"]["original"] / call["wall_ms"]["swapped"]
    return entry


# --- report ---------------------------------------------------------------------------------

def markdown(result: dict) -> str:
    env = result["environment"]
    fp8 = result.get("fp8", False)
    accumulation = result.get("accumulation", "promoted")
    down = "down in e4m3 too" if result.get("fp8_down") else "down in bf16"
    swap = (f"jax_swiglu's fp8 blocks (gate and up in e4m3 per channel, {accumulation} "
            f"accumulation, {down})" if fp8 else "jax_swiglu")
    lines = [f"# tunix Llama 3, MLP blocks swapped for {swap} ({env['device']})", "",
             f"{env['date']}, jax {env['jax']}, jax_swiglu {env['jax_swiglu']}, google-tunix "
             f"{result['tunix']}, git {env['git']}; `{env['command']}`", "",
             f"Random bf16 weights; wall-clock medians of {result['iterations']} jitted calls "
             f"each (block_until_ready), in {result['rounds']} interleaved rounds. Logits: "
             "relative Frobenius error of swapped vs original, share of equal argmax, and "
             "(prefill) swapped vs original error against the model in float32, " + (
                 "stated for fp8 (its weights and tokens carry their own error)." if fp8 else
                 f"which the swapped one must meet within {result['f32_margin']}x."), ""]
    for note in result["notes"]:
        lines.append(f"* {note}")
    if result["notes"]:
        lines.append("")
    lines += ["| model | layers | call | batch x tokens | original ms | swapped ms | speedup "
              "| logits rel. err | argmax agree | vs float32: swapped / original | MLP kernel |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in result["models"]:
        for call in model["calls"]:
            shape = (f"1 x {call['tokens']}" if call["call"] == "prefill"
                     else f"{call['batch']} x 1 (context {call['context']})")
            kernel = call["kernel"].split(": ", 1)[-1].split(" (")[0]
            logits = call["logits"]
            exact = "-"
            if "swapped_vs_f32_rel_fro" in logits:
                exact = (f"{logits['swapped_vs_f32_rel_fro']:.2e} / "
                         f"{logits['original_vs_f32_rel_fro']:.2e}"
                         f"{'' if fp8 or logits['within_bf16_tolerance'] else ' (OVER)'}")
            lines.append(
                f"| {model['model']} | {model['num_layers']} | {call['call']} | {shape} | "
                f"{call['wall_ms']['original']:.3f} | {call['wall_ms']['swapped']:.3f} | "
                f"{call['speedup']:.3f}x | {logits['rel_fro']:.2e} | "
                f"{logits['argmax_agree']:.3f} | {exact} | {kernel} |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None,
                        help="directory for the JSON and markdown (default: "
                             "benchmarks/results/<device>/)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--tiny", action="store_true",
                        help="a tiny Llama 3 and small calls instead (quick, any device)")
    parser.add_argument("--layers", type=int, default=None,
                        help="decoder layers (default: the model's own)")
    parser.add_argument("--prefill-tokens", type=int, default=None, help="default 2048 (tiny 64)")
    parser.add_argument("--decode-batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--context", type=int, default=None,
                        help="KV cache length of the decode calls (default 2048, tiny 64)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="timed calls per variant and call (default 30, tiny 6)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-f32-reference", dest="f32_reference", action="store_false",
                        help="skip the float32 run of the original (prefill only; its weights "
                             "take twice the bf16 model's memory)")
    parser.add_argument("--fp8", action="store_true",
                        help="swap in fp8 blocks (gate and up quantized to e4m3 per channel)")
    parser.add_argument("--accumulation", choices=("promoted", "fast"), default="promoted",
                        help="with --fp8, the fp8 kernel's accumulation (swiglu's accumulation=)")
    parser.add_argument("--fp8-down", action="store_true",
                        help="with --fp8, the down projection in e4m3 too (the whole block)")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the head of the report; repeatable")
    return parser.parse_args(argv)


def default_out_dir(device: str) -> str:
    """Where recorded runs of this device live, as bench_swiglu's default."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                        device.replace(" ", "_"))


def main(argv=None):
    args = parse_args(argv)
    small = args.tiny
    args.prefill_tokens = args.prefill_tokens or (64 if small else 2048)
    args.context = args.context or (64 if small else 2048)
    args.iterations = args.iterations or (6 if small else 30)
    models = ["tiny"] if small else args.models

    llama3()  # fail early, before any work, where tunix is missing
    env = environment_lib.environment()
    out = args.out or default_out_dir(env["device"])
    os.makedirs(out, exist_ok=True)
    stem = bench_swiglu.output_stem(out, env["date"][:10],
                                    "-model-swap" + ("-fp8" if args.fp8 else "")
                                    + ("-down" if args.fp8 and args.fp8_down else "")
                                    + ("-fast" if args.fp8 and args.accumulation == "fast"
                                       else ""))
    result = {"environment": env, "tunix": importlib.metadata.version("google-tunix"),
              "fp8": args.fp8, "accumulation": args.accumulation if args.fp8 else "promoted",
              "fp8_down": args.fp8 and args.fp8_down,
              "kernels_available": jax_swiglu.kernels_available(),
              "iterations": args.iterations, "rounds": args.rounds,
              "f32_margin": F32_MARGIN, "notes": args.note, "models": []}
    if not result["kernels_available"]:
        print("no SM90 GPU with the kernels: the swapped model runs the XLA reference path",
              flush=True)
    for name in models:
        entry = bench_model(name, args)
        result["models"].append(entry)
        with open(stem + ".json", "w") as f:  # after every model: a cut-short run keeps its data
            json.dump(result, f, indent=1)
        for call in entry["calls"]:
            print(f"{name} {call['call']} batch {call['batch']}: original "
                  f"{call['wall_ms']['original']:.3f} ms, swapped {call['wall_ms']['swapped']:.3f}"
                  f" ms ({call['speedup']:.3f}x), logits rel. err {call['logits']['rel_fro']:.2e}",
                  flush=True)
    text = markdown(result)
    with open(stem + ".md", "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {stem}.json, {os.path.basename(stem)}.md")
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
