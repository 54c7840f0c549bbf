"""What a new user does first, end to end on the CPU: every route by which gate/up weights of
another layout could arrive, the Flax modules as Flax users drive them, and whole Hugging Face
checkpoints (GitHub issue 45).

The fused modules take the XLA reference path here, so every output is compared exactly with
the reference on the weights as the user holds them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flax", reason="the Flax flows need flax: pip install jax_swiglu[flax]")
import flax.linen as nn  # noqa: E402
from flax import nnx  # noqa: E402

import jax_swiglu  # noqa: E402
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
