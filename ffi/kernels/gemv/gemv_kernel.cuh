// The decode kernel family (few tokens): act(x @ W_gate) * (x @ W_up) as one stream of the
// packed weights, K split over a thread-block cluster whose sums meet in distributed shared
// memory (split_k_store.cuh): no workspace, no fixup in global memory. Two forms:
//  - on CUDA cores (this file): no wgmma and no TMA; a CTA owns 256 packed columns (one
//    warp's row of 16-byte loads: 512 bytes of each weight row) and one of `splits` equal
//    ranges of K; its 8 warps take the range's 8-row steps in turn, each thread keeping fp32
//    sums of its 8 packed columns for every token (in K order), which meet in warp order and
//    then in rank order over the cluster.
//  - on the tensor cores (wgmma_gemv.cuh): swap-AB wgmma fed by TMA through a pipeline in
//    shared memory, for up to 16 tokens.
// Both forms also run a plain projection (LaunchGemvProjection: a gated MLP's down
// projection), the same stream with each column's sum stored as an output.
// At M <= 16 a call is a stream of the packed [K, 2N] weights; what decides its time is how
// many bytes are in flight on every SM and how little the launch costs around the stream.
// Launched with PDL (launch.h), each waits for the previous kernel before its first load.
// (A tensor-core form on mma.sync with direct loads, measured slower, lives in
// benchmarks/research/gemv_probe/.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "../../can_implement.h"
#include "../../kernel_configs.h"
#include "../../launch.h"
#include "../activations.cuh"
#include "split_k_store.cuh"

namespace jax_swiglu {

inline constexpr int kGemvWarps = 8;
inline constexpr int kGemvThreads = 32 * kGemvWarps;
// Packed columns per CTA: 32 lanes x 8 two-byte columns (16 bytes each).
inline constexpr int kGemvColumns = 256;
// K rows per step of a warp.
inline constexpr int kGemvRows = 8;

// 16 bytes of weights, read once: not kept in L1, and fetched from DRAM in 256-byte
// sectors (a warp reads 512 contiguous bytes of a row).
__device__ __forceinline__ uint4 LoadWeights(const void* address) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(address));
  return v;
}

// The fp32 sums of `kTokens` tokens for this thread's 8 packed columns over `rows` rows
// starting at `row` (a multiple of kGemvRows each), added into `sums`.
template <int kTokens, class Tag>
__device__ __forceinline__ void AccumulateStep(const GemvParams& p, const uint4* weights,
                                               int row, float (&sums)[kTokens][8]) {
  using E = Element16<Tag>;
  const auto* x = static_cast<const typename E::type*>(p.x);
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    if (t >= p.m) break;  // uniform over the CTA
    const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + int64_t(t) * p.k + row));
    const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
    for (int i = 0; i < kGemvRows; ++i) {
      const float2 xp = E::Unpack(xw[i / 2]);
      const float xi = (i % 2 == 0) ? xp.x : xp.y;
      const uint32_t ww[4] = {weights[i].x, weights[i].y, weights[i].z, weights[i].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 w = E::Unpack(ww[j]);
        sums[t][2 * j] = fmaf(xi, w.x, sums[t][2 * j]);
        sums[t][2 * j + 1] = fmaf(xi, w.y, sums[t][2 * j + 1]);
      }
    }
  }
}

// Two CTAs per SM (128 registers a thread) where the sums leave room: more bytes in flight.
constexpr int GemvMinBlocks(int tokens) { return tokens <= 4 ? 2 : 1; }

template <int kTokens, class Tag, Activation kActivation, bool kGated>
__global__ void __launch_bounds__(kGemvThreads, GemvMinBlocks(kTokens)) GemvKernel(GemvParams p) {
  using E = Element16<Tag>;
  extern __shared__ float4 gemv_shared[];
  // [warp][token][column] partial sums; after step 2, warp 0's rows hold the CTA's sums.
  float* shared = reinterpret_cast<float*>(gemv_shared);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int split = blockIdx.x, splits = gridDim.x;
  const int64_t column = int64_t(blockIdx.y) * kGemvColumns + 8 * lane;
  const bool has_columns = column < p.packed_columns;  // whole 16-byte chunks: 2N' % 64 == 0
  const auto* packed = static_cast<const typename E::type*>(p.packed) + column;

  float sums[kTokens][8];
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
#pragma unroll
    for (int j = 0; j < 8; ++j) sums[t][j] = 0.f;
  }

  // Programmatic dependent launch: nothing above touches global memory, so the launch may
  // overlap the previous kernel's drain; its results are visible past this wait.
  asm volatile("griddepcontrol.wait;" ::: "memory");

  const int steps = p.k / kGemvRows;
  const int first = split * p.steps_per_split;
  const int last = min(steps, first + p.steps_per_split);
  // Two steps' loads in flight per thread where the registers allow.
  constexpr int kUnroll = kTokens <= 2 ? 2 : 1;
  int step = first + warp;
  if (has_columns) {
    for (; step + (kUnroll - 1) * kGemvWarps < last; step += kUnroll * kGemvWarps) {
      uint4 weights[kUnroll][kGemvRows];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int i = 0; i < kGemvRows; ++i) {
          const int64_t row = int64_t(step + u * kGemvWarps) * kGemvRows + i;
          weights[u][i] = LoadWeights(packed + row * p.packed_columns);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        AccumulateStep<kTokens, Tag>(p, weights[u], (step + u * kGemvWarps) * kGemvRows, sums);
      }
    }
    if (kUnroll > 1 && step < last) {
      uint4 weights[kGemvRows];
#pragma unroll
      for (int i = 0; i < kGemvRows; ++i) {
        weights[i] = LoadWeights(packed + (int64_t(step) * kGemvRows + i) * p.packed_columns);
      }
      AccumulateStep<kTokens, Tag>(p, weights, step * kGemvRows, sums);
    }
  }

  // The weights are read: the next kernel of the stream may start its own prologue.
  asm volatile("griddepcontrol.launch_dependents;");

  // 2. The warps' sums, added in warp order by the thread that owns each column.
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    float4* row = reinterpret_cast<float4*>(shared + (warp * kTokens + t) * kGemvColumns + 8 * lane);
    row[0] = make_float4(sums[t][0], sums[t][1], sums[t][2], sums[t][3]);
    row[1] = make_float4(sums[t][4], sums[t][5], sums[t][6], sums[t][7]);
  }
  ReduceSplitsAndStore<kTokens, kGemvColumns, kGemvWarps, kGemvThreads, kGemvColumns, Tag,
                       kActivation, /*kScaled=*/false, kGated>(p, shared, split, splits);
}

// Every warp's fp32 sums of every token and packed column of the CTA.
constexpr int GemvSharedBytes(const KernelConfig& config) {
  return kGemvWarps * config.tile_m * config.tile_n * static_cast<int>(sizeof(float));
}

// The tensor-core form's launcher, defined in wgmma_gemv.cuh (which includes this file and is
// the header of the tensor-core rows' translation units, so the CUDA-core ones never parse
// CuTe).
// The tensor-core form (wgmma_gemv.cuh), on `Tag` or (kFp8) e4m3 operands, with the
// product's stream parameters: two CTAs an SM, the weights' reads promoted to 128-byte L2
// lines, normal eviction; gated (a SwigluProblem) or a plain projection (a
// ProjectionProblem, kGated false).
template <int kTokens, int kColumns, class Tag, bool kFp8, Activation kActivation,
          int kCtasPerSm = 2, int kL2PromotionBytes = 128, bool kEvictFirst = false,
          bool kGated = true, class Problem = SwigluProblem>
std::string LaunchWgmmaGemv(const Problem& p, const DeviceFacts& facts, cudaStream_t stream);

// Row ConfigId's form on `p`: a SwigluProblem (kGated) or a ProjectionProblem.
template <int ConfigId, class ElementTag, Activation kActivation, bool kGated, class Problem>
std::string LaunchGemvForm(const Problem& p, const DeviceFacts& facts, cudaStream_t stream) {
  constexpr KernelConfig config = kConfigs[ConfigId];
  static_assert(config.family == Family::Gemv, "a row of the decode family");
  // (Tokens, K, N and the split: CannotRun or CannotRunProjection, before this.)
  const void* const buffers[] = {p.x, StreamedWeights(p), p.out};
  for (const void* ptr : buffers) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {
      return "gemv config " + std::to_string(ConfigId) + " needs 16-byte aligned buffers";
    }
  }
  if constexpr (config.schedule == Schedule::TensorCores) {
    return LaunchWgmmaGemv<config.tile_m, config.tile_n, ElementTag,
                           config.operands == Operands::Fp8E4m3, kActivation, 2, 128, false,
                           kGated>(p, facts, stream);
  } else {
    static_assert(config.operands == Operands::Bits16, "the CUDA-core form: 16-bit operands");
    static_assert(config.tile_n == kGemvColumns && config.tile_k == kGemvRows,
                  "the CUDA-core form's CTA is one warp's row of loads, 8 rows a step");
    auto* kernel = GemvKernel<config.tile_m, ElementTag, kActivation, kGated>;
    const int shared_bytes = GemvSharedBytes(config);
    if (std::string err = EnsureSharedMemoryLimit(reinterpret_cast<const void*>(kernel),
                                                  shared_bytes, facts.device);
        !err.empty()) {
      return err;
    }
    return LaunchClusterSplitKGrid(kernel, MakeGemvParams(p, config.tile_k), kGemvThreads,
                                   shared_bytes, config.tile_n, p, facts, stream);
  }
}

template <int ConfigId, class ElementTag, Activation kActivation>
std::string LaunchGemv(const SwigluProblem& p, const DeviceFacts& facts, cudaStream_t stream) {
  return LaunchGemvForm<ConfigId, ElementTag, kActivation, /*kGated=*/true>(p, facts, stream);
}

// A plain projection checks its own shapes (CannotRunProjection) and has no activation:
// the form is instantiated with SiLU's, which its store never calls.
template <int ConfigId, class ElementTag>
std::string LaunchGemvProjection(const ProjectionProblem& p, const DeviceFacts& facts,
                                 cudaStream_t stream) {
  if (std::string err = CannotRunProjection(kConfigs[ConfigId], p); !err.empty()) return err;
  return LaunchGemvForm<ConfigId, ElementTag, Activation::Silu, /*kGated=*/false>(p, facts,
                                                                                  stream);
}

// Neither form needs a workspace.
template <int ConfigId, class ElementTag, Activation kActivation>
size_t GemvWorkspaceBytes(const SwigluProblem&, const DeviceFacts&) {
  return 0;
}

}  // namespace jax_swiglu
