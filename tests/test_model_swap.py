"""jax_swiglu.nn.swap_mlp_blocks: a model's gated MLP blocks swapped for FusedSwiGLUMLP.

On hand-made nnx models shaped like tunix's (bias-free nnx.Linear gate_proj/up_proj/down_proj)
everywhere, and on tunix's own Llama 3 and Gemma 1 and 3 (``tunix`` marker; Gemma's GeGLU MLP
swapped with ``activation="gelu_tanh"``, and shown to need it) where google-tunix imports: it is
an optional dependency, too heavy for CI (its package import pulls in its whole trainer
stack), so those tests skip without it. Run them with ``pip install google-tunix`` and
``pytest -m tunix tests/test_model_swap.py``.

Everything runs on the CPU device, where the fused blocks take the XLA reference path: the
swapped block equals SwiGLUMLP on the same weights bit for bit, and the swapped model equals
the original within bf16 rounding (the original rounds after each dot and the activation,
the fused block once in fp32).
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flax", reason="jax_swiglu.nn needs flax: pip install jax_swiglu[flax]")
import flax  # noqa: E402
from flax import nnx  # noqa: E402

import jax_swiglu  # noqa: E402
from jax_swiglu.nn import (Fp8SwiGLUMLP, FusedSwiGLUMLP, SwiGLUMLP,  # noqa: E402
                           swap_mlp_blocks)

from helpers import random_x  # noqa: E402

# Relative Frobenius error of the swapped model's output against the original's, for the
# three-layer models here: four bf16 ulps at 1. Each swapped block moves its output by about
# one ulp (rounding once instead of three times), and the layers add these up, so deeper
# models drift further; the float32 comparison below is the bound for any depth.
MODEL_REL_FRO = 2.0 ** -6
# A logit may move by this much: the logits are of unit scale by construction (variance-
# preserving random weights), so this is about 32 bf16 ulps at 1.
MODEL_MAX_ABS = 2.0 ** -3


@pytest.fixture(autouse=True)
def on_the_cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def relative_fro(y, reference) -> float:
    y, reference = (np.asarray(a, np.float32) for a in (y, reference))
    return float(np.linalg.norm(y - reference) / np.linalg.norm(reference))


def swiglu_primitives(fn, *args) -> int:
    """How many jax_swiglu primitives the jaxpr of ``fn(*args)`` binds (nested jaxprs too)."""
    return len(re.findall(r"\bjax_swiglu\[", str(jax.make_jaxpr(fn)(*args))))


# --- hand-made models shaped like tunix's ------------------------------------------------------

def _linear(k, n, rngs, dtype, **options):
    init = nnx.initializers.normal(stddev=k ** -0.5)
    return nnx.Linear(k, n, use_bias=options.pop("use_bias", False), param_dtype=dtype,
                      kernel_init=init, rngs=rngs, **options)


class GatedMLP(nnx.Module):
    """tunix's Llama/Qwen MLP (``activation="silu"``) or Gemma's FeedForward ("gelu_tanh")."""

    def __init__(self, k, n, rngs, *, dtype=jnp.bfloat16, activation="silu", **linear_options):
        self.gate_proj = _linear(k, n, rngs, dtype, **linear_options)
        self.up_proj = _linear(k, n, rngs, dtype, **linear_options)
        self.down_proj = _linear(n, k, rngs, dtype, **linear_options)
        self.gelu = activation == "gelu_tanh"

    def __call__(self, x):
        gate = self.gate_proj(x)
        return self.down_proj((nnx.gelu(gate) if self.gelu else nnx.silu(gate)) * self.up_proj(x))


def rms_norm(x):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(x.dtype)


class Layer(nnx.Module):
    def __init__(self, mlp):
        self.mlp = mlp

    def __call__(self, x):
        return x + self.mlp(rms_norm(x))


class Decoder(nnx.Module):
    """Pre-norm residual layers in an nnx.List, as tunix keeps them; ``extra`` blocks sit in
    an nnx.Dict and are applied after the layers."""

    def __init__(self, blocks, extra=None):
        self.layers = nnx.List([Layer(block) for block in blocks])
        self.extra = nnx.Dict(extra or {})

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        for name in sorted(self.extra):
            x = x + self.extra[name](rms_norm(x))
        return x


def decoder(k=64, n=128, layers=3, seed=0, **options):
    rngs = nnx.Rngs(seed)
    return Decoder([GatedMLP(k, n, rngs, **options) for _ in range(layers)])


def _kernels(block):
    return {name: getattr(block, name).kernel[...] for name in ("gate_proj", "up_proj",
                                                                "down_proj")}


@pytest.mark.parametrize("k, n", [(64, 128), (96, 200)])  # 200: N padded to 224 when packed
def test_swap_keeps_the_model_output(key, k, n):
    model = decoder(k, n)
    originals = [_kernels(layer.mlp) for layer in model.layers]
    x = random_x(key, (2, 7, k))
    before = model(x)
    assert swap_mlp_blocks(model) == 3
    for layer, kernels in zip(model.layers, originals):
        assert isinstance(layer.mlp, FusedSwiGLUMLP)
        assert layer.mlp.dtype == jnp.bfloat16 and layer.mlp.param_dtype == jnp.bfloat16
        assert layer.mlp.activation == "silu"
        # The same weights: the fused block is SwiGLUMLP on them, bit for bit.
        reference = SwiGLUMLP.from_params({name: {"kernel": w} for name, w in kernels.items()})
        h = random_x(jax.random.fold_in(key, 1), (5, k))
        np.testing.assert_array_equal(layer.mlp(h), reference(h))
    after = model(x)
    assert after.dtype == before.dtype and after.shape == before.shape
    assert relative_fro(after, before) <= MODEL_REL_FRO
    np.testing.assert_allclose(np.asarray(after, np.float32), np.asarray(before, np.float32),
                               atol=MODEL_MAX_ABS * float(jnp.max(jnp.abs(before))), rtol=0)


@pytest.mark.parametrize("scale", ["per_channel", "per_tensor"])
def test_swap_to_fp8_blocks(key, scale):
    """fp8=True: every block an Fp8SwiGLUMLP with gate and up quantized once from the same
    weights (the block is quantize_weights + fused_mlp on them, bit for bit), the down
    projection kept; the model within fp8's error of the original."""
    model = decoder(64, 200)
    originals = [_kernels(layer.mlp) for layer in model.layers]
    x = random_x(key, (2, 7, 64))
    before = model(x)
    assert swap_mlp_blocks(model, fp8=True, fp8_scale=scale) == 3
    h = random_x(jax.random.fold_in(key, 1), (5, 64))
    for layer, kernels in zip(model.layers, originals):
        block = layer.mlp
        assert isinstance(block, Fp8SwiGLUMLP) and block.scale_mode == scale
        assert block.dtype == jnp.bfloat16 and block.activation == "silu"
        weights = jax_swiglu.quantize_weights(kernels["gate_proj"], kernels["up_proj"],
                                              scale=scale)
        np.testing.assert_array_equal(block.gate_up_data[...], weights.data)
        np.testing.assert_array_equal(block.down_proj.kernel[...], kernels["down_proj"])
        np.testing.assert_array_equal(
            block(h), jax_swiglu.fused_mlp(h, weights, kernels["down_proj"]))
    after = model(x)
    assert after.dtype == before.dtype and after.shape == before.shape
    # e4m3 keeps 3 mantissa bits: a weight or token moves by up to 2^-4 of itself (about
    # 2^-5 on average), each of the three blocks adds its own, and the residual stream keeps
    # the input: a few percent, well under 2^-4 x 3 layers.
    assert 0 < relative_fro(after, before) <= 0.08
    whole = decoder(64, 200)
    assert swap_mlp_blocks(whole, fp8=True, fp8_scale=scale, fp8_down=True) == 3
    for layer, kernels in zip(whole.layers, originals):
        down = jax_swiglu.quantize_down(kernels["down_proj"], scale=scale)
        np.testing.assert_array_equal(layer.mlp.down_data[...], down.data)
        assert layer.mlp.down_weights().scale_mode == scale
    assert 0 < relative_fro(whole(x), before) <= 0.12  # one more fp8 step per block
    with pytest.raises(ValueError, match="pass fp8=True too"):
        swap_mlp_blocks(decoder(64, 200), fp8_down=True)
    fast = decoder(64, 200)
    assert swap_mlp_blocks(fast, fp8=True, fp8_scale=scale, accumulation="fast") == 3
    assert all(layer.mlp.accumulation == "fast" for layer in fast.layers)
    with pytest.raises(ValueError, match="is for fp8 weights"):
        swap_mlp_blocks(decoder(64, 200), accumulation="fast")


def test_swapped_model_binds_the_primitive_and_jits(key):
    model = decoder()
    swap_mlp_blocks(model)
    x = random_x(key, (2, 4, 64))
    graphdef, state = nnx.split(model)
    forward = lambda state, x: nnx.merge(graphdef, state)(x)  # noqa: E731
    assert swiglu_primitives(forward, state, x) == 3
    # Compiled whole, XLA fuses the norms and residuals differently from the eager run.
    assert relative_fro(nnx.jit(lambda m, x: m(x))(model, x), model(x)) <= MODEL_REL_FRO


def test_swapped_blocks_carry_the_logical_axis_names():
    model = decoder()
    swap_mlp_blocks(model)
    P = jax.sharding.PartitionSpec
    assert nnx.to_pure_dict(nnx.get_partition_spec(nnx.state(model.layers[0].mlp))) == {
        "gate_up_packed": {"kernel": P("embed", "mlp")}, "down_proj": {"kernel": P("mlp", "embed")}}


def test_a_shared_block_is_swapped_once_everywhere():
    rngs = nnx.Rngs(0)
    shared = GatedMLP(64, 128, rngs)
    model = Decoder([shared, GatedMLP(64, 128, rngs), shared], extra={"tail": shared})
    assert swap_mlp_blocks(model) == 2
    assert model.layers[0].mlp is model.layers[2].mlp is model.extra["tail"]
    assert isinstance(model.extra["tail"], FusedSwiGLUMLP)
    assert model.layers[1].mlp is not model.layers[0].mlp


def test_swap_takes_the_activation(key):
    model = decoder(activation="gelu_tanh")
    x = random_x(key, (2, 5, 64))
    before = model(x)
    swap_mlp_blocks(model, activation="gelu_tanh")
    assert all(layer.mlp.activation == "gelu_tanh" for layer in model.layers)
    assert relative_fro(model(x), before) <= MODEL_REL_FRO


def test_swap_reads_a_stated_activation():
    # jax_swiglu's own SwiGLUMLP states it; a gelu_tanh block must not become SiLU.
    rngs = nnx.Rngs(0)
    gelu = Decoder([SwiGLUMLP(64, 128, activation="gelu_tanh", rngs=rngs)])
    with pytest.raises(ValueError, match=r"layers\.0\.mlp\.activation is 'gelu_tanh'"):
        swap_mlp_blocks(gelu)
    assert swap_mlp_blocks(gelu, activation="gelu_tanh") == 1
    assert isinstance(gelu.layers[0].mlp, FusedSwiGLUMLP)
    block = GatedMLP(64, 128, rngs)
    block.act_fn = "gelu"  # Hugging Face's exact GELU: no kernel computes it
    with pytest.raises(ValueError, match=r"layers\.0\.mlp\.act_fn is 'gelu', an activation"):
        swap_mlp_blocks(Decoder([block]))


def test_float32_blocks_need_a_dtype(key):
    model = decoder(dtype=jnp.float32)
    with pytest.raises(ValueError, match=r"layers\.0\.mlp computes in float32.*dtype=jnp\.bf"):
        swap_mlp_blocks(model)
    x = random_x(key, (2, 3, 64), jnp.float32)
    before = model(x)
    assert swap_mlp_blocks(model, dtype=jnp.bfloat16) == 3
    mlp = model.layers[0].mlp
    assert mlp.dtype == jnp.bfloat16 and mlp.param_dtype == jnp.float32  # storage kept
    # Computing in bf16 now: within bf16 rounding of the float32 model, three layers deep.
    assert relative_fro(model(x), before) <= 4 * MODEL_REL_FRO


# --- refusals: a ValueError naming the block, and the model left as it was -------------------

def _with_bad_layer(bad):
    rngs = nnx.Rngs(0)
    return Decoder([GatedMLP(64, 128, rngs), bad, GatedMLP(64, 128, rngs)])


def _assert_untouched(model):
    assert not any(isinstance(layer.mlp, FusedSwiGLUMLP) for layer in model.layers)


@pytest.mark.parametrize("bad, message", [
    (lambda rngs: GatedMLP(64, 128, rngs, use_bias=True), r"layers\.1\.mlp\.gate_proj has a bias"),
    (lambda rngs: GatedMLP(60, 128, rngs), r"layers\.1\.mlp: K=60 and N=128 must be multiples"),
    (lambda rngs: GatedMLP(64, 100, rngs), r"layers\.1\.mlp: K=64 and N=100 must be multiples"),
    (lambda rngs: GatedMLP(64, 128, rngs, dot_general=lambda *a, **k: jax.lax.dot_general(*a, **k)),
     r"layers\.1\.mlp\.gate_proj computes with a custom dot_general"),
])
def test_refuses_a_block_it_cannot_convert(bad, message):
    model = _with_bad_layer(bad(nnx.Rngs(1)))
    with pytest.raises(ValueError, match=message):
        swap_mlp_blocks(model)
    _assert_untouched(model)


def test_refuses_a_block_holding_more_state():
    block = GatedMLP(64, 128, nnx.Rngs(1))
    block.norm = nnx.RMSNorm(64, rngs=nnx.Rngs(2))
    model = _with_bad_layer(block)
    with pytest.raises(ValueError, match=r"layers\.1\.mlp holds state besides the three kernels "
                                         r"\(norm\.scale\)"):
        swap_mlp_blocks(model)
    _assert_untouched(model)


def test_refuses_mismatched_kernels():
    block = GatedMLP(64, 128, nnx.Rngs(1))
    block.up_proj = _linear(64, 96, nnx.Rngs(2), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"layers\.1\.mlp: kernels .* are not gate/up \[K, N\]"):
        swap_mlp_blocks(_with_bad_layer(block))


def test_refuses_without_a_block():
    class Other(nnx.Module):
        def __init__(self):
            self.proj = nnx.Linear(64, 64, rngs=nnx.Rngs(0))

    with pytest.raises(ValueError, match="found no gated MLP block in the Other"):
        swap_mlp_blocks(Other())
    model = decoder()
    swap_mlp_blocks(model)
    with pytest.raises(ValueError, match="found no gated MLP block"):  # already swapped
        swap_mlp_blocks(model)
    with pytest.raises(ValueError, match="the model itself is a gated MLP block"):
        swap_mlp_blocks(GatedMLP(64, 128, nnx.Rngs(0)))


@pytest.mark.parametrize("options, error", [
    ({"activation": "relu"}, ValueError), ({"kernel": "fastest"}, ValueError),
    ({"dtype": jnp.float32}, TypeError), ({"fp8": "e4m3"}, TypeError),
    ({"fp8": True, "fp8_scale": "per_row"}, ValueError)])
def test_refuses_bad_arguments(options, error):
    model = decoder()
    with pytest.raises(error):
        swap_mlp_blocks(model, **options)
    _assert_untouched(model)


# --- mixture-of-experts layers shaped like tunix's Qwen3 MoELayer ------------------------------

class RoutedExperts(nnx.Module):
    """tunix's Qwen3 MoELayer on its dense path: a bias-free router, softmax over the experts
    in float32, the top-k renormalized and rounded, every expert's gated MLP in bf16 (rounded
    after each op), combined by the routing weights."""

    def __init__(self, k, f, experts, top_k, rngs, *, dtype=jnp.bfloat16, router_bias=False):
        self.router = nnx.Linear(k, experts, use_bias=router_bias, dtype=dtype, param_dtype=dtype,
                                 kernel_init=nnx.initializers.normal(stddev=k ** -0.5), rngs=rngs)
        draw = lambda shape, fan_in: nnx.Param(  # noqa: E731
            nnx.initializers.normal(stddev=fan_in ** -0.5)(rngs.params(), shape, dtype))
        self.gate_proj = draw((experts, k, f), k)
        self.up_proj = draw((experts, k, f), k)
        self.down_proj = draw((experts, f, k), f)
        self.experts_per_tok, self.num_experts, self.dtype = top_k, experts, dtype

    def __call__(self, x):
        scores = self.router(x).astype(jnp.float32)
        weights, chosen = jax.lax.top_k(jax.nn.softmax(scores, axis=-1), self.experts_per_tok)
        weights = (weights / jnp.sum(weights, -1, keepdims=True)).astype(self.dtype)
        per_expert = jnp.einsum("...k,...ke->...e", weights,
                                jax.nn.one_hot(chosen, self.num_experts, dtype=self.dtype))
        outputs = jnp.stack([(nnx.silu(x @ self.gate_proj[e]) * (x @ self.up_proj[e]))
                             @ self.down_proj[e] for e in range(self.num_experts)], axis=-2)
        return jnp.einsum("...ed,...e->...d", outputs, per_expert)


def moe_decoder(k=64, f=96, experts=8, top_k=2, layers=2, seed=0, **options):
    rngs = nnx.Rngs(seed)
    return Decoder([RoutedExperts(k, f, experts, top_k, rngs, **options) for _ in range(layers)],
                   extra={"dense": GatedMLP(k, 128, rngs)})


def test_swap_moe_blocks_keeps_the_model_output(key):
    from jax_swiglu.nn import FusedExpertsMLP, FusedMoE, swap_moe_blocks
    model = moe_decoder()
    x = random_x(key, (2, 9, 64))
    before = model(x)
    routers = [layer.mlp.router for layer in model.layers]
    weights = [{name: getattr(layer.mlp, name)[...] for name in ("gate_proj", "up_proj",
                                                                  "down_proj")}
               for layer in model.layers]
    assert swap_moe_blocks(model) == 2
    for layer, router, w in zip(model.layers, routers, weights):
        assert isinstance(layer.mlp, FusedMoE) and layer.mlp.router is router
        assert layer.mlp.top_k == 2 and isinstance(layer.mlp.experts, FusedExpertsMLP)
        gate, up = jax_swiglu.unpack_expert_weights(layer.mlp.experts.packed_experts())
        np.testing.assert_array_equal(gate, w["gate_proj"])
        np.testing.assert_array_equal(up, w["up_proj"])
        np.testing.assert_array_equal(layer.mlp.experts.down_proj.kernel[...], w["down_proj"])
    assert isinstance(model.extra["dense"], GatedMLP)  # a dense block is not an MoE layer
    after = model(x)
    assert after.dtype == before.dtype and after.shape == before.shape
    assert relative_fro(after, before) <= MODEL_REL_FRO
    np.testing.assert_allclose(np.asarray(after, np.float32), np.asarray(before, np.float32),
                               atol=MODEL_MAX_ABS * float(jnp.max(jnp.abs(before))), rtol=0)
    graphdef, state = nnx.split(model)
    text = str(jax.make_jaxpr(lambda s, x: nnx.merge(graphdef, s)(x))(state, x))
    assert len(re.findall(r"\bjax_swiglu_grouped\[", text)) == 2
    # The dense block is swap_mlp_blocks's, which leaves the MoE layers alone.
    assert swap_mlp_blocks(model) == 1


def test_fused_moe_routes_without_renormalizing_when_asked(key):
    """normalize_top_k=False (Qwen1.5/2-MoE, OLMoE) weights each chosen expert by its softmax
    probability itself; the default renormalizes them to sum to 1, as the layer here does."""
    from jax_swiglu.nn import swap_moe_blocks
    x = random_x(key, (12, 64))
    model = Decoder([RoutedExperts(64, 96, 4, 2, nnx.Rngs(3))])
    reference = model.layers[0].mlp(x)
    unnormalized = nnx.clone(model)
    swap_moe_blocks(model)
    assert relative_fro(model.layers[0].mlp(x), reference) <= MODEL_REL_FRO
    swap_moe_blocks(unnormalized, normalize_top_k=False)
    fused = unnormalized.layers[0].mlp
    weights, _ = fused.route(x)
    probabilities = jax.nn.softmax(fused.router(x).astype(jnp.float32), axis=-1)
    kept = jax.lax.top_k(probabilities, 2)[0]
    np.testing.assert_allclose(np.asarray(weights, np.float32), np.asarray(kept), rtol=2.0 ** -7)
    assert float(jnp.max(jnp.sum(kept, -1))) < 1.0
    assert relative_fro(fused(x), reference) > MODEL_REL_FRO


def test_swap_moe_blocks_refuses_what_it_cannot_convert():
    from jax_swiglu.nn import swap_moe_blocks
    with pytest.raises(ValueError, match=r"layers\.0\.mlp\.router has a bias"):
        swap_moe_blocks(moe_decoder(router_bias=True))
    model = moe_decoder()
    model.layers[1].mlp.scale = nnx.Param(jnp.ones((64,), jnp.bfloat16))
    with pytest.raises(ValueError, match=r"layers\.1\.mlp holds state besides .*scale"):
        swap_moe_blocks(model)
    assert isinstance(model.layers[0].mlp, RoutedExperts)  # nothing swapped on a refusal
    model = moe_decoder()
    for layer in model.layers:
        del layer.mlp.experts_per_tok
    with pytest.raises(ValueError, match="pass top_k="):
        swap_moe_blocks(model)
    assert swap_moe_blocks(model, top_k=2) == 2
    with pytest.raises(ValueError, match="computes in float32"):
        swap_moe_blocks(moe_decoder(dtype=jnp.float32))
    with pytest.raises(ValueError, match="found no mixture-of-experts layer"):
        swap_moe_blocks(decoder())
    with pytest.raises(ValueError, match="found no gated MLP block"):
        swap_mlp_blocks(Decoder([RoutedExperts(64, 96, 8, 2, nnx.Rngs(0))]))
    with pytest.raises(ValueError, match="top_k=9 but the layer has 8 experts"):
        swap_moe_blocks(moe_decoder(), top_k=9)


# --- tunix's Llama 3 and Gemma (optional) ------------------------------------------------------

def _tunix_model(name):
    """tunix.models.<name>.model, with the flax flag its import flips restored afterwards."""
    flag = "flax_always_shard_variable"
    before = getattr(flax.config, flag, None)
    module = pytest.importorskip(
        f"tunix.models.{name}.model",
        reason="google-tunix is optional (pip install google-tunix); its model tests skip")
    if before is not None:
        # What the first import of tunix's models sets; it builds its params without a mesh.
        flax.config.update(flag, False)
    yield module
    if before is not None:
        flax.config.update(flag, before)


@pytest.fixture
def llama3():
    yield from _tunix_model("llama3")


@pytest.fixture(params=["gemma", "gemma3"])
def gemma(request):
    """tunix.models.gemma.model (Gemma 1 and 2) or tunix.models.gemma3.model."""
    yield from _tunix_model(request.param)


def tiny_llama3_config(llama3):
    # Real Llama 3 proportions at toy size: GQA, head dim 32, N a multiple of 32.
    return llama3.ModelConfig(num_layers=3, vocab_size=512, embed_dim=128, hidden_dim=320,
                              num_heads=4, head_dim=32, num_kv_heads=2, rope_theta=500_000,
                              norm_eps=1e-5)


def assert_logits_within_bf16(swapped, original, exact):
    """The swapped model's logits against the original's (both bf16, of unit scale) and
    against ``exact``, the original's weights computed in float32."""
    from benchmarks import model_swap

    assert relative_fro(swapped, original) <= MODEL_REL_FRO
    np.testing.assert_allclose(swapped, original, rtol=0, atol=MODEL_MAX_ABS)
    # And no farther from the float32 model than the bf16 original is (it rounds less often):
    # the bound that holds at any depth, which the benchmark checks on the full-size models.
    assert relative_fro(swapped, exact) <= (
        model_swap.F32_MARGIN * relative_fro(original, exact))


def causal_inputs(batch, length, vocab, key):
    tokens = jax.random.randint(key, (batch, length), 0, vocab, jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((length, length), bool)), (batch, length, length))
    return tokens, positions, mask


@pytest.mark.tunix
def test_tunix_llama3_logits_survive_the_swap(llama3, key):
    from benchmarks import model_swap

    config = tiny_llama3_config(llama3)
    tokens, positions, mask = causal_inputs(2, 16, config.vocab_size, key)

    def logits(model):
        return model(tokens, positions, None, mask)[0].astype(jnp.float32)

    model = model_swap.random_llama3(config, seed=0, dtype=jnp.bfloat16)
    assert all(isinstance(layer.mlp, llama3.MLP) for layer in model.layers)
    original = logits(model)
    # bf16's own error: the same weights computed in float32.
    with jax.default_matmul_precision("highest"):
        exact = logits(model_swap.cast_params(model, jnp.float32))
    assert model.layers[0].mlp.gate_proj.kernel.dtype == jnp.bfloat16

    assert swap_mlp_blocks(model) == config.num_layers
    assert all(isinstance(layer.mlp, FusedSwiGLUMLP) for layer in model.layers)
    swapped = logits(model)

    assert_logits_within_bf16(swapped, original, exact)

    graphdef, state = nnx.split(model)

    def forward(state):
        return nnx.merge(graphdef, state)(tokens, positions, None, mask)[0]

    assert swiglu_primitives(forward, state) == config.num_layers


@pytest.mark.tunix
def test_tunix_llama3_decode_with_a_cache(llama3, key):
    from benchmarks import model_swap

    config = tiny_llama3_config(llama3)
    model = model_swap.random_llama3(config, seed=1)
    swapped = nnx.clone(model)
    swap_mlp_blocks(swapped)
    inputs = model_swap.decode_inputs(config, 3, 24, jnp.bfloat16, key)
    out = {name: m(*inputs) for name, m in (("original", model), ("swapped", swapped))}
    for name in out:
        assert out[name][0].shape == (3, 1, config.vocab_size)
        assert set(out[name][1]) == {f"layer_{i}" for i in range(config.num_layers)}
    assert relative_fro(out["swapped"][0], out["original"][0]) <= MODEL_REL_FRO
    # The clone shares the attention weights, the original keeps its MLP.
    assert isinstance(model.layers[0].mlp, llama3.MLP)
    assert swapped.layers[0].attn.q_proj.w[...] is model.layers[0].attn.q_proj.w[...]


def tiny_gemma(gemma, seed):
    """A tiny Gemma (1) or Gemma 3 of tunix's, random bf16 weights, norms the identity."""
    from benchmarks import model_swap

    sizes = dict(num_layers=3, num_embed=512, embed_dim=128, hidden_dim=320, num_heads=4,
                 head_dim=32, num_kv_heads=2)
    if hasattr(gemma, "Gemma3"):  # post-attention and post-MLP norms, q/k norms, local layers
        config, build = gemma.ModelConfig(**sizes, sliding_window_size=8), gemma.Gemma3
    else:
        config = gemma.ModelConfig(**sizes, final_logit_softcap=None, use_post_attn_norm=False,
                                   use_post_ffw_norm=False,
                                   attention_types=(gemma.AttentionType.GLOBAL,) * 3)
        build = gemma.Gemma
    # Gemma's RMSNorm multiplies by 1 + scale: scales 0 keep the logits of unit scale.
    model = model_swap.random_model(lambda rngs: build(config, rngs=rngs), seed=seed,
                                    norm_scale=0.0)
    return config, model


@pytest.mark.tunix
def test_tunix_gemma_geglu_logits_survive_the_swap(gemma, key):
    from benchmarks import model_swap

    config, model = tiny_gemma(gemma, seed=0)
    tokens, positions, mask = causal_inputs(2, 16, config.num_embed, key)

    def logits(model):
        return model(tokens, positions, None, mask)[0].astype(jnp.float32)

    # Its FeedForward: bias-free nnx.Linear gate_proj/up_proj/down_proj, nnx.gelu on the gate,
    # which is jax.nn.gelu, tanh approximation by default: "gelu_tanh".
    assert all(isinstance(layer.mlp, gemma.FeedForward) for layer in model.layers)
    assert model.layers[0].mlp.gate_proj.kernel.dtype == jnp.bfloat16
    original = logits(model)
    with jax.default_matmul_precision("highest"):
        exact = logits(model_swap.cast_params(model, jnp.float32))
    silu = nnx.clone(model)  # the same weights, swapped with the wrong activation

    assert swap_mlp_blocks(model, activation="gelu_tanh") == config.num_layers
    assert all(isinstance(layer.mlp, FusedSwiGLUMLP) and layer.mlp.activation == "gelu_tanh"
               for layer in model.layers)
    assert_logits_within_bf16(logits(model), original, exact)

    # The blocks do not state their activation, so SiLU swaps in silently; the logits show it,
    # far outside the tolerance the right activation meets.
    assert swap_mlp_blocks(silu, activation="silu") == config.num_layers
    wrong = logits(silu)
    assert relative_fro(wrong, original) > 4 * MODEL_REL_FRO
    assert float(jnp.max(jnp.abs(wrong - original))) > 2 * MODEL_MAX_ABS


@pytest.mark.tunix
def test_model_swap_benchmark_runs_tiny(llama3, tmp_path):
    import json

    from benchmarks import model_swap

    result = model_swap.main(["--tiny", "--out", str(tmp_path), "--iterations", "2",
                              "--rounds", "1", "--decode-batch", "1", "2"])
    (json_path,) = tmp_path.glob("*-model-swap.json")
    assert json.loads(json_path.read_text())["models"][0]["swapped_blocks"] == 2
    assert (tmp_path / (json_path.stem + ".md")).exists()
    calls = result["models"][0]["calls"]
    assert [(c["call"], c["batch"]) for c in calls] == [("prefill", 1), ("decode", 1),
                                                        ("decode", 2)]
    assert calls[0]["logits"]["within_bf16_tolerance"]
    assert all(c["logits"]["rel_fro"] <= MODEL_REL_FRO for c in calls)


@pytest.mark.tunix
def test_model_swap_benchmark_runs_tiny_fp8(llama3, tmp_path):
    from benchmarks import model_swap

    result = model_swap.main(["--tiny", "--fp8", "--out", str(tmp_path), "--iterations", "2",
                              "--rounds", "1", "--decode-batch", "1"])
    (md_path,) = tmp_path.glob("*-model-swap-fp8.md")
    assert "fp8 blocks" in md_path.read_text() and result["fp8"]
    prefill = result["models"][0]["calls"][0]["logits"]
    assert 0 < prefill["rel_fro"] <= 0.08  # fp8's own error, as in test_swap_to_fp8_blocks


def test_model_swap_report_states_fp8_errors_without_the_bf16_bound():
    from benchmarks import model_swap

    call = {"call": "prefill", "batch": 1, "tokens": 64, "wall_ms": {"original": 2.0,
            "swapped": 1.6}, "speedup": 1.25, "kernel": "x: interleaved [fp8] (data)",
            "logits": {"rel_fro": 0.03, "argmax_agree": 0.9, "swapped_vs_f32_rel_fro": 0.031,
                       "original_vs_f32_rel_fro": 0.004, "within_bf16_tolerance": False}}
    result = {"environment": {"device": "GPU", "date": "2026-12-04", "jax": "0",
                              "jax_swiglu": "0", "git": "x", "command": "c"},
              "tunix": "0", "iterations": 2, "rounds": 1, "f32_margin": model_swap.F32_MARGIN,
              "notes": [], "models": [{"model": "tiny", "num_layers": 2, "calls": [call]}]}
    assert "(OVER)" in model_swap.markdown(result)
    text = model_swap.markdown(dict(result, fp8=True))
    assert "fp8 blocks" in text and "stated for fp8" in text and "(OVER)" not in text
    assert "3.10e-02 / 4.00e-03" in text


# --- tunix's Qwen3-MoE (optional) --------------------------------------------------------------

@pytest.fixture
def qwen3():
    yield from _tunix_model("qwen3")


@pytest.mark.tunix
def test_tunix_qwen3_moe_logits_survive_the_swap(qwen3, key):
    """tunix's Qwen3 with MoE layers (Qwen3-30B-A3B's routing: top-k of the softmax,
    renormalized), random bf16 weights: swap_moe_blocks replaces every MoELayer, and the
    logits stay within the bf16 tolerance of the original's (its dense path on the CPU)."""
    from benchmarks import model_swap
    from jax_swiglu.nn import FusedMoE, swap_moe_blocks

    config = qwen3.ModelConfig(num_layers=2, vocab_size=512, embed_dim=128, hidden_dim=96,
                               num_heads=4, head_dim=32, num_kv_heads=2, rope_theta=1_000_000,
                               norm_eps=1e-6, num_experts=8, num_experts_per_tok=2,
                               dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    tokens, positions, mask = causal_inputs(2, 16, config.vocab_size, key)

    def logits(model):
        return model(tokens, positions, None, mask)[0].astype(jnp.float32)

    model = model_swap.random_model(lambda rngs: qwen3.Qwen3(config, rngs=rngs), seed=0)
    assert all(isinstance(layer.mlp, qwen3.MoELayer) for layer in model.layers)
    original = logits(model)
    # bf16's own error: the same weights in a float32 model (the config's dtype is what
    # tunix computes in, whatever the params').
    in_float32 = nnx.eval_shape(lambda: qwen3.Qwen3(
        dataclasses.replace(config, dtype=jnp.float32, param_dtype=jnp.float32),
        rngs=nnx.Rngs(0)))
    nnx.update(in_float32, nnx.state(model_swap.cast_params(model, jnp.float32)))
    with jax.default_matmul_precision("highest"):
        exact = logits(in_float32)

    assert swap_moe_blocks(model) == config.num_layers
    assert all(isinstance(layer.mlp, FusedMoE) and layer.mlp.top_k == 2
               for layer in model.layers)
    assert_logits_within_bf16(logits(model), original, exact)
