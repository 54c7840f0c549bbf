// The 16-bit element types as raw words, for the kernels that read them without CUTLASS (the
// gemv forms and the token quantizer): the two values of a 32-bit word as floats, and a float
// rounded back once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "../launch.h"

namespace jax_swiglu {

template <class Tag>
struct Element16;
template <>
struct Element16<BF16> {
  using type = __nv_bfloat16;
  // Low half first.
  static __device__ __forceinline__ float2 Unpack(uint32_t word) {
    return make_float2(__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u));
  }
  static __device__ __forceinline__ __nv_bfloat16 Round(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct Element16<F16> {
  using type = __half;
  static __device__ __forceinline__ float2 Unpack(uint32_t word) {
    __half2 h;
    *reinterpret_cast<uint32_t*>(&h) = word;
    return __half22float2(h);
  }
  static __device__ __forceinline__ __half Round(float v) { return __float2half_rn(v); }
};

}  // namespace jax_swiglu
