// The probe's launchers of the gemv kernel's mma.sync form (ffi/kernels/gemv_kernel.cuh) with
// unrolling and occupancy other than the product rows', and a stream-only kernel: the same
// loads with no math (its output is not the product), for the rate the access pattern allows.
// bf16 and SiLU only.
#pragma once

#include "kernels/gemv_kernel.cuh"

namespace gemv_probe {

using jax_swiglu::GemvParams;
using jax_swiglu::kGemvMmaRows;
using jax_swiglu::kGemvThreads;
using jax_swiglu::kGemvWarps;

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
          w[u][c][r] = has ? jax_swiglu::LoadWeights(base + (r % 2 + 8 * (r / 2)) *
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
  static std::mutex mutex;
  static std::set<int> opted_in;
  constexpr int kColumns = 64 * kChunks;
  if constexpr (kStreamOnly) {
    return jax_swiglu::LaunchGemvGrid(StreamOnlyKernel<kChunks, kUnroll, kMinBlocks>, 0, kColumns,
                                      kGemvMmaRows, p, facts, stream, mutex, opted_in);
  } else {
    constexpr int kShared = kGemvWarps * 8 * kTokenTiles * kColumns * int(sizeof(float));
    return jax_swiglu::LaunchGemvGrid(
        jax_swiglu::GemvMmaKernel<kTokenTiles, kChunks, jax_swiglu::BF16,
                                  jax_swiglu::Activation::Silu, kUnroll, kMinBlocks>,
        kShared, kColumns, kGemvMmaRows, p, facts, stream, mutex, opted_in);
  }
}

}  // namespace gemv_probe
