// The gemv kernel's tensor-core form on mma.sync (measured slower than the product's
// CUDA-core form and cuBLAS: benchmarks/results/NVIDIA_H200/2026-12-01-gemv-probe.md), with
// the unrolling and occupancy the probe varies, and a stream-only kernel: the same loads with
// no math (its output is not the product), for the rate the access pattern allows. The CTA,
// its split of K and the order of the sums are the product's (ffi/kernels/gemv/
// gemv_kernel.cuh, whose reduction and store it calls). bf16 and f16 inputs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/gemv/gemv_kernel.cuh"

namespace gemv_probe {

using jax_swiglu::Activation;
using jax_swiglu::GemvParams;
using jax_swiglu::kGemvThreads;
using jax_swiglu::kGemvWarps;
using jax_swiglu::LoadWeights;

// d += a (16 x 16, row-major) * b (16 x 8, column-major), fp32 accumulators.
template <class Tag>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<Tag, jax_swiglu::BF16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// The tensor-core form: mma.sync m16n8k16 with 16 packed columns on its M
// side, 8 tokens (a token tile) on its N side and 16 rows of K a step, so the multiply costs
// a few instructions per 16-byte load however many tokens there are. The CTA, its split of
// K and the order of the sums are the CUDA-core form's; only the columns per CTA (tile_n, in
// 64-column chunks) and the step differ.
//
// A thread of mma group g (lane / 4) and quad lane q (lane % 4) loads, for each chunk c
// (packed columns 64 c + 8 g .. + 7 of the CTA's), rows 2 q, 2 q + 1, 2 q + 8 and 2 q + 9 of
// the step. The A fragment pairs two rows of one column per register: byte permutes build
// them, fragment row g being the chunk's column 2 i and row g + 8 column 2 i + 1 (one mma per
// i = 0..3). x feeds the B fragment with the same rows, and the accumulators come back as
// columns 2 i, 2 i + 1 for tokens 2 q, 2 q + 1: the thread ends with its own 8 columns. A K
// that is not a multiple of 16 leaves the last step's upper 8 rows out (read as zeros).
inline constexpr int kGemvMmaRows = 16;

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <int kChunks, int kTokenTiles>
struct GemvMmaStep {
  uint4 weights[kChunks][4];   // rows 2 q, 2 q + 1, 2 q + 8, 2 q + 9
  uint32_t x[kTokenTiles][2];  // a token's rows 2 q, 2 q + 1, and 2 q + 8, 2 q + 9
};

// A warp's steps (`rows` of K each) of its CTA's split of K, every kGemvWarps-th from `warp`
// on, for the tensor-core forms: `load(step, s)` fills a `Step` of registers and
// `multiply(s)` uses it, with kUnroll steps' loads in flight before their multiplies.
template <class Step, int kUnroll, class Load, class Multiply>
__device__ __forceinline__ void ForEachGemvStep(const GemvParams& p, int rows, int warp,
                                                Load&& load, Multiply&& multiply) {
  const int steps = static_cast<int>((int64_t(p.k) + rows - 1) / rows);
  const int first = blockIdx.x * p.steps_per_split;
  const int last = min(steps, first + p.steps_per_split);
  int step = first + warp;
  for (; step + (kUnroll - 1) * kGemvWarps < last; step += kUnroll * kGemvWarps) {
    Step s[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load(step + u * kGemvWarps, s[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) multiply(s[u]);
  }
  for (; step < last; step += kGemvWarps) {
    Step s;
    load(step, s);
    multiply(s);
  }
}

// More token tiles keep more accumulators: one step in flight instead of two, so every row
// fits two CTAs an SM (128 registers a thread).
constexpr int GemvMmaUnroll(int token_tiles) { return token_tiles == 1 ? 2 : 1; }

// kUnroll and kMinBlocks: steps in flight, CTAs an SM (by default GemvMmaUnroll and two).
template <int kTokenTiles, int kChunks, class Tag, Activation kActivation,
          int kUnroll = GemvMmaUnroll(kTokenTiles), int kMinBlocks = 2>
__global__ void __launch_bounds__(kGemvThreads, kMinBlocks) GemvMmaKernel(GemvParams p) {
  constexpr int kTokens = 8 * kTokenTiles;
  constexpr int kColumns = 64 * kChunks;
  extern __shared__ float4 gemv_shared[];
  float* shared = reinterpret_cast<float*>(gemv_shared);  // [warp][token][column]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, quad = lane % 4;
  const int64_t block_column = int64_t(blockIdx.y) * kColumns;
  const auto* packed = static_cast<const uint16_t*>(p.packed);
  const auto* x = static_cast<const uint16_t*>(p.x);

  // Chunks are whole 64-column gate/up pairs (2N' % 64 == 0): in or out for the whole warp.
  bool has[kChunks];
  const uint16_t* chunk[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    has[c] = block_column + 64 * c < p.packed_columns;
    chunk[c] = has[c] ? packed + block_column + 64 * c + 8 * group +
                            int64_t(2 * quad) * p.packed_columns
                      : packed;  // never read
  }
  bool has_token[kTokenTiles];
  const uint16_t* token_row[kTokenTiles];
#pragma unroll
  for (int tt = 0; tt < kTokenTiles; ++tt) {
    has_token[tt] = 8 * tt + group < p.m;
    token_row[tt] = x + int64_t(has_token[tt] ? 8 * tt + group : 0) * p.k + 2 * quad;
  }
  float acc[kChunks][4][kTokenTiles][4] = {};

  auto load = [&](int step, GemvMmaStep<kChunks, kTokenTiles>& s) {
    const int64_t row = int64_t(step) * kGemvMmaRows;
    const bool upper = row + kGemvMmaRows <= p.k;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if (!has[c]) continue;
      const uint16_t* base = chunk[c] + row * p.packed_columns;
      s.weights[c][0] = LoadWeights(base);
      s.weights[c][1] = LoadWeights(base + p.packed_columns);
      s.weights[c][2] = upper ? LoadWeights(base + 8 * p.packed_columns) : uint4{};
      s.weights[c][3] = upper ? LoadWeights(base + 9 * p.packed_columns) : uint4{};
    }
#pragma unroll
    for (int tt = 0; tt < kTokenTiles; ++tt) {
      const auto* words = reinterpret_cast<const uint32_t*>(token_row[tt] + row);
      s.x[tt][0] = has_token[tt] ? __ldg(words) : 0u;
      s.x[tt][1] = has_token[tt] && upper ? __ldg(words + 4) : 0u;
    }
  };
  auto multiply = [&](const GemvMmaStep<kChunks, kTokenTiles>& s) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if (!has[c]) continue;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t w0 = Word(s.weights[c][0], i), w1 = Word(s.weights[c][1], i);
        const uint32_t w8 = Word(s.weights[c][2], i), w9 = Word(s.weights[c][3], i);
        const uint32_t a[4] = {__byte_perm(w0, w1, 0x5410), __byte_perm(w0, w1, 0x7632),
                               __byte_perm(w8, w9, 0x5410), __byte_perm(w8, w9, 0x7632)};
#pragma unroll
        for (int tt = 0; tt < kTokenTiles; ++tt) {
          if (8 * tt < p.m) Mma<Tag>(acc[c][i][tt], a, s.x[tt][0], s.x[tt][1]);
        }
      }
    }
  };

  ForEachGemvStep<GemvMmaStep<kChunks, kTokenTiles>, kUnroll>(p, kGemvMmaRows, warp, load,
                                                               multiply);

#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int tt = 0; tt < kTokenTiles; ++tt)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int column = 64 * c + 8 * group + 2 * i + j / 2;
          const int token = 8 * tt + 2 * quad + j % 2;
          shared[(warp * kTokens + token) * kColumns + column] = acc[c][i][tt][j];
        }

  jax_swiglu::ReduceSplitsAndStore<kTokens, kColumns, kGemvWarps, kGemvThreads, kColumns, Tag,
                                   kActivation>(p, shared, blockIdx.x, gridDim.x);
}
// Each thread loads the mma form's rows of its chunks and folds the words together; one
// float per thread goes out (to `out`, which must hold a float per thread of the grid).
template <int kChunks, int kUnroll, int kMinBlocks>
__global__ void __launch_bounds__(kGemvThreads, kMinBlocks) StreamOnlyKernel(GemvParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, quad = lane % 4;
  const int64_t block_column = int64_t(blockIdx.y) * 64 * kChunks;
  const auto* packed = static_cast<const uint16_t*>(p.packed);
  uint32_t fold = 0;
  const int steps = static_cast<int>((p.k + kGemvMmaRows - 1) / kGemvMmaRows);
  const int first = blockIdx.x * p.steps_per_split;
  const int last = min(steps, first + p.steps_per_split);
  for (int step = first + warp; step < last; step += kUnroll * kGemvWarps) {
    uint4 w[kUnroll][kChunks][4];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t row = int64_t(step + u * kGemvWarps) * kGemvMmaRows;
      const bool inside = step + u * kGemvWarps < last && row + kGemvMmaRows <= p.k;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const bool has = inside && block_column + 64 * c < p.packed_columns;
        const uint16_t* base = packed + block_column + 64 * c + 8 * group +
                               (row + 2 * quad) * p.packed_columns;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          w[u][c][r] = has ? LoadWeights(base + (r % 2 + 8 * (r / 2)) *
                                                                 int64_t(p.packed_columns))
                           : uint4{};
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          fold ^= w[u][c][r].x ^ w[u][c][r].y ^ w[u][c][r].z ^ w[u][c][r].w;
        }
  }
  const int64_t block = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
  const int64_t thread = block * kGemvThreads + threadIdx.x;
  static_cast<uint32_t*>(p.out)[thread] = fold;
}

template <int kTokenTiles, int kChunks, int kUnroll, int kMinBlocks, bool kStreamOnly = false>
std::string LaunchGemvMma(const jax_swiglu::SwigluProblem& p,
                          const jax_swiglu::DeviceFacts& facts, cudaStream_t stream) {
  if (p.m > 8 * kTokenTiles) return "too many tokens";
  if (p.k % 8 != 0 || p.n_packed % jax_swiglu::kGateUpBlock != 0) return "K, N not multiples of 8";
  const int steps = static_cast<int>((p.k + kGemvMmaRows - 1) / kGemvMmaRows);
  if ((p.splits != 1 && p.splits != 2 && p.splits != 4 && p.splits != 8) || p.splits > steps) {
    return "splits must be a cluster size of at most the 16-row steps";
  }
  constexpr int kColumns = 64 * kChunks;
  const GemvParams params = jax_swiglu::MakeGemvParams(p, kGemvMmaRows);
  if constexpr (kStreamOnly) {
    return jax_swiglu::LaunchClusterSplitKGrid(StreamOnlyKernel<kChunks, kUnroll, kMinBlocks>,
                                               params, kGemvThreads, 0, kColumns, p, facts,
                                               stream);
  } else {
    constexpr int kShared = kGemvWarps * 8 * kTokenTiles * kColumns * int(sizeof(float));
    auto* kernel = GemvMmaKernel<kTokenTiles, kChunks, jax_swiglu::BF16, Activation::Silu,
                                 kUnroll, kMinBlocks>;
    if (std::string err = jax_swiglu::EnsureSharedMemoryLimit(
            reinterpret_cast<const void*>(kernel), kShared, facts.device);
        !err.empty()) {
      return err;
    }
    return jax_swiglu::LaunchClusterSplitKGrid(kernel, params, kGemvThreads, kShared, kColumns, p,
                                               facts, stream);
  }
}

}  // namespace gemv_probe
