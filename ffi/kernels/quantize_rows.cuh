// Tokens quantized per row for the e4m3 kernels, as jax_swiglu.quantize_tokens defines them
// (bit for bit): amax = max |x| over the row, scale = 2^e the smallest power of two with
// amax / 2^e <= 448 (e from amax's fp32 bits, clamped to [-126, 127]), inverse = 2^-e (both
// 1 where amax is 0, infinite or NaN), x_q = e4m3(clamp(x * inverse, -448, 448)) rounded to
// nearest even. The product is exact, so the cast is the only rounding and XLA's fusions of
// the same definition get the same bits. One kernel where XLA would run several fusions,
// launched with PDL (launch.h) like the fused kernels: it waits for the previous kernel
// before reading x, then lets the next kernel of the stream (the fused e4m3 kernel or the
// projection that reads x_q) start its prologue at once.
//
// One CTA per row: each thread reads 16 bytes (8 values) at a time and keeps them (a row of
// up to 16384 values is read once), the CTA reduces the row's amax (and whether it holds a
// NaN) through its warps, then each thread writes 8 bytes of e4m3 at a time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "../launch.h"
#include "element16.cuh"

namespace jax_swiglu {

inline constexpr int kQuantizeThreads = 256;
inline constexpr int kQuantizeVector = 8;  // 16-bit values per 16-byte load
inline constexpr int kQuantizeCached = 8;  // 16-byte loads a thread keeps in registers
// The largest finite e4m3 value (float8_e4m3fn), 1.75 * 2^8, as fp32 bits.
inline constexpr int kE4m3LargestBits = 0x43e00000;
inline constexpr int kFloatMantissaBits = 0x7fffff;

// The row's scale exponent (see the top): amax = 1.a * 2^A and 448 = 1.l * 2^L give
// e = A - L, plus 1 where a > l; both fields read from the bits, as _quantize._token_scales
// does.
__device__ __forceinline__ int ScaleExponent(float amax) {
  const int bits = __float_as_int(amax);
  const int e = (bits >> 23) - (kE4m3LargestBits >> 23) +
                ((bits & kFloatMantissaBits) > (kE4m3LargestBits & kFloatMantissaBits) ? 1 : 0);
  return min(max(e, -126), 127);
}

template <class Tag>
__device__ __forceinline__ void UnpackEight(uint4 v, float (&out)[kQuantizeVector]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair = Element16<Tag>::Unpack(words[i]);
    out[2 * i] = pair.x;
    out[2 * i + 1] = pair.y;
  }
}

// x [m, k] (k a multiple of kQuantizeVector, rows 16-byte aligned) -> x_q [m, k] e4m3 and
// x_scale [m]; one CTA per row (blockIdx.x).
template <class Tag>
__global__ void __launch_bounds__(kQuantizeThreads)
    QuantizeRowsKernel(const void* __restrict__ x, int64_t k, uint8_t* __restrict__ x_q,
                       float* __restrict__ x_scale) {
  __shared__ float warp_amax[kQuantizeThreads / 32];
  __shared__ int warp_nan[kQuantizeThreads / 32];
  __shared__ float row_inverse;
  // x may be the previous kernel's output; the next kernel waits for this grid's end itself.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  const int64_t row = blockIdx.x;
  const uint4* in = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(x) + row * k);
  const int64_t vectors = k / kQuantizeVector;
  float amax = 0.0f;
  bool nan = false;
  auto add_to_amax = [&](uint4 raw) {
    float values[kQuantizeVector];
    UnpackEight<Tag>(raw, values);
#pragma unroll
    for (int i = 0; i < kQuantizeVector; ++i) {
      amax = fmaxf(amax, fabsf(values[i]));
      nan |= values[i] != values[i];
    }
  };
  // A row of up to kQuantizeCached * 2048 values is read once, kept in registers; the rest
  // of a longer one is read again for the cast.
  uint4 cached[kQuantizeCached];
#pragma unroll
  for (int j = 0; j < kQuantizeCached; ++j) {
    const int64_t v = threadIdx.x + int64_t(j) * kQuantizeThreads;
    cached[j] = v < vectors ? __ldg(in + v) : make_uint4(0, 0, 0, 0);
    add_to_amax(cached[j]);  // (zeros past the row change no amax)
  }
  for (int64_t v = threadIdx.x + int64_t(kQuantizeCached) * kQuantizeThreads; v < vectors;
       v += kQuantizeThreads) {
    add_to_amax(__ldg(in + v));
  }
  // fmaxf drops NaNs; jnp.max propagates them, and a NaN amax means scale 1 (below).
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  nan = __any_sync(0xffffffffu, nan);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_amax[warp] = amax;
    warp_nan[warp] = nan;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float row_amax = 0.0f;
    bool row_nan = false;
#pragma unroll
    for (int w = 0; w < kQuantizeThreads / 32; ++w) {
      row_amax = fmaxf(row_amax, warp_amax[w]);
      row_nan |= warp_nan[w] != 0;
    }
    const bool finite_positive = !row_nan && row_amax > 0.0f && !isinf(row_amax);
    const int e = finite_positive ? ScaleExponent(row_amax) : 0;
    x_scale[row] = __int_as_float((127 + e) << 23);
    row_inverse = __int_as_float((127 - e) << 23);
  }
  __syncthreads();
  const float inverse = row_inverse;
  uint2* out = reinterpret_cast<uint2*>(x_q + row * k);
  auto store_quantized = [&](uint4 raw, int64_t v) {
    float values[kQuantizeVector];
    UnpackEight<Tag>(raw, values);
    uint32_t words[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < kQuantizeVector; i += 2) {
      // Saturating to the largest finite value is quantize_tokens' clamp (a NaN stays NaN).
      const __nv_fp8x2_storage_t pair = __nv_cvt_float2_to_fp8x2(
          make_float2(values[i] * inverse, values[i + 1] * inverse), __NV_SATFINITE, __NV_E4M3);
      words[i / 4] |= static_cast<uint32_t>(pair) << (16 * ((i / 2) % 2));
    }
    out[v] = make_uint2(words[0], words[1]);
  };
#pragma unroll
  for (int j = 0; j < kQuantizeCached; ++j) {
    const int64_t v = threadIdx.x + int64_t(j) * kQuantizeThreads;
    if (v < vectors) store_quantized(cached[j], v);
  }
  for (int64_t v = threadIdx.x + int64_t(kQuantizeCached) * kQuantizeThreads; v < vectors;
       v += kQuantizeThreads) {
    store_quantized(__ldg(in + v), v);
  }
}

template <class Tag>
std::string LaunchQuantizeRows(const void* x, int64_t m, int64_t k, void* x_q, float* x_scale,
                               const DeviceFacts& facts, cudaStream_t stream) {
  if (m == 0) return {};
  if (k % kQuantizeVector != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(x_q) % 8 != 0) {
    return "quantize_rows needs K a multiple of " + std::to_string(kQuantizeVector) +
           " and 16-byte aligned buffers";
  }
  if (m > 0x7fffffff) return "quantize_rows: more than 2^31 - 1 rows";
  cudaLaunchConfig_t launch = {};
  launch.gridDim = dim3(static_cast<unsigned>(m), 1, 1);
  launch.blockDim = dim3(kQuantizeThreads, 1, 1);
  launch.dynamicSmemBytes = 0;
  launch.stream = stream;
  cudaLaunchAttribute attrs[2];
  launch.attrs = attrs;
  launch.numAttrs = LaunchAttributes(facts, dim3(1, 1, 1), /*always_cluster=*/false, attrs);
  if (cudaError_t err = cudaLaunchKernelEx(&launch, QuantizeRowsKernel<Tag>, x, k,
                                           static_cast<uint8_t*>(x_q), x_scale);
      err != cudaSuccess) {
    return std::string("quantize_rows launch failed: ") + cudaGetErrorString(err);
  }
  return {};
}

}  // namespace jax_swiglu
