// The interleaved fused SwiGLU kernel (Kernel-2 of the design).
//
// One CUTLASS SM90 TMA warp-specialized GEMM over [M, 2N, K] on the packed gate/up
// matrix, assembled from parts: the CollectiveBuilder's TMA + wgmma mainloop, our
// SwiGluEpilogue (swiglu_epilogue.cuh) and the persistent tile scheduler. Each CTA tile
// covers tile_n packed columns = tile_n / 2 output columns, so the grid has twice the
// tiles of an [M, N] grid with the same output tile.
#pragma once

#include <cuda_runtime_api.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/device_kernel.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.hpp>

#include <mutex>
#include <set>
#include <string>

#include "../kernel_configs.h"
#include "../launch.h"
#include "swiglu_epilogue.cuh"

namespace jax_swiglu {

template <class Tag>
struct CutlassElement;
template <>
struct CutlassElement<BF16> {
  using type = cutlass::bfloat16_t;
};
template <>
struct CutlassElement<F16> {
  using type = cutlass::half_t;
};

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

template <int ConfigId, class ElementTag>
struct InterleavedKernel {
  static constexpr KernelConfig kConfig = kInterleavedConfigs[ConfigId];
  using Element = typename CutlassElement<ElementTag>::type;
  using TileShape = cute::Shape<cute::Int<kConfig.tile_m>, cute::Int<kConfig.tile_n>,
                                cute::Int<kConfig.tile_k>>;
  using ClusterShape =
      cute::Shape<cute::Int<kConfig.cluster_m>, cute::Int<kConfig.cluster_n>, cute::_1>;

  using Epilogue = SwiGluEpilogue<Element, TileShape>;

  // A = x [M, K] (K contiguous), B = packed [K, 2N] (packed N contiguous), fp32 accumulate.
  static constexpr int kAlignment = 16 / sizeof(Element);
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, cutlass::layout::RowMajor, kAlignment,
      Element, cutlass::layout::RowMajor, kAlignment,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<Epilogue::kSharedBytes>,
      typename KernelScheduleFor<kConfig.schedule>::type>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, cutlass::gemm::PersistentScheduler>;
};

// Raises the kernel's dynamic shared-memory limit once per device (a function attribute
// is per device; setting it is a host call, kept out of the per-call path).
template <class Kernel>
cudaError_t EnsureSharedMemoryLimit(int device) {
  static std::mutex mutex;
  static std::set<int> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (done.count(device)) return cudaSuccess;
  cudaError_t err = cudaFuncSetAttribute(cutlass::device_kernel<Kernel>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Kernel::SharedStorageSize);
  if (err == cudaSuccess) done.insert(device);
  return err;
}

template <int ConfigId, class ElementTag>
std::string LaunchInterleaved(const SwigluProblem& p, const DeviceFacts& facts,
                              cudaStream_t stream) {
  using Assembly = InterleavedKernel<ConfigId, ElementTag>;
  using Kernel = typename Assembly::Kernel;
  using Element = typename Assembly::Element;
  using StrideA = typename Kernel::StrideA;
  using StrideB = typename Kernel::StrideB;

  const int m = static_cast<int>(p.m);
  const int packed_cols = static_cast<int>(2 * p.n_packed);
  const int k = static_cast<int>(p.k);

  // Strides in CuTe's (rows, contraction, batch) order: A is (M, K, L), B is (N, K, L).
  StrideA stride_a = cute::make_stride(int64_t(k), cute::_1{}, int64_t(0));
  StrideB stride_b = cute::make_stride(cute::_1{}, int64_t(packed_cols), int64_t(0));

  typename Kernel::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {m, packed_cols, k, 1},
      {static_cast<Element const*>(p.x), stride_a, static_cast<Element const*>(p.packed),
       stride_b},
      {static_cast<Element*>(p.out), static_cast<int>(p.n)},
      cutlass::KernelHardwareInfo{facts.device, facts.sm_count},
      {}};
  using RasterOrder = typename Kernel::TileScheduler::RasterOrderOptions;
  args.scheduler.max_swizzle_size = p.swizzle;
  args.scheduler.raster_order = p.raster == 1   ? RasterOrder::AlongM
                                : p.raster == 2 ? RasterOrder::AlongN
                                                : RasterOrder::Heuristic;

  if (!Kernel::can_implement(args)) {
    return "interleaved kernel cannot implement M=" + std::to_string(p.m) +
           " N=" + std::to_string(p.n) + " K=" + std::to_string(p.k) +
           " (K and N must be multiples of 8, buffers 16-byte aligned)";
  }
  if (Kernel::get_workspace_size(args) != 0) {
    return "interleaved kernel unexpectedly needs a workspace";
  }

  typename Kernel::Params params = Kernel::to_underlying_arguments(args, nullptr);
  if (cudaError_t err = EnsureSharedMemoryLimit<Kernel>(facts.device); err != cudaSuccess) {
    return std::string("cudaFuncSetAttribute failed: ") + cudaGetErrorString(err);
  }

  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = Assembly::kConfig.cluster_m;
  cluster.val.clusterDim.y = Assembly::kConfig.cluster_n;
  cluster.val.clusterDim.z = 1;

  cudaLaunchConfig_t launch{};
  launch.gridDim = Kernel::get_grid_shape(params);
  launch.blockDim = Kernel::get_block_shape();
  launch.dynamicSmemBytes = Kernel::SharedStorageSize;
  launch.stream = stream;
  launch.attrs = &cluster;
  launch.numAttrs = 1;

  cudaError_t err = cudaLaunchKernelEx(&launch, cutlass::device_kernel<Kernel>, params);
  if (err != cudaSuccess) {
    return std::string("interleaved kernel launch failed: ") + cudaGetErrorString(err);
  }
  return {};
}

}  // namespace jax_swiglu
