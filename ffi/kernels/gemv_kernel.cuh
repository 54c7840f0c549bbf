// The fused kernel for a few tokens (decode): act(x @ W_gate) * (x @ W_up) as a GEMV that
// streams the packed weights once, with no wgmma, no TMA and no workspace. Two forms share the
// split of K over a cluster and the order of the sums: the CUDA-core form (CudaCores rows:
// FMAs) and the tensor-core form (MmaSync rows: warp-level mma.sync, GemvMmaKernel below).
//
// At M <= 8 a call is a stream of the packed [K, 2N] weights; what decides its time is how
// many bytes are in flight on every SM and how little the launch costs around the stream.
// A CUDA-core CTA owns 256 packed columns (one warp's row of 16-byte loads: 512 bytes of
// each weight row) and one of `splits` equal ranges of K; its 8 warps take the range's
// 8-row steps in turn. Each thread keeps fp32 sums of its 8 packed columns for every token.
// The sums meet in a fixed order, so the result is bitwise the same on every call:
//  1. within a thread, over its rows in K order;
//  2. within the CTA, over the 8 warps in warp order (shared memory);
//  3. over the splits, which are one thread-block cluster: CTA 0 adds the others' sums from
//     their shared memory (distributed shared memory), in rank order.
// CTA 0 then pairs each gate sum with its up sum (32 packed columns apart in the packed
// layout, jax_swiglu/_layout.py), applies the activation in fp32 and rounds once. Nothing
// is allocated, synchronized with the host, or written outside `out`.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <set>
#include <string>

#include "../kernel_configs.h"
#include "../launch.h"
#include "swiglu_epilogue.cuh"

namespace jax_swiglu {

inline constexpr int kGemvWarps = 8;
inline constexpr int kGemvThreads = 32 * kGemvWarps;
// Packed columns per CTA: 32 lanes x 8 two-byte columns (16 bytes each).
inline constexpr int kGemvColumns = 256;
// K rows per step of a warp.
inline constexpr int kGemvRows = 8;
// Cluster sizes a split may have (the portable maximum is 8).
inline constexpr int kGemvMaxSplits = 8;

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
  // d += a (16 x 16, row-major) * b (16 x 8, column-major), fp32 accumulators.
  static __device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
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
  static __device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
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
  const void* packed;  // [k, packed_columns]; the fp8 form's is [packed_columns, k]
  void* out;           // [m, n]
  int m, n, k;
  int packed_columns;  // 2 * n_packed
  int steps_per_split;  // steps of K per split
  // The fp8 form only (launch.h): x row t's scale, packed column c's w_scale[c * stride].
  const float* x_scale;
  const float* w_scale;
  int w_scale_stride;
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

// Steps 2 and 3 and the store, for every form: `shared` holds every warp's fp32 sums as
// [warp][token][column] (kTokens token slots, kColumns packed columns; written before the
// call). The thread that owns a column adds the warps' sums in warp order, CTA 0 of the
// cluster (`split` of `splits`) adds the other CTAs' in rank order, and it pairs each gate
// sum with its up sum (kScaled, the fp8 form: each first times its token's scale, then its
// packed column's, as the tokens-on-M fp8 epilogue does), applies the activation in fp32
// and rounds once to `Tag`.
template <int kTokens, int kColumns, class Tag, Activation kActivation, bool kScaled = false>
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
    float gate = shared[t * kColumns + column];
    float up = shared[t * kColumns + kGateUpBlock + column];
    if constexpr (kScaled) {
      const float x_scale = __ldg(p.x_scale + t);
      const int64_t packed = int64_t(blockIdx.y) * kColumns + column;
      gate = gate * x_scale * __ldg(p.w_scale + packed * p.w_scale_stride);
      up = up * x_scale * __ldg(p.w_scale + (packed + kGateUpBlock) * p.w_scale_stride);
    }
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

  // 2. The warps' sums, added in warp order by the thread that owns each column.
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    float4* row = reinterpret_cast<float4*>(shared + (warp * kTokens + t) * kGemvColumns + 8 * lane);
    row[0] = make_float4(sums[t][0], sums[t][1], sums[t][2], sums[t][3]);
    row[1] = make_float4(sums[t][4], sums[t][5], sums[t][6], sums[t][7]);
  }
  GemvReduceAndStore<kTokens, kGemvColumns, Tag, kActivation>(p, shared, split, splits);
}

// The tensor-core form (MmaSync rows): mma.sync m16n8k16 with 16 packed columns on its M
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

// kUnroll and kMinBlocks are the rows' (GemvMmaUnroll, two CTAs an SM); the research probe
// (benchmarks/research/gemv_probe/) times others.
template <int kTokenTiles, int kChunks, class Tag, Activation kActivation,
          int kUnroll = GemvMmaUnroll(kTokenTiles), int kMinBlocks = 2>
__global__ void __launch_bounds__(kGemvThreads, kMinBlocks) GemvMmaKernel(GemvParams p) {
  using E = GemvElement<Tag>;
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
          if (8 * tt < p.m) E::Mma(acc[c][i][tt], a, s.x[tt][0], s.x[tt][1]);
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

  GemvReduceAndStore<kTokens, kColumns, Tag, kActivation>(p, shared, blockIdx.x, gridDim.x);
}

// The fp8 form (the fp8 table's MmaSync rows): e4m3 x_q and packed weights, both K-major as
// the fp8 kernel takes them (x_q [M, K], packed [2 N', K]), on mma.sync m16n8k32 (16 packed
// columns by 8 tokens by 32 of K), 64 of K a warp step. A thread of group g and quad lane q
// loads, for each 16-column tile of its chunks, bytes 16 q .. 16 q + 15 of the step from
// packed columns g and g + 8 of the tile, and the same bytes of token g's x_q: the two
// mma of a step take 8 of those bytes each, 4 as the fragments' low k and 4 as their high
// k. That is a permutation of K, the same for both operands, so the products are those of
// W^T x with no byte permutes (SM90 has no fp8 mma.sync of its own: ptxas turns each into
// conversions to f16 and two f16 mma, exact for e4m3). Each mma starts from zero and its
// result is added to the fp32 sums (a promotion after every mma: the tensor cores add only
// 32 products at less than fp32 precision). The sums meet as in the other forms, and the
// store applies the scales before the activation. K is a multiple of 16: a thread's 16
// bytes are all in K or all past it (read as zeros).
inline constexpr int kGemvFp8Rows = 64;

template <int kChunks, int kTokenTiles>
struct GemvFp8Step {
  uint4 weights[kChunks][4][2];  // tile i: columns g and g + 8, 16 bytes of K each
  uint4 x[kTokenTiles];          // token 8 tt + g, the same 16 bytes of K
};

// d = a (16 x 32 e4m3, row-major) * b (32 x 8 e4m3, column-major), fp32, from zero.
__device__ __forceinline__ void MmaFp8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

template <int kTokenTiles, int kChunks, class OutputTag, Activation kActivation,
          int kUnroll = GemvMmaUnroll(kTokenTiles), int kMinBlocks = 2>
__global__ void __launch_bounds__(kGemvThreads, kMinBlocks) GemvFp8Kernel(GemvParams p) {
  constexpr int kTokens = 8 * kTokenTiles;
  constexpr int kColumns = 64 * kChunks;
  extern __shared__ float4 gemv_shared[];
  float* shared = reinterpret_cast<float*>(gemv_shared);  // [warp][token][column]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, quad = lane % 4;
  const int64_t block_column = int64_t(blockIdx.y) * kColumns;
  const auto* packed = static_cast<const uint8_t*>(p.packed);
  const auto* x = static_cast<const uint8_t*>(p.x);
  const int64_t tile_stride = int64_t(16) * p.k;  // 16 packed columns of K bytes

  // Chunks are whole 64-column gate/up pairs (2N' % 64 == 0): in or out for the whole warp.
  bool has[kChunks];
  const uint8_t* chunk[kChunks];  // column g of the chunk's tile 0, at this thread's bytes
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    has[c] = block_column + 64 * c < p.packed_columns;
    chunk[c] = has[c] ? packed + (block_column + 64 * c + group) * p.k + 16 * quad
                      : packed;  // never read
  }
  bool has_token[kTokenTiles];
  const uint8_t* token_row[kTokenTiles];
#pragma unroll
  for (int tt = 0; tt < kTokenTiles; ++tt) {
    has_token[tt] = 8 * tt + group < p.m;
    token_row[tt] = x + int64_t(has_token[tt] ? 8 * tt + group : 0) * p.k + 16 * quad;
  }
  float acc[kChunks][4][kTokenTiles][4] = {};

  auto load = [&](int step, GemvFp8Step<kChunks, kTokenTiles>& s) {
    const int64_t offset = int64_t(step) * kGemvFp8Rows;
    const bool inside = offset + 16 * quad + 16 <= p.k;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if (!has[c]) continue;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint8_t* column = chunk[c] + i * tile_stride + offset;
        s.weights[c][i][0] = inside ? LoadWeights(column) : uint4{};
        s.weights[c][i][1] = inside ? LoadWeights(column + int64_t(8) * p.k) : uint4{};
      }
    }
#pragma unroll
    for (int tt = 0; tt < kTokenTiles; ++tt) {
      s.x[tt] = has_token[tt] && inside
                    ? __ldg(reinterpret_cast<const uint4*>(token_row[tt] + offset))
                    : uint4{};
    }
  };
  auto multiply = [&](const GemvFp8Step<kChunks, kTokenTiles>& s) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if (!has[c]) continue;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint4& low = s.weights[c][i][0];   // column g
        const uint4& high = s.weights[c][i][1];  // column g + 8
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const uint32_t a[4] = {Word(low, 2 * j), Word(high, 2 * j), Word(low, 2 * j + 1),
                                 Word(high, 2 * j + 1)};
#pragma unroll
          for (int tt = 0; tt < kTokenTiles; ++tt) {
            if (8 * tt >= p.m) continue;  // uniform over the CTA
            float d[4];
            MmaFp8(d, a, Word(s.x[tt], 2 * j), Word(s.x[tt], 2 * j + 1));
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[c][i][tt][e] += d[e];
          }
        }
      }
    }
  };

  ForEachGemvStep<GemvFp8Step<kChunks, kTokenTiles>, kUnroll>(p, kGemvFp8Rows, warp, load,
                                                               multiply);

  // Accumulator e of (c, i, tt): packed column 64 c + 16 i + g (+ 8 for e >= 2), token
  // 8 tt + 2 q + e % 2.
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int tt = 0; tt < kTokenTiles; ++tt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int column = 64 * c + 16 * i + group + 8 * (e / 2);
          const int token = 8 * tt + 2 * quad + e % 2;
          shared[(warp * kTokens + token) * kColumns + column] = acc[c][i][tt][e];
        }

  GemvReduceAndStore<kTokens, kColumns, OutputTag, kActivation, /*kScaled=*/true>(
      p, shared, blockIdx.x, gridDim.x);
}

// Every warp's fp32 sums of every token and packed column of the CTA.
constexpr int GemvSharedBytes(const KernelConfig& config) {
  return kGemvWarps * config.tile_m * config.tile_n * static_cast<int>(sizeof(float));
}

// Why `p` cannot run on `config` (a gemv row, `name` in messages; K a multiple of
// `k_multiple`), or "" if it can.
inline std::string GemvLaunchError(const KernelConfig& config, const std::string& name,
                                   int k_multiple, const SwigluProblem& p) {
  if (p.m > config.tile_m) {
    return name + " runs at most " + std::to_string(config.tile_m) + " tokens (got M=" +
           std::to_string(p.m) + ")";
  }
  if (p.k % k_multiple != 0 || p.n_packed % kGateUpBlock != 0) {
    return name + " needs K a multiple of " + std::to_string(k_multiple) +
           " and the padded N a multiple of 32 (got K=" + std::to_string(p.k) + ", N'=" +
           std::to_string(p.n_packed) + ")";
  }
  const int steps = static_cast<int>((p.k + config.tile_k - 1) / config.tile_k);
  if (p.splits != 1 && p.splits != 2 && p.splits != 4 && p.splits != kGemvMaxSplits) {
    return name + " splits K over a cluster of 1, 2, 4 or 8 CTAs (got splits=" +
           std::to_string(p.splits) + ")";
  }
  if (p.splits > steps) {
    return name + " cannot split K=" + std::to_string(p.k) + " " + std::to_string(p.splits) +
           " ways (a step of " + std::to_string(config.tile_k) + " rows per split at least)";
  }
  for (const void* ptr : {p.x, p.packed, static_cast<const void*>(p.out)}) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return name + " needs 16-byte aligned buffers";
  }
  return {};
}

// The kernel of gemv config `ConfigId`: its form, with the row's tokens and columns.
template <int ConfigId, class ElementTag, Activation kActivation>
constexpr auto GemvKernelOf() {
  constexpr KernelConfig config = kGemvConfigs[ConfigId];
  if constexpr (config.schedule == Schedule::MmaSync) {
    return GemvMmaKernel<config.tile_m / 8, config.tile_n / 64, ElementTag, kActivation>;
  } else {
    return GemvSwigluKernel<config.tile_m, ElementTag, kActivation>;
  }
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
                    (steps + p.splits - 1) / p.splits, p.x_scale, p.w_scale,
                    p.w_scale_stride};
  const int column_blocks = static_cast<int>((2 * p.n_packed + columns - 1) / columns);
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = p.splits;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t launch{};
  launch.gridDim = dim3(p.splits, column_blocks, 1);
  launch.blockDim = dim3(kGemvThreads, 1, 1);
  launch.dynamicSmemBytes = shared_bytes;
  launch.stream = stream;
  launch.attrs = &cluster;
  launch.numAttrs = p.splits > 1 ? 1 : 0;
  if (cudaError_t err = cudaLaunchKernelEx(&launch, kernel, params); err != cudaSuccess) {
    return std::string("gemv kernel launch failed: ") + cudaGetErrorString(err);
  }
  return {};
}

template <int ConfigId, class ElementTag, Activation kActivation>
std::string LaunchGemv(const SwigluProblem& p, const DeviceFacts& facts, cudaStream_t stream) {
  constexpr KernelConfig config = kGemvConfigs[ConfigId];
  static_assert(config.schedule == Schedule::MmaSync ||
                    (config.tile_n == kGemvColumns && config.tile_k == kGemvRows),
                "the CUDA-core form's CTA is one warp's row of loads, 8 rows a step");
  if (std::string err = GemvLaunchError(config, "gemv config " + std::to_string(ConfigId),
                                        kGemvRows, p);
      !err.empty()) {
    return err;
  }
  static std::mutex opt_in_mutex;
  static std::set<int> opted_in;
  return LaunchGemvGrid(GemvKernelOf<ConfigId, ElementTag, kActivation>(),
                        GemvSharedBytes(config), config.tile_n, config.tile_k, p, facts, stream,
                        opt_in_mutex, opted_in);
}

// The fp8 table's gemv rows (`OutputTag` is the output's; x_q and packed are e4m3, their
// scales in `p`). K is a multiple of 16: 16-byte rows of fp8.
template <int ConfigId, class OutputTag, Activation kActivation>
std::string LaunchFp8Gemv(const SwigluProblem& p, const DeviceFacts& facts,
                          cudaStream_t stream) {
  constexpr KernelConfig config = kFp8Configs[ConfigId];
  static_assert(config.schedule == Schedule::MmaSync && config.tile_k == kGemvFp8Rows,
                "the fp8 gemv form is mma.sync over 64-byte steps of K");
  if (std::string err = GemvLaunchError(config, "fp8 config " + std::to_string(ConfigId), 16,
                                        p);
      !err.empty()) {
    return err;
  }
  static std::mutex opt_in_mutex;
  static std::set<int> opted_in;
  return LaunchGemvGrid(GemvFp8Kernel<config.tile_m / 8, config.tile_n / 64, OutputTag,
                                      kActivation>,
                        GemvSharedBytes(config), config.tile_n, config.tile_k, p, facts, stream,
                        opt_in_mutex, opted_in);
}

// The gemv kernel needs no workspace.
template <int ConfigId, class ElementTag, Activation kActivation>
size_t GemvWorkspaceBytes(const SwigluProblem&, const DeviceFacts&) {
  return 0;
}

}  // namespace jax_swiglu
