// The interleaved fused SwiGLU kernel (Kernel-2 of the design).
//
// One CUTLASS SM90 TMA warp-specialized GEMM over [M, 2N, K] on the packed gate/up
// matrix, assembled from parts: the CollectiveBuilder's TMA + wgmma mainloop (its edge
// tiles' loads kept inside x: edge_tiles.cuh), our SwiGluEpilogue (swiglu_epilogue.cuh)
// and the persistent tile scheduler. Each CTA tile
// covers tile_n packed columns = tile_n / 2 output columns, so the grid has twice the
// tiles of an [M, N] grid with the same output tile.
#pragma once

#include <cuda_runtime_api.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.hpp>

#include <string>

#include "../kernel_configs.h"
#include "../launch.h"
#include "edge_tiles.cuh"
#include "launch_gemm.cuh"
#include "m_bands.cuh"
#include "split_tail.cuh"
#include "swiglu_epilogue.cuh"

namespace jax_swiglu {

template <Schedule S>
struct KernelScheduleFor;
template <>
struct KernelScheduleFor<Schedule::Cooperative> {
  using type = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
};
template <>
struct KernelScheduleFor<Schedule::Pingpong> {
  using type = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
};

template <TileScheduler T, int kMBands>
struct TileSchedulerFor;
template <>
struct TileSchedulerFor<TileScheduler::Persistent, 1> {
  using type = cutlass::gemm::PersistentScheduler;
};
template <int kMBands>
struct TileSchedulerFor<TileScheduler::Persistent, kMBands> {
  using type = MBandsPersistentScheduler<kMBands>;
};
template <>
struct TileSchedulerFor<TileScheduler::StreamK, 1> {
  using type = cutlass::gemm::StreamKScheduler;
};
template <>
struct TileSchedulerFor<TileScheduler::SplitTail, 1> {
  using type = SplitTailPersistentScheduler;
};

// kStore: the config's own output path unless a probe asks for the other one
// (benchmarks/gemm_probe/traced_kernel.cuh).
template <int ConfigId, class ElementTag,
          OutputStore kStore = kInterleavedConfigs[ConfigId].store>
struct InterleavedKernel {
  static constexpr KernelConfig kConfig = kInterleavedConfigs[ConfigId];
  using Element = typename CutlassElement<ElementTag>::type;
  using TileShape = cute::Shape<cute::Int<kConfig.tile_m>, cute::Int<kConfig.tile_n>,
                                cute::Int<kConfig.tile_k>>;
  using ClusterShape =
      cute::Shape<cute::Int<kConfig.cluster_m>, cute::Int<kConfig.cluster_n>, cute::_1>;

  // A split last round (split_tail.cuh): half tiles, whose rows only the direct store skips.
  static constexpr bool kSplitTail = kConfig.scheduler == TileScheduler::SplitTail;

  // SiLU's reciprocal: alternating Newton and MUFU for the cooperative schedule, MUFU's
  // for pingpong (swiglu_epilogue.cuh, Silu).
  using Epilogue =
      SwiGluEpilogue<Element, TileShape,
                     InterleavedPairs<kConfig.schedule == Schedule::Cooperative>, kStore,
                     kSplitTail>;

  // A = x [M, K] (K contiguous), B = packed [K, 2N] (packed N contiguous), fp32 accumulate;
  // with the direct store, edge tiles' x loads kept inside x (edge_tiles.cuh).
  static constexpr int kAlignment = 16 / sizeof(Element);
  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, cutlass::layout::RowMajor, kAlignment,
      Element, cutlass::layout::RowMajor, kAlignment,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<Epilogue::kSharedBytes>,
      typename KernelScheduleFor<kConfig.schedule>::type>::CollectiveOp;
  using EdgeMainloop = cute::conditional_t<Epilogue::kShiftedRows,
                                          EdgeTileMainloop<BuiltMainloop>, BuiltMainloop>;
  static_assert(!kSplitTail || (kConfig.schedule == Schedule::Pingpong && Epilogue::kDirect),
                "a split tail needs the pingpong schedule and the direct store");
  using Mainloop = cute::conditional_t<kSplitTail, SplitTailMainloop<EdgeMainloop>, EdgeMainloop>;

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue,
                                           typename TileSchedulerFor<kConfig.scheduler,
                                                                     kConfig.m_bands>::type>;
};

template <int ConfigId, class ElementTag>
typename InterleavedKernel<ConfigId, ElementTag>::Kernel::Arguments InterleavedArguments(
    const SwigluProblem& p, const DeviceFacts& facts) {
  using Assembly = InterleavedKernel<ConfigId, ElementTag>;
  using Kernel = typename Assembly::Kernel;
  using Element = typename Assembly::Element;
  // Strides in CuTe's (rows, contraction, batch) order: A is (M, K, L), B is (N, K, L).
  typename Kernel::StrideA stride_a = cute::make_stride(p.k, cute::_1{}, int64_t(0));
  typename Kernel::StrideB stride_b = cute::make_stride(cute::_1{}, 2 * p.n_packed, int64_t(0));
  return GemmArguments<Kernel>({static_cast<Element const*>(p.x), stride_a,
                                static_cast<Element const*>(p.packed), stride_b},
                               p, facts);
}

template <int ConfigId, class ElementTag>
std::string LaunchInterleaved(const SwigluProblem& p, const DeviceFacts& facts,
                              cudaStream_t stream) {
  using Assembly = InterleavedKernel<ConfigId, ElementTag>;
  constexpr KernelConfig config = Assembly::kConfig;
  if (Assembly::kSplitTail && p.swizzle > 1) {
    // The mainloop plans the split on tiles padded to whole clusters, not to swizzle groups.
    return "interleaved config " + std::to_string(ConfigId) +
           " splits its last round and takes no swizzle (got " + std::to_string(p.swizzle) + ")";
  }
  if (config.m_bands > 1 && p.m % (config.m_bands * config.tile_m * config.cluster_m) != 0) {
    // The bands are whole clusters of tiles (m_bands.cuh).
    return "interleaved config " + std::to_string(ConfigId) + " runs M in " +
           std::to_string(config.m_bands) + " bands and needs M to be a multiple of " +
           std::to_string(config.m_bands * config.tile_m * config.cluster_m) + " (got " +
           std::to_string(p.m) + ")";
  }
  return LaunchGemm<typename Assembly::Kernel>(InterleavedArguments<ConfigId, ElementTag>(p, facts),
                                               p, facts, dim3(config.cluster_m, config.cluster_n, 1),
                                               stream, "interleaved");
}

template <int ConfigId, class ElementTag>
size_t InterleavedWorkspaceBytes(const SwigluProblem& p, const DeviceFacts& facts) {
  using Kernel = typename InterleavedKernel<ConfigId, ElementTag>::Kernel;
  return Kernel::get_workspace_size(InterleavedArguments<ConfigId, ElementTag>(p, facts));
}

}  // namespace jax_swiglu
