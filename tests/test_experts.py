"""Grouped (mixture-of-experts) calls on any machine: the packed expert layout, the ragged_dot
convention, defined results for any group sizes, errors; the grouped primitive's lowering
for CUDA (the kernel's custom call) and its choice. The kernel itself runs in the kernel
suite (tests/kernels/test_base.py) on an SM90 GPU."""

import re


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_swiglu
from helpers import requires_kernels
from jax_swiglu import (grouped_fused_mlp, grouped_swiglu, grouped_swiglu_reference,
                        pack_expert_weights, unpack_expert_weights)

E, K, F = 4, 64, 80  # F not a multiple of 32: each expert's columns are padded


def _weights(key, e=E, k=K, f=F, dtype=jnp.bfloat16):
    kg, ku, kd = jax.random.split(key, 3)
    draw = lambda key, shape: (jax.random.normal(key, shape) / np.sqrt(shape[1])).astype(dtype)  # noqa: E731
    return draw(kg, (e, k, f)), draw(ku, (e, k, f)), draw(kd, (e, f, k))


def _expected(x, w_gate, w_up, sizes):
    """Per row, its expert's SiLU(x @ Wg) * (x @ Wu) in float64; rows past the groups 0."""
    x64, g64, u64 = (np.asarray(a, np.float64) for a in (x, w_gate, w_up))
    out = np.zeros((x.shape[0], w_gate.shape[2]))
    start = 0
    for e, size in enumerate(sizes):
        rows = slice(start, start + size)
        gate, up = x64[rows] @ g64[e], x64[rows] @ u64[e]
        out[rows] = gate / (1 + np.exp(-gate)) * up
        start += size
    return out


@pytest.mark.parametrize("sizes", [[3, 5, 2, 6], [0, 16, 0, 0], [1, 0, 2, 0], [0, 0, 0, 0]])
def test_every_row_gets_its_experts_mlp(key, sizes):
    kx, kw = jax.random.split(key)
    w_gate, w_up, _ = _weights(kw)
    x = jax.random.normal(kx, (16, K)).astype(jnp.bfloat16)
    group_sizes = jnp.array(sizes, jnp.int32)
    y = jax.jit(grouped_swiglu)(x, pack_expert_weights(w_gate, w_up), group_sizes)
    assert y.shape == (16, F) and y.dtype == jnp.bfloat16
    expected = _expected(x, w_gate, w_up, sizes)
    # One rounding of an fp32 result: within half a bf16 ulp (plus fp32 accumulation).
    np.testing.assert_allclose(np.asarray(y, np.float64), expected, rtol=2**-8, atol=1e-6)
    assert not np.asarray(y[sum(sizes):], np.float32).any()  # rows past the groups
    np.testing.assert_array_equal(
        y, grouped_swiglu_reference(x, w_gate, w_up, group_sizes))


def test_any_group_sizes_give_a_defined_result(key):
    """Negative sizes count as 0; a sum over T ends the groups at T."""
    kx, kw = jax.random.split(key)
    w_gate, w_up, _ = _weights(kw)
    experts = pack_expert_weights(w_gate, w_up)
    x = jax.random.normal(kx, (10, K)).astype(jnp.bfloat16)
    run = jax.jit(grouped_swiglu)
    np.testing.assert_array_equal(run(x, experts, jnp.array([4, -3, 2, 1], jnp.int32)),
                                  run(x, experts, jnp.array([4, 0, 2, 1], jnp.int32)))
    np.testing.assert_array_equal(run(x, experts, jnp.array([4, 5, 9, 9], jnp.int32)),
                                  run(x, experts, jnp.array([4, 5, 1, 0], jnp.int32)))
    np.testing.assert_array_equal(
        jax_swiglu._experts.defined_group_sizes(jnp.array([-1, 7, 5, -2], jnp.int32), 10),
        [0, 7, 3, 0])
    # Sizes near the int32 range (a device-computed value gone wrong) do not wrap the sum.
    huge = jnp.array([3, 2**31 - 2, 4, 1], jnp.int32)
    np.testing.assert_array_equal(jax_swiglu._experts.defined_group_sizes(huge, 10),
                                  [3, 7, 0, 0])
    np.testing.assert_array_equal(run(x, experts, huge),
                                  run(x, experts, jnp.array([3, 7, 0, 0], jnp.int32)))


def test_the_whole_expert_block_and_other_dtypes(key):
    kx, kw = jax.random.split(key)
    w_gate, w_up, w_down = _weights(kw)
    x = jax.random.normal(kx, (12, K)).astype(jnp.bfloat16)
    sizes = jnp.array([5, 0, 4, 3], jnp.int32)
    experts = pack_expert_weights(w_gate, w_up)
    out = jax.jit(grouped_fused_mlp)(x, experts, w_down, sizes)
    y = grouped_swiglu(x, experts, sizes)
    np.testing.assert_array_equal(
        out, jax.lax.ragged_dot(y, w_down, sizes, preferred_element_type=jnp.float32)
        .astype(jnp.bfloat16))
    # float32 runs the same math; the activation takes names, aliases and callables.
    w32 = [w.astype(jnp.float32) for w in (w_gate, w_up)]
    y32 = grouped_swiglu(x.astype(jnp.float32), pack_expert_weights(*w32), sizes)
    np.testing.assert_allclose(y32, _expected(x, *w32, [5, 0, 4, 3]), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(grouped_swiglu(x, experts, sizes, activation="swish"), y)
    relu = grouped_swiglu(x, experts, sizes, activation=jax.nn.relu)
    np.testing.assert_array_equal(
        relu, grouped_swiglu_reference(x, w_gate, w_up, sizes, activation=jax.nn.relu))


def test_source_layouts_pack_the_same_and_unpack_exactly(key):
    w_gate, w_up, _ = _weights(key)
    experts = pack_expert_weights(w_gate, w_up)
    assert experts.data.shape == (E, K, 2 * 96) and experts.n == F
    for other in (pack_expert_weights(jnp.stack([w_gate, w_up], axis=2)),
                  pack_expert_weights(jnp.concatenate([w_gate, w_up], axis=2),
                                      layout="concatenated")):
        np.testing.assert_array_equal(other.data, experts.data)
    gate, up = unpack_expert_weights(experts)
    np.testing.assert_array_equal(gate, w_gate)
    np.testing.assert_array_equal(up, w_up)
    # Each expert is exactly the dense packed layout.
    np.testing.assert_array_equal(experts.data[2], jax_swiglu.pack_weights(w_gate[2], w_up[2]).data)
    # A pytree: through jit and back, and rebuilt from saved data.
    same = jax.jit(lambda e: e)(experts)
    assert isinstance(same, jax_swiglu.PackedExperts) and same.n == F
    np.testing.assert_array_equal(
        jax_swiglu.PackedExperts.from_packed_data(experts.data, F).data, experts.data)


@pytest.mark.parametrize("bound_experts, block", [(1, 1), (2, 2), (5, 3)])
def test_experts_packed_a_block_at_a_time_match_the_whole(key, monkeypatch, bound_experts,
                                                          block):
    """Concrete weights on one device pack through lax.map over blocks of experts (no
    temporary of every expert's size), each block the largest that divides E within the
    bound (a remainder would cost a second copy); the bits are those of the one expression
    that traced or sharded weights take."""
    from jax_swiglu import _layout
    w_gate, w_up, _ = _weights(key, e=6)
    whole = jax.jit(lambda g, u: pack_expert_weights(g, u).data)(w_gate, w_up)
    monkeypatch.setattr(_layout, "PACK_BLOCK_BYTES",
                        bound_experts * 2 * K * _layout.padded_n(F) * 2)
    blocks = []
    real_map = jax.lax.map
    monkeypatch.setattr(jax.lax, "map", lambda f, xs, batch_size=None: (
        blocks.append(batch_size), real_map(f, xs, batch_size=batch_size))[1])
    packed = pack_expert_weights(w_gate, w_up)
    assert blocks == [block]
    np.testing.assert_array_equal(packed.data, whole)
    np.testing.assert_array_equal(unpack_expert_weights(packed)[0], w_gate)


def test_explain_grouped_says_what_runs(key):
    experts = pack_expert_weights(*_weights(key)[:2])
    x, sizes = jax.ShapeDtypeStruct((32, K), jnp.bfloat16), jax.ShapeDtypeStruct((E,), jnp.int32)
    text = jax_swiglu.explain_grouped(x, experts, sizes, platform="cpu")
    assert text.startswith(f"T=32 E={E} F={F} K={K} bfloat16 silu on cpu: runs plain XLA"), text
    text = jax_swiglu.explain_grouped(x.update(dtype=jnp.float32), pack_expert_weights(
        *(w.astype(jnp.float32) for w in _weights(key)[:2])), sizes, platform="cuda")
    assert "runs plain XLA" in text and "bfloat16 or float16, x is float32" in text, text
    # No rows: the lowering emits no kernel, and explain says so.
    text = jax_swiglu.explain_grouped(x.update(shape=(0, K)), experts, sizes, platform="cuda")
    assert "runs plain XLA" in text and "since T = 0: no rows" in text, text


def _grouped_custom_calls(fn, *args):
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    return [(name, int(config)) for name, config in re.findall(
        r"custom_call @(jax_swiglu_grouped\w+)\(.*?config = (\d+)", text)]


@requires_kernels
@pytest.mark.parametrize("t", [1, 24, 4096])
def test_grouped_calls_lower_to_the_grouped_kernel(key, t):
    """On CUDA a 16-bit call is one custom call of a grouped row, the one explain names; a
    forced row, kernel='xla' and float32 x lower as asked; the down projection stays XLA's."""
    w_gate, w_up, w_down = _weights(key)
    experts = pack_expert_weights(w_gate, w_up)
    x = jnp.zeros((t, K), jnp.bfloat16)
    sizes = jnp.full((E,), t // E, jnp.int32)
    calls = _grouped_custom_calls(grouped_swiglu, x, experts, sizes)
    grouped = {i for i, row in jax_swiglu.kernel_configs().items() if row.grouped}
    assert len(calls) == 1 and calls[0][0] == "jax_swiglu_grouped_silu_bf16", calls
    assert calls[0][1] in grouped
    explained = jax_swiglu.explain_grouped(x, experts, sizes, platform="cuda")
    assert f"runs the grouped fused kernel config {calls[0][1]} " in explained, explained
    for config in grouped:
        forced = lambda x, e, s, c=config: grouped_swiglu(x, e, s, launch=c)  # noqa: E731
        assert _grouped_custom_calls(forced, x, experts, sizes) == [
            ("jax_swiglu_grouped_silu_bf16", config)]
    gelu = lambda x, e, s: grouped_swiglu(x, e, s, activation="gelu_tanh")  # noqa: E731
    assert _grouped_custom_calls(gelu, x, experts, sizes)[0][0] == (
        "jax_swiglu_grouped_gelu_tanh_bf16")
    mlp = lambda x, e, s: grouped_fused_mlp(x, e, w_down, s)  # noqa: E731
    assert len(_grouped_custom_calls(mlp, x, experts, sizes)) == 1
    xla = lambda x, e, s: grouped_swiglu(x, e, s, kernel="xla")  # noqa: E731
    assert _grouped_custom_calls(xla, x, experts, sizes) == []
    experts32 = pack_expert_weights(w_gate.astype(jnp.float32), w_up.astype(jnp.float32))
    assert _grouped_custom_calls(grouped_swiglu, x.astype(jnp.float32), experts32, sizes) == []


@requires_kernels
def test_forced_grouped_launches_are_checked(key):
    experts = pack_expert_weights(*_weights(key)[:2])
    x, sizes = jnp.zeros((8, K), jnp.bfloat16), jnp.array([2, 2, 2, 2], jnp.int32)
    dense = min(i for i, row in jax_swiglu.kernel_configs().items() if not row.grouped)
    grouped = min(i for i, row in jax_swiglu.kernel_configs().items() if row.grouped)
    with pytest.raises(ValueError, match="is a dense row; grouped calls run the grouped rows"):
        jax.jit(lambda x, e, s: grouped_swiglu(x, e, s, launch=dense)).trace(x, experts, sizes)
    # ... and a grouped row cannot run a dense call.
    packed = jax_swiglu.pack_weights(*(w[0] for w in _weights(key)[:2]))
    with pytest.raises(ValueError, match="runs grouped .expert. calls only"):
        jax.jit(lambda x, w: jax_swiglu.swiglu(x, w, launch=grouped)).trace(x, packed)
    with pytest.raises(ValueError, match="launch=.* and kernel='xla' ask for two"):
        grouped_swiglu(x, experts, sizes, kernel="xla", launch=grouped)
    with pytest.raises(ValueError, match="cannot run this call: the grouped kernel takes"):
        experts32 = pack_expert_weights(*(w.astype(jnp.float32) for w in _weights(key)[:2]))
        grouped_swiglu(x.astype(jnp.float32), experts32, sizes, launch=grouped)


def test_the_fused_path_is_inference_only_and_the_spec_differentiates(key):
    kx, kw = jax.random.split(key)
    w_gate, w_up, _ = _weights(kw)
    experts = pack_expert_weights(w_gate, w_up)
    x = jax.random.normal(kx, (8, K)).astype(jnp.bfloat16)
    sizes = jnp.array([2, 2, 2, 2], jnp.int32)
    loss = lambda x: grouped_swiglu(x, experts, sizes).astype(jnp.float32).sum()  # noqa: E731
    with pytest.raises(NotImplementedError, match="grouped_swiglu_reference"):
        jax.grad(loss)(x)
    spec = lambda x: grouped_swiglu_reference(x, w_gate, w_up, sizes).astype(  # noqa: E731
        jnp.float32).sum()
    assert jax.grad(spec)(x).shape == x.shape
    # float32 calls run the spec itself, so they differentiate.
    experts32 = pack_expert_weights(w_gate.astype(jnp.float32), w_up.astype(jnp.float32))
    grad = jax.grad(lambda x: grouped_swiglu(x, experts32, sizes).sum())(x.astype(jnp.float32))
    assert grad.shape == x.shape


def test_vmap_runs_each_routing(key):
    kx, kw = jax.random.split(key)
    experts = pack_expert_weights(*_weights(kw)[:2])
    xs = jax.random.normal(kx, (3, 8, K)).astype(jnp.bfloat16)
    sizes = jnp.array([[2, 2, 2, 2], [8, 0, 0, 0], [0, 1, 0, 3]], jnp.int32)
    ys = jax.vmap(lambda x, s: grouped_swiglu(x, experts, s))(xs, sizes)
    for i in range(3):
        np.testing.assert_array_equal(ys[i], grouped_swiglu(xs[i], experts, sizes[i]))
    empty = jax.vmap(lambda x, s: grouped_swiglu(x, experts, s))(xs[:0], sizes[:0])
    assert empty.shape == (0, 8, F) and empty.dtype == jnp.bfloat16


@pytest.mark.parametrize("call, error, match", [
    (lambda x, e, s: grouped_swiglu(x, e, s.astype(jnp.float32)), TypeError,
     "group_sizes must be int32"),
    (lambda x, e, s: grouped_swiglu(x, e, s.astype(jnp.int16)), TypeError,
     "group_sizes must be int32"),
    (lambda x, e, s: grouped_swiglu(x, e, s[:3]), ValueError,
     r"one size per expert, shape \(4,\), got \(3,\)"),
    (lambda x, e, s: grouped_swiglu(x[:, :32], e, s), ValueError, "x has K=32"),
    (lambda x, e, s: grouped_swiglu(x[None], e, s), ValueError, r"x must be \[T, K\]"),
    (lambda x, e, s: grouped_swiglu(x.astype(jnp.float16), e, s), TypeError,
     "x is float16 but the expert weights are bfloat16"),
    (lambda x, e, s: grouped_swiglu(x, e.data, s), TypeError, "experts must be PackedExperts"),
    (lambda x, e, s: grouped_swiglu(x, e, s, kernel="gemv"), ValueError,
     "grouped calls run kernel='auto', 'interleaved'"),
    (lambda x, e, s: grouped_swiglu(x, e, s, activation="relu"), ValueError,
     "activation must be one of"),
    (lambda x, e, s: grouped_fused_mlp(x, e, jnp.zeros((E, K, K), x.dtype), s), ValueError,
     r"w_down must be \[E, F, K_out\]"),
])
def test_bad_input_is_a_trace_time_error(key, call, error, match):
    experts = pack_expert_weights(*_weights(key)[:2])
    x = jnp.zeros((8, K), jnp.bfloat16)
    sizes = jnp.array([2, 2, 2, 2], jnp.int32)
    with pytest.raises(error, match=match):
        jax.jit(call).trace(x, experts, sizes)


@pytest.mark.parametrize("args, error, match", [
    ((jnp.zeros((E, K, F)), jnp.zeros((E, K, F + 8))), ValueError, "must have the same shape"),
    ((jnp.zeros((K, F)), jnp.zeros((K, F))), ValueError, r"must be \[E, K, F\]"),
    ((jnp.zeros((E, K, 2 * F)),), ValueError, "layout='concatenated'"),
    ((jnp.zeros((E, K, F), jnp.int8), jnp.zeros((E, K, F), jnp.int8)), TypeError,
     "floating-point"),
    ((jnp.zeros((E, 60, F)), jnp.zeros((E, 60, F))), ValueError, "multiples of 8"),
])
def test_bad_weights_are_clear_errors(args, error, match):
    with pytest.raises(error, match=match):
        pack_expert_weights(*args)
    with pytest.raises(TypeError, match="not built from an array"):
        jax_swiglu.PackedExperts(jnp.zeros((E, K, 2 * F)))


# --- expert MLPs of a Hugging Face checkpoint --------------------------------------------------

def _moe_state_dict(key, layers=(1, 2), experts=3, k=K, f=F, style="hf"):
    """A DeepSeek-like checkpoint: layer 0 dense, the given layers with experts ([out, in])."""
    from jax_swiglu import convert
    names = ((convert.HF_EXPERT_GATE, convert.HF_EXPERT_UP, convert.HF_EXPERT_DOWN)
             if style == "hf" else (convert.MIXTRAL_EXPERT_GATE, convert.MIXTRAL_EXPERT_UP,
                                    convert.MIXTRAL_EXPERT_DOWN))
    rng = np.random.default_rng(0)
    sd = {"model.layers.0.mlp.gate_proj.weight": np.ones((f, k), np.float32),
          "model.embed_tokens.weight": np.ones((10, k), np.float32)}
    for i in layers:
        sd[f"model.layers.{i}.mlp.gate.weight"] = np.ones((experts, k), np.float32)  # router
        for j in range(experts):
            for pattern, shape in zip(names, ((f, k), (f, k), (k, f))):
                sd[pattern.format(i=i, j=j)] = rng.standard_normal(shape).astype(np.float32)
    return sd, names


@pytest.mark.parametrize("style", ["hf", "mixtral"])
def test_a_checkpoints_experts_convert_and_export_bit_exactly(key, style):
    from jax_swiglu import convert
    sd, (gate, up, down) = _moe_state_dict(key, style=style)
    layers = convert.pack_hf_experts_checkpoint(sd, gate=gate, up=up, down=down)
    assert sorted(layers) == [1, 2]
    experts, w_down = layers[2]
    assert experts.data.shape == (3, K, 2 * 96) and experts.n == F and w_down.shape == (3, F, K)
    w_gate, w_up = unpack_expert_weights(experts)
    np.testing.assert_array_equal(w_gate[1], sd[gate.format(i=2, j=1)].T)
    np.testing.assert_array_equal(w_up[0], sd[up.format(i=2, j=0)].T)
    np.testing.assert_array_equal(w_down[2], sd[down.format(i=2, j=2)].T)
    exported = convert.hf_experts_checkpoint(layers, gate=gate, up=up, down=down)
    assert set(exported) == {n for n in sd if "experts" in n}
    for name, tensor in exported.items():
        np.testing.assert_array_equal(tensor, sd[name])
    # bf16 on the way in, and the layer runs.
    experts16, down16 = convert.pack_hf_experts_checkpoint(sd, gate=gate, up=up, down=down,
                                                           dtype=jnp.bfloat16)[1]
    x = jnp.ones((5, K), jnp.bfloat16)
    assert grouped_fused_mlp(x, experts16, down16, jnp.array([2, 0, 3], jnp.int32)).shape == (5, K)


def test_bad_expert_checkpoints_are_clear_errors(key, tmp_path):
    from jax_swiglu import convert
    sd, _ = _moe_state_dict(key)
    with pytest.raises(ValueError, match="no tensor of the checkpoint is named like.*MIXTRAL"):
        convert.pack_hf_experts_checkpoint(sd, gate=convert.MIXTRAL_EXPERT_GATE,
                                           up=convert.MIXTRAL_EXPERT_UP,
                                           down=convert.MIXTRAL_EXPERT_DOWN)
    missing = dict(sd)
    del missing[convert.HF_EXPERT_UP.format(i=1, j=1)]
    with pytest.raises(ValueError, match=r"layer 1 has experts 0 \.\. 2, but lacks 1"):
        convert.pack_hf_experts_checkpoint(missing)
    odd = dict(sd)
    odd[convert.HF_EXPERT_DOWN.format(i=2, j=0)] = np.zeros((F, K), np.float32)
    with pytest.raises(ValueError, match=r"layer 2: every expert's gate and up must be \[F, K\]"):
        convert.pack_hf_experts_checkpoint(odd)
    with pytest.raises(ValueError, match=r"\{i\} once for the layer and \{j\} once"):
        convert.pack_hf_experts_checkpoint(sd, gate="model.layers.{i}.mlp.gate_proj.weight")
    # Exporting: w_down must be the experts' [E, F, K] (a missing expert or [E, K, F] is not
    # a checkpoint).
    experts, w_down = convert.pack_hf_experts_checkpoint(sd)[1]
    for bad in (w_down[:-1], jnp.swapaxes(w_down, 1, 2)):
        with pytest.raises(ValueError, match=r"layers\[1\]: w_down must be \[E, F, K\]"):
            convert.hf_experts_checkpoint({1: (experts, bad)})
    # .safetensors files too (read lazily, only the expert tensors).
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    safetensors_numpy.save_file(sd, str(tmp_path / "model.safetensors"))
    from_file = convert.pack_hf_experts_checkpoint(tmp_path / "model.safetensors")
    np.testing.assert_array_equal(from_file[1][0].data,
                                  convert.pack_hf_experts_checkpoint(sd)[1][0].data)


# --- the Flax expert block in a Mixtral-style layer ---------------------------------------------

def _moe_layer(experts_mlp, router, x, top_k):
    """A Mixtral-style sparse layer around the expert block: route, sort by expert, run the
    experts, unsort, combine with the softmaxed top-k router weights."""
    logits = x @ router
    weights, chosen = jax.lax.top_k(logits, top_k)
    weights = jax.nn.softmax(weights.astype(jnp.float32), axis=-1)
    flat = chosen.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.bincount(flat, length=router.shape[1]).astype(jnp.int32)
    y = experts_mlp(jnp.repeat(x, top_k, axis=0)[order], sizes)
    y = jnp.zeros_like(y).at[order].set(y).reshape(x.shape[0], top_k, -1)
    return jnp.einsum("tk,tkd->td", weights, y.astype(jnp.float32))


def test_the_expert_block_in_a_mixtral_style_layer(key):
    nnx = pytest.importorskip("flax.nnx", reason="the Flax expert block needs flax")
    from jax_swiglu import nn as swiglu_nn
    kx, kr = jax.random.split(key)
    block = swiglu_nn.FusedExpertsMLP(K, F, E, rngs=nnx.Rngs(0))
    assert block.gate_up_packed.kernel.shape == (E, K, 2 * 96)
    assert block.down_proj.kernel.shape == (E, F, K)
    router = jax.random.normal(kr, (K, E)).astype(jnp.bfloat16)
    x = jax.random.normal(kx, (24, K)).astype(jnp.bfloat16)
    y = nnx.jit(lambda block, x: _moe_layer(block, router, x, top_k=2))(block, x)
    # Reference: every expert on every token in float64, combined by the same routing.
    w_gate, w_up = (np.asarray(w, np.float64) for w in unpack_expert_weights(block.packed_experts()))
    w_down = np.asarray(block.down_proj.kernel.get_value(), np.float64)
    logits = np.asarray(x @ router, np.float32)
    weights, chosen = jax.lax.top_k(logits, 2)
    weights = np.asarray(jax.nn.softmax(weights, axis=-1), np.float64)
    x64 = np.asarray(x, np.float64)
    expected = np.zeros((24, K))
    for t in range(24):
        for slot in range(2):
            e = int(chosen[t, slot])
            gate, up = x64[t] @ w_gate[e], x64[t] @ w_up[e]
            h = np.asarray((gate / (1 + np.exp(-gate)) * up), np.float32).astype(jnp.bfloat16)
            expected[t] += weights[t, slot] * (np.asarray(h, np.float64) @ w_down[e])
    np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-2, atol=2e-2)
    # From converted experts, and abstractly built then loaded.
    same = swiglu_nn.FusedExpertsMLP.from_experts(block.packed_experts(),
                                                  block.down_proj.kernel.get_value())
    sizes = jnp.array([6, 0, 10, 8], jnp.int32)
    np.testing.assert_array_equal(same(x, sizes), block(x, sizes))
    abstract = nnx.eval_shape(lambda: swiglu_nn.FusedExpertsMLP(K, F, E, rngs=nnx.Rngs(1)))
    with pytest.raises(ValueError, match="load them first"):
        abstract(x, sizes)
    nnx.update(abstract, nnx.state(block))
    np.testing.assert_array_equal(abstract(x, sizes), block(x, sizes))
    shapes = jax.ShapeDtypeStruct((24, K), jnp.bfloat16), jax.ShapeDtypeStruct((E,), jnp.int32)
    assert "runs plain XLA" in block.explain(*shapes, platform="cpu")
    if jax_swiglu.kernels_available():
        assert "runs the grouped fused kernel" in block.explain(*shapes, platform="cuda")


def test_the_linen_expert_block_matches_the_nnx_one(key):
    pytest.importorskip("flax", reason="the Flax expert blocks need flax")
    import flax.linen as nn
    from jax_swiglu import nn as swiglu_nn
    x = jax.random.normal(key, (12, K)).astype(jnp.bfloat16)
    sizes = jnp.array([3, 0, 5, 4], jnp.int32)
    block = swiglu_nn.linen.FusedExpertsMLP(F, E)
    variables = block.init(jax.random.key(0), x, sizes)
    assert nn.get_partition_spec(variables)["params"]["gate_up_packed"]["kernel"] == \
        jax.sharding.PartitionSpec("expert", "embed", "mlp")
    params = nn.unbox(variables)["params"]
    assert params["gate_up_packed"]["kernel"].shape == (E, K, 2 * 96)
    y = jax.jit(block.apply)(variables, x, sizes)
    experts = jax_swiglu.PackedExperts.from_packed_data(params["gate_up_packed"]["kernel"], F)
    same = swiglu_nn.FusedExpertsMLP.from_experts(experts, params["down_proj"]["kernel"])
    np.testing.assert_array_equal(y, same(x, sizes))
