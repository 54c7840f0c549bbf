"""What a new user does first, end to end on the CPU: every route by which gate/up weights of
another layout could arrive, the Flax modules as Flax users drive them, and whole Hugging Face
checkpoints (GitHub issue 45).

The fused modules take the XLA reference path here, so every output is compared exactly with
the reference on the weights as the user holds them.
"""

import ast
import builtins
import re
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flax", reason="the Flax flows need flax: pip install jax_swiglu[flax]")
import flax.linen as nn  # noqa: E402
from flax import nnx  # noqa: E402

import jax_swiglu  # noqa: E402
from jax_swiglu import convert  # noqa: E402
from jax_swiglu import nn as swiglu_nn  # noqa: E402
from jax_swiglu.nn import linen as swiglu_linen  # noqa: E402

from helpers import random_x  # noqa: E402

K, N = 64, 96


@pytest.fixture(autouse=True)
def on_the_cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _draw(key, shape, dtype=jnp.bfloat16):
    return (jax.random.normal(key, shape) / np.sqrt(shape[0])).astype(dtype)


@pytest.fixture
def weights(key):
    """gate, up [K, N], down [N, K]: a block as a user holds it, and its expected output."""
    kg, ku, kd, kx = jax.random.split(key, 4)
    gate, up, down = _draw(kg, (K, N)), _draw(ku, (K, N)), _draw(kd, (N, K))
    x = random_x(kx, (3, K))
    expected = jax_swiglu.swiglu_reference(x, gate, up) @ down
    return gate, up, down, x, expected


def _concatenated(gate, up, down):
    """The block as Phi-3 and vLLM store it: gate_up_proj = [gate | up]."""
    return {"gate_up_proj": {"kernel": jnp.concatenate([gate, up], axis=1)},
            "down_proj": {"kernel": down}}


# --- a [gate | up] concatenation, by every route ------------------------------------------

def test_a_concatenation_converts_by_name_and_computes_the_block(weights):
    gate, up, down, x, expected = weights
    phi3 = _concatenated(gate, up, down)
    fused = swiglu_nn.fuse_params(phi3)
    np.testing.assert_array_equal(fused["gate_up_packed"]["kernel"],
                                  jax_swiglu.pack_weights(gate, up).data)
    np.testing.assert_array_equal(swiglu_nn.FusedSwiGLUMLP.from_params(fused)(x), expected)
    np.testing.assert_array_equal(
        swiglu_linen.FusedSwiGLUMLP(N).apply({"params": fused}, x), expected)
    # ... and exports back to it exactly.
    back = swiglu_nn.unfuse_params(fused, layout="concatenated")
    np.testing.assert_array_equal(back["gate_up_proj"]["kernel"], phi3["gate_up_proj"]["kernel"])
    # Hugging Face's Phi-3 tensors ([out, in]) too.
    hf = {"gate_up_proj.weight": phi3["gate_up_proj"]["kernel"].T, "down_proj.weight": down.T}
    from_hf = swiglu_nn.fuse_hf_weights(hf)
    np.testing.assert_array_equal(from_hf["gate_up_packed"]["kernel"],
                                  fused["gate_up_packed"]["kernel"])
    exported = swiglu_nn.fused_to_hf_weights(from_hf, layout="concatenated")
    np.testing.assert_array_equal(exported["gate_up_proj.weight"], hf["gate_up_proj.weight"])


def test_a_concatenation_is_never_taken_for_the_packed_matrix(weights):
    gate, up, down, x, _ = weights
    phi3 = _concatenated(gate, up, down)
    with pytest.raises(ValueError, match="gate_up_proj names the concatenation"):
        swiglu_nn.FusedSwiGLUMLP(K, N, params=phi3)
    with pytest.raises(ValueError, match="gate_up_proj names the concatenation"):
        swiglu_nn.FusedSwiGLUMLP.from_params(phi3)
    with pytest.raises(ValueError, match="gate_up_proj names the concatenation"):
        swiglu_linen.FusedSwiGLUMLP(N).apply({"params": phi3}, x)
    with pytest.raises(ValueError, match="gate_up_proj names the concatenation"):
        swiglu_nn.unfuse_params(phi3)
    with pytest.raises(ValueError, match="it holds gate_up_proj blocks"):
        swiglu_nn.unfuse_mlp_blocks({"layers": {"0": {"mlp": phi3}}})
    with pytest.raises(ValueError, match="fused already"):
        swiglu_nn.fuse_params(swiglu_nn.fuse_params(phi3))
    with pytest.raises(ValueError, match="both gate_up_proj and gate_proj"):
        swiglu_nn.fuse_params({**phi3, "gate_proj": {"kernel": gate}})
    # Unfused params where fused ones belong say what to call.
    with pytest.raises(ValueError, match="convert them with jax_swiglu.nn.fuse_params"):
        swiglu_nn.FusedSwiGLUMLP.from_params({"gate_proj": {"kernel": gate},
                                              "up_proj": {"kernel": up},
                                              "down_proj": {"kernel": down}})


def test_loading_into_an_abstract_module_checks_the_state(weights):
    """nnx.eval_shape + nnx.update, the way checkpoints load: a concatenation under its own
    name has nowhere to go, a wrongly shaped matrix and weights never loaded are refused."""
    gate, up, down, x, expected = weights
    abstract = lambda: nnx.eval_shape(lambda: swiglu_nn.FusedSwiGLUMLP(K, N, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="gate_up_proj"):
        nnx.update(abstract(), _concatenated(gate, up, down))
    with pytest.raises(ValueError, match="holds no weights.*nnx.update"):
        abstract()(x)
    module = abstract()
    nnx.update(module, {"gate_up_packed": {"kernel": jnp.zeros((K, 2 * N + 64), jnp.bfloat16)},
                        "down_proj": {"kernel": down}})
    with pytest.raises(ValueError, match=r"gate_up_packed.kernel has shape \(64, 256\)"):
        module(x)
    module = abstract()
    nnx.update(module, swiglu_nn.fuse_params(_concatenated(gate, up, down)))
    np.testing.assert_array_equal(module(x), expected)


def test_whole_trees_with_concatenated_blocks_fuse(weights):
    gate, up, down, x, expected = weights
    tree = {"layers": {"0": {"mlp": _concatenated(gate, up, down), "norm": {"scale": jnp.ones(K)}},
                       "1": {"mlp": {"gate_proj": {"kernel": gate}, "up_proj": {"kernel": up},
                                     "down_proj": {"kernel": down}}}}}
    fused = swiglu_nn.fuse_mlp_blocks(tree)
    for i in "01":
        block = swiglu_nn.FusedSwiGLUMLP.from_params(fused["layers"][i]["mlp"])
        np.testing.assert_array_equal(block(x), expected)
    assert sorted(fused["layers"]["0"]) == ["mlp", "norm"]


# --- Flax as Flax users expect (nnx.Linear's conventions) ---------------------------------

class LlamaMLP(nnx.Module):
    """A user's own MLP block, written as Flax users write it."""

    def __init__(self, k, n, *, rngs, param_dtype=jnp.bfloat16, use_bias=False, **extra):
        linear = lambda i, o: nnx.Linear(i, o, use_bias=use_bias, param_dtype=param_dtype,
                                         rngs=rngs)
        self.gate_proj, self.up_proj, self.down_proj = linear(k, n), linear(k, n), linear(n, k)
        for name, value in extra.items():
            setattr(self, name, value)

    def __call__(self, x):
        return self.down_proj(nnx.silu(self.gate_proj(x)) * self.up_proj(x))


class Phi3MLP(nnx.Module):
    """Phi-3's block: gate and up in one layer, [gate | up] along its output."""

    def __init__(self, k, n, *, rngs):
        self.gate_up_proj = nnx.Linear(k, 2 * n, use_bias=False, param_dtype=jnp.bfloat16,
                                       rngs=rngs)
        self.down_proj = nnx.Linear(n, k, use_bias=False, param_dtype=jnp.bfloat16, rngs=rngs)

    def __call__(self, x):
        gate, up = jnp.split(self.gate_up_proj(x), 2, axis=-1)
        return self.down_proj(nnx.silu(gate) * up)


def _block_reference(x, gate, up, down, activation="silu"):
    return jax_swiglu.swiglu_reference(x, gate, up, activation=activation) @ down


def test_from_unfused_takes_any_block_of_linear_layers(key):
    mlp = LlamaMLP(K, N, rngs=nnx.Rngs(0))
    before = nnx.to_pure_dict(nnx.state(mlp))
    fused = swiglu_nn.FusedSwiGLUMLP.from_unfused(mlp)
    x = random_x(key, (2, 5, K))
    kernels = [getattr(mlp, name).kernel[...] for name in ("gate_proj", "up_proj", "down_proj")]
    np.testing.assert_array_equal(fused(x), _block_reference(x, *kernels))
    # The block's own bf16 math rounds the gate and up products before the product: close.
    np.testing.assert_allclose(np.asarray(fused(x), np.float32), np.asarray(mlp(x), np.float32),
                               rtol=0.05, atol=0.05)
    assert fused.dtype is None and fused.param_dtype == jnp.bfloat16  # nnx.Linear's dtype=None
    jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(nnx.state(mlp)), before)
    # A Phi-3 block reads its gate_up_proj as the concatenation it is.
    phi3 = Phi3MLP(K, N, rngs=nnx.Rngs(1))
    gate_up = phi3.gate_up_proj.kernel[...]
    expected = _block_reference(x, gate_up[:, :N], gate_up[:, N:], phi3.down_proj.kernel[...])
    np.testing.assert_array_equal(swiglu_nn.FusedSwiGLUMLP.from_unfused(phi3)(x), expected)


def test_from_unfused_reads_or_is_told_the_activation(key):
    x = random_x(key, (3, K))
    gemma = LlamaMLP(K, N, rngs=nnx.Rngs(2), act_fn=nnx.gelu)  # states its activation
    kernels = [getattr(gemma, name).kernel[...] for name in ("gate_proj", "up_proj", "down_proj")]
    fused = swiglu_nn.FusedSwiGLUMLP.from_unfused(gemma)
    assert fused.activation == "gelu_tanh"
    np.testing.assert_array_equal(fused(x), _block_reference(x, *kernels, "gelu_tanh"))
    with pytest.raises(ValueError, match="act_fn is .*'gelu_tanh', but activation='silu'"):
        swiglu_nn.FusedSwiGLUMLP.from_unfused(gemma, activation="silu")
    with pytest.raises(ValueError, match="an activation FusedSwiGLUMLP does not have"):
        swiglu_nn.FusedSwiGLUMLP.from_unfused(LlamaMLP(K, N, rngs=nnx.Rngs(2), act_fn=nnx.relu))
    # Silent about it, a block is told.
    told = swiglu_nn.FusedSwiGLUMLP.from_unfused(LlamaMLP(K, N, rngs=nnx.Rngs(2)),
                                                 activation="gelu_tanh")
    np.testing.assert_array_equal(told(x), fused(x))


def test_from_unfused_refuses_what_the_fused_block_would_drop():
    with pytest.raises(ValueError, match="gate_proj has a bias"):
        swiglu_nn.FusedSwiGLUMLP.from_unfused(LlamaMLP(K, N, rngs=nnx.Rngs(0), use_bias=True))
    lora = LlamaMLP(K, N, rngs=nnx.Rngs(0), lora_a=nnx.Param(jnp.zeros((K, 4))))
    with pytest.raises(ValueError, match=r"holds state besides .* \(lora_a\)"):
        swiglu_nn.FusedSwiGLUMLP.from_unfused(lora)
    with pytest.raises(TypeError, match="has no \\['up_proj', 'down_proj'\\]"):
        swiglu_nn.FusedSwiGLUMLP.from_unfused(nnx.Dict(gate_proj=nnx.Linear(K, N, rngs=nnx.Rngs(0))))


def test_dtype_none_computes_in_the_inputs_and_params_dtype(key):
    x = random_x(key, (3, K))
    reference = swiglu_nn.SwiGLUMLP(K, N, dtype=None, rngs=nnx.Rngs(0))
    fused = swiglu_nn.FusedSwiGLUMLP(K, N, dtype=None, rngs=nnx.Rngs(0))
    kernels = [getattr(reference, name).kernel[...] for name in ("gate_proj", "up_proj",
                                                                 "down_proj")]
    for module in (reference, fused):
        y = module(x)
        assert y.dtype == jnp.bfloat16
        np.testing.assert_array_equal(y, _block_reference(x, *kernels))
    # float32 in: the reference block computes in float32 as nnx.Linear would ...
    x32 = x.astype(jnp.float32)
    y32 = reference(x32)
    assert y32.dtype == jnp.float32
    np.testing.assert_array_equal(
        y32, _block_reference(x32, *(kernel.astype(jnp.float32) for kernel in kernels)))
    # ... and the fused block, which runs bfloat16 or float16, says what to do.
    with pytest.raises(TypeError, match=r"dtype=None.*\(float32\).*float32.*Cast the input"):
        fused(x32)
    assert "M=3 N=96 K=64 bfloat16" in fused.explain(x, platform="cpu")
    linen = swiglu_linen.FusedSwiGLUMLP(N, dtype=None)
    params = swiglu_nn.fuse_params(nnx.to_pure_dict(nnx.state(reference, nnx.Param)))
    np.testing.assert_array_equal(linen.apply({"params": params}, x), fused(x))
    with pytest.raises(TypeError, match="dtype=None"):
        linen.apply({"params": params}, x32)
    # dtype=None is no longer read as float64 anywhere.
    with pytest.raises(TypeError, match="got dtype=None"):
        swiglu_nn.Fp8SwiGLUMLP.quantize(reference)


P = jax.sharding.PartitionSpec


def _specs(module):
    return nnx.to_pure_dict(nnx.get_partition_spec(nnx.state(module)))


def test_kernel_init_with_partitioning_and_maxtexts_axis_names():
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("hidden", "ffn"))
    fused = swiglu_nn.FusedSwiGLUMLP(K, N, kernel_init=init, rngs=nnx.Rngs(0))
    assert _specs(fused) == {"gate_up_packed": {"kernel": P("hidden", "ffn")},
                             "down_proj": {"kernel": P("ffn", "hidden")}}
    # The same draws as a plain initializer: the names are metadata.
    plain = swiglu_nn.FusedSwiGLUMLP(K, N, rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(fused.gate_up_packed.kernel[...], plain.gate_up_packed.kernel[...])
    reference = swiglu_nn.SwiGLUMLP(K, N, kernel_init=init, rngs=nnx.Rngs(0))
    assert _specs(reference)["down_proj"] == {"kernel": P("ffn", "hidden")}
    assert _specs(swiglu_nn.FusedSwiGLUMLP.from_unfused(reference)) == _specs(fused)
    assert _specs(reference.__class__(K, N, kernel_axes=("hidden", "ffn"), rngs=nnx.Rngs(0))) \
        == _specs(reference)
    # MaxText names its fused kernel [embed, num_activations, mlp]: the packed matrix keeps
    # each gate/up pair in the mlp axis.
    maxtext = swiglu_nn.FusedSwiGLUMLP(K, N, kernel_axes=("embed", "num_activations", "mlp"),
                                       rngs=nnx.Rngs(0))
    assert _specs(maxtext) == {"gate_up_packed": {"kernel": P("embed", "mlp")},
                               "down_proj": {"kernel": P("mlp", "embed")}}
    with pytest.raises(ValueError, match="give the names once"):
        swiglu_nn.FusedSwiGLUMLP(K, N, kernel_init=init, kernel_axes=("embed", "mlp"),
                                 rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="kernel_axes must name"):
        swiglu_nn.FusedSwiGLUMLP(K, N, kernel_axes=("embed",), rngs=nnx.Rngs(0))
    # Under a mesh with logical rules the params are placed by those names.
    mesh = jax.make_mesh((1,), ("model",), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=jax.devices("cpu")[:1])
    with jax.set_mesh(mesh), nnx.logical_axis_rules((("hidden", None), ("ffn", "model"))):
        placed = swiglu_nn.FusedSwiGLUMLP(K, N, kernel_init=init, rngs=nnx.Rngs(0))
    assert placed.gate_up_packed.kernel[...].sharding.spec == P(None, "model")


def test_linen_kernel_init_boxes_and_axis_names(key):
    x = random_x(key, (2, K))
    init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("hidden", "ffn"))
    for module in (swiglu_linen.FusedSwiGLUMLP(N, kernel_init=init),
                   swiglu_linen.FusedSwiGLUMLP(N, kernel_axes=("hidden", "num_activations", "ffn"))):
        specs = nn.get_partition_spec(module.init(key, x))["params"]
        assert specs == {"gate_up_packed": {"kernel": P("hidden", "ffn")},
                         "down_proj": {"kernel": P("ffn", "hidden")}}
    reference = swiglu_linen.SwiGLUMLP(N, kernel_init=init)
    variables = reference.init(key, x)
    assert nn.get_partition_spec(variables)["params"]["down_proj"]["kernel"] == P("ffn", "hidden")
    fused_params = swiglu_nn.fuse_params(nn.unbox(variables)["params"])
    np.testing.assert_array_equal(
        swiglu_linen.FusedSwiGLUMLP(N, kernel_init=init).apply({"params": fused_params}, x),
        reference.apply(variables, x))
    # Mesh axes (nn.with_partitioning) stay mesh axes.
    mesh_init = nn.with_partitioning(nn.initializers.lecun_normal(), (None, "model"))
    boxed = swiglu_linen.FusedSwiGLUMLP(N, kernel_init=mesh_init).init(key, x)["params"]
    assert type(boxed["gate_up_packed"]["kernel"]) is nn.Partitioned
    assert boxed["down_proj"]["kernel"].names == ("model", None)


def test_an_abstract_module_loads_a_checkpoint(key):
    """nnx.eval_shape builds the module without weights; nnx.update puts a checkpoint's in."""
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("embed", "mlp"))
    source = swiglu_nn.FusedSwiGLUMLP(K, N, rngs=nnx.Rngs(7))
    checkpoint = nnx.to_pure_dict(nnx.state(source, nnx.Param))  # what a restore hands back
    abstract = nnx.eval_shape(
        lambda: swiglu_nn.FusedSwiGLUMLP(K, N, kernel_init=init, rngs=nnx.Rngs(0)))
    assert isinstance(abstract.gate_up_packed.kernel.get_value(), jax.ShapeDtypeStruct)
    assert _specs(abstract)["gate_up_packed"] == {"kernel": P("embed", "mlp")}
    nnx.update(abstract, checkpoint)
    x = random_x(key, (4, K))
    np.testing.assert_array_equal(abstract(x), source(x))
    # The module's own nnx.State loads the same way, and so does a whole model's.
    again = nnx.eval_shape(lambda: swiglu_nn.FusedSwiGLUMLP(K, N, rngs=nnx.Rngs(0)))
    nnx.update(again, nnx.state(source))
    np.testing.assert_array_equal(again(x), source(x))


def test_from_packed_builds_the_module_from_adapters_output(weights):
    gate, up, down, x, expected = weights
    packed = jax_swiglu.pack_weights(gate, up)
    module = swiglu_nn.FusedSwiGLUMLP.from_packed(packed, down)
    np.testing.assert_array_equal(module(x), expected)
    np.testing.assert_array_equal(module.packed_weights().data, packed.data)
    with pytest.raises(ValueError, match=r"w_down must be \[N, K\] = \[96, 64\]"):
        swiglu_nn.FusedSwiGLUMLP.from_packed(packed, down.T)
    with pytest.raises(TypeError, match="layout='concatenated'"):
        swiglu_nn.FusedSwiGLUMLP.from_packed(jnp.concatenate([gate, up], axis=1), down)


# --- whole Hugging Face checkpoints --------------------------------------------------------

LAYERS = 3


def _hf_state_dict(key, names=None, k=K, n=N, dtype=jnp.bfloat16):
    """A small Llama-style state dict, [out, in] numpy tensors, MLPs and other tensors."""
    names = names or {"gate": "model.layers.{i}.mlp.gate_proj.weight",
                      "up": "model.layers.{i}.mlp.up_proj.weight",
                      "down": "model.layers.{i}.mlp.down_proj.weight"}
    sd = {"model.embed_tokens.weight": np.asarray(_draw(key, (10, k), dtype))}
    for i in range(LAYERS):
        keys = jax.random.split(jax.random.fold_in(key, i), 4)
        sd[f"model.layers.{i}.input_layernorm.weight"] = np.ones(k, np.float32)
        if "gate_up" in names:
            sd[names["gate_up"].format(i=i)] = np.asarray(_draw(keys[0], (2 * n, k), dtype))
        else:
            sd[names["gate"].format(i=i)] = np.asarray(_draw(keys[0], (n, k), dtype))
            sd[names["up"].format(i=i)] = np.asarray(_draw(keys[1], (n, k), dtype))
        sd[names["down"].format(i=i)] = np.asarray(_draw(keys[2], (k, n), dtype))
    return sd


def _assert_bitwise(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_a_state_dict_converts_layer_by_layer_and_exports_bit_exactly(key):
    sd = _hf_state_dict(key)
    before = {name: tensor.copy() for name, tensor in sd.items()}
    layers = convert.pack_hf_checkpoint(sd)
    assert len(layers) == LAYERS
    x = random_x(key, (4, K))
    for i, (packed, w_down) in enumerate(layers):
        gate, up, down = (sd[f"model.layers.{i}.mlp.{p}_proj.weight"] for p in ("gate", "up",
                                                                                  "down"))
        _assert_bitwise(w_down, down.T)
        np.testing.assert_array_equal(jax_swiglu.swiglu(x, packed),
                                      jax_swiglu.swiglu_reference(x, gate.T, up.T))
        # The fused module of the layer computes the Hugging Face block.
        module = swiglu_nn.FusedSwiGLUMLP.from_packed(packed, w_down)
        np.testing.assert_array_equal(module(x), _block_reference(x, gate.T, up.T, down.T))
    exported = convert.hf_checkpoint(layers)
    assert sorted(exported) == sorted(name for name in sd if ".mlp." in name)
    for name, tensor in exported.items():
        _assert_bitwise(tensor, sd[name])
        assert tensor.flags.c_contiguous
    for name, tensor in sd.items():  # nothing given was modified
        _assert_bitwise(tensor, before[name])
    # dtype= casts on the way in.
    assert convert.pack_hf_checkpoint(sd, dtype=jnp.float16)[0][1].dtype == jnp.float16


def test_safetensors_files_convert_and_export_bit_exactly(key, tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")

    sd = _hf_state_dict(key)
    single = tmp_path / "model.safetensors"
    safetensors_numpy.save_file(sd, single)
    # A sharded checkpoint: two files, layers split between them.
    shards = tmp_path / "sharded"
    shards.mkdir()
    names = sorted(sd)
    for part, chunk in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        safetensors_numpy.save_file({name: sd[name] for name in chunk},
                                    shards / f"model-0000{part + 1}-of-00002.safetensors")
    expected = convert.pack_hf_checkpoint(sd)
    for source in (single, str(single), shards, sorted(shards.glob("*.safetensors"))):
        layers = convert.pack_hf_checkpoint(source)
        for (packed, w_down), (want, want_down) in zip(layers, expected, strict=True):
            _assert_bitwise(packed.data, want.data)
            _assert_bitwise(w_down, want_down)
    # Exported beside the model's other tensors, the file is the original, tensor for tensor.
    others = {name: tensor for name, tensor in sd.items() if ".mlp." not in name}
    out = tmp_path / "exported.safetensors"
    convert.save_hf_checkpoint(out, expected, tensors=others)
    again = safetensors_numpy.load_file(out)
    assert sorted(again) == sorted(sd)
    for name in sd:
        _assert_bitwise(again[name], sd[name])
    from safetensors import safe_open
    with safe_open(str(out), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}


def test_other_naming_patterns_and_phi3s_concatenation(key):
    mistral = {"gate": "layers.{i}.feed_forward.w1.weight", "up": "layers.{i}.feed_forward.w3.weight",
               "down": "layers.{i}.feed_forward.w2.weight"}
    sd = _hf_state_dict(key, mistral)
    layers = convert.pack_hf_checkpoint(sd, **mistral)
    x = random_x(key, (2, K))
    gate, up = sd["layers.1.feed_forward.w1.weight"], sd["layers.1.feed_forward.w3.weight"]
    np.testing.assert_array_equal(jax_swiglu.swiglu(x, layers[1][0]),
                                  jax_swiglu.swiglu_reference(x, gate.T, up.T))
    for name, tensor in convert.hf_checkpoint(layers, **mistral).items():
        _assert_bitwise(tensor, sd[name])
    # Phi-3: gate_up_proj.weight [2N, K], gate rows first.
    phi3 = {"gate_up": convert.HF_GATE_UP, "down": convert.HF_DOWN}
    sd = _hf_state_dict(key, phi3)
    with pytest.raises(ValueError, match=r"holds gate_up_proj tensors .* pass gate_up="):
        convert.pack_hf_checkpoint(sd)
    layers = convert.pack_hf_checkpoint(sd, gate_up=convert.HF_GATE_UP)
    gate_up = sd["model.layers.2.mlp.gate_up_proj.weight"]
    np.testing.assert_array_equal(jax_swiglu.swiglu(x, layers[2][0]),
                                  jax_swiglu.swiglu_reference(x, gate_up[:N].T, gate_up[N:].T))
    for name, tensor in convert.hf_checkpoint(layers, gate_up=convert.HF_GATE_UP).items():
        _assert_bitwise(tensor, sd[name])


def test_one_layers_tensors_by_any_prefix(key):
    sd = _hf_state_dict(key)
    layer = {name: tensor for name, tensor in sd.items() if name.startswith("model.layers.1.")}
    expected = convert.pack_hf(layer["model.layers.1.mlp.gate_proj.weight"],
                               layer["model.layers.1.mlp.up_proj.weight"])
    mlp_prefixed = {name.removeprefix("model.layers.1."): t for name, t in layer.items()}
    for weights in (layer, mlp_prefixed):
        _assert_bitwise(convert.pack_hf(weights).data, expected.data)
        fused = swiglu_nn.fuse_hf_weights(weights)
        _assert_bitwise(fused["gate_up_packed"]["kernel"], expected.data)
    with pytest.raises(ValueError, match=r"3 tensors are named ...gate_proj.weight .*"
                                         r"pack_hf_checkpoint"):
        convert.pack_hf(sd)
    with pytest.raises(ValueError, match="different prefixes"):
        convert.pack_hf({"a.gate_proj.weight": layer["model.layers.1.mlp.gate_proj.weight"],
                         "b.up_proj.weight": layer["model.layers.1.mlp.up_proj.weight"]})


def test_bad_checkpoints_are_clear_errors(key, tmp_path):
    sd = _hf_state_dict(key)
    missing = {name: t for name, t in sd.items() if name != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(ValueError, match=r"layers 0 \.\. 2, but it lacks 1 of their tensors: "
                                         r"\['model.layers.1.mlp.up_proj.weight'\]"):
        convert.pack_hf_checkpoint(missing)
    mismatched = {**sd, "model.layers.2.mlp.down_proj.weight": sd["model.layers.2.mlp.gate_proj.weight"]}
    with pytest.raises(ValueError, match=r"layer 2: the MLP tensors must be gate and up \[N, K\], "
                                         r"down \[K, N\]"):
        convert.pack_hf_checkpoint(mismatched)
    with pytest.raises(ValueError, match=r"no tensor of the checkpoint is named like "
                                         r"gate='transformer.h.\{i\}.mlp.c_fc.weight'"):
        convert.pack_hf_checkpoint(sd, gate="transformer.h.{i}.mlp.c_fc.weight")
    with pytest.raises(ValueError, match=r"with \{i\} once"):
        convert.pack_hf_checkpoint(sd, gate="model.layers.0.mlp.gate_proj.weight")
    with pytest.raises(ValueError, match="not both"):
        convert.pack_hf_checkpoint(sd, gate=convert.HF_GATE, gate_up=convert.HF_GATE_UP)
    unaligned = _hf_state_dict(key, n=36)
    with pytest.raises(ValueError, match=r"model.layers.0.mlp: .*multiples of 8"):
        convert.pack_hf_checkpoint(unaligned)
    with pytest.raises(FileNotFoundError, match="no such checkpoint file"):
        convert.pack_hf_checkpoint(tmp_path / "absent.safetensors")
    (tmp_path / "model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="not a .safetensors file"):
        convert.pack_hf_checkpoint(tmp_path / "model.bin")
    with pytest.raises(TypeError, match=r"layers\[0\] must be \(packed, w_down\)"):
        convert.hf_checkpoint([convert.pack_hf_checkpoint(sd)[0][0]])


# --- the README's snippets, run as written -------------------------------------------------

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_snippets():
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def _names(code: str) -> tuple[set[str], set[str]]:
    """(names a snippet reads, those it reads without ever defining them): the first are what
    the test hands it, the second what the test must bind."""
    tree = ast.parse(code)
    imported = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    stored = {node.id for node in ast.walk(tree)
              if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    read = {node.id for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    read -= imported | set(dir(builtins))
    return read, read - stored


def _bindings(key, tmp_path):
    """Small random weights for every name the README's snippets use, as each snippet's comments
    describe them, and what each name a snippet computes must then equal."""
    gate, up, down = _draw(key, (K, N)), _draw(jax.random.fold_in(key, 1), (K, N)), \
        _draw(jax.random.fold_in(key, 2), (N, K))
    x = random_x(jax.random.fold_in(key, 3), (2, 5, K))
    wi = jnp.stack([gate, up], axis=1)  # MaxText [embed, 2, mlp]
    gating = jnp.stack([gate, up])  # Gemma [2, embed, mlp]
    mlp_block = LlamaMLP(K, N, rngs=nnx.Rngs(4))
    sd = _hf_state_dict(key)
    others = {name: tensor for name, tensor in sd.items() if ".mlp." not in name}
    pytest.importorskip("safetensors.numpy").save_file(sd, tmp_path / "model.safetensors")

    class Model(nnx.Module):
        def __init__(self):
            self.blocks = nnx.List([LlamaMLP(K, N, rngs=nnx.Rngs(6)) for _ in range(2)])

    hf_gate = sd["model.layers.0.mlp.gate_proj.weight"]
    block = LlamaMLP(K, N, rngs=nnx.Rngs(7))
    block_kernels = [getattr(block, name).kernel[...] for name in ("gate_proj", "up_proj",
                                                                   "down_proj")]
    names = {
        "w_gate": gate, "w_up": up, "w_down": down, "x": x,
        "mlp": {"wi": {"kernel": wi}}, "config": types.SimpleNamespace(transpose_gating_einsum=False),
        "w": gating, "layer": types.SimpleNamespace(mlp=mlp_block),
        "sd": {name.removeprefix("model.layers.0."): t for name, t in sd.items()},
        "other_tensors": others, "model": Model(), "block": block,
    }
    same = lambda expected: lambda value: _assert_equal_trees(value, expected())  # noqa: E731
    checks = {
        "y": same(lambda: jax_swiglu.swiglu_reference(x, gate, up)),
        "out": same(lambda: jax_swiglu.swiglu_reference(x, gate, up) @ down),
        "wi": same(lambda: wi), "w": same(lambda: gating), "gate_weight": same(lambda: hf_gate),
        "layers": same(lambda: convert.pack_hf_checkpoint(sd)),
        "swapped": same(lambda: 2),
        "fused": lambda fused: np.testing.assert_array_equal(
            fused(x), _block_reference(x, *block_kernels)),
    }
    return names, checks


def _assert_equal_trees(actual, expected):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_readme_snippets_run_as_written(key, tmp_path, monkeypatch, capsys):
    snippets = _readme_snippets()
    assert len(snippets) >= 3, "the README's python snippets moved: update this test"
    monkeypatch.chdir(tmp_path)  # the snippets read and write files where they run
    names, checks = _bindings(key, tmp_path)
    checked = set()
    for number, code in enumerate(snippets, 1):
        read, free = _names(code)
        unbound = sorted(free - set(names))
        assert not unbound, (f"README snippet {number} uses {unbound}, which this test does not "
                             "bind: add them to _bindings")
        namespace = {name: value for name, value in names.items() if name in read}
        exec(compile(code, f"README.md python snippet {number}", "exec"), namespace)
        for name, check in checks.items():
            if name in namespace:
                check(namespace[name])
                checked.add(name)
    assert checked == set(checks), f"no snippet computes {sorted(set(checks) - checked)}"
    assert "on cuda:" in capsys.readouterr().out  # explain printed its choice
    # What the snippets exported and swapped is what they were given.
    exported = safetensors_numpy_load(tmp_path / "out.safetensors")
    sd = _hf_state_dict(key)
    assert sorted(exported) == sorted(sd)
    for tensor_name, tensor in sd.items():
        _assert_bitwise(exported[tensor_name], tensor)
    assert all(isinstance(b, swiglu_nn.FusedSwiGLUMLP) for b in names["model"].blocks)


def safetensors_numpy_load(path):
    return pytest.importorskip("safetensors.numpy").load_file(path)
