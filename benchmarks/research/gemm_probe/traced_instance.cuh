// The definition of LaunchTraced, included by one generated translation unit per
// (config, variant) (trace.sh writes them), like the kernels' own instance.cu.in.
#pragma once

#include <utility>

#include "traced_kernel.cuh"

namespace gemm_probe {

template <int ConfigId, TraceVariant kVariant>
std::string LaunchTraced(const jax_swiglu::SwigluProblem& p, const jax_swiglu::DeviceFacts& facts,
                         unsigned long long* trace, unsigned long long* steps,
                         cudaStream_t stream) {
  for (auto [symbol, buffer] : {std::pair{&g_trace, trace}, std::pair{&g_steps, steps}}) {
    if (cudaError_t err = cudaMemcpyToSymbolAsync(*symbol, &buffer, sizeof(buffer), 0,
                                                  cudaMemcpyHostToDevice, stream);
        err != cudaSuccess) {
      return std::string("setting a trace buffer failed: ") + cudaGetErrorString(err);
    }
  }
  using Traced = TracedInterleaved<ConfigId, kVariant>;
  using Kernel = typename Traced::Kernel;
  using Element = typename Traced::Element;
  constexpr jax_swiglu::KernelConfig config = Traced::kConfig;
  // As the product's InterleavedAssembly (tokens on M): A = x [M, K], B = packed [K, 2N].
  typename Kernel::StrideA stride_a = cute::make_stride(p.k, cute::_1{}, int64_t(0));
  typename Kernel::StrideB stride_b = cute::make_stride(cute::_1{}, 2 * p.n_packed, int64_t(0));
  auto args = jax_swiglu::GemmArguments<Kernel>(
      {static_cast<int>(p.m), static_cast<int>(2 * p.n_packed), static_cast<int>(p.k), 1},
      {static_cast<Element const*>(p.x), stride_a, static_cast<Element const*>(p.packed),
       stride_b},
      p, facts);
  return jax_swiglu::LaunchGemm<Kernel>(args, p, facts,
                                        dim3(config.cluster_m, config.cluster_n, 1), stream,
                                        "traced interleaved");
}

}  // namespace gemm_probe
