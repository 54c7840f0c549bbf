// The interleaved fused SwiGLU kernel: one GEMM over the packed gate/up matrix.
//
// One CUTLASS SM90 TMA warp-specialized GEMM assembled from parts: the CollectiveBuilder's
// TMA + wgmma mainloop (for e4m3 operands CUTLASS's fp8 mainloop, which promotes the tensor
// cores' accumulators into fp32 ones, with its math loop replaced on a row promoting in halves,
// or on a fast-accumulation row the plain one), one of our
// SwiGLU epilogues, and a tile scheduler. A
// row of the config table (kernel_configs.h) picks the parts; one assembly serves 16-bit and
// e4m3 operands, each in two forms:
//  - tokens on the wgmma M side (the prefill form): the GEMM is [M, 2N, K], x is A and the
//    packed weights B; each tile covers tile_n packed columns = tile_n / 2 output columns,
//    and SwiGluEpilogue pairs gate and up in registers. Edge tiles' x loads stay inside x
//    (mainloop/edge_tiles.cuh), and the split-tail and banded schedulers are ours.
//  - weights on the wgmma M side (swap-AB, the decode form): the GEMM is [2N, M, K] with the
//    packed weights as A and x as B; SwapAbSwiGluEpilogue pairs gate and up through shared
//    memory.
// A grouped row (scheduler Grouped) runs the prefill form over every expert of a
// mixture-of-experts call in one persistent grid: x's rows sorted by expert, E packed weight
// matrices, the group sizes read on the device (schedulers/expert_groups.cuh).
// x is K-contiguous ([M, K]). The 16-bit packed weights are packed-column-contiguous
// ([K, 2N]); the e4m3 ones K-contiguous ([2N, K]), as SM90's fp8 wgmma reads both operands
// K-major. The fp8 epilogues multiply each accumulator by its token's and its packed
// column's scale before the activation (epilogue/scales.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/float8.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.hpp>

#include <string>

#include "../kernel_configs.h"
#include "../launch.h"
#include "epilogue/direct_store.cuh"
#include "epilogue/pairs.cuh"
#include "epilogue/scales.cuh"
#include "epilogue/swap_ab_epilogue.cuh"
#include "epilogue/swiglu_epilogue.cuh"
#include "epilogue/tma_store.cuh"
#include "launch_gemm.cuh"
#include "mainloop/edge_tiles.cuh"
#include "mainloop/promotion_in_halves.cuh"
#include "schedulers/expert_groups.cuh"
#include "schedulers/m_bands.cuh"
#include "schedulers/split_tail.cuh"

namespace jax_swiglu {

// CUTLASS's kernel schedule for a row's schedule and accumulation: the fast-accumulation
// schedules select the plain TMA + wgmma mainloop for e4m3 operands (no promotion, no second
// set of accumulators) instead of CUTLASS's fp8 one.
template <Schedule S, Accumulation A>
struct KernelScheduleFor;
template <>
struct KernelScheduleFor<Schedule::Cooperative, Accumulation::Promoted> {
  using type = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
};
template <>
struct KernelScheduleFor<Schedule::Pingpong, Accumulation::Promoted> {
  using type = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
};
// (Promotion in halves replaces the promoted mainloop's math: InterleavedAssembly.)
template <Schedule S>
struct KernelScheduleFor<S, Accumulation::PromotedInHalves>
    : KernelScheduleFor<S, Accumulation::Promoted> {};
template <>
struct KernelScheduleFor<Schedule::Cooperative, Accumulation::Fast> {
  using type = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum;
};
template <>
struct KernelScheduleFor<Schedule::Pingpong, Accumulation::Fast> {
  using type = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum;
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
template <>
struct TileSchedulerFor<TileScheduler::Grouped, 1> {
  using type = ExpertGroupsPersistentScheduler<false>;
};
// (The swap-AB grouped rows' scheduler is chosen in the assembly, which knows the m side.)

// The output path of a tokens-on-M row: `kStore`'s part (epilogue/*_store.cuh).
template <OutputStore kStore, class ElementD, int kTileM, int kTilePacked, class Pairs,
          bool kHalfUnits, class Rows>
using StoreFor =
    cute::conditional_t<kStore == OutputStore::DirectStore,
                        DirectStore<ElementD, kTileM, kTilePacked, Pairs, kHalfUnits, Rows>,
                        TmaStore<ElementD, kTileM, kTilePacked, Pairs>>;

// The CollectiveBuilder's TMA + wgmma mainloop on `TileShape`, A and B of `Element` in these
// layouts, fp32 accumulators (for fp8 elements and promoted accumulation CUTLASS's fp8
// mainloop, which promotes them), on clusters of kClusterM x kClusterN CTAs, leaving
// kCarveoutBytes of shared memory free (the epilogue's).
template <class Element, class TileShape, class LayoutA, class LayoutB, int kClusterM,
          int kClusterN, Schedule kSchedule, Accumulation kAccumulation, int kCarveoutBytes>
using CollectiveMainloopFor = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA,
    16 / sizeof(Element), Element, LayoutB, 16 / sizeof(Element), float, TileShape,
    cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>,
    cutlass::gemm::collective::StageCountAutoCarveout<kCarveoutBytes>,
    typename KernelScheduleFor<kSchedule, kAccumulation>::type>::CollectiveOp;

// The swap-AB epilogue's chunk of tokens (swap_ab_epilogue.cuh): 32 (half the barriers of 16)
// unless 16 leave the mainloop a stage more, by the stage count CUTLASS's builder fits beside
// each one's shared memory (`BuildersBeside<carveout bytes>`).
template <bool kSwapAb, template <int> class SwapAbEpilogue, template <int> class BuildersBeside>
constexpr int SwapAbChunkTokens() {
  if constexpr (kSwapAb) {
    constexpr int wide = BuildersBeside<SwapAbEpilogue<32>::kSharedBytes>::DispatchPolicy::Stages;
    constexpr int narrow =
        BuildersBeside<SwapAbEpilogue<16>::kSharedBytes>::DispatchPolicy::Stages;
    return narrow > wide ? 16 : 32;
  } else {
    return 32;  // no swap-AB epilogue
  }
}

// CUTLASS's mma_promotion_interval for a problem's fp8_promotion: fast accumulation is an
// interval no k loop reaches (a multiple of any k tile's wgmma count, as CUTLASS checks), so
// the only promotion is the one after the last k tile.
constexpr uint32_t PromotionInterval(int fp8_promotion) {
  return fp8_promotion == kFastAccumulation ? 0xFFFFFFF0u : static_cast<uint32_t>(fp8_promotion);
}

// Row `ConfigId` of the interleaved family, with output `ElementTag` (and operands of that
// type, or e4m3) and the gate's activation.
template <int ConfigId, class ElementTag, Activation kActivation>
struct InterleavedAssembly {
  static constexpr KernelConfig kConfig = kConfigs[ConfigId];
  static_assert(kConfig.family == Family::Interleaved, "a row of the interleaved kernel");
  static constexpr bool kFp8 = kConfig.operands == Operands::Fp8E4m3;
  // The fast-accumulation mainloop takes no promotion interval (it never promotes).
  static constexpr bool kFastAccumulation = kConfig.accumulation == Accumulation::Fast;
  static constexpr bool kSwapAb = kConfig.m_side == MmaMSide::Weights;
  using ElementD = typename CutlassElement<ElementTag>::type;
  using Element = cute::conditional_t<kFp8, cutlass::float_e4m3_t, ElementD>;

  // CUTLASS's (M, N, K) tile: swap-AB puts the packed columns on M.
  using TileShape =
      cute::conditional_t<kSwapAb,
                          cute::Shape<cute::Int<kConfig.tile_n>, cute::Int<kConfig.tile_m>,
                                      cute::Int<kConfig.tile_k>>,
                          cute::Shape<cute::Int<kConfig.tile_m>, cute::Int<kConfig.tile_n>,
                                      cute::Int<kConfig.tile_k>>>;
  // CUTLASS's layouts of A (M x K) and B (N x K): RowMajor A and ColumnMajor B are
  // K-contiguous. x always is; the 16-bit weights are packed-column-contiguous.
  using XLayoutAsA = cutlass::layout::RowMajor;
  using XLayoutAsB = cutlass::layout::ColumnMajor;
  using WeightsLayoutAsB =
      cute::conditional_t<kFp8, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using WeightsLayoutAsA =
      cute::conditional_t<kFp8, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
  using LayoutA = cute::conditional_t<kSwapAb, WeightsLayoutAsA, XLayoutAsA>;
  using LayoutB = cute::conditional_t<kSwapAb, XLayoutAsB, WeightsLayoutAsB>;

  // A split last round (split_tail.cuh): half tiles, whose rows only the direct store skips.
  static constexpr bool kSplitTail = kConfig.scheduler == TileScheduler::SplitTail;
  // Grouped tiles: an expert's rows of a tile (expert_groups.cuh).
  static constexpr bool kGrouped = kConfig.scheduler == TileScheduler::Grouped;
  // The sigmoid's reciprocal: alternating Newton and MUFU for the cooperative schedule,
  // MUFU's for pingpong (activations.cuh, Sigmoid).
  using Pairs = InterleavedPairs<kConfig.schedule == Schedule::Cooperative, kActivation>;
  using Store = StoreFor<kConfig.store, ElementD, kConfig.tile_m, kConfig.tile_n, Pairs,
                         kSplitTail, cute::conditional_t<kGrouped, ExpertTileRows, DenseTileRows>>;
  using Scales = cute::conditional_t<
      kFp8, TokenAndColumnScales<kConfig.tile_m, kConfig.tile_n, Store::kShiftedRows>, NoScales>;
  // CUTLASS's cluster is (M, N) of its tile: swap-AB's packed columns first.
  static constexpr int kClusterM = kSwapAb ? kConfig.cluster_n : kConfig.cluster_m;
  static constexpr int kClusterN = kSwapAb ? kConfig.cluster_m : kConfig.cluster_n;
  template <int kCarveoutBytes>
  using BuildersBeside =
      CollectiveMainloopFor<Element, TileShape, LayoutA, LayoutB, kClusterM, kClusterN,
                            kConfig.schedule, kConfig.accumulation, kCarveoutBytes>;
  template <int kChunkTokens>
  using SwapAbEpilogue =
      SwapAbSwiGluEpilogue<ElementD, TileShape, kActivation, kFp8,
                           cute::conditional_t<kGrouped, ExpertTileRows, DenseTileRows>,
                           kChunkTokens>;
  using Epilogue = cute::conditional_t<
      kSwapAb, SwapAbEpilogue<SwapAbChunkTokens<kSwapAb, SwapAbEpilogue, BuildersBeside>()>,
      SwiGluEpilogue<ElementD, TileShape, Pairs, Store, Scales>>;
  using Builders = BuildersBeside<Epilogue::kSharedBytes>;
  // CUTLASS's loads, with the math loop of promotion in halves where the row asks for it.
  using Built = cute::conditional_t<kConfig.accumulation == Accumulation::PromotedInHalves,
                                    PromotionInHalvesMainloop<Builders>, Builders>;
  // Edge tiles' x loads are kept inside x (edge_tiles.cuh): tokens on M with the direct store,
  // and every dense swap-AB row (its epilogue stores from DenseTileRows).
  static constexpr bool kShiftedRows = kSwapAb ? !kGrouped : Store::kShiftedRows;
  using EdgeMainloop = cute::conditional_t<
      kGrouped, ExpertGroupsMainloop<Built, kSwapAb>,
      cute::conditional_t<kShiftedRows, EdgeTileMainloop<Built, kSwapAb>, Built>>;
  using Mainloop = cute::conditional_t<kSplitTail, SplitTailMainloop<EdgeMainloop>, EdgeMainloop>;
  using Scheduler = cute::conditional_t<
      kGrouped, ExpertGroupsPersistentScheduler<kSwapAb>,
      typename TileSchedulerFor<kConfig.scheduler, kConfig.m_bands>::type>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, Scheduler>;

  static typename Kernel::Arguments Arguments(const SwigluProblem& p, const DeviceFacts& facts) {
    // Strides in CuTe's (rows, contraction, batch) order: A is (M, K, L), B is (N, K, L).
    const auto x_stride = cute::make_stride(p.k, cute::_1{}, int64_t(0));
    // (A grouped call's experts are the weights' batches, one [K, 2 N_pad] matrix each.)
    auto weights_stride = [&] {
      if constexpr (kFp8) {
        return cute::make_stride(p.k, cute::_1{}, int64_t(0));
      } else {
        return cute::make_stride(cute::_1{}, 2 * p.n_packed, kGrouped ? p.k * 2 * p.n_packed : 0);
      }
    }();
    const auto* x = static_cast<Element const*>(p.x);
    const auto* weights = static_cast<Element const*>(p.packed);
    const int packed = static_cast<int>(2 * p.n_packed), m = static_cast<int>(p.m),
              k = static_cast<int>(p.k);
    typename Kernel::ProblemShape shape =
        kSwapAb ? typename Kernel::ProblemShape{packed, m, k, 1}
                : typename Kernel::ProblemShape{m, packed, k, 1};
    typename Kernel::StrideA stride_a;
    typename Kernel::StrideB stride_b;
    Element const* a;
    Element const* b;
    if constexpr (kSwapAb) {
      a = weights, stride_a = weights_stride, b = x, stride_b = x_stride;
    } else {
      a = x, stride_a = x_stride, b = weights, stride_b = weights_stride;
    }
    if constexpr (kFp8 && !kFastAccumulation) {
      return GemmArguments<Kernel>(
          shape, {a, stride_a, b, stride_b, PromotionInterval(p.fp8_promotion)}, p, facts);
    } else if constexpr (kGrouped) {
      typename Kernel::MainloopArguments mainloop{};
      static_cast<typename Built::Arguments&>(mainloop) = {a, stride_a, b, stride_b};
      mainloop.experts = static_cast<int>(p.experts);
      auto args = GemmArguments<Kernel>(shape, mainloop, p, facts);
      args.scheduler.group_sizes = p.group_sizes;
      args.scheduler.experts = static_cast<int>(p.experts);
      args.scheduler.l2_bytes = facts.l2_bytes;
      args.scheduler.band = facts.grouped_band;
      return args;
    } else {
      return GemmArguments<Kernel>(shape, {a, stride_a, b, stride_b}, p, facts);
    }
  }
};

template <int ConfigId, class ElementTag, Activation kActivation>
std::string LaunchInterleaved(const SwigluProblem& p, const DeviceFacts& facts,
                              cudaStream_t stream) {
  using Assembly = InterleavedAssembly<ConfigId, ElementTag, kActivation>;
  // (The shapes and launch attributes: CannotRun, before this.)
  if (Assembly::kFp8 && (p.x_scale == nullptr || p.w_scale == nullptr)) {
    return "the fp8 kernel was called without scales";
  }
  return LaunchGemm<typename Assembly::Kernel>(Assembly::Arguments(p, facts), p, facts,
                                               dim3(Assembly::kClusterM, Assembly::kClusterN, 1),
                                               stream, Assembly::kFp8 ? "fp8 interleaved"
                                                                      : "interleaved");
}

template <int ConfigId, class ElementTag, Activation kActivation>
size_t InterleavedWorkspaceBytes(const SwigluProblem& p, const DeviceFacts& facts) {
  using Assembly = InterleavedAssembly<ConfigId, ElementTag, kActivation>;
  return Assembly::Kernel::get_workspace_size(Assembly::Arguments(p, facts));
}

}  // namespace jax_swiglu
