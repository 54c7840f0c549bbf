// A tensor-core form of the gemv kernel, for the probe only (not a product config): the
// same CTA shape and fixed-order sums as ffi/kernels/gemv_kernel.cuh, with the multiply on
// mma.sync m16n8k16 instead of FMAs, so the instructions per 16-byte load do not grow with
// the tokens (the CUDA-core form issues one FMA per weight and token, which bounds it at
// 4-8 tokens). bf16 and SiLU only.
//
// The mma's M side is 16 packed columns, its N side 8 tokens (a token tile), K 16 rows. A
// thread of mma group g (lane / 4) and quad lane q (lane % 4) loads, for each of its kChunks
// 16-byte chunks (packed columns 64 c + 8 g .. + 7 of the CTA's), rows 2 q, 2 q + 1, 2 q + 8
// and 2 q + 9 of each 16-row step. The A fragment pairs two K rows of one column per
// register: byte permutes build them; fragment row g is the chunk's column 2 i and row g + 8
// column 2 i + 1 (one mma per i = 0..3). x feeds the B fragment with the same K rows, and the
// accumulators come back as columns 2 i, 2 i + 1 for tokens 2 q, 2 q + 1: the thread ends with
// the sums of its own 8 columns. A K that is not a multiple of 16 leaves the last step's upper
// 8 rows out (they read as zeros).
#pragma once

#include "kernels/gemv_kernel.cuh"

namespace gemv_probe {

using jax_swiglu::Activation;
using jax_swiglu::GemvParams;
using jax_swiglu::kGateUpBlock;
using jax_swiglu::kGemvThreads;
using jax_swiglu::kGemvWarps;

inline constexpr int kMmaRows = 16;

__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <int kChunks, int kTokenTiles>
struct Step {
  uint4 weights[kChunks][4];   // rows 2 q, 2 q + 1, 2 q + 8, 2 q + 9
  uint32_t x[kTokenTiles][2];  // x[token][rows 2 q, 2 q + 1] and [rows 2 q + 8, 2 q + 9]
};

// kStreamOnly: the same loads with the multiply replaced by a bitwise fold of the weights
// (its output is not the product): the rate this access pattern streams at with no math.
template <int kTokenTiles, int kChunks, int kUnroll, int kMinBlocks, bool kStreamOnly = false>
__global__ void __launch_bounds__(kGemvThreads, kMinBlocks) GemvMmaKernel(GemvParams p) {
  constexpr int kTokens = 8 * kTokenTiles;
  constexpr int kColumns = 64 * kChunks;
  extern __shared__ float4 probe_shared[];
  float* shared = reinterpret_cast<float*>(probe_shared);  // [warp][token][column]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, quad = lane % 4;
  const int64_t block_column = int64_t(blockIdx.y) * kColumns;
  const auto* packed = static_cast<const uint16_t*>(p.packed);
  const auto* x = static_cast<const uint16_t*>(p.x);

  // Chunks are whole 64-column gate/up pairs: in or out of the matrix for the whole warp.
  bool has[kChunks];
  const uint16_t* chunk[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    has[c] = block_column + 64 * c < p.packed_columns;
    chunk[c] = packed + block_column + 64 * c + 8 * group + int64_t(2 * quad) * p.packed_columns;
  }
  bool has_token[kTokenTiles];
  const uint16_t* token_row[kTokenTiles];
#pragma unroll
  for (int tt = 0; tt < kTokenTiles; ++tt) {
    has_token[tt] = 8 * tt + group < p.m;
    token_row[tt] = x + int64_t(has_token[tt] ? 8 * tt + group : 0) * p.k + 2 * quad;
  }
  float acc[kChunks][4][kTokenTiles][4] = {};

  auto load = [&](int step, Step<kChunks, kTokenTiles>& s) {
    const int64_t row = int64_t(step) * kMmaRows;
    const bool upper = row + kMmaRows <= p.k;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if (!has[c]) continue;
      const uint16_t* base = chunk[c] + row * p.packed_columns;
      s.weights[c][0] = jax_swiglu::LoadWeights(base);
      s.weights[c][1] = jax_swiglu::LoadWeights(base + p.packed_columns);
      s.weights[c][2] = upper ? jax_swiglu::LoadWeights(base + 8 * p.packed_columns) : uint4{};
      s.weights[c][3] = upper ? jax_swiglu::LoadWeights(base + 9 * p.packed_columns) : uint4{};
    }
#pragma unroll
    for (int tt = 0; tt < kTokenTiles; ++tt) {
      const auto* words = reinterpret_cast<const uint32_t*>(token_row[tt] + row);
      s.x[tt][0] = has_token[tt] ? __ldg(words) : 0u;
      s.x[tt][1] = has_token[tt] && upper ? __ldg(words + 4) : 0u;
    }
  };
  auto multiply = [&](const Step<kChunks, kTokenTiles>& s) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if (!has[c]) continue;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t w0 = Word(s.weights[c][0], i), w1 = Word(s.weights[c][1], i);
        const uint32_t w8 = Word(s.weights[c][2], i), w9 = Word(s.weights[c][3], i);
        if constexpr (kStreamOnly) {
          acc[c][i][0][0] = __uint_as_float(__float_as_uint(acc[c][i][0][0]) ^ w0 ^ w1 ^ w8 ^ w9);
          continue;
        }
        const uint32_t a[4] = {__byte_perm(w0, w1, 0x5410), __byte_perm(w0, w1, 0x7632),
                               __byte_perm(w8, w9, 0x5410), __byte_perm(w8, w9, 0x7632)};
#pragma unroll
        for (int tt = 0; tt < kTokenTiles; ++tt) {
          if (8 * tt < p.m) MmaBf16(acc[c][i][tt], a, s.x[tt][0], s.x[tt][1]);
        }
      }
    }
  };

  const int steps = static_cast<int>((p.k + kMmaRows - 1) / kMmaRows);
  const int first = blockIdx.x * p.steps_per_split;
  const int last = min(steps, first + p.steps_per_split);
  int step = first + warp;
  for (; step + (kUnroll - 1) * kGemvWarps < last; step += kUnroll * kGemvWarps) {
    Step<kChunks, kTokenTiles> s[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load(step + u * kGemvWarps, s[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) multiply(s[u]);
  }
  for (; step < last; step += kGemvWarps) {
    Step<kChunks, kTokenTiles> s;
    load(step, s);
    multiply(s);
  }

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

  // The warps' sums in warp order, the cluster's in rank order (as the product kernel).
  namespace cg = cooperative_groups;
  const int tokens = min(p.m, kTokens);
  __syncthreads();
  for (int item = threadIdx.x; item < tokens * kColumns; item += kGemvThreads) {
    float v = shared[item];
#pragma unroll
    for (int w = 1; w < kGemvWarps; ++w) v += shared[w * kTokens * kColumns + item];
    shared[item] = v;
  }
  if (gridDim.x > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    if (blockIdx.x == 0) {
      for (int item = threadIdx.x; item < tokens * kColumns; item += kGemvThreads) {
        float v = shared[item];
        for (unsigned r = 1; r < gridDim.x; ++r) v += cluster.map_shared_rank(shared, r)[item];
        shared[item] = v;
      }
    }
    cluster.sync();
    if (blockIdx.x != 0) return;
  } else {
    __syncthreads();
  }
  // Gate and up 32 packed columns apart, quad-transposed runs (jax_swiglu/_layout.py).
  auto* out = static_cast<__nv_bfloat16*>(p.out);
  constexpr int kOutputs = kColumns / 2;
  for (int item = threadIdx.x; item < tokens * kOutputs; item += kGemvThreads) {
    const int t = item / kOutputs, o = item % kOutputs;
    const int pair = o / kGateUpBlock, position = o % kGateUpBlock;
    const int j = position / 8, q = (position % 8) / 2, e = position % 2;
    const int64_t n = int64_t(blockIdx.y) * kOutputs + pair * kGateUpBlock + 8 * q + 2 * j + e;
    if (n >= p.n) continue;
    const float gate = shared[t * kColumns + 2 * kGateUpBlock * pair + position];
    const float up = shared[t * kColumns + 2 * kGateUpBlock * pair + kGateUpBlock + position];
    out[int64_t(t) * p.n + n] =
        __float2bfloat16_rn(jax_swiglu::Activate<Activation::Silu, false>(gate) * up);
  }
}

// Launches the form on `p` with the product's grid: (splits, column blocks), one cluster per
// column block. Returns why not, or "".
template <int kTokenTiles, int kChunks, int kUnroll, int kMinBlocks, bool kStreamOnly = false>
std::string LaunchGemvMma(const jax_swiglu::SwigluProblem& p, const jax_swiglu::DeviceFacts&,
                          cudaStream_t stream) {
  constexpr int kColumns = 64 * kChunks;
  constexpr int kShared = kGemvWarps * 8 * kTokenTiles * kColumns * static_cast<int>(sizeof(float));
  auto* kernel = GemvMmaKernel<kTokenTiles, kChunks, kUnroll, kMinBlocks, kStreamOnly>;
  if (p.m > 8 * kTokenTiles) return "too many tokens";
  if (p.k % 8 != 0 || p.n_packed % kGateUpBlock != 0) return "K and N must be multiples of 8";
  const int steps = static_cast<int>((p.k + kMmaRows - 1) / kMmaRows);
  if ((p.splits != 1 && p.splits != 2 && p.splits != 4 && p.splits != 8) || p.splits > steps) {
    return "splits must be a cluster size of at most the 16-row steps";
  }
  static bool opted_in = false;  // the probe runs one device
  if (kShared > 48 * 1024 && !opted_in) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kShared) !=
        cudaSuccess) {
      return "cudaFuncSetAttribute failed";
    }
    opted_in = true;
  }
  GemvParams params{p.x, p.packed, p.out, static_cast<int>(p.m), static_cast<int>(p.n),
                    static_cast<int>(p.k), static_cast<int>(2 * p.n_packed),
                    (steps + p.splits - 1) / p.splits};
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = p.splits;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t launch{};
  const auto column_blocks = static_cast<unsigned>((2 * p.n_packed + kColumns - 1) / kColumns);
  launch.gridDim = dim3(p.splits, column_blocks, 1);
  launch.blockDim = dim3(kGemvThreads, 1, 1);
  launch.dynamicSmemBytes = kShared;
  launch.stream = stream;
  launch.attrs = &cluster;
  launch.numAttrs = p.splits > 1 ? 1 : 0;
  if (cudaError_t err = cudaLaunchKernelEx(&launch, kernel, params); err != cudaSuccess) {
    return std::string("launch failed: ") + cudaGetErrorString(err);
  }
  return {};
}

}  // namespace gemv_probe
