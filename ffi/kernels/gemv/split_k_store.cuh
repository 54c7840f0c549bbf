// What both forms of the decode kernel (the CUDA-core GEMV, gemv_kernel.cuh, and the wgmma
// one, wgmma_gemv.cuh) share: K split over a thread-block cluster whose CTAs add their fp32
// sums in distributed shared memory, in rank order, then the gate/up pairing, the activation
// and one rounding (or, for a plain projection, each column's sum rounded once); and the
// launch of such a grid.
//
// A CTA owns `kColumns` packed columns (blockIdx.y) and one of `splits` ranges of K
// (blockIdx.x, its rank in the cluster). The sums meet in a fixed order, so the result is
// bitwise the same on every call: within the CTA over its warps' partial sums in warp order,
// then over the splits in rank order (CTA 0 reads the others' shared memory). Nothing is
// allocated, synchronized with the host, or written outside `out`.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "../../kernel_configs.h"
#include "../../launch.h"
#include "../activations.cuh"
#include "../element16.cuh"
#include "../epilogue/scale_params.cuh"

namespace jax_swiglu {

struct GemvParams {
  const void* x;       // [m, k]
  const void* packed;  // [k, packed_columns] (e4m3: [packed_columns, k])
  void* out;           // [m, n]
  int m, n, k;
  int packed_columns;  // 2 * n_packed (a plain projection: n)
  int steps_per_split;  // steps of K (the form's tile_k rows each) per split
  // e4m3 operands (SwigluProblem's): the sums times their token's and packed column's scale;
  // the tensor cores' sums promoted into fp32 ones every `promotion` wgmma (of 32 of K), or
  // once at the end (kFastAccumulation).
  ScaleParams scales;
  int promotion;
};

// The reduction and the store, called by all `kThreads` threads of every CTA of the cluster.
// `shared` holds the CTA's fp32 partial sums as [warp][token][column] (kWarps partial sums,
// kTokens token slots, kColumns packed columns in rows of kStride floats; written before the
// call). The sums are added over the warps in warp order and over the cluster's CTAs in rank
// order; CTA 0 then pairs each gate sum with its up sum (kScaled: each first times its
// token's and its packed column's scale), applies the activation in fp32 and rounds once to
// `Tag`; or, not kGated (a plain projection), stores each column's sum (scaled likewise) as
// output column blockIdx.y * kColumns + c, rounded once (kActivation unused).
template <int kTokens, int kColumns, int kWarps, int kThreads, int kStride, class Tag,
          Activation kActivation, bool kScaled = false, bool kGated = true>
__device__ __forceinline__ void ReduceSplitsAndStore(const GemvParams& p, float* shared,
                                                     int split, int splits) {
  using E = Element16<Tag>;
  namespace cg = cooperative_groups;
  static_assert(kStride >= kColumns, "a row of sums holds the CTA's columns");
  __syncthreads();
  if constexpr (kWarps > 1) {
    for (int c = threadIdx.x; c < kColumns; c += kThreads) {
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        float v = shared[t * kStride + c];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) v += shared[(w * kTokens + t) * kStride + c];
        shared[t * kStride + c] = v;
      }
    }
  }

  if (splits > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every CTA's sums are written and visible to the cluster
    if (split == 0) {
      for (int c = threadIdx.x; c < kColumns; c += kThreads) {
        float v[kTokens];
#pragma unroll
        for (int t = 0; t < kTokens; ++t) v[t] = shared[t * kStride + c];
        for (int r = 1; r < splits; ++r) {
          const float* peer = cluster.map_shared_rank(shared, r);
#pragma unroll
          for (int t = 0; t < kTokens; ++t) v[t] += peer[t * kStride + c];
        }
#pragma unroll
        for (int t = 0; t < kTokens; ++t) shared[t * kStride + c] = v[t];
      }
    }
    cluster.sync();  // the peers' shared memory stays valid until CTA 0 has read it
    if (split != 0) return;
  } else {
    __syncthreads();
  }

  auto* out = static_cast<typename E::type*>(p.out);
  if constexpr (!kGated) {
    // Consecutive threads store consecutive columns of a token's row.
    for (int item = threadIdx.x; item < kTokens * kColumns; item += kThreads) {
      const int t = item / kColumns, c = item % kColumns;
      const int64_t n = int64_t(blockIdx.y) * kColumns + c;
      if (t >= p.m || n >= p.n) continue;
      float sum = shared[t * kStride + c];
      if constexpr (kScaled) sum *= TokenScale(p.scales, t) * ColumnScale(p.scales, int(n));
      out[int64_t(t) * p.n + n] = E::Round(sum);
    }
    return;
  }
  // Pairs: packed column 64 b + i (i < 32) is gate, 64 b + 32 + i its up; run position i
  // = 8 j + 2 q + e holds the run's column 8 q + 2 j + e (the quad transpose).
  constexpr int kOutputs = kColumns / 2;
  for (int item = threadIdx.x; item < kTokens * kOutputs; item += kThreads) {
    const int t = item / kOutputs, o = item % kOutputs;
    const int pair = o / kGateUpBlock, position = o % kGateUpBlock;
    const int j = position / 8, q = (position % 8) / 2, e = position % 2;
    const int64_t n = int64_t(blockIdx.y) * kOutputs + pair * kGateUpBlock + 8 * q + 2 * j + e;
    if (t >= p.m || n >= p.n) continue;
    const int column = 2 * kGateUpBlock * pair + position;  // the gate's; up is 32 on
    float gate = shared[t * kStride + column];
    float up = shared[t * kStride + kGateUpBlock + column];
    if constexpr (kScaled) {
      const int packed = int(blockIdx.y) * kColumns + column;  // < 2^31 (CannotRun)
      const float x_scale = TokenScale(p.scales, t);
      gate *= x_scale * ColumnScale(p.scales, packed);  // (as the swap-AB epilogue)
      up *= x_scale * ColumnScale(p.scales, packed + kGateUpBlock);
    }
    out[int64_t(t) * p.n + n] = E::Round(Activate<kActivation, false>(gate) * up);
  }
}

// The weights a call streams and their columns: the packed gate/up matrix's, or a
// projection's own.
inline const void* StreamedWeights(const SwigluProblem& p) { return p.packed; }
inline const void* StreamedWeights(const ProjectionProblem& p) { return p.w; }
inline int64_t StreamedColumns(const SwigluProblem& p) { return 2 * p.n_packed; }
inline int64_t StreamedColumns(const ProjectionProblem& p) { return p.n; }

// The GemvParams of `p` (a SwigluProblem or a ProjectionProblem) for CTAs that split K in
// steps of `rows` rows.
template <class Problem>
GemvParams MakeGemvParams(const Problem& p, int rows) {
  const int steps = static_cast<int>((p.k + rows - 1) / rows);
  return GemvParams{p.x,
                    StreamedWeights(p),
                    p.out,
                    static_cast<int>(p.m),
                    static_cast<int>(p.n),
                    static_cast<int>(p.k),
                    static_cast<int>(StreamedColumns(p)),
                    (steps + p.splits - 1) / p.splits,
                    {p.x_scale, p.w_scale, p.w_scale_stride},
                    p.fp8_promotion};
}

// Launches `kernel(params)` with `threads` threads and `shared_bytes` of shared memory per CTA
// over the grid (splits, column blocks of `columns` packed columns), one cluster per column
// block (p.splits CTAs; checked by the caller). The kernel's shared-memory limit must be
// raised first (EnsureSharedMemoryLimit, launch.h).
template <class Kernel, class Params, class Problem>
std::string LaunchClusterSplitKGrid(Kernel* kernel, const Params& params, int threads,
                                    int shared_bytes, int columns, const Problem& p,
                                    const DeviceFacts& facts, cudaStream_t stream) {
  const int column_blocks = static_cast<int>((StreamedColumns(p) + columns - 1) / columns);
  cudaLaunchAttribute attrs[2];
  cudaLaunchConfig_t launch{};
  launch.gridDim = dim3(p.splits, column_blocks, 1);
  launch.blockDim = dim3(threads, 1, 1);
  launch.dynamicSmemBytes = shared_bytes;
  launch.stream = stream;
  launch.attrs = attrs;
  launch.numAttrs = LaunchAttributes(facts, dim3(p.splits, 1, 1), /*always_cluster=*/false, attrs);
  if (cudaError_t err = cudaLaunchKernelEx(&launch, kernel, params); err != cudaSuccess) {
    return std::string("gemv kernel launch failed: ") + cudaGetErrorString(err);
  }
  return {};
}

}  // namespace jax_swiglu
