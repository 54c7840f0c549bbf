// The gated activations act(g) of act(g) * u, in fp32, as every kernel computes them: one
// definition, which the epilogues and the gemv kernel call (the activation is a compile-time
// parameter, so each config is one kernel per activation with no branch per element).
#pragma once

#include <cutlass/cutlass.h>

#include "../kernel_configs.h"

namespace jax_swiglu {

// The gate's activation, act(g) in fp32, as a product g * sigmoid(t) for both activations:
//  - SiLU: t = g.
//  - GELU, tanh form (Gemma's GeGLU): 0.5 * (1 + tanh(z)) = sigmoid(2z), so
//    gelu_tanh(g) = g * sigmoid(2 sqrt(2/pi) (g + 0.044715 g^3)). Written through the
//    sigmoid it costs two more FMA-pipe instructions than SiLU and keeps its accuracy where
//    tanh(z) nears -1: 1 + tanh(z) from a tanh of bounded relative error would cancel there.
// The sigmoid, 1 / (1 + exp(-t)) in fp32, two ways that cost the SM different things. The
// cooperative kernel's epilogue runs while the tensor cores wait, and for a 128x128 output
// tile it is bound by two limits: the SM issues one instruction per clock per scheduler
// (each of the 8 math warps issues ~800 instructions per tile, 2 warps per scheduler)
// and 16 MUFU ops per clock (CUDA guide's throughput table). Both ways use MUFU.EX2 for
// exp(-t); the reciprocal is either:
//  - MUFU.RCP: 6 instructions per element, 2 of them MUFU, or
//  - Newton-Raphson on the FMA pipe: 11 instructions, 1 MUFU. A guess from the float's
//    bits (relative error at most 0.051 while 1 + exp(-t) < 2^125, i.e. t > -86.6) and
//    two Newton steps, each squaring the error: at most 6.6e-6 there (an fp32 emulation),
//    far below a bf16 half-ulp, so the output still rounds once from a near-exact value.
// MUFU.RCP alone makes a tile's SiLU 2048 MUFU clocks, Newton alone ~2000 issue clocks;
// alternating them (`Combine` takes the even/odd column of each pair) ~1650. That is for
// the cooperative schedule. In the pingpong schedule one warpgroup runs its epilogue at a
// time (one math warp per scheduler) while the other's wgmmas run: there the chain of
// dependent instructions is what counts, and MUFU.RCP on every column measured faster than
// alternating on every shape tried (docs/design.md).
// Range, both ways and both activations: act(+inf) = inf, act(-inf) = -inf * 0 = NaN,
// act(NaN) = NaN, as in the reference. Below t = -86.6 the sigmoid is under 2^-125, and
// each way returns a tiny value or 0 where the reference has a tiny value or 0 (outputs at
// most ~1e-36 apart): MUFU.RCP flushes denormal results to 0; Newton caps exp(-t) just
// below 2^128 (so 1 + exp(-t) stays finite), its guess degrades past 2^125 and is clamped
// to +0 from ~2^127 on, which the steps keep.
template <bool kNewtonReciprocal>
CUTLASS_DEVICE float Sigmoid(float t) {
  constexpr float kMinusLog2E = -1.44269504088896341f;
  float exp_minus_t, sigmoid;
  if constexpr (kNewtonReciprocal) {
    constexpr float kMaxExponent = 127.99f;       // 2^127.99 < FLT_MAX
    constexpr int kReciprocalGuess = 0x7EF311C3;  // 2^127 / d, roughly, in integer bits
    asm("ex2.approx.ftz.f32 %0, %1;"
        : "=f"(exp_minus_t)
        : "f"(fminf(t * kMinusLog2E, kMaxExponent)));  // fminf(NaN, c) = c
    const float denominator = 1.0f + exp_minus_t;
    sigmoid = __int_as_float(max(kReciprocalGuess - __float_as_int(denominator), 0));
    sigmoid = fmaf(sigmoid, fmaf(-denominator, sigmoid, 1.0f), sigmoid);
    sigmoid = fmaf(sigmoid, fmaf(-denominator, sigmoid, 1.0f), sigmoid);
  } else {
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(exp_minus_t) : "f"(t * kMinusLog2E));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(sigmoid) : "f"(1.0f + exp_minus_t));
  }
  return sigmoid;
}

template <Activation kActivation, bool kNewtonReciprocal>
CUTLASS_DEVICE float Activate(float gate) {
  if constexpr (kActivation == Activation::Silu) {
    return gate * Sigmoid<kNewtonReciprocal>(gate);
  } else {
    static_assert(kActivation == Activation::GeluTanh, "an activation without its math");
    constexpr float kLinear = 1.5957691216057308f;              // 2 sqrt(2 / pi)
    constexpr float kCubic = 1.5957691216057308f * 0.044715f;   // 2 sqrt(2 / pi) 0.044715
    return gate * Sigmoid<kNewtonReciprocal>(gate * fmaf(kCubic, gate * gate, kLinear));
  }
}

}  // namespace jax_swiglu
