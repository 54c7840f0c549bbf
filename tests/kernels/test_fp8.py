"""The e4m3 rows' special cases, on an SM90 GPU: one scale for all, fp8 x with its own
scales, every promotion interval a row takes, fast accumulation, the HLO naming the fp8
kernel, the kernel that quantizes 16-bit x, and the inputs left as they were. (Every e4m3
row runs the suite of test_base.py too, with criterion.py's fp8 allowance.)"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_swiglu
from jax_swiglu import (Launch, _native, _primitive, dequantize_down, fused_mlp, quantize_down,
                        quantize_tokens, swiglu)
from jax_swiglu._reference import fused_mlp_reference_quantized

from criterion import FAST_OFF_PER_MILLION, FEW_OFF_PER_MILLION, check, errors, inputs, rows

FP8_ROWS = [r.id for r in rows(operands="e4m3")]


@pytest.mark.parametrize("config", FP8_ROWS)
@pytest.mark.parametrize("m, k, n", [(1, 64, 8), (63, 144, 200), (300, 2048, 72)])
def test_one_scale_for_all(config, m, k, n, key):
    row = [r for r in rows(operands="e4m3") if r.id == config][0]
    if not row.runs(m):
        pytest.skip(f"config {config} runs at most {row.max_m} tokens")
    check(m, k, n, key, launch=Launch(config), operands="e4m3", scale="per_tensor")


# Promoting less often than every 128 of K (CUTLASS's default, 4 wgmma of 32) lets the tensor
# cores add more products below fp32 before each promotion: a launch a user may force for
# speed, documented (docs/design.md, FP8 weights) to put 10-500x more outputs past the line.
# Such a launch must still write every element and stay within the Frobenius bound; its
# outliers are allowed up to one in a thousand, far below what a wrong result gives.
LONG_PROMOTION_OFF_PER_MILLION = 1000.0


@pytest.mark.parametrize("config", FP8_ROWS)
@pytest.mark.parametrize("promotion", [2, 4, 8, 16])
def test_every_promotion_a_row_takes(config, promotion, key):
    row = [r for r in rows(operands="e4m3") if r.id == config][0]
    if row.fast_accumulation:
        with pytest.raises(ValueError, match="fast accumulation"):
            check(16, 256, 256, key, launch=Launch(config, promotion=promotion),
                  operands="e4m3")
        return
    if promotion % (row.tile_k // 32):
        pytest.skip(f"config {config} promotes after whole k tiles of {row.tile_k // 32} wgmma")
    m = 16 if row.m_side == "weights" else 1000
    check(m, 2560, 9728, key, launch=Launch(config, promotion=promotion), operands="e4m3",
          off_per_million=None if promotion <= 4 else LONG_PROMOTION_OFF_PER_MILLION)


# Fast accumulation (accumulation="fast", promotion 0, and the fast-accumulation rows): the
# tensor cores add all of K, promoted once if at all; criterion.py's fast allowance, at a
# deep K too.
@pytest.mark.parametrize("config", FP8_ROWS)
@pytest.mark.parametrize("k", [2560, 8192])
def test_fast_accumulation(config, k, key):
    row = [r for r in rows(operands="e4m3") if r.id == config][0]
    m = 16 if row.m_side == "weights" else 1000
    check(m, k, 4096, key, launch=Launch(config, promotion=0), operands="e4m3")


def test_a_fast_accumulation_row_needs_the_fast_call(key):
    """A fast-accumulation row forced on a promoted call is a clear error, not a silently
    less exact result."""
    fast_rows = [r.id for r in rows(operands="e4m3") if r.fast_accumulation]
    if not fast_rows:
        pytest.skip("no fast-accumulation row in this build")
    x, q = inputs(key, 64, 256, 256, jnp.dtype(jnp.bfloat16), "e4m3")
    with pytest.raises(ValueError, match="pass accumulation='fast'"):
        swiglu(x, q, launch=Launch(fast_rows[0]))
    assert np.isfinite(np.asarray(swiglu(x, q, launch=Launch(fast_rows[0]),
                                         accumulation="fast"), np.float32)).all()


def test_fast_accumulation_as_a_model_asks_for_it(key):
    """swiglu(..., accumulation="fast") as a model calls it: finite, and within the
    Frobenius bound of the promoted call."""
    x, q = inputs(key, 300, 4096, 2816, jnp.dtype(jnp.bfloat16), "e4m3")
    promoted = np.asarray(jax.jit(lambda x, q: swiglu(x, q))(x, q), np.float32)
    fast = np.asarray(jax.jit(lambda x, q: swiglu(x, q, accumulation="fast"))(x, q), np.float32)
    assert np.isfinite(fast).all()
    rel = np.linalg.norm(fast - promoted) / np.linalg.norm(promoted)
    assert rel < 1e-2, rel


def gemm_operand_types(compiled_hlo):
    """The element types of what the compiled program's GEMM custom calls read: compiled
    HLO names operands without their shapes, so each is looked up where it is defined."""
    defined = dict(re.findall(r"%(\S+) = \(?(\w+)\[", compiled_hlo))
    types = set()
    for line in compiled_hlo.splitlines():
        # cuBLASLt's GEMM, or a Triton GEMM fusion under any of the kind names XLA gives one
        # (__triton_gemm; others where its autotuner is off, as scripts/gpu_check.sh has it).
        if "__cublas$lt$matmul" in line or re.search(r"__triton\w*gemm", line):
            call = re.search(r"(?:custom-call|fusion)\(([^)]*)\)", line)
            operands = re.findall(r"%(\S+?)[,)]", call.group(1) + ")") if call else []
            types |= {defined.get(name) for name in operands}
    return types


@pytest.mark.parametrize("accumulation", ["promoted", "fast"])
@pytest.mark.parametrize("m, k, n", [(1, 4096, 2816), (300, 2560, 9728), (2048, 8192, 1000)])
def test_the_xla_path_is_xlas_fp8_gemm(m, k, n, accumulation, key):
    """kernel="xla" on e4m3 weights runs XLA's own fp8 GEMM in the call's accumulation:
    within the criterion as the fused kernel in that accumulation is, fp8 x too. From two
    tokens the compiled program has a GEMM on the fp8 operands (at one, XLA may reduce)."""
    check(m, k, n, key, kernel="xla", operands="e4m3", accumulation=accumulation)
    x, q = inputs(key, m, k, n, jnp.dtype(jnp.bfloat16), "e4m3")
    x_q, x_scale = quantize_tokens(x)
    on_xla = jax.jit(lambda x, q: swiglu(x, q, kernel="xla", accumulation=accumulation))
    if m > 1:
        read = gemm_operand_types(on_xla.lower(x, q).compile().as_text())
        assert "f8e4m3fn" in read, read
    a = on_xla(x, q)
    b = jax.jit(lambda x_q, s, q: swiglu(x_q, q, x_scale=s, kernel="xla",
                                         accumulation=accumulation))(x_q, x_scale, q)
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=1e-2, atol=1e-3)


def test_a_callable_activation_runs_on_xlas_fp8_gemm(key):
    """An activation no kernel compiles, on e4m3 weights: XLA's fp8 GEMM, within the
    criterion's fp8 allowance."""
    def relu(g):
        return jnp.maximum(g, 0.0)
    m, n = 300, 2000
    x, q = inputs(key, m, 2560, n, jnp.dtype(jnp.bfloat16), "e4m3")
    y = jax.jit(lambda x, q: swiglu(x, q, activation=relu))(x, q)
    off, rel_fro, _ = (float(v) for v in errors(y, x, q, relu))
    assert off <= max(1.0, FEW_OFF_PER_MILLION * m * n / 1e6) and rel_fro < 1e-2, (off, rel_fro)


@pytest.mark.parametrize("m", [1, 64, 2048])
def test_float16_output(m, key):
    check(m, 1024, 2816, key, operands="e4m3", dtype=jnp.float16)


def test_fp8_x_with_its_scales_is_the_same_call(key):
    x, q = inputs(key, 48, 1024, 2816, jnp.dtype(jnp.bfloat16), "e4m3")
    x_q, x_scale = quantize_tokens(x)
    a = jax.jit(lambda x, q: swiglu(x, q))(x, q)
    b = jax.jit(lambda x_q, s, q: swiglu(x_q, q, x_scale=s))(x_q, x_scale, q)
    assert b.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


def test_the_hlo_names_the_fp8_kernel(key):
    """At 8 tokens the GPU's data picks an e4m3 gemv row or the e4m3 swap-AB GEMM (close on
    this shape): the HLO names the one explain names."""
    x, q = inputs(key, 8, 1024, 2816, jnp.dtype(jnp.bfloat16), "e4m3")
    hlo = jax.jit(lambda x, q: swiglu(x, q)).lower(x, q).as_text()
    target = re.search(r"\[(jax_swiglu_\w+), config", jax_swiglu.explain(x, q)).group(1)
    assert target in ("jax_swiglu_gemv_fp8_silu_bf16", "jax_swiglu_interleaved_fp8_silu_bf16")
    assert target in hlo
    assert ("jax_swiglu_quantize_rows_e4m3_bf16" in hlo) == _primitive.QUANTIZE_KERNEL
    x, q = inputs(key, 64, 1024, 2816, jnp.dtype(jnp.bfloat16), "e4m3")
    hlo = jax.jit(lambda x, q: swiglu(x, q)).lower(x, q).as_text()
    assert "jax_swiglu_interleaved_fp8_silu_bf16" in hlo


def _quantize_rows(x):
    """The kernel that quantizes an fp8 call's 16-bit x, called by itself."""
    m, k = x.shape
    return jax.ffi.ffi_call(_native.quantize_target(x.dtype),
                            (jax.ShapeDtypeStruct((m, k), jnp.float8_e4m3fn),
                             jax.ShapeDtypeStruct((m,), jnp.float32)))(x)


def _assert_same_quantization(got, want, nan_rows=()):
    (q, s), (q_want, s_want) = [[np.asarray(a) for a in pair] for pair in (got, want)]
    np.testing.assert_array_equal(s.view(np.uint32), s_want.view(np.uint32))
    q, q_want = q.view(np.uint8), q_want.view(np.uint8)
    nan, nan_want = (q & 0x7F) == 0x7F, (q_want & 0x7F) == 0x7F  # e4m3fn's NaNs, either sign
    np.testing.assert_array_equal(nan, nan_want)
    np.testing.assert_array_equal(np.where(nan, 0, q), np.where(nan_want, 0, q_want))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("m, k", [(1, 16), (5, 1032), (16, 8192), (3, 20480), (300, 4096),
                                  (2048, 2560)])
def test_tokens_quantize_in_one_kernel_as_quantize_tokens_does(m, k, dtype, key):
    """The kernel that quantizes an fp8 call's 16-bit x (one CTA a row) gives
    quantize_tokens' x_q and x_scale bit for bit: rows of every magnitude the dtype holds
    (each with e4m3 subnormals near its zeros), an all-zero row (scale 1), K not a multiple
    of the CTA's 2048 values a pass, and rows longer than the 16384 values it keeps in
    registers."""
    top = 12 if dtype == jnp.float16 else 100
    magnitudes = 2.0 ** jnp.linspace(-14, top, m)
    x = (jax.random.normal(key, (m, k), jnp.float32) * magnitudes[:, None]).astype(dtype)
    if m > 2:
        x = x.at[m // 2].set(0)
    _assert_same_quantization(jax.jit(_quantize_rows)(x), jax.jit(quantize_tokens)(x))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_tokens_quantize_with_nan_and_inf_as_quantize_tokens_does(dtype, key):
    """A row with a NaN or an infinity has scale 1 (its other values quantized as they are,
    NaN where x is NaN, the largest finite value where it is infinite): as quantize_tokens
    defines them."""
    x = jax.random.normal(key, (4, 512), jnp.float32).astype(dtype)
    x = x.at[1, 7].set(jnp.nan).at[2, 300].set(jnp.inf).at[3, 0].set(-jnp.inf)
    _assert_same_quantization(jax.jit(_quantize_rows)(x), jax.jit(quantize_tokens)(x))


def test_16bit_x_quantized_in_the_call_is_the_same_call(key):
    """The fused call of 16-bit x (its own quantization kernel first) against the same launch
    on quantize_tokens' x_q and x_scale: the same bits, at decode (a gemv row) and beyond."""
    for m in (1, 16, 300):
        x, q = inputs(key, m, 2048, 2816, jnp.dtype(jnp.bfloat16), "e4m3")
        a = jax.jit(lambda x, q: swiglu(x, q))(x, q)
        x_q, x_scale = jax.jit(quantize_tokens)(x)
        b = jax.jit(lambda x_q, s, q: swiglu(x_q, q, x_scale=s))(x_q, x_scale, q)
        np.testing.assert_array_equal(np.asarray(a).view(np.uint16),
                                      np.asarray(b).view(np.uint16))


def test_inputs_are_not_modified(key):
    x, q = inputs(key, 16, 1024, 2816, jnp.dtype(jnp.bfloat16), "e4m3")
    before = [np.asarray(a).copy() for a in (x, q.data, q.scales)]
    jax.block_until_ready(jax.jit(lambda x, q: swiglu(x, q))(x, q))
    for a, b in zip(before, (x, q.data, q.scales)):
        np.testing.assert_array_equal(a.view(np.uint8), np.asarray(b).view(np.uint8))


# --- the whole block in fp8: fused_mlp(x, q, quantize_down(w_down)) ------------------------

# The fast block's Frobenius bound: twice the largest error measured on the H200
# (tests/results/INDEX.md has the run).
FAST_BLOCK_FROBENIUS = 5e-2


@pytest.mark.parametrize("accumulation", ["promoted", "fast"])
@pytest.mark.parametrize("m", [1, 4, 8, 300, 2048])
def test_the_whole_block_in_fp8(m, accumulation, key):
    """The block on the GPU: the fused kernel's h (checked above), quantized per row, through
    XLA's fp8 GEMM with the down weights (at 2-8 tokens the gemv row's projection instead).
    Against h's own quantization and the down projection in float64: the criterion's line
    and allowance of the mode (the down dot adds N = 2816 products per output). Against the
    whole spec (the exact h quantized): a Frobenius bound. Quantizing h to e4m3 turns a
    small difference in h into a whole e4m3 step wherever h lies near a rounding boundary,
    so the bound is the criterion's for promoted sums and FAST_BLOCK_FROBENIUS under fast
    accumulation, whose h is further off."""
    kx, kd = jax.random.split(key)
    x, q = inputs(kx, m, 1024, 2816, jnp.dtype(jnp.bfloat16), "e4m3")
    w_down = jax.random.normal(kd, (2816, 1024), jnp.float32) / np.sqrt(2816)
    down = quantize_down(w_down)
    block = jax.jit(lambda x, q, d: fused_mlp(x, q, d, accumulation=accumulation))
    out = np.asarray(block(x, q, down), np.float32)
    h = jax.jit(lambda x, q: swiglu(x, q, accumulation=accumulation))(x, q)
    h_q, h_scale = quantize_tokens(h)
    h64 = np.asarray(h_q, np.float64) * np.asarray(h_scale, np.float64)[:, None]
    reference = h64 @ np.asarray(dequantize_down(down), np.float64)
    off = int(np.sum(~(np.abs(out - reference) <= 0.01 * np.abs(reference) + 1e-3)))
    per_million = FAST_OFF_PER_MILLION if accumulation == "fast" else FEW_OFF_PER_MILLION
    assert off <= max(1.0, per_million * out.size / 1e6), off
    spec = np.asarray(fused_mlp_reference_quantized(x, q, down), np.float32)
    bound = FAST_BLOCK_FROBENIUS if accumulation == "fast" else 1e-2
    assert np.linalg.norm(out - spec) / np.linalg.norm(spec) < bound


@pytest.mark.parametrize("m", [2, 5, 8])
@pytest.mark.parametrize("scale", ["per_channel", "per_tensor"])
def test_the_block_runs_the_gemv_projection_at_a_few_tokens(m, scale, key):
    """At the token counts selection.choose_projection gives the decode form, the block's
    down projection is the chosen gemv launch on h quantized by quantize_tokens' definition:
    the same bits as calling that launch directly, twice over (deterministic)."""
    from jax_swiglu import selection
    from jax_swiglu._projection import gemv_projection

    kx, kd = jax.random.split(key)
    x, q = inputs(kx, m, 1024, 2816, jnp.dtype(jnp.bfloat16), "e4m3")
    down = quantize_down(jax.random.normal(kd, (2816, 4096), jnp.float32) / np.sqrt(2816),
                         scale=scale)
    choice = selection.choose_projection(m, 4096, 2816, "bfloat16")
    assert choice.launch is not None, choice.reason
    block = jax.jit(lambda x, q, d: fused_mlp(x, q, d))
    out = np.asarray(block(x, q, down)).view(np.uint16)
    np.testing.assert_array_equal(np.asarray(block(x, q, down)).view(np.uint16), out)
    h = jax.jit(lambda x, q: swiglu(x, q))(x, q)
    h_q, h_scale = jax.jit(quantize_tokens)(h)
    direct = jax.jit(lambda h_q, s, d: gemv_projection(
        h_q, d, config=choice.launch.config, splits=choice.launch.splits, x_scale=s,
        promotion=choice.launch.promotion_interval))(
        h_q, h_scale, down)
    np.testing.assert_array_equal(np.asarray(direct).view(np.uint16), out)
