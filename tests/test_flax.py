"""The Flax modules (jax_swiglu.nn): math, conversion, param layout and logical axis names.

These run on the CPU device even where a GPU exists, so the fused modules take the reference
path and must equal the unfused reference bit for bit (tests/gpu/test_flax.py compares the
fused kernels with the reference within the kernels' tolerance).
"""

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flax", reason="jax_swiglu.nn needs flax: pip install jax_swiglu[flax]")
import flax.linen as nn  # noqa: E402
from flax import nnx  # noqa: E402

import jax_swiglu  # noqa: E402
from jax_swiglu import nn as swiglu_nn  # noqa: E402
from jax_swiglu.nn import linen as swiglu_linen  # noqa: E402

from helpers import random_x  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def on_the_cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _modules(k, n, seed=0, **options):
    """(reference, fused) nnx modules with the same weights: both draw gate, up, down in order."""
    return (swiglu_nn.SwiGLUMLP(k, n, rngs=nnx.Rngs(seed), **options),
            swiglu_nn.FusedSwiGLUMLP(k, n, rngs=nnx.Rngs(seed), **options))


def _params(module):
    return nnx.to_pure_dict(nnx.state(module, nnx.Param))


def _random_unfused(key, k, n, dtype=jnp.bfloat16):
    kg, ku, kd = jax.random.split(key, 3)
    draw = lambda key, shape: (jax.random.normal(key, shape) / np.sqrt(shape[0])).astype(dtype)
    return {"gate_proj": {"kernel": draw(kg, (k, n))}, "up_proj": {"kernel": draw(ku, (k, n))},
            "down_proj": {"kernel": draw(kd, (n, k))}}


def _assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def _count(tree):
    return sum(leaf.size for leaf in jax.tree.leaves(tree))


# --- the fused module computes the reference --------------------------------------------------

@pytest.mark.parametrize("k, n", [(64, 128), (96, 200), (896, 4864)])
def test_fused_equals_reference_module(key, k, n):
    reference, fused = _modules(k, n)
    _assert_trees_equal(_params(fused.to_unfused()), _params(reference))  # same rngs, same weights
    x = random_x(key, (2, 9, k))
    y = fused(x)
    assert y.shape == (2, 9, k) and y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(y, reference(x))
    # ... which is the spec followed by the down dot.
    gate, up, down = (getattr(reference, name).kernel[...]
                      for name in ("gate_proj", "up_proj", "down_proj"))
    expected = jax_swiglu.swiglu_reference(x, gate, up) @ down
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("lead", [(), (5,), (2, 7), (2, 3, 4)])
def test_leading_batch_and_sequence_dims(key, lead):
    reference, fused = _modules(32, 72)
    x = random_x(key, (*lead, 32))
    y = fused(x)
    assert y.shape == (*lead, 32)
    np.testing.assert_array_equal(y, reference(x))


def test_jax_jit_and_nnx_jit(key):
    reference, fused = _modules(64, 128)
    x = random_x(key, (3, 64))
    eager = fused(x)
    np.testing.assert_array_equal(jax.jit(lambda m, x: m(x))(fused, x), eager)
    np.testing.assert_array_equal(nnx.jit(lambda m, x: m(x))(fused, x), eager)
    np.testing.assert_array_equal(nnx.jit(lambda m, x: m(x))(reference, x), eager)


def test_param_dtype_is_cast_at_call_time(key):
    _, fused32 = _modules(64, 128, param_dtype=jnp.float32)
    assert fused32.gate_up_packed.kernel.dtype == jnp.float32
    fused16 = swiglu_nn.FusedSwiGLUMLP.from_params(_params(fused32), param_dtype=jnp.bfloat16)
    x = random_x(key, (4, 64))
    y = fused32(x)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(y, fused16(x))


def test_float16(key):
    reference, fused = _modules(64, 128, dtype=jnp.float16, param_dtype=jnp.float16)
    x = random_x(key, (4, 64), jnp.bfloat16)  # cast to dtype, as flax layers do
    y = fused(x)
    assert y.dtype == jnp.float16
    np.testing.assert_array_equal(y, reference(x))


def test_kernel_attribute_reaches_the_primitive(key):
    fused = swiglu_nn.FusedSwiGLUMLP(64, 128, kernel="xla", rngs=nnx.Rngs(0))
    jaxpr = jax.make_jaxpr(lambda m, x: m(x))(fused, random_x(key, (4, 64)))
    binds = [e for e in jaxpr.jaxpr.eqns if e.primitive is jax_swiglu.swiglu_p]
    assert [e.params["kernel"] for e in binds] == ["xla"]
    x = jax.ShapeDtypeStruct((4, 64), jnp.bfloat16)
    assert "details: xla (override: kernel='xla')" in fused.explain(x, platform="cuda")


def test_linen_modules(key):
    kx, ki = jax.random.split(key)
    x = random_x(kx, (2, 5, 64))
    reference = swiglu_linen.SwiGLUMLP(intermediate_size=200)
    variables = reference.init(ki, x)
    params = nn.unbox(variables)["params"]
    fused = swiglu_linen.FusedSwiGLUMLP(intermediate_size=200)
    fused_params = swiglu_nn.fuse_params(params)
    y = jax.jit(fused.apply)({"params": fused_params}, x)
    assert y.shape == (2, 5, 64) and y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(y, reference.apply(variables, x))
    # Its own init packs the same layout.
    own = nn.unbox(fused.init(ki, x))["params"]
    assert jax.tree.map(jnp.shape, own) == jax.tree.map(jnp.shape, fused_params)


def test_gelu_tanh_modules_compute_geglu(key):
    """activation="gelu_tanh" (Gemma's GeGLU) in both module kinds: the fused module equals the
    reference module, which is the GeGLU spec followed by the down dot; conversions keep it."""
    reference, fused = _modules(64, 200, activation="gelu_tanh")
    x = random_x(key, (3, 64))
    gate, up, down = (getattr(reference, name).kernel[...]
                      for name in ("gate_proj", "up_proj", "down_proj"))
    expected = jax_swiglu.swiglu_reference(x, gate, up, activation="gelu_tanh") @ down
    np.testing.assert_array_equal(reference(x), expected)
    np.testing.assert_array_equal(fused(x), expected)
    assert not np.array_equal(np.asarray(fused(x)), np.asarray(_modules(64, 200)[1](x)))
    assert fused.to_unfused().activation == "gelu_tanh"
    assert swiglu_nn.FusedSwiGLUMLP.from_unfused(reference).activation == "gelu_tanh"
    assert " gelu_tanh on cuda: " in fused.explain(jax.ShapeDtypeStruct((3, 64), jnp.bfloat16),
                                                    platform="cuda")
    linen = swiglu_linen.FusedSwiGLUMLP(intermediate_size=200, activation="gelu_tanh")
    params = swiglu_nn.fuse_params(_params(reference))
    np.testing.assert_array_equal(linen.apply({"params": params}, x), expected)
    linen_reference = swiglu_linen.SwiGLUMLP(intermediate_size=200, activation="gelu_tanh")
    np.testing.assert_array_equal(linen_reference.apply({"params": _params(reference)}, x),
                                  expected)


# --- conversion -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_unfused_fused_round_trips_are_exact(key, dtype):
    unfused = _random_unfused(key, 64, 200, dtype)  # N=200: padded to 224 when packed
    fused = swiglu_nn.fuse_params(unfused)
    assert fused["gate_up_packed"]["kernel"].shape == (64, 448)
    _assert_trees_equal(swiglu_nn.unfuse_params(fused), unfused)
    _assert_trees_equal(swiglu_nn.fuse_params(swiglu_nn.unfuse_params(fused)), fused)


def test_hf_round_trip_is_exact_and_oriented(key):
    unfused = _random_unfused(key, 64, 200)
    hf = {f"{name}.weight": unfused[name]["kernel"].T for name in unfused}  # [out, in]
    fused = swiglu_nn.fuse_hf_weights({name: np.asarray(w) for name, w in hf.items()})
    _assert_trees_equal(fused, swiglu_nn.fuse_params(unfused))
    _assert_trees_equal(swiglu_nn.fused_to_hf_weights(fused), hf)
    # The module computes the Hugging Face block, F.linear(x, W) = x @ W.T.
    x = random_x(key, (3, 64))
    expected = jax_swiglu.swiglu_reference(
        x, hf["gate_proj.weight"].T, hf["up_proj.weight"].T) @ hf["down_proj.weight"].T
    np.testing.assert_array_equal(swiglu_nn.FusedSwiGLUMLP.from_params(fused)(x), expected)


def test_module_conversion_round_trip(key):
    reference = swiglu_nn.SwiGLUMLP(64, 200, param_dtype=jnp.float32, rngs=nnx.Rngs(3))
    fused = swiglu_nn.FusedSwiGLUMLP.from_unfused(reference, kernel="xla")
    assert (fused.dtype, fused.param_dtype, fused.kernel) == (jnp.bfloat16, jnp.float32, "xla")
    back = fused.to_unfused()
    _assert_trees_equal(_params(back), _params(reference))
    x = random_x(key, (4, 64))
    np.testing.assert_array_equal(fused(x), reference(x))
    np.testing.assert_array_equal(back(x), reference(x))


def test_fuse_mlp_blocks_swaps_every_block(key):
    keys = jax.random.split(key, 3)
    scale = {"scale": jnp.ones(64)}
    tree = {"embed": {"embedding": jnp.ones((10, 64))},
            "layers": {str(i): {"mlp": _random_unfused(keys[i], 64, 128), "norm": scale}
                       for i in range(2)},
            "extra_mlp": {**_random_unfused(keys[2], 64, 96), "norm": scale}}
    fused = swiglu_nn.fuse_mlp_blocks(tree)
    for i in range(2):
        _assert_trees_equal(fused["layers"][str(i)]["mlp"],
                            swiglu_nn.fuse_params(tree["layers"][str(i)]["mlp"]))
        _assert_trees_equal(fused["layers"][str(i)]["norm"], scale)
    assert sorted(fused["extra_mlp"]) == ["down_proj", "gate_up_packed", "norm"]
    _assert_trees_equal(fused["embed"], tree["embed"])
    _assert_trees_equal(swiglu_nn.unfuse_mlp_blocks(fused), tree)
    with pytest.raises(ValueError, match="found no unfused MLP block"):
        swiglu_nn.fuse_mlp_blocks({"wi_0": {"kernel": jnp.ones((4, 8))}})


def test_fused_tree_loads_into_an_nnx_model(key):
    class Model(nnx.Module):
        def __init__(self, mlp_class, rngs):
            self.blocks = nnx.List([mlp_class(64, 128, rngs=rngs) for _ in range(2)])

        def __call__(self, x):
            for block in self.blocks:
                x = x + block(x)
            return x

    reference = Model(swiglu_nn.SwiGLUMLP, nnx.Rngs(0))
    fused = nnx.eval_shape(lambda: Model(swiglu_nn.FusedSwiGLUMLP, nnx.Rngs(0)))
    nnx.update(fused, swiglu_nn.fuse_mlp_blocks(_params(reference)))
    x = random_x(key, (4, 64))
    np.testing.assert_array_equal(fused(x), reference(x))


# --- param layout: counts, shapes, logical axis names -----------------------------------------

@pytest.mark.parametrize("k, n, n_pad", [(64, 200, 224), (896, 4864, 4864)])
def test_param_shapes_and_counts_as_documented(k, n, n_pad):
    reference = nnx.eval_shape(lambda: swiglu_nn.SwiGLUMLP(k, n, rngs=nnx.Rngs(0)))
    fused = nnx.eval_shape(lambda: swiglu_nn.FusedSwiGLUMLP(k, n, rngs=nnx.Rngs(0)))
    shapes = lambda module: jax.tree.map(jnp.shape, _params(module))
    assert shapes(reference) == {"gate_proj": {"kernel": (k, n)}, "up_proj": {"kernel": (k, n)},
                                 "down_proj": {"kernel": (n, k)}}
    assert shapes(fused) == {"gate_up_packed": {"kernel": (k, 2 * n_pad)},
                             "down_proj": {"kernel": (n, k)}}
    assert _count(_params(reference)) == 3 * k * n
    assert _count(_params(fused)) == 2 * k * n_pad + n * k
    x = jax.ShapeDtypeStruct((1, k), jnp.bfloat16)
    linen_params = jax.eval_shape(swiglu_linen.FusedSwiGLUMLP(n).init, jax.random.key(0), x)
    assert jax.tree.map(jnp.shape, nn.unbox(linen_params)["params"]) == shapes(fused)


def test_logical_axis_names(key):
    reference, fused = _modules(64, 128)
    P = jax.sharding.PartitionSpec
    gate_up, down = P("embed", "mlp"), P("mlp", "embed")
    assert nnx.to_pure_dict(nnx.get_partition_spec(nnx.state(fused))) == {
        "gate_up_packed": {"kernel": gate_up}, "down_proj": {"kernel": down}}
    assert nnx.to_pure_dict(nnx.get_partition_spec(nnx.state(reference))) == {
        "gate_proj": {"kernel": gate_up}, "up_proj": {"kernel": gate_up},
        "down_proj": {"kernel": down}}
    x = random_x(key, (2, 64))
    linen_specs = {
        swiglu_linen.FusedSwiGLUMLP(128): {"gate_up_packed": gate_up, "down_proj": down},
        swiglu_linen.SwiGLUMLP(128): {"gate_proj": gate_up, "up_proj": gate_up, "down_proj": down},
    }
    for module, expected in linen_specs.items():
        specs = nn.get_partition_spec(module.init(key, x))["params"]
        assert {name: spec["kernel"] for name, spec in specs.items()} == expected


def test_eager_sharding_under_a_mesh_follows_the_logical_rules():
    mesh = jax.make_mesh((1,), ("model",), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=jax.devices("cpu")[:1])
    with jax.set_mesh(mesh), nnx.logical_axis_rules((("embed", None), ("mlp", "model"))):
        fused = swiglu_nn.FusedSwiGLUMLP(64, 128, rngs=nnx.Rngs(0))
    P = jax.sharding.PartitionSpec
    assert fused.gate_up_packed.kernel[...].sharding.spec == P(None, "model")
    assert fused.down_proj.kernel[...].sharding.spec == P("model", None)


# --- errors -----------------------------------------------------------------------------------

def test_bad_configurations():
    with pytest.raises(TypeError, match="bfloat16 or float16, got dtype=float32"):
        swiglu_nn.FusedSwiGLUMLP(64, 128, dtype=jnp.float32, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="kernel must be one of"):
        swiglu_nn.FusedSwiGLUMLP(64, 128, kernel="fastest", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="activation must be one of"):
        swiglu_nn.FusedSwiGLUMLP(64, 128, activation="gelu", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="activation must be one of"):
        swiglu_nn.SwiGLUMLP(64, 128, activation="swish", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="multiples of 8"):
        swiglu_nn.FusedSwiGLUMLP(60, 128, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="exactly one of rngs= .* and params="):
        swiglu_nn.FusedSwiGLUMLP(64, 128)
    fused = swiglu_nn.fuse_params(_random_unfused(jax.random.key(0), 64, 128))
    with pytest.raises(ValueError, match=r"gate_up_packed kernel must have shape \(64, 512\)"):
        swiglu_nn.FusedSwiGLUMLP(64, 256, params=fused)


def test_bad_params():
    unfused = _random_unfused(jax.random.key(0), 64, 128)
    with pytest.raises(ValueError, match="expected unfused MLP params with 'up_proj'"):
        swiglu_nn.fuse_params({"gate_proj": unfused["gate_proj"]})
    with pytest.raises(ValueError, match=r"down_proj kernel must be \[N, K\] = \[128, 64\]"):
        swiglu_nn.fuse_params({**unfused, "down_proj": unfused["gate_proj"]})
    boxed = swiglu_linen.SwiGLUMLP(128).init(jax.random.key(0), jnp.ones((1, 64)))["params"]
    with pytest.raises(TypeError, match="unbox"):
        swiglu_nn.fuse_params(boxed)
    with pytest.raises(ValueError, match=r"lack \['up_proj.weight'\]"):
        swiglu_nn.fuse_hf_weights({"gate_proj.weight": 0, "down_proj.weight": 0})


def test_jax_swiglu_imports_without_flax():
    code = (
        "import sys\n"
        "class NoFlax:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'flax':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, NoFlax())\n"
        "import jax_swiglu\n"
        "assert 'flax' not in sys.modules\n"
        "try:\n"
        "    import jax_swiglu.nn\n"
        "except ImportError as error:\n"
        "    print(error)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "jax_swiglu.nn needs flax: pip install 'jax_swiglu[flax]'" in result.stdout


@pytest.mark.parametrize("scale", ["per_channel", "per_tensor"])
def test_fp8_module_is_the_fp8_spec_then_the_down_dot(key, scale):
    mlp = swiglu_nn.SwiGLUMLP(128, 96, rngs=nnx.Rngs(0))
    fp8 = swiglu_nn.Fp8SwiGLUMLP.quantize(mlp, scale=scale)
    assert fp8.gate_up_data[...].dtype == jnp.float8_e4m3fn
    assert fp8.gate_up_data[...].shape == (192, 128)  # [2 N_pad, K]
    assert not nnx.state(fp8, nnx.Param).get("gate_up_data")  # not a trainable Param
    x = random_x(key, (2, 5, 128))
    expected = jnp.matmul(jax_swiglu.swiglu_reference_quantized(x, fp8.quantized_weights()),
                          mlp.down_proj.kernel[...])
    out = nnx.jit(lambda m, x: m(x))(fp8, x)
    assert out.shape == (2, 5, 128) and out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(expected, np.float32),
                               rtol=0.02, atol=0.02)
    # Close to the bf16 block, within fp8's error.
    bf16 = np.asarray(mlp(x), np.float32)
    assert np.linalg.norm(np.asarray(out, np.float32) - bf16) / np.linalg.norm(bf16) < 0.1
    # From the fused module too, to the same weights.
    again = swiglu_nn.Fp8SwiGLUMLP.quantize(swiglu_nn.FusedSwiGLUMLP.from_unfused(mlp),
                                            scale=scale)
    np.testing.assert_array_equal(np.asarray(again.gate_up_data[...]).view(np.uint8),
                                  np.asarray(fp8.gate_up_data[...]).view(np.uint8))
    assert "float8_e4m3fn weights" in fp8.explain(x)
    with pytest.raises(TypeError, match="SwiGLUMLP or FusedSwiGLUMLP"):
        swiglu_nn.Fp8SwiGLUMLP.quantize(object())
    # Fast accumulation is the module's call option: off CUDA the same spec runs.
    fast = swiglu_nn.Fp8SwiGLUMLP.quantize(mlp, scale=scale, accumulation="fast")
    assert fast.accumulation == "fast"
    np.testing.assert_array_equal(nnx.jit(lambda m, x: m(x))(fast, x), out)
    with pytest.raises(ValueError, match="accumulation must be one of"):
        swiglu_nn.Fp8SwiGLUMLP.quantize(mlp, accumulation="exact")


def test_fp8_module_with_the_down_projection_in_fp8_is_the_whole_block(key):
    """quantize(down=True): the down projection stored in fp8 too (no bf16 Param left), the
    block exactly fused_mlp on the stored QuantizedWeights and QuantizedDown."""
    mlp = swiglu_nn.SwiGLUMLP(128, 96, rngs=nnx.Rngs(0))
    fp8 = swiglu_nn.Fp8SwiGLUMLP.quantize(mlp, down=True)
    assert fp8.down_data[...].dtype == jnp.float8_e4m3fn
    assert fp8.down_data[...].shape == (128, 96) and fp8.down_scales[...].shape == (128,)
    assert not nnx.state(fp8, nnx.Param)  # every weight quantized: nothing to train
    down = fp8.down_weights()
    assert isinstance(down, jax_swiglu.QuantizedDown)
    x = random_x(key, (2, 5, 128))
    out = nnx.jit(lambda m, x: m(x))(fp8, x)
    np.testing.assert_array_equal(out, jax_swiglu.fused_mlp(x, fp8.quantized_weights(), down))
    bf16 = np.asarray(mlp(x), np.float32)
    assert np.linalg.norm(np.asarray(out, np.float32) - bf16) / np.linalg.norm(bf16) < 0.1
    with pytest.raises(TypeError, match="down must be True or False"):
        swiglu_nn.Fp8SwiGLUMLP.quantize(mlp, down="yes")
    with pytest.raises(ValueError, match="quantized down projection"):
        swiglu_nn.Fp8SwiGLUMLP(fp8.quantized_weights(), jax_swiglu.quantize_down(
            jnp.ones((64, 128))))


@pytest.mark.parametrize("down", [False, True])
def test_an_abstract_fp8_module_explains_and_asks_for_its_weights(down):
    """Built under nnx.eval_shape (state to be loaded later): explain works from the shapes,
    a call says the weights are missing, and after nnx.update the block runs."""
    build = lambda: swiglu_nn.Fp8SwiGLUMLP.quantize(  # noqa: E731
        swiglu_nn.SwiGLUMLP(64, 96, rngs=nnx.Rngs(0)), down=down)
    abstract, concrete = nnx.eval_shape(build), build()
    x = jnp.ones((2, 64), jnp.bfloat16)
    for platform in ("cpu", "cuda"):
        assert abstract.explain(x, platform=platform) == concrete.explain(x, platform=platform)
    with pytest.raises(ValueError, match="holds no weights, only their shape"):
        abstract(x)
    nnx.update(abstract, nnx.state(concrete))
    np.testing.assert_array_equal(abstract(x), concrete(x))
