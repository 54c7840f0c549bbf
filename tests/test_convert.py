"""The layout adapters (jax_swiglu.convert): each source layout packs, runs and exports exactly.

For every layout: pack then export gives back the input bit for bit; unpacking gives the
(gate, up) the source layout means (read with the source's own indexing); and ``swiglu`` on
the packed weights is the model's own formula, written with the source layout's einsum.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_swiglu
from jax_swiglu import convert, swiglu, swiglu_reference, unpack_weights

from helpers import random_x, rounding_tolerance

SHAPES = [(64, 96), (64, 40)]  # N = 96: three whole 32-column runs; N = 40: padded
DTYPES = [jnp.bfloat16, jnp.float32]
PARAMS = pytest.mark.parametrize("k, n", SHAPES)
DTYPE_PARAMS = pytest.mark.parametrize("dtype", DTYPES)


def _random(key, shape, dtype):
    return (jax.random.normal(key, shape, jnp.float32) / np.sqrt(shape[-1])).astype(dtype)


def _assert_same(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected))


def _silu_gate(h_gate, h_up, dtype):
    """The models' SiLU gate on fp32 pre-activations, rounded once, as swiglu rounds."""
    return (jax.nn.silu(h_gate) * h_up).astype(dtype)


def _einsum_f32(eqn, x, w):
    return jnp.einsum(eqn, x, w, preferred_element_type=jnp.float32,
                      precision=jax.lax.Precision.HIGHEST)


def _assert_close_bf16(actual, expected):
    # The einsum may sum in another order than the reference's dot: a rounding apart.
    tol = rounding_tolerance(jnp.bfloat16)
    np.testing.assert_allclose(np.asarray(actual, np.float32), np.asarray(expected, np.float32),
                               rtol=2 * tol, atol=2 * tol)


def _check_runs(key, packed, gate, up, formula):
    """swiglu on ``packed`` is the reference on (gate, up) exactly, and the model's formula.

    The kernels take bfloat16 (or float16): float32 sources are packed with ``dtype=``.
    """
    k = gate.shape[0]
    x = random_x(key, (3, 5, k), jnp.bfloat16)
    y = swiglu(x, packed)
    _assert_same(y, swiglu_reference(x, gate.astype(x.dtype), up.astype(x.dtype)))
    _assert_close_bf16(y, formula(x))


# --- MaxText wi [embed, 2, mlp] --------------------------------------------------------------

@PARAMS
@DTYPE_PARAMS
def test_maxtext_wi(key, k, n, dtype):
    wi = _random(key, (k, 2, n), dtype)
    packed = convert.pack_maxtext_wi(wi)
    assert packed.k == k and packed.n == n and packed.dtype == dtype
    _assert_same(convert.maxtext_wi(packed), wi)
    gate, up = unpack_weights(packed)
    _assert_same(gate, wi[:, 0])  # wi_0, the activation's input
    _assert_same(up, wi[:, 1])  # wi_1, linear

    def maxtext(x):  # MlpBlock, fused_mlp=True, mlp_activations=("silu", "linear")
        h = _einsum_f32("...d,dkf->...kf", x, wi.astype(x.dtype))
        return _silu_gate(h[..., 0, :], h[..., 1, :], x.dtype)

    runnable = convert.pack_maxtext_wi(wi, dtype=jnp.bfloat16)
    _check_runs(jax.random.fold_in(key, 1), runnable, wi[:, 0], wi[:, 1], maxtext)


def test_maxtext_wi_is_the_stacked_form(key):
    wi = _random(key, (64, 2, 96), jnp.bfloat16)
    _assert_same(convert.pack_maxtext_wi(wi).data, jax_swiglu.pack_weights(wi).data)


# --- Gemma gating_einsum ---------------------------------------------------------------------

@PARAMS
@DTYPE_PARAMS
@pytest.mark.parametrize("transposed", [False, True])
def test_gemma_gating(key, k, n, dtype, transposed):
    # Gemma's FeedForward: [2, features, hidden] by default, [2, hidden, features] transposed.
    shape, eqn = ((2, n, k), "...F,NHF->...NH") if transposed else ((2, k, n), "...F,NFH->...NH")
    w = _random(key, shape, dtype)
    packed = convert.pack_gemma_gating(w, transpose_gating_einsum=transposed)
    assert packed.k == k and packed.n == n and packed.dtype == dtype
    _assert_same(convert.gemma_gating(packed, transpose_gating_einsum=transposed), w)
    gate, up = unpack_weights(packed)
    _assert_same(gate, w[0].T if transposed else w[0])
    _assert_same(up, w[1].T if transposed else w[1])

    def gemma(x):  # the gating einsum, then Gemma's gate[..., 0, :] * gate[..., 1, :] (SiLU here)
        h = _einsum_f32(eqn, x, w.astype(x.dtype))
        return _silu_gate(h[..., 0, :], h[..., 1, :], x.dtype)

    runnable = convert.pack_gemma_gating(w, transpose_gating_einsum=transposed,
                                         dtype=jnp.bfloat16)
    _check_runs(jax.random.fold_in(key, 1), runnable, gate, up, gemma)


def test_gemma_transposed_forms_pack_alike(key):
    w = _random(key, (2, 64, 96), jnp.bfloat16)
    plain = convert.pack_gemma_gating(w)
    transposed = convert.pack_gemma_gating(w.transpose(0, 2, 1), transpose_gating_einsum=True)
    _assert_same(transposed.data, plain.data)


# --- Hugging Face [out, in] ------------------------------------------------------------------

@PARAMS
@DTYPE_PARAMS
def test_hf(key, k, n, dtype):
    kg, ku, kx = jax.random.split(key, 3)
    gate_weight, up_weight = _random(kg, (n, k), dtype), _random(ku, (n, k), dtype)
    packed = convert.pack_hf(gate_weight, up_weight)
    assert packed.k == k and packed.n == n and packed.dtype == dtype
    gate_back, up_back = convert.hf_gate_up(packed)
    _assert_same(gate_back, gate_weight)
    _assert_same(up_back, up_weight)
    gate, up = unpack_weights(packed)
    _assert_same(gate, gate_weight.T)
    _assert_same(up, up_weight.T)

    def llama(x):  # act_fn(gate_proj(x)) * up_proj(x), nn.Linear: x @ weight.T
        h_gate = _einsum_f32("...k,nk->...n", x, gate_weight.astype(x.dtype))
        h_up = _einsum_f32("...k,nk->...n", x, up_weight.astype(x.dtype))
        return _silu_gate(h_gate, h_up, x.dtype)

    runnable = convert.pack_hf(gate_weight, up_weight, dtype=jnp.bfloat16)
    _check_runs(kx, runnable, gate_weight.T, up_weight.T, llama)


def test_hf_dict_form_is_nn_s(key):
    pytest.importorskip("flax", reason="jax_swiglu.nn needs flax")
    from jax_swiglu import nn

    kg, ku, kd = jax.random.split(key, 3)
    weights = {"gate_proj.weight": _random(kg, (40, 64), jnp.bfloat16),
               "up_proj.weight": _random(ku, (40, 64), jnp.bfloat16),
               "down_proj.weight": _random(kd, (64, 40), jnp.bfloat16)}
    fused = convert.fuse_hf_weights(weights)
    _assert_same(fused["gate_up_packed"]["kernel"],
                 nn.fuse_hf_weights(weights)["gate_up_packed"]["kernel"])
    _assert_same(fused["gate_up_packed"]["kernel"],
                 convert.pack_hf(weights["gate_proj.weight"], weights["up_proj.weight"]).data)
    for name, tensor in convert.fused_to_hf_weights(fused).items():
        _assert_same(tensor, weights[name])


# --- nnx.Linear layers (google-tunix Llama 3 / Qwen 3 MLP) -----------------------------------

def _duck_mlp(key, k, n, dtype):
    """An object shaped like tunix's MLP, without flax: layers with plain-array kernels."""
    kg, ku, kd = jax.random.split(key, 3)
    layer = types.SimpleNamespace
    return types.SimpleNamespace(gate_proj=layer(kernel=_random(kg, (k, n), dtype)),
                                 up_proj=layer(kernel=_random(ku, (k, n), dtype)),
                                 down_proj=layer(kernel=_random(kd, (n, k), dtype)))


@PARAMS
@DTYPE_PARAMS
def test_linears_duck_typed(key, k, n, dtype):
    mlp = _duck_mlp(key, k, n, dtype)
    gate, up, down = mlp.gate_proj.kernel, mlp.up_proj.kernel, mlp.down_proj.kernel
    packed, w_down = convert.pack_linears(mlp)
    assert packed.k == k and packed.n == n and packed.dtype == dtype
    _assert_same(w_down, down)
    for got, want in zip(convert.linear_kernels(packed, w_down), (gate, up, down)):
        _assert_same(got, want)
    # The three layers may be passed separately.
    again, _ = convert.pack_linears(mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    _assert_same(again.data, packed.data)

    def tunix(x):  # nnx.silu(gate_proj(x)) * up_proj(x), nnx.Linear: x @ kernel
        h_gate = _einsum_f32("...k,kn->...n", x, gate.astype(x.dtype))
        h_up = _einsum_f32("...k,kn->...n", x, up.astype(x.dtype))
        return _silu_gate(h_gate, h_up, x.dtype)

    runnable, runnable_down = convert.pack_linears(mlp, dtype=jnp.bfloat16)
    assert runnable_down.dtype == jnp.bfloat16
    _check_runs(jax.random.fold_in(key, 1), runnable, gate, up, tunix)


@PARAMS
@DTYPE_PARAMS
def test_nnx_linears(key, k, n, dtype):
    pytest.importorskip("flax", reason="nnx.Linear needs flax")
    from flax import nnx

    def linear(rngs, fan_in, fan_out):
        return nnx.Linear(fan_in, fan_out, use_bias=False, param_dtype=dtype,
                          dtype=jnp.float32, rngs=rngs)

    class MLP(nnx.Module):  # the shape of google-tunix's Llama 3 / Qwen 3 MLP
        def __init__(self, rngs):
            self.gate_proj = linear(rngs, k, n)
            self.up_proj = linear(rngs, k, n)
            self.down_proj = linear(rngs, n, k)

        def gated(self, x):
            return nnx.silu(self.gate_proj(x)) * self.up_proj(x)

    mlp = MLP(nnx.Rngs(int(jax.random.randint(key, (), 0, 2**30))))
    kernels = [getattr(mlp, name).kernel[...] for name in ("gate_proj", "up_proj", "down_proj")]
    packed, w_down = convert.pack_linears(mlp)
    assert packed.dtype == dtype and w_down.dtype == dtype
    for got, want in zip(convert.linear_kernels(packed, w_down), kernels):
        _assert_same(got, want)

    runnable, runnable_down = convert.pack_linears(mlp, dtype=jnp.bfloat16)
    model = mlp
    if dtype != jnp.bfloat16:  # the same MLP with its kernels rounded to bf16, as packed
        model = MLP(nnx.Rngs(0))
        convert.set_linear_kernels(model, runnable, runnable_down)
    # The module computes in fp32 (dtype=float32); swiglu rounds once at the end, as here.
    _check_runs(jax.random.fold_in(key, 1), runnable, kernels[0], kernels[1],
                lambda x: model.gated(x).astype(x.dtype))

    # Export: write the unpacked kernels into a fresh MLP; it then equals the first.
    fresh = MLP(nnx.Rngs(int(jax.random.randint(key, (), 0, 2**30)) + 1))
    assert not np.array_equal(np.asarray(fresh.gate_proj.kernel[...]), np.asarray(kernels[0]))
    param = fresh.gate_proj.kernel
    convert.set_linear_kernels(fresh, packed, w_down)
    assert fresh.gate_proj.kernel is param and isinstance(param, nnx.Param)
    for name, want in zip(("gate_proj", "up_proj", "down_proj"), kernels):
        _assert_same(getattr(fresh, name).kernel[...], want)


def test_set_linear_kernels_duck_typed(key):
    source, target = _duck_mlp(key, 64, 40, jnp.bfloat16), _duck_mlp(key, 64, 40, jnp.float32)
    packed, w_down = convert.pack_linears(source)
    convert.set_linear_kernels(target, packed, w_down)
    for name in ("gate_proj", "up_proj", "down_proj"):
        _assert_same(getattr(target, name).kernel, getattr(source, name).kernel)


@PARAMS
def test_concatenated_linears(key, k, n):
    """A block with gate_up_proj ([K, 2N], [gate | up], Phi-3) and down_proj: read as the
    concatenation it is, and written back as one."""
    kg, kd = jax.random.split(key)
    layer = types.SimpleNamespace
    gate_up = _random(kg, (k, 2 * n), jnp.bfloat16)
    mlp = types.SimpleNamespace(gate_up_proj=layer(kernel=gate_up),
                                down_proj=layer(kernel=_random(kd, (n, k), jnp.bfloat16)))
    packed, w_down = convert.pack_linears(mlp)
    gate, up = unpack_weights(packed)
    _assert_same(gate, gate_up[:, :n])
    _assert_same(up, gate_up[:, n:])
    _check_runs(key, packed, gate, up, lambda x: _silu_gate(
        *jnp.split(_einsum_f32("...k,kn->...n", x, gate_up), 2, axis=-1), x.dtype))
    target = types.SimpleNamespace(gate_up_proj=layer(kernel=jnp.zeros_like(gate_up)),
                                   down_proj=layer(kernel=jnp.zeros_like(w_down)))
    convert.set_linear_kernels(target, packed, w_down)
    _assert_same(target.gate_up_proj.kernel, gate_up)
    _assert_same(target.down_proj.kernel, mlp.down_proj.kernel)
    with pytest.raises(ValueError, match=r"gate_up_proj / down_proj .*concatenated.*\[K, 2N\]"):
        convert.pack_linears(types.SimpleNamespace(gate_up_proj=layer(kernel=gate_up[:, :-1]),
                                                   down_proj=mlp.down_proj))


# --- bad input -------------------------------------------------------------------------------

def _zeros(*shape, dtype=jnp.bfloat16):
    return jnp.zeros(shape, dtype)


@pytest.mark.parametrize(
    "pack, error, match",
    [
        # MaxText wi
        (lambda: convert.pack_maxtext_wi(_zeros(64, 96)), ValueError,
         r"expected MaxText wi \[embed, 2, mlp\], got shape \(64, 96\)"),
        (lambda: convert.pack_maxtext_wi(_zeros(64, 3, 96)), ValueError,
         r"MaxText wi \[embed, 2, mlp\]"),
        (lambda: convert.pack_maxtext_wi(_zeros(2, 64, 96)), ValueError,
         r"MaxText wi \[embed, 2, mlp\], got shape \(2, 64, 96\)"),
        (lambda: convert.pack_maxtext_wi(_zeros(64, 4, 2, 96)), ValueError,
         r"scanned layers .*wi\[:, layer\]"),
        (lambda: convert.pack_maxtext_wi(_zeros(64, 2, 96, dtype=jnp.int32)), TypeError,
         r"floating-point array \(MaxText wi \[embed, 2, mlp\]\), got dtype int32"),
        (lambda: convert.pack_maxtext_wi(_zeros(64, 2, 36)), ValueError,
         r"MaxText wi \[embed, 2, mlp\]: K=64 and N=36 must be multiples of 8"),
        (lambda: convert.pack_maxtext_wi(_zeros(60, 2, 96)), ValueError,
         r"MaxText wi .*K=60 and N=96 must be multiples of 8"),
        (lambda: convert.pack_maxtext_wi([[1.0, 2.0]]), TypeError, "must be an array"),
        # Gemma gating_einsum
        (lambda: convert.pack_gemma_gating(_zeros(3, 64, 96)), ValueError,
         r"expected Gemma gating_einsum \[2, embed, mlp\], got shape \(3, 64, 96\)"),
        (lambda: convert.pack_gemma_gating(_zeros(64, 2, 96), transpose_gating_einsum=True),
         ValueError, r"Gemma gating_einsum \[2, mlp, embed\] \(transpose_gating_einsum=True\)"),
        (lambda: convert.pack_gemma_gating(_zeros(2, 64, 96, dtype=jnp.int8)), TypeError,
         r"floating-point array \(Gemma gating_einsum"),
        (lambda: convert.pack_gemma_gating(_zeros(2, 96, 60), transpose_gating_einsum=True),
         ValueError, r"Gemma gating_einsum \[2, mlp, embed\].*K=60 and N=96 must be multiples"),
        # Hugging Face
        (lambda: convert.pack_hf(_zeros(96, 64), _zeros(96, 72)), ValueError,
         r"expected Hugging Face gate_proj.weight / up_proj.weight \[N, K\].*\(96, 64\) and "
         r"\(96, 72\)"),
        (lambda: convert.pack_hf(_zeros(2, 96, 64), _zeros(2, 96, 64)), ValueError,
         r"Hugging Face .*\[N, K\]"),
        (lambda: convert.pack_hf(_zeros(96, 64), _zeros(96, 64, dtype=jnp.int32)), TypeError,
         r"up_proj.weight must be a floating-point array \(Hugging Face"),
        (lambda: convert.pack_hf(_zeros(96, 64), _zeros(96, 64, dtype=jnp.float16)), TypeError,
         r"Hugging Face .*different dtypes"),
        (lambda: convert.pack_hf(_zeros(36, 64), _zeros(36, 64)), ValueError,
         r"Hugging Face .*N=36 must be multiples of 8"),
    ],
)
def test_bad_input(pack, error, match):
    with pytest.raises(error, match=match):
        pack()


def _mlp(gate, up, down, **extra):
    layer = types.SimpleNamespace
    return types.SimpleNamespace(gate_proj=layer(kernel=gate, **extra), up_proj=layer(kernel=up),
                                 down_proj=layer(kernel=down))


@pytest.mark.parametrize(
    "mlp, error, match",
    [
        (types.SimpleNamespace(gate_proj=None), TypeError,
         r"gate_proj', 'up_proj', 'down_proj'\] linear layers.*has no \['up_proj', 'down_proj'\]"),
        (types.SimpleNamespace(gate_up_proj=None), TypeError,
         r"\['gate_up_proj', 'down_proj'\]\), or the three layers; .*has no \['down_proj'\]"),
        (_mlp(_zeros(64, 96), _zeros(64, 96), _zeros(64, 96)), ValueError,
         r"down_proj.kernel must be \[N, K\] = \[96, 64\]"),
        (_mlp(_zeros(64, 96), _zeros(64, 40), _zeros(96, 64)), ValueError,
         r"linear kernels \(\[in, out\]\): .*same shape"),
        (_mlp(_zeros(64, 96, 1), _zeros(64, 96, 1), _zeros(96, 64)), ValueError,
         r"linear kernels \(\[in, out\]\): .*must be \[K, N\]"),
        (_mlp(_zeros(64, 96, dtype=jnp.int32), _zeros(64, 96), _zeros(96, 64)), TypeError,
         r"gate_proj.kernel must be a floating-point array"),
        (_mlp(_zeros(64, 96), _zeros(64, 96), _zeros(96, 64), bias=_zeros(96)), ValueError,
         "gate_proj has a bias"),
        (types.SimpleNamespace(gate_proj=object(), up_proj=object(), down_proj=object()),
         TypeError, r"gate_proj must be a linear layer with a .kernel"),
    ],
)
def test_bad_linears(mlp, error, match):
    with pytest.raises(error, match=match):
        convert.pack_linears(mlp)


def test_bad_linear_calls(key):
    mlp = _duck_mlp(key, 64, 96, jnp.bfloat16)
    with pytest.raises(TypeError, match="all three of gate_proj, up_proj and down_proj"):
        convert.pack_linears(mlp.gate_proj, mlp.up_proj)
    packed, w_down = convert.pack_linears(mlp)
    with pytest.raises(ValueError, match=r"w_down must be \[N, K\] = \[96, 64\]"):
        convert.linear_kernels(packed, w_down.T)
    with pytest.raises(ValueError, match=r"gate_proj.kernel is \(64, 40\) but these weights give "
                                         r"\(64, 96\)"):
        convert.set_linear_kernels(_duck_mlp(key, 64, 40, jnp.bfloat16), packed, w_down)


@pytest.mark.parametrize("export", [
    convert.maxtext_wi, convert.gemma_gating, convert.hf_gate_up,
    lambda packed: convert.linear_kernels(packed, _zeros(96, 64))])
def test_exports_refuse_unpacked_weights(export):
    with pytest.raises(TypeError, match="PackedWeights"):
        export(_zeros(64, 2, 96))
