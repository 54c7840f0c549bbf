// Launching an assembled CUTLASS 3.x GemmUniversal kernel: what every fused kernel shares.
#pragma once

#include <cuda_runtime_api.h>

#include <cutlass/cutlass.h>
#include <cutlass/device_kernel.h>
#include <cutlass/gemm/gemm_enumerated_types.h>
#include <cutlass/kernel_hardware_info.hpp>
#include <cutlass/numeric_types.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "../launch.h"

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

// EnsureSharedMemoryLimit (launch.h) for a CUTLASS kernel: its whole SharedStorage.
template <class Kernel>
std::string EnsureSharedMemoryLimit(int device) {
  return EnsureSharedMemoryLimit(reinterpret_cast<const void*>(cutlass::device_kernel<Kernel>),
                                 static_cast<int>(Kernel::SharedStorageSize), device);
}

// The launch configuration of `Kernel` on `grid` in clusters of `cluster_dims` CTAs: its
// block, its shared memory and the shared launch attributes (LaunchAttributes), written to
// `attrs` (the configuration points at them, so they must outlive the launch or query).
template <class Kernel>
cudaLaunchConfig_t KernelLaunchConfig(dim3 grid, dim3 cluster_dims, const DeviceFacts& facts,
                                      cudaStream_t stream, cudaLaunchAttribute (&attrs)[2]) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = Kernel::get_block_shape();
  config.dynamicSmemBytes = Kernel::SharedStorageSize;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = LaunchAttributes(facts, cluster_dims, /*always_cluster=*/true, attrs);
  return config;
}

// How many clusters of `cluster_dims` CTAs of `Kernel` the device runs at once (0 if the
// query fails), once per device and cluster shape. A persistent grid sized beyond it would
// leave some clusters waiting for others to finish, a second ragged wave; CUTLASS's own
// estimate assumes whole 18-SM GPCs, which clusters of 4 or 8 CTAs do not get on an H200.
// Call after EnsureSharedMemoryLimit (the query sees the kernel's shared-memory limit).
template <class Kernel>
int MaxActiveClusters(const DeviceFacts& facts, dim3 cluster_dims) {
  const int device = facts.device;
  static std::mutex mutex;
  static std::map<std::pair<int, int>, int> known;
  const int cluster_size = static_cast<int>(cluster_dims.x * cluster_dims.y * cluster_dims.z);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find({device, cluster_size});
  if (it != known.end()) return it->second;
  cudaLaunchAttribute attrs[2];
  const cudaLaunchConfig_t config =
      KernelLaunchConfig<Kernel>(cluster_dims, cluster_dims, facts, /*stream=*/nullptr, attrs);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, cutlass::device_kernel<Kernel>, &config) !=
      cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; fall back to CUTLASS's estimate
    clusters = 0;
  }
  known[{device, cluster_size}] = clusters;
  return clusters;
}

// Sets the stream-K scheduler's decomposition (other schedulers have none): a plain split-K
// where `splits` > 1, else stream-K wherever the last wave of whole tiles would be ragged.
// CUTLASS's own heuristic keeps whole tiles when that wave is more than half full, which
// leaves SMs idle while a memory-bound call streams its weights.
template <class SchedulerArguments>
auto SetDecomposition(SchedulerArguments& args, int splits, int)
    -> decltype(args.decomposition_mode, void()) {
  using Mode = decltype(args.decomposition_mode);
  args.splits = splits;
  args.decomposition_mode = splits > 1 ? Mode::SplitK : Mode::StreamK;
}
template <class SchedulerArguments>
void SetDecomposition(SchedulerArguments&, int, long) {}

// The arguments of `Kernel` (any mainloop + one of our SwiGLU epilogues) on the GEMM
// `problem` (the packed [M, 2 N_pad, K] one, or its swap-AB transpose), around the kernel's
// own mainloop arguments, with the tile order.
template <class Kernel>
typename Kernel::Arguments GemmArguments(typename Kernel::ProblemShape problem,
                                         typename Kernel::MainloopArguments mainloop,
                                         const SwigluProblem& p, const DeviceFacts& facts) {
  using ElementD = typename Kernel::CollectiveEpilogue::ElementD;
  typename Kernel::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  problem,
                                  mainloop,
                                  {static_cast<ElementD*>(p.out), static_cast<int>(p.n),
                                   p.x_scale, p.w_scale, p.w_scale_stride},
                                  cutlass::KernelHardwareInfo{facts.device, facts.sm_count},
                                  {}};
  using RasterOrder = typename Kernel::TileScheduler::RasterOrderOptions;
  args.scheduler.max_swizzle_size = p.swizzle;
  args.scheduler.raster_order = p.raster == 1   ? RasterOrder::AlongM
                                : p.raster == 2 ? RasterOrder::AlongN
                                                : RasterOrder::Heuristic;
  SetDecomposition(args.scheduler, p.splits, 0);
  return args;
}

// Checks and launches `args` with the cluster shape on `stream`: builds the params (TMA
// descriptors) and, for a kernel that needs one, initializes its workspace (an async
// memset on `stream`). No allocation, no synchronization.
template <class Kernel>
std::string LaunchGemm(typename Kernel::Arguments args, const SwigluProblem& p,
                       const DeviceFacts& facts, dim3 cluster_dims, cudaStream_t stream,
                       const char* kernel_name) {
  const std::string name(kernel_name);
  if (std::string err = EnsureSharedMemoryLimit<Kernel>(facts.device); !err.empty()) return err;
  if (cluster_dims.x * cluster_dims.y * cluster_dims.z > 1) {
    args.hw_info.max_active_clusters = MaxActiveClusters<Kernel>(facts, cluster_dims);
  }
  if (!Kernel::can_implement(args)) {
    return name + " kernel cannot implement M=" + std::to_string(p.m) + " N=" +
           std::to_string(p.n) + " K=" + std::to_string(p.k) +
           " (K and N must be multiples of 8, buffers 16-byte aligned)";
  }
  const size_t workspace_bytes = Kernel::get_workspace_size(args);
  if (workspace_bytes > p.workspace_bytes) {
    return name + " kernel needs " + std::to_string(workspace_bytes) +
           " bytes of workspace and was given " + std::to_string(p.workspace_bytes) +
           " (was the call lowered for a GPU with another SM count?)";
  }
  if (workspace_bytes > 0 &&
      Kernel::initialize_workspace(args, p.workspace, stream) != cutlass::Status::kSuccess) {
    return name + " kernel: initializing its workspace failed";
  }

  typename Kernel::Params params = Kernel::to_underlying_arguments(args, p.workspace);

  cudaLaunchAttribute attrs[2];
  const cudaLaunchConfig_t launch = KernelLaunchConfig<Kernel>(Kernel::get_grid_shape(params),
                                                               cluster_dims, facts, stream, attrs);

  cudaError_t err = cudaLaunchKernelEx(&launch, cutlass::device_kernel<Kernel>, params);
  if (err != cudaSuccess) {
    return name + " kernel launch failed: " + cudaGetErrorString(err);
  }
  return {};
}

}  // namespace jax_swiglu
