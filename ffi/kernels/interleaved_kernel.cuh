// The interleaved fused SwiGLU kernel: one GEMM over the packed gate/up matrix.
//
// One CUTLASS SM90 TMA warp-specialized GEMM assembled from parts: the CollectiveBuilder's
// TMA + wgmma mainloop, one of our SwiGLU epilogues, and a tile scheduler. A config row
// (kernel_configs.h) picks the parts. Two forms:
//  - tokens on the wgmma M side (the prefill form): the GEMM is [M, 2N, K], x is A and the
//    packed weights B; each tile covers tile_n packed columns = tile_n / 2 output columns,
//    and SwiGluEpilogue pairs gate and up in registers. Edge tiles' x loads stay inside x
//    (edge_tiles.cuh), and the split-tail and banded schedulers are ours.
//  - weights on the wgmma M side (swap-AB, the decode form): the GEMM is [2N, M, K] with the
//    packed weights as A (their packed columns contiguous, an MN-major operand) and x as B;
//    SwapAbSwiGluEpilogue pairs gate and up through shared memory.
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
#include "swap_ab_epilogue.cuh"
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

// The CollectiveBuilder's TMA + wgmma mainloop on `TileShape`, A and B of `Element` in these
// layouts, fp32 accumulators (for fp8 elements CUTLASS's fp8 mainloop, which promotes them),
// on clusters of kClusterM x kClusterN CTAs, leaving kCarveoutBytes of shared memory free
// (the epilogue's).
template <class Element, class TileShape, class LayoutA, class LayoutB, int kClusterM,
          int kClusterN, Schedule kSchedule, int kCarveoutBytes>
using CollectiveMainloopFor = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA,
    16 / sizeof(Element), Element, LayoutB, 16 / sizeof(Element), float, TileShape,
    cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>,
    cutlass::gemm::collective::StageCountAutoCarveout<kCarveoutBytes>,
    typename KernelScheduleFor<kSchedule>::type>::CollectiveOp;

// That mainloop for interleaved config `ConfigId` beside `Epilogue`.
template <int ConfigId, class Element, class TileShape, class LayoutA, class LayoutB,
          class Epilogue>
using BuiltMainloop =
    CollectiveMainloopFor<Element, TileShape, LayoutA, LayoutB,
                          kInterleavedConfigs[ConfigId].cluster_m,
                          kInterleavedConfigs[ConfigId].cluster_n,
                          kInterleavedConfigs[ConfigId].schedule, Epilogue::kSharedBytes>;

// Tokens on the wgmma M side: A = x [M, K] (K contiguous), B = packed [K, 2N] (packed
// columns contiguous).
template <int ConfigId, class ElementTag, Activation kActivation>
struct TokensOnMAssembly {
  static constexpr KernelConfig kConfig = kInterleavedConfigs[ConfigId];
  using Element = typename CutlassElement<ElementTag>::type;
  using TileShape = cute::Shape<cute::Int<kConfig.tile_m>, cute::Int<kConfig.tile_n>,
                                cute::Int<kConfig.tile_k>>;
  // A split last round (split_tail.cuh): half tiles, whose rows only the direct store skips.
  static constexpr bool kSplitTail = kConfig.scheduler == TileScheduler::SplitTail;
  // The sigmoid's reciprocal: alternating Newton and MUFU for the cooperative schedule,
  // MUFU's for pingpong (swiglu_epilogue.cuh, Sigmoid).
  using Epilogue = SwiGluEpilogue<
      Element, TileShape,
      InterleavedPairs<kConfig.schedule == Schedule::Cooperative, kActivation>, kConfig.store,
      kSplitTail>;
  using Built = BuiltMainloop<ConfigId, Element, TileShape,
                              cutlass::layout::RowMajor, cutlass::layout::RowMajor, Epilogue>;
  // With the direct store, edge tiles' x loads are kept inside x (edge_tiles.cuh).
  using EdgeMainloop =
      cute::conditional_t<Epilogue::kShiftedRows, EdgeTileMainloop<Built>, Built>;
  static_assert(!kSplitTail || (kConfig.schedule == Schedule::Pingpong && Epilogue::kDirect),
                "a split tail needs the pingpong schedule and the direct store");
  using Mainloop = cute::conditional_t<kSplitTail, SplitTailMainloop<EdgeMainloop>, EdgeMainloop>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<
      cute::Shape<int, int, int, int>, Mainloop, Epilogue,
      typename TileSchedulerFor<kConfig.scheduler, kConfig.m_bands>::type>;

  static typename Kernel::Arguments Arguments(const SwigluProblem& p, const DeviceFacts& facts) {
    // Strides in CuTe's (rows, contraction, batch) order: A is (M, K, L), B is (N, K, L).
    typename Kernel::StrideA stride_a = cute::make_stride(p.k, cute::_1{}, int64_t(0));
    typename Kernel::StrideB stride_b = cute::make_stride(cute::_1{}, 2 * p.n_packed, int64_t(0));
    return GemmArguments<Kernel>(
        {static_cast<int>(p.m), static_cast<int>(2 * p.n_packed), static_cast<int>(p.k), 1},
        {static_cast<Element const*>(p.x), stride_a, static_cast<Element const*>(p.packed),
         stride_b},
        p, facts);
  }
};

// Weights on the wgmma M side (swap-AB): A = packed^T [2N, K] (packed columns contiguous:
// CUTLASS's column-major A), B = x as [M, K] (K contiguous: column-major B).
template <int ConfigId, class ElementTag, Activation kActivation>
struct WeightsOnMAssembly {
  static constexpr KernelConfig kConfig = kInterleavedConfigs[ConfigId];
  using Element = typename CutlassElement<ElementTag>::type;
  using TileShape = cute::Shape<cute::Int<kConfig.tile_n>, cute::Int<kConfig.tile_m>,
                                cute::Int<kConfig.tile_k>>;
  using Epilogue = SwapAbSwiGluEpilogue<Element, TileShape, kActivation>;
  using Mainloop = BuiltMainloop<ConfigId, Element, TileShape,
                                 cutlass::layout::ColumnMajor, cutlass::layout::ColumnMajor,
                                 Epilogue>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<
      cute::Shape<int, int, int, int>, Mainloop, Epilogue,
      typename TileSchedulerFor<kConfig.scheduler, kConfig.m_bands>::type>;

  static typename Kernel::Arguments Arguments(const SwigluProblem& p, const DeviceFacts& facts) {
    typename Kernel::StrideA stride_a = cute::make_stride(cute::_1{}, 2 * p.n_packed, int64_t(0));
    typename Kernel::StrideB stride_b = cute::make_stride(p.k, cute::_1{}, int64_t(0));
    return GemmArguments<Kernel>(
        {static_cast<int>(2 * p.n_packed), static_cast<int>(p.m), static_cast<int>(p.k), 1},
        {static_cast<Element const*>(p.packed), stride_a, static_cast<Element const*>(p.x),
         stride_b},
        p, facts);
  }
};

template <int ConfigId, class ElementTag, Activation kActivation>
using InterleavedKernel =
    cute::conditional_t<kInterleavedConfigs[ConfigId].m_side == MmaMSide::Weights,
                        WeightsOnMAssembly<ConfigId, ElementTag, kActivation>,
                        TokensOnMAssembly<ConfigId, ElementTag, kActivation>>;

// Why `p` cannot run on config `ConfigId`, or "" if it can.
template <int ConfigId>
std::string InterleavedLaunchError(const SwigluProblem& p) {
  constexpr KernelConfig config = kInterleavedConfigs[ConfigId];
  const std::string name = "interleaved config " + std::to_string(ConfigId);
  if (config.scheduler == TileScheduler::SplitTail && p.swizzle > 1) {
    // The mainloop plans the split on tiles padded to whole clusters, not to swizzle groups.
    return name + " splits its last round and takes no swizzle (got " +
           std::to_string(p.swizzle) + ")";
  }
  if (config.m_bands > 1 && p.m % (config.m_bands * config.tile_m * config.cluster_m) != 0) {
    // The bands are whole clusters of tiles (m_bands.cuh).
    return name + " runs M in " + std::to_string(config.m_bands) +
           " bands and needs M to be a multiple of " +
           std::to_string(config.m_bands * config.tile_m * config.cluster_m) + " (got " +
           std::to_string(p.m) + ")";
  }
  if (p.splits > 1 && config.scheduler != TileScheduler::StreamK) {
    return name + " has no split-K (got splits=" + std::to_string(p.splits) + ")";
  }
  return {};
}

template <int ConfigId, class ElementTag, Activation kActivation>
std::string LaunchInterleaved(const SwigluProblem& p, const DeviceFacts& facts,
                              cudaStream_t stream) {
  using Assembly = InterleavedKernel<ConfigId, ElementTag, kActivation>;
  constexpr KernelConfig config = kInterleavedConfigs[ConfigId];
  if (std::string err = InterleavedLaunchError<ConfigId>(p); !err.empty()) return err;
  return LaunchGemm<typename Assembly::Kernel>(Assembly::Arguments(p, facts), p, facts,
                                               dim3(config.cluster_m, config.cluster_n, 1),
                                               stream, "interleaved");
}

template <int ConfigId, class ElementTag, Activation kActivation>
size_t InterleavedWorkspaceBytes(const SwigluProblem& p, const DeviceFacts& facts) {
  using Assembly = InterleavedKernel<ConfigId, ElementTag, kActivation>;
  return Assembly::Kernel::get_workspace_size(Assembly::Arguments(p, facts));
}

}  // namespace jax_swiglu
