// A plain CUTLASS GEMM, D[M, 2N] = X[M, K] @ W[K, 2N] in bf16 with fp32 accumulation,
// assembled exactly as the interleaved kernel is (same CollectiveBuilder mainloop, tile,
// cluster and persistent scheduler) but with CUTLASS's own TMA epilogue writing the whole
// [M, 2N] product. It answers one question for target 2 of issue 4: how much of the fused
// kernel's gap to cuBLAS's bare GEMM is CUTLASS's mainloop, and how much is our epilogue.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include <string>

#include "kernels/interleaved_kernel.cuh"  // KernelScheduleFor, LaunchGemm

namespace gemm_probe {

template <jax_swiglu::Schedule S>
struct EpilogueScheduleFor;
template <>
struct EpilogueScheduleFor<jax_swiglu::Schedule::Cooperative> {
  using type = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
template <>
struct EpilogueScheduleFor<jax_swiglu::Schedule::Pingpong> {
  using type = cutlass::epilogue::TmaWarpSpecialized;
};

// The plain GEMM with the tiles of interleaved config `ConfigId`.
template <int ConfigId>
struct PlainGemm {
  static constexpr jax_swiglu::KernelConfig kConfig = jax_swiglu::kInterleavedConfigs[ConfigId];
  using Element = cutlass::bfloat16_t;
  using TileShape = cute::Shape<cute::Int<kConfig.tile_m>, cute::Int<kConfig.tile_n>,
                                cute::Int<kConfig.tile_k>>;
  using ClusterShape =
      cute::Shape<cute::Int<kConfig.cluster_m>, cute::Int<kConfig.cluster_n>, cute::_1>;
  static constexpr int kAlignment = 8;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, cutlass::layout::RowMajor, kAlignment,  // no source tensor
      Element, cutlass::layout::RowMajor, kAlignment,
      typename EpilogueScheduleFor<kConfig.schedule>::type>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, cutlass::layout::RowMajor, kAlignment,
      Element, cutlass::layout::RowMajor, kAlignment,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      typename jax_swiglu::KernelScheduleFor<kConfig.schedule>::type>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, cutlass::gemm::PersistentScheduler>;
};

// Launches the plain GEMM on the problem's x [m, k] and packed [k, 2 n_packed], writing
// [m, 2 n_packed] to `out` (the caller's buffer of that size).
template <int ConfigId>
std::string LaunchPlain(const jax_swiglu::SwigluProblem& p, const jax_swiglu::DeviceFacts& facts,
                        cudaStream_t stream) {
  using G = PlainGemm<ConfigId>;
  using Kernel = typename G::Kernel;
  using Element = typename G::Element;
  const int m = static_cast<int>(p.m), n2 = static_cast<int>(2 * p.n_packed),
            k = static_cast<int>(p.k);
  // CuTe's (rows, contraction, batch) order: A is (M, K, L), B is (N, K, L), D is (M, N, L).
  typename Kernel::StrideA stride_a = cute::make_stride(int64_t(k), cute::_1{}, int64_t(0));
  typename Kernel::StrideB stride_b = cute::make_stride(cute::_1{}, int64_t(n2), int64_t(0));
  typename Kernel::StrideD stride_d = cute::make_stride(int64_t(n2), cute::_1{}, int64_t(0));
  typename Kernel::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {m, n2, k, 1},
      {static_cast<Element const*>(p.x), stride_a, static_cast<Element const*>(p.packed),
       stride_b},
      {{}, nullptr, stride_d, static_cast<Element*>(p.out), stride_d},
      cutlass::KernelHardwareInfo{facts.device, facts.sm_count},
      {}};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  return jax_swiglu::LaunchGemm<Kernel>(
      args, p, facts, dim3(G::kConfig.cluster_m, G::kConfig.cluster_n, 1), stream, "plain");
}

}  // namespace gemm_probe
