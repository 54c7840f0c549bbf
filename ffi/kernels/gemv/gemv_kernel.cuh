// The fused kernel for a few tokens (decode): act(x @ W_gate) * (x @ W_up) as a GEMV on CUDA
// cores that streams the packed weights once, with no wgmma, no TMA and no workspace.
//
// At M <= 8 a call is a stream of the packed [K, 2N] weights; what decides its time is how
// many bytes are in flight on every SM and how little the launch costs around the stream.
// A CTA owns 256 packed columns (one warp's row of 16-byte loads: 512 bytes of each weight
// row) and one of `splits` equal ranges of K; its 8 warps take the range's 8-row steps in
// turn. Each thread keeps fp32 sums of its 8 packed columns for every token. The sums meet in
// a fixed order, so the result is bitwise the same on every call:
//  1. within a thread, over its rows in K order;
//  2. within the CTA, over the 8 warps in warp order (shared memory);
//  3. over the splits, which are one thread-block cluster: CTA 0 adds the others' sums from
//     their shared memory (distributed shared memory), in rank order.
// CTA 0 then pairs each gate sum with its up sum (32 packed columns apart in the packed
// layout, jax_swiglu/_layout.py), applies the activation in fp32 and rounds once. Nothing
// is allocated, synchronized with the host, or written outside `out`. Launched with PDL
// (launch.h), it waits for the previous kernel before its first load. (A tensor-core form on
// mma.sync, measured slower, lives in benchmarks/research/gemv_probe/.)
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <set>
#include <string>

#include "../../kernel_configs.h"
#include "../../launch.h"
#include "../activations.cuh"

namespace jax_swiglu {

inline constexpr int kGemvWarps = 8;
inline constexpr int kGemvThreads = 32 * kGemvWarps;
// Packed columns per CTA: 32 lanes x 8 two-byte columns (16 bytes each).
inline constexpr int kGemvColumns = 256;
// K rows per step of a warp.
inline constexpr int kGemvRows = 8;

template <class Tag>
struct GemvElement;
template <>
struct GemvElement<BF16> {
  using type = __nv_bfloat16;
  // The two 2-byte values of a 32-bit word as floats (low half first).
  static __device__ __forceinline__ float2 Unpack(uint32_t word) {
    return make_float2(__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u));
  }
  static __device__ __forceinline__ __nv_bfloat16 Round(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct GemvElement<F16> {
  using type = __half;
  static __device__ __forceinline__ float2 Unpack(uint32_t word) {
    __half2 h;
    *reinterpret_cast<uint32_t*>(&h) = word;
    return __half22float2(h);
  }
  static __device__ __forceinline__ __half Round(float v) { return __float2half_rn(v); }
};

// 16 bytes of weights, read once: not kept in L1, and fetched from DRAM in 256-byte
// sectors (a warp reads 512 contiguous bytes of a row).
__device__ __forceinline__ uint4 LoadWeights(const void* address) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(address));
  return v;
}

struct GemvParams {
  const void* x;       // [m, k]
  const void* packed;  // [k, packed_columns]
  void* out;           // [m, n]
  int m, n, k;
  int packed_columns;  // 2 * n_packed
  int steps_per_split;  // steps of K per split
};

// The fp32 sums of `kTokens` tokens for this thread's 8 packed columns over `rows` rows
// starting at `row` (a multiple of kGemvRows each), added into `sums`.
template <int kTokens, class Tag>
__device__ __forceinline__ void AccumulateStep(const GemvParams& p, const uint4* weights,
                                               int row, float (&sums)[kTokens][8]) {
  using E = GemvElement<Tag>;
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

// Steps 2 and 3 and the store: `shared` holds every warp's fp32 sums as [warp][token][column]
// (kTokens token slots, kColumns packed columns; written before the call). The thread that
// owns a column adds the warps' sums in warp order, CTA 0 of the cluster (`split` of
// `splits`) adds the other CTAs' in rank order, and it pairs each gate sum with its up sum,
// applies the activation in fp32 and rounds once to `Tag`.
template <int kTokens, int kColumns, class Tag, Activation kActivation>
__device__ __forceinline__ void GemvReduceAndStore(const GemvParams& p, float* shared, int split,
                                                   int splits) {
  using E = GemvElement<Tag>;
  namespace cg = cooperative_groups;
  static_assert(kColumns <= kGemvThreads, "at most one column per thread in the reduction");
  __syncthreads();
  const int c = threadIdx.x;
  // (Threads past the CTA's columns, where it has fewer than threads, only store.)
  const bool owns_column = kColumns == kGemvThreads || c < kColumns;
  if (owns_column) {
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      float v = shared[t * kColumns + c];
#pragma unroll
      for (int w = 1; w < kGemvWarps; ++w) v += shared[(w * kTokens + t) * kColumns + c];
      shared[t * kColumns + c] = v;
    }
  }

  if (splits > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every CTA's sums are written and visible to the cluster
    if (split == 0 && owns_column) {
      float v[kTokens];
#pragma unroll
      for (int t = 0; t < kTokens; ++t) v[t] = shared[t * kColumns + c];
      for (int r = 1; r < splits; ++r) {
        const float* peer = cluster.map_shared_rank(shared, r);
#pragma unroll
        for (int t = 0; t < kTokens; ++t) v[t] += peer[t * kColumns + c];
      }
#pragma unroll
      for (int t = 0; t < kTokens; ++t) shared[t * kColumns + c] = v[t];
    }
    cluster.sync();  // the peers' shared memory stays valid until CTA 0 has read it
    if (split != 0) return;
  } else {
    __syncthreads();
  }

  // Pairs: packed column 64 b + i (i < 32) is gate, 64 b + 32 + i its up; run position i
  // = 8 j + 2 q + e holds the run's column 8 q + 2 j + e (the quad transpose).
  auto* out = static_cast<typename E::type*>(p.out);
  constexpr int kOutputs = kColumns / 2;
  for (int item = threadIdx.x; item < kTokens * kOutputs; item += kGemvThreads) {
    const int t = item / kOutputs, o = item % kOutputs;
    const int pair = o / kGateUpBlock, position = o % kGateUpBlock;
    const int j = position / 8, q = (position % 8) / 2, e = position % 2;
    const int64_t n = int64_t(blockIdx.y) * kOutputs + pair * kGateUpBlock + 8 * q + 2 * j + e;
    if (t >= p.m || n >= p.n) continue;
    const int column = 2 * kGateUpBlock * pair + position;  // the gate's; up is 32 on
    const float gate = shared[t * kColumns + column];
    const float up = shared[t * kColumns + kGateUpBlock + column];
    out[int64_t(t) * p.n + n] = E::Round(Activate<kActivation, false>(gate) * up);
  }
}

// Two CTAs per SM (128 registers a thread) where the sums leave room: more bytes in flight.
constexpr int GemvMinBlocks(int tokens) { return tokens <= 4 ? 2 : 1; }

template <int kTokens, class Tag, Activation kActivation>
__global__ void __launch_bounds__(kGemvThreads, GemvMinBlocks(kTokens)) GemvSwigluKernel(GemvParams p) {
  using E = GemvElement<Tag>;
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
  GemvReduceAndStore<kTokens, kGemvColumns, Tag, kActivation>(p, shared, split, splits);
}

// Every warp's fp32 sums of every token and packed column of the CTA.
constexpr int GemvSharedBytes(const KernelConfig& config) {
  return kGemvWarps * config.tile_m * config.tile_n * static_cast<int>(sizeof(float));
}

// Launches `kernel`, a gemv form whose CTAs hold `shared_bytes` of shared memory and own
// `columns` packed columns in steps of `rows` rows of K, over `p` (checked by the caller):
// the grid is (splits, column blocks), one cluster per column block. Above the default
// shared-memory limit the kernel opts in once per device (`opted_in`, under `opt_in_mutex`:
// a host call kept out of the per-call path).
template <class Kernel>
std::string LaunchGemvGrid(Kernel* kernel, int shared_bytes, int columns, int rows,
                           const SwigluProblem& p, const DeviceFacts& facts, cudaStream_t stream,
                           std::mutex& opt_in_mutex, std::set<int>& opted_in) {
  if (shared_bytes > 48 * 1024) {
    std::lock_guard<std::mutex> lock(opt_in_mutex);
    if (!opted_in.count(facts.device)) {
      if (cudaError_t err = cudaFuncSetAttribute(
              kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes);
          err != cudaSuccess) {
        return std::string("cudaFuncSetAttribute failed: ") + cudaGetErrorString(err);
      }
      opted_in.insert(facts.device);
    }
  }
  const int steps = static_cast<int>((p.k + rows - 1) / rows);
  GemvParams params{p.x, p.packed, p.out, static_cast<int>(p.m), static_cast<int>(p.n),
                    static_cast<int>(p.k), static_cast<int>(2 * p.n_packed),
                    (steps + p.splits - 1) / p.splits};
  const int column_blocks = static_cast<int>((2 * p.n_packed + columns - 1) / columns);
  cudaLaunchAttribute attrs[2];
  cudaLaunchConfig_t launch{};
  launch.gridDim = dim3(p.splits, column_blocks, 1);
  launch.blockDim = dim3(kGemvThreads, 1, 1);
  launch.dynamicSmemBytes = shared_bytes;
  launch.stream = stream;
  launch.attrs = attrs;
  launch.numAttrs = LaunchAttributes(facts, dim3(p.splits, 1, 1), /*always_cluster=*/false, attrs);
  if (cudaError_t err = cudaLaunchKernelEx(&launch, kernel, params); err != cudaSuccess) {
    return std::string("gemv kernel launch failed: ") + cudaGetErrorString(err);
  }
  return {};
}

template <int ConfigId, class ElementTag, Activation kActivation>
std::string LaunchGemv(const SwigluProblem& p, const DeviceFacts& facts, cudaStream_t stream) {
  constexpr KernelConfig config = kConfigs[ConfigId];
  static_assert(config.family == Family::Gemv && config.tile_n == kGemvColumns &&
                    config.tile_k == kGemvRows,
                "the gemv kernel's CTA is one warp's row of loads, 8 rows a step");
  // (Tokens, K, N and the split: CannotRun, before this.)
  for (const void* ptr : {p.x, p.packed, static_cast<const void*>(p.out)}) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {
      return "gemv config " + std::to_string(ConfigId) + " needs 16-byte aligned buffers";
    }
  }
  static std::mutex opt_in_mutex;
  static std::set<int> opted_in;
  return LaunchGemvGrid(GemvSwigluKernel<config.tile_m, ElementTag, kActivation>,
                        GemvSharedBytes(config), config.tile_n, config.tile_k, p, facts, stream,
                        opt_in_mutex, opted_in);
}

// The gemv kernel needs no workspace.
template <int ConfigId, class ElementTag, Activation kActivation>
size_t GemvWorkspaceBytes(const SwigluProblem&, const DeviceFacts&) {
  return 0;
}

}  // namespace jax_swiglu
