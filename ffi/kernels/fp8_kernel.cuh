// The interleaved fused SwiGLU kernel on fp8 (e4m3) operands.
//
// The same assembly as interleaved_kernel.cuh, with CUTLASS's fp8 mainloop (fp32
// accumulators promoted out of the tensor cores every k tile) and both operands K-major, as
// SM90's fp8 wgmma reads them: x_q [M, K] and the packed weights stored as [2 N_pad, K]
// (jax_swiglu/_quantize.py). The epilogues are the bf16 kernel's in their scaled form: each
// fp32 accumulator is multiplied by its token's and its packed column's scale before the
// pairing and the activation, and the output is rounded once to bfloat16 or float16. Two
// forms, as there:
//  - tokens on the wgmma M side (prefill): GEMM [M, 2N, K], A = x_q, B = the packed rows;
//  - weights on the wgmma M side (swap-AB, decode): GEMM [2N, M, K], A = the packed rows,
//    B = x_q.
// The table's gemv rows (MmaSync) launch the gemv kernel's fp8 form instead (gemv_kernel.cuh).
#pragma once

#include <cutlass/float8.h>

#include "gemv_kernel.cuh"
#include "interleaved_kernel.cuh"

namespace jax_swiglu {

using Fp8Element = cutlass::float_e4m3_t;

template <int ConfigId, class OutputTag, Activation kActivation>
struct Fp8TokensOnMAssembly {
  static constexpr KernelConfig kConfig = kFp8Configs[ConfigId];
  using ElementD = typename CutlassElement<OutputTag>::type;
  using TileShape = cute::Shape<cute::Int<kConfig.tile_m>, cute::Int<kConfig.tile_n>,
                                cute::Int<kConfig.tile_k>>;
  using Epilogue = SwiGluEpilogue<
      ElementD, TileShape,
      InterleavedPairs<kConfig.schedule == Schedule::Cooperative, kActivation>, kConfig.store,
      /*kHalfUnits=*/false, /*kScaled=*/true>;
  using Built = CollectiveMainloopFor<Fp8Element, TileShape, cutlass::layout::RowMajor,
                                      cutlass::layout::ColumnMajor, kConfig.cluster_m,
                                      kConfig.cluster_n, kConfig.schedule, Epilogue::kSharedBytes>;
  using Mainloop = cute::conditional_t<Epilogue::kShiftedRows, EdgeTileMainloop<Built>, Built>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<
      cute::Shape<int, int, int, int>, Mainloop, Epilogue,
      typename TileSchedulerFor<kConfig.scheduler, 1>::type>;

  static typename Kernel::Arguments Arguments(const SwigluProblem& p, const DeviceFacts& facts) {
    // (rows, contraction, batch): both K-contiguous.
    typename Kernel::StrideA stride_a = cute::make_stride(p.k, cute::_1{}, int64_t(0));
    typename Kernel::StrideB stride_b = cute::make_stride(p.k, cute::_1{}, int64_t(0));
    return GemmArguments<Kernel>(
        {static_cast<int>(p.m), static_cast<int>(2 * p.n_packed), static_cast<int>(p.k), 1},
        {static_cast<Fp8Element const*>(p.x), stride_a,
         static_cast<Fp8Element const*>(p.packed), stride_b,
         static_cast<uint32_t>(p.fp8_promotion)},
        p, facts);
  }
};

template <int ConfigId, class OutputTag, Activation kActivation>
struct Fp8WeightsOnMAssembly {
  static constexpr KernelConfig kConfig = kFp8Configs[ConfigId];
  using ElementD = typename CutlassElement<OutputTag>::type;
  using TileShape = cute::Shape<cute::Int<kConfig.tile_n>, cute::Int<kConfig.tile_m>,
                                cute::Int<kConfig.tile_k>>;
  using Epilogue = SwapAbSwiGluEpilogue<ElementD, TileShape, kActivation, /*kScaled=*/true>;
  using Mainloop = CollectiveMainloopFor<Fp8Element, TileShape, cutlass::layout::RowMajor,
                                         cutlass::layout::ColumnMajor, 1, 1, kConfig.schedule,
                                         Epilogue::kSharedBytes>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<
      cute::Shape<int, int, int, int>, Mainloop, Epilogue,
      typename TileSchedulerFor<kConfig.scheduler, 1>::type>;

  static typename Kernel::Arguments Arguments(const SwigluProblem& p, const DeviceFacts& facts) {
    typename Kernel::StrideA stride_a = cute::make_stride(p.k, cute::_1{}, int64_t(0));
    typename Kernel::StrideB stride_b = cute::make_stride(p.k, cute::_1{}, int64_t(0));
    return GemmArguments<Kernel>(
        {static_cast<int>(2 * p.n_packed), static_cast<int>(p.m), static_cast<int>(p.k), 1},
        {static_cast<Fp8Element const*>(p.packed), stride_a,
         static_cast<Fp8Element const*>(p.x), stride_b, static_cast<uint32_t>(p.fp8_promotion)},
        p, facts);
  }
};

template <int ConfigId, class OutputTag, Activation kActivation>
using Fp8Kernel = cute::conditional_t<kFp8Configs[ConfigId].m_side == MmaMSide::Weights,
                                      Fp8WeightsOnMAssembly<ConfigId, OutputTag, kActivation>,
                                      Fp8TokensOnMAssembly<ConfigId, OutputTag, kActivation>>;

// The wgmma rows (tokens on M, or swap-AB).
template <int ConfigId, class OutputTag, Activation kActivation>
std::string LaunchFp8Gemm(const SwigluProblem& p, const DeviceFacts& facts,
                          cudaStream_t stream) {
  using Assembly = Fp8Kernel<ConfigId, OutputTag, kActivation>;
  constexpr KernelConfig config = kFp8Configs[ConfigId];
  if (p.splits > 1 && config.scheduler != TileScheduler::StreamK) {
    return "fp8 config " + std::to_string(ConfigId) + " has no split-K (got splits=" +
           std::to_string(p.splits) + ")";
  }
  // CUTLASS promotes after whole k tiles: an interval of their wgmma (32 of K each).
  constexpr int kWgmmaPerTile = config.tile_k / 32;
  if (p.fp8_promotion % kWgmmaPerTile != 0) {
    return "fp8 config " + std::to_string(ConfigId) + " promotes after whole k tiles of " +
           std::to_string(kWgmmaPerTile) + " wgmma (got promotion=" +
           std::to_string(p.fp8_promotion) + ")";
  }
  return LaunchGemm<typename Assembly::Kernel>(Assembly::Arguments(p, facts), p, facts,
                                               dim3(config.cluster_m, config.cluster_n, 1),
                                               stream, "fp8 interleaved");
}

template <int ConfigId, class OutputTag, Activation kActivation>
std::string LaunchFp8(const SwigluProblem& p, const DeviceFacts& facts, cudaStream_t stream) {
  constexpr KernelConfig config = kFp8Configs[ConfigId];
  if (p.x_scale == nullptr || p.w_scale == nullptr) return "fp8 kernel called without scales";
  if constexpr (IsGemvSchedule(config.schedule)) {
    return LaunchFp8Gemv<ConfigId, OutputTag, kActivation>(p, facts, stream);
  } else {
    return LaunchFp8Gemm<ConfigId, OutputTag, kActivation>(p, facts, stream);
  }
}

template <int ConfigId, class OutputTag, Activation kActivation>
size_t Fp8WorkspaceBytes(const SwigluProblem& p, const DeviceFacts& facts) {
  if constexpr (IsGemvSchedule(kFp8Configs[ConfigId].schedule)) {
    return 0;  // the gemv form needs none
  } else {
    using Assembly = Fp8Kernel<ConfigId, OutputTag, kActivation>;
    return Assembly::Kernel::get_workspace_size(Assembly::Arguments(p, facts));
  }
}

}  // namespace jax_swiglu
