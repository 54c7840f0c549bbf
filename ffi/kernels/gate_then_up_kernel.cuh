// The gate-then-up fused SwiGLU kernel (the paper's Kernel-1; the public kernel="pingpong").
//
// CUTLASS's SM90 TMA warp-specialized GemmUniversal kernel (a producer warp loading with
// TMA; two consumer warpgroups, on the pingpong schedule alternating between a tile's
// mainloop and the previous tile's epilogue, on the cooperative one sharing each tile) with
// our parts: the gate-then-up mainloop (mainloop/gate_then_up_mainloop.cuh), which
// accumulates an output tile's gate pass and then its up pass, the weights multicast over a
// cluster along the tokens, and the SwiGLU epilogue pairing the two accumulators
// (SequentialPairs, which applies the activation) with the TMA store. The grid is the
// [M, N] output grid.
#pragma once

#include <cuda_runtime_api.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.hpp>

#include <algorithm>
#include <string>

#include "../kernel_configs.h"
#include "../launch.h"
#include "epilogue/pairs.cuh"
#include "epilogue/scales.cuh"
#include "epilogue/swiglu_epilogue.cuh"
#include "epilogue/tma_store.cuh"
#include "launch_gemm.cuh"
#include "mainloop/gate_then_up_mainloop.cuh"

namespace jax_swiglu {

template <int ConfigId, class ElementTag, Activation kActivation>
struct GateThenUpAssembly {
  static constexpr KernelConfig kConfig = kConfigs[ConfigId];
  static_assert(kConfig.family == Family::GateThenUp && kConfig.store == OutputStore::TmaStore &&
                    kConfig.scheduler == TileScheduler::Persistent,
                "Kernel-1 runs whole tiles and the TMA store (IsValidRow has the rest)");
  static constexpr bool kCooperative = kConfig.schedule == Schedule::Cooperative;
  using KernelSchedule =
      cute::conditional_t<kCooperative, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                          cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using Element = typename CutlassElement<ElementTag>::type;
  using TileShape = cute::Shape<cute::Int<kConfig.tile_m>, cute::Int<kConfig.tile_n>,
                                cute::Int<kConfig.tile_k>>;
  // The sigmoid's reciprocal as in the interleaved kernel: alternating Newton and MUFU for
  // the cooperative schedule, MUFU's for pingpong (activations.cuh, Sigmoid).
  using Pairs = SequentialPairs<kCooperative, kActivation>;
  using Epilogue =
      SwiGluEpilogue<Element, TileShape, Pairs,
                     TmaStore<Element, kConfig.tile_m, kConfig.tile_n, Pairs>, NoScales>;
  static_assert(!Epilogue::kShiftedRows, "GateThenUpMainloop loads every tile at its own rows");

  // As many pipeline stages as fit beside the epilogue tile (and the kernel's barriers).
  static constexpr int kSharedBytes = 227 * 1024;
  static constexpr int kStageBytes =
      (kConfig.tile_m + kConfig.tile_n / 2) * kConfig.tile_k * static_cast<int>(sizeof(Element));
  static constexpr int kStages =
      std::min(8, (kSharedBytes - Epilogue::kSharedBytes - 1024) / kStageBytes);
  static_assert(kStages >= 3, "tile too large for a useful pipeline");

  using Mainloop =
      GateThenUpMainloop<Element, TileShape, kStages, KernelSchedule, kConfig.cluster_m>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, cutlass::gemm::PersistentScheduler>;
};

template <int ConfigId, class ElementTag, Activation kActivation>
typename GateThenUpAssembly<ConfigId, ElementTag, kActivation>::Kernel::Arguments GateThenUpArguments(
    const SwigluProblem& p, const DeviceFacts& facts) {
  using Assembly = GateThenUpAssembly<ConfigId, ElementTag, kActivation>;
  using Element = typename Assembly::Element;
  // The problem's K counts both passes' k-tiles (GateThenUpMainloop).
  const int k = static_cast<int>(p.k);
  return GemmArguments<typename Assembly::Kernel>(
      {static_cast<int>(p.m), static_cast<int>(2 * p.n_packed),
       Assembly::Mainloop::BothPassesK(k), 1},
      {static_cast<Element const*>(p.x), static_cast<Element const*>(p.packed), k}, p, facts);
}

template <int ConfigId, class ElementTag, Activation kActivation>
std::string LaunchGateThenUp(const SwigluProblem& p, const DeviceFacts& facts,
                           cudaStream_t stream) {
  constexpr KernelConfig kConfig = kConfigs[ConfigId];
  return LaunchGemm<typename GateThenUpAssembly<ConfigId, ElementTag, kActivation>::Kernel>(
      GateThenUpArguments<ConfigId, ElementTag, kActivation>(p, facts), p, facts,
      dim3(kConfig.cluster_m, kConfig.cluster_n, 1), stream, "gate-then-up");
}

template <int ConfigId, class ElementTag, Activation kActivation>
size_t GateThenUpWorkspaceBytes(const SwigluProblem& p, const DeviceFacts& facts) {
  using Kernel = typename GateThenUpAssembly<ConfigId, ElementTag, kActivation>::Kernel;
  return Kernel::get_workspace_size(
      GateThenUpArguments<ConfigId, ElementTag, kActivation>(p, facts));
}

}  // namespace jax_swiglu
