// Host-side interface between the FFI handlers (plain C++) and the CUTLASS kernel
// instantiations (CUDA translation units). Nothing here includes CUTLASS.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "kernel_configs.h"

namespace jax_swiglu {

// Element types the kernels are instantiated for (tags, so this header needs no CUDA
// half/bfloat16 headers).
struct BF16 {};
struct F16 {};

// SwigluProblem::fp8_promotion's fast accumulation: no promotion before the last k tile.
inline constexpr int kFastAccumulation = 0;

// One fused gated-MLP call: out[M, N] = act(x @ W_gate) * (x @ W_up), all row-major, with
// act the launcher's Activation (SiLU for SwiGLU, GELU's tanh form for GeGLU).
struct SwigluProblem {
  const void* x;       // [m, k]
  const void* packed;  // [k, 2 * n_packed], layout of jax_swiglu/_layout.py
  void* out;           // [m, n]
  int64_t m;
  int64_t n;         // output columns, n <= n_packed
  int64_t n_packed;  // n rounded up to the gate/up block
  int64_t k;
  // Tile scheduler order (persistent and stream-K), chosen per call by the Python
  // selection: tiles are visited in groups of `swizzle` (1, 2, 4 or 8) along the minor
  // axis, and `raster` is 0 (CUTLASS heuristic), 1 (along M) or 2 (along N).
  int swizzle;
  int raster;
  // Stream-K configs only: 1 spreads the K iterations of a ragged last wave over every SM
  // (stream-K); s > 1 splits every tile into s equal K ranges instead (split-K).
  int splits = 1;
  // Scratch for the kernels whose tile scheduler needs one (stream-K: partial sums and
  // flags); an output buffer of the custom call, sized by the matching *WorkspaceBytes.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // fp8 kernel only (x and packed are then e4m3, packed stored K-major as [2 * n_packed, k]):
  // x row m stands for x_q[m, :] * x_scale[m], packed column p for its fp8 values times
  // w_scale[p * w_scale_stride] (stride 1: a scale per packed column; 0: one for all).
  const float* x_scale = nullptr;
  const float* w_scale = nullptr;
  int w_scale_stride = 1;
  // fp8 only: wgmma instructions (32 of K each) between two promotions of the tensor cores'
  // accumulators into the fp32 ones (CUTLASS's mma_promotion_interval; a multiple of the
  // k tile's, tile_k / 32). The tensor cores accumulate fp8 products at reduced precision in
  // between. kFastAccumulation (0): one promotion, after the last k tile (the tensor cores
  // add all of K, as cuBLASLt's fast accumulation does).
  int fp8_promotion = 4;
  // Grouped rows only (a mixture-of-experts call): `packed` holds `experts` packed matrices
  // [k, 2 * n_packed] one after the other, and x's rows are sorted by expert, group_sizes[e]
  // of them (int32, on the device; a negative size counts as 0, a sum past m ends the groups
  // at row m) for expert e; rows past the groups are written as zeros. experts is 0 for a
  // dense call.
  const int32_t* group_sizes = nullptr;
  int64_t experts = 0;
};

// A plain projection on the decode form (the gemv rows): out[m, n] = x[m, k] @ W, each of W's
// n columns an output column (no gate/up pairing, no activation), fp32 sums rounded once: a
// gated MLP's down projection at a few tokens. 16-bit: x [m, k] and W [k, n] row-major, out
// [m, n], all of one dtype. e4m3 (a row of e4m3 operands): x_q [m, k] with x_scale [m], W
// K-major [n, k] with w_scale [n] (stride 1) or one scale (stride 0), out [m, n] in the
// launcher's Element; promotion as SwigluProblem::fp8_promotion.
struct ProjectionProblem {
  const void* x;
  const void* w;
  void* out;
  int64_t m;
  int64_t n;
  int64_t k;
  int splits = 1;  // K split over a cluster of this many CTAs
  const float* x_scale = nullptr;
  const float* w_scale = nullptr;
  int w_scale_stride = 1;
  int fp8_promotion = 4;
};

// Per-device facts the launchers need, read once per device and cached.
struct DeviceFacts {
  int device;
  int sm_count;
  int cc_major;
  int cc_minor;
  // Launch with programmatic dependent launch (PDL): a kernel may start its prologue while
  // the stream's previous kernel drains, and waits (griddepcontrol.wait) before its first
  // global-memory access. On unless JAX_SWIGLU_PDL=0 (read once per process).
  bool programmatic_launch = true;
  // The L2's bytes (0: unknown), which bound a grouped call's bands of token tiles.
  int64_t l2_bytes = 0;
  // Grouped calls' bands (schedulers/expert_groups.cuh): 0 the rule's; for control runs in one
  // build, JAX_SWIGLU_GROUPED_BANDS=0 walks whole experts (-1 here) and =N takes bands of N.
  int grouped_band = 0;
};

// The launch attributes every fused kernel shares, written to `attrs` (room for 2): the
// cluster shape (always for CUTLASS's kernels, `always_cluster`; else where a cluster has
// more than one CTA), and PDL where `facts` allow it. Returns how many were written.
inline unsigned LaunchAttributes(const DeviceFacts& facts, dim3 cluster_dims, bool always_cluster,
                                 cudaLaunchAttribute* attrs) {
  unsigned count = 0;
  if (always_cluster || cluster_dims.x * cluster_dims.y * cluster_dims.z > 1) {
    attrs[count].id = cudaLaunchAttributeClusterDimension;
    attrs[count].val.clusterDim.x = cluster_dims.x;
    attrs[count].val.clusterDim.y = cluster_dims.y;
    attrs[count].val.clusterDim.z = cluster_dims.z;
    ++count;
  }
  if (facts.programmatic_launch) {
    attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  return count;
}

// Each kernel family's launcher of its row `ConfigId` (kernel_configs.h), with the gate
// activation `kActivation`, on `stream` (on `device`): `Element` is the operands' and the
// output's type (BF16 or F16), or the output's for a row of e4m3 operands. Returns an empty
// string on success, otherwise a message that says what was wrong. Never synchronizes and
// never allocates, so it is safe inside CUDA graph capture. Each is defined in its family's
// header (kernels/) and instantiated once per row and element, in a translation unit of its
// own (kernels/instance.cu.in).
template <int ConfigId, class Element, Activation kActivation>
std::string LaunchInterleaved(const SwigluProblem& problem, const DeviceFacts& device,
                              cudaStream_t stream);
template <int ConfigId, class Element, Activation kActivation>
std::string LaunchGateThenUp(const SwigluProblem& problem, const DeviceFacts& device,
                             cudaStream_t stream);
template <int ConfigId, class Element, Activation kActivation>
std::string LaunchGemv(const SwigluProblem& problem, const DeviceFacts& device,
                       cudaStream_t stream);
// The gemv row `ConfigId`'s plain projection (ProjectionProblem), instantiated with the
// row's gated launcher.
template <int ConfigId, class Element>
std::string LaunchGemvProjection(const ProjectionProblem& problem, const DeviceFacts& device,
                                 cudaStream_t stream);
// Bytes of workspace a launch of that row on `problem` (its shapes and tile order; pointers
// unused) needs on a GPU with `device.sm_count` SMs; 0 for most.
template <int ConfigId, class Element, Activation kActivation>
size_t InterleavedWorkspaceBytes(const SwigluProblem& problem, const DeviceFacts& device);
template <int ConfigId, class Element, Activation kActivation>
size_t GateThenUpWorkspaceBytes(const SwigluProblem& problem, const DeviceFacts& device);
template <int ConfigId, class Element, Activation kActivation>
size_t GemvWorkspaceBytes(const SwigluProblem& problem, const DeviceFacts& device);

// Quantizes the 16-bit tokens x [m, k] (`Element`) per row to e4m3 x_q [m, k] with fp32
// scales x_scale [m], as jax_swiglu.quantize_tokens does, bit for bit (kernels/
// quantize_rows.cuh): what an e4m3 call of 16-bit tokens runs before its fused kernel. k a
// multiple of 8.
template <class Element>
std::string LaunchQuantizeRows(const void* x, int64_t m, int64_t k, void* x_q, float* x_scale,
                               const DeviceFacts& device, cudaStream_t stream);

// Raises `kernel`'s dynamic shared-memory limit to `bytes` once per device (a function
// attribute is per device; setting it is a host call, kept out of the per-call path).
// Returns an error message or "".
inline std::string EnsureSharedMemoryLimit(const void* kernel, int bytes, int device) {
  static std::mutex mutex;
  static std::set<std::pair<int, const void*>> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (done.count({device, kernel})) return {};
  if (cudaError_t err =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      err != cudaSuccess) {
    return std::string("cudaFuncSetAttribute failed: ") + cudaGetErrorString(err);
  }
  done.insert({device, kernel});
  return {};
}

// Fills `facts` for the current device; returns an error message or "".
std::string CurrentDeviceFacts(DeviceFacts* facts);

// Clusters of `cluster_size` CTAs, each filling an SM, that the current GPU holds at once
// (cluster_slots.cu); 0 where the query fails.
int ClusterSlots(int cluster_size);

}  // namespace jax_swiglu
