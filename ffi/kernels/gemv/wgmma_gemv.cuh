// The decode kernel on the tensor cores: swap-AB wgmma over a CTA's share of K, fed by TMA
// through a pipeline in shared memory, K split over a thread-block cluster whose sums meet in
// distributed shared memory (split_k_store.cuh): no workspace, no memset, no fixup in global
// memory, one kernel per call.
//
// The CUDA-core form loads the weights into registers and is bound by the bytes its threads
// keep in flight; a stream of TMA boxes into a deep pipeline keeps more of them in flight per
// SM with one issuing thread, and the tensor cores make the multiply cost the same for 1 and
// 16 tokens. A CTA owns kColumns packed columns (blockIdx.y) and one of `splits` equal ranges
// of K's tiles of 128 bytes a row (blockIdx.x, its rank in the cluster: 64 rows of 16-bit
// operands, 128 of e4m3). Its warps 0-3 are one math warpgroup: the packed columns on the
// wgmma M side (the weights as stored: 16-bit MN-major, e4m3 K-major, which SM90's fp8 wgmma
// needs), the tokens on its N side (x K-major; rows past M read as zeros), fp32
// accumulators; warp 4 issues the loads. With e4m3 operands the tensor cores' sums are
// promoted into fp32 ones every `promotion` wgmma, as in the fp8 GEMM kernels. Two CTAs fit
// on an SM (their stages sized for it), so a grid of up to twice the SM count runs in one
// wave. At the end the accumulators go to shared memory as [token][column] and meet in rank
// order over the cluster; CTA 0 scales (e4m3), pairs, activates and stores (kGated), or
// stores each column's sum (a plain projection).
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/cuda_host_adapter.hpp>
#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>
#include <string>

#include "../../kernel_configs.h"
#include "../../launch.h"
#include "../launch_gemm.cuh"
#include "gemv_kernel.cuh"
#include "split_k_store.cuh"

namespace jax_swiglu {

// The shared-memory budget of one CTA when `ctas_per_sm` share an SM (228 KB an SM, 1 KB of
// it reserved per CTA).
constexpr int WgmmaGemvSharedBudget(int ctas_per_sm) {
  return 228 * 1024 / ctas_per_sm - 1024;
}
inline constexpr int kWgmmaGemvMathThreads = 128;  // one warpgroup
inline constexpr int kWgmmaGemvThreads = kWgmmaGemvMathThreads + 32;  // + the load warp
// One TMA box of the 16-bit weights: 64 packed columns (128 bytes, the 128-byte swizzle's
// row) by 64 rows of K, one MN-major swizzled block of a stage. The e4m3 weights' box is a
// stage's whole tile: its kColumns rows of 128 bytes of K.
inline constexpr int kWgmmaGemvBoxColumns = 64;
// x as TMA reads it: (tokens, K), K-contiguous.
template <class Element>
auto WgmmaGemvX(const Element* x, int m, int k) {
  return cute::make_tensor(cute::make_gmem_ptr(x),
                           cute::make_layout(cute::make_shape(m, k),
                                             cute::make_stride(k, cute::_1{})));
}

// The tensor-core form's types for `kTokens` tokens, `kColumns` packed columns and `Tag`
// output, on operands of that type or (kFp8) e4m3.
template <int kTokens, int kColumns, class Tag, bool kFp8, int kCtasPerSm>
struct WgmmaGemv {
  using Element =
      cute::conditional_t<kFp8, cutlass::float_e4m3_t, typename CutlassElement<Tag>::type>;
  static constexpr int kTileK = 128 / static_cast<int>(sizeof(Element));  // 128 bytes a row
  static constexpr auto kWeightsMajor = kFp8 ? cute::GMMA::Major::K : cute::GMMA::Major::MN;
  using Columns = cute::Int<kColumns>;
  using Tokens = cute::Int<kTokens>;
  using TileK = cute::Int<kTileK>;

  static constexpr int kSharedBudget = WgmmaGemvSharedBudget(kCtasPerSm);
  static constexpr int kStageBytes =
      (kColumns + kTokens) * kTileK * static_cast<int>(sizeof(Element));
  // As many stages as kCtasPerSm CTAs an SM leave room for (the barriers take a few bytes).
  static constexpr int kStages =
      (kSharedBudget - 256) / kStageBytes < 8 ? (kSharedBudget - 256) / kStageBytes : 8;
  static_assert(kStages >= 2, "a pipeline of at least two stages");

  // 16-bit weights: 64-column atoms of 128 bytes (MN-major, 128-byte swizzle), stacked along
  // K first so a stage is kColumns / 64 contiguous TMA boxes of 64 columns x 64 rows, each
  // laid out as the box's 128-byte swizzle writes it. e4m3 weights: K-major atoms of 8
  // columns x 128 bytes stacked along the columns, as one box of the stage's tile writes
  // them. x: K-major atoms of 8 tokens x 128 bytes.
  using SmemLayoutW = cute::conditional_t<
      kFp8,
      decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<Element>{},
                                   cute::make_shape(Columns{}, TileK{}, cute::Int<kStages>{}))),
      decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<Element>{},
                                   cute::make_shape(Columns{}, TileK{}, cute::Int<kStages>{}),
                                   cute::Step<cute::_2, cute::_1, cute::_3>{}))>;
  using SmemLayoutX = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<Element>{},
      cute::make_shape(Tokens{}, TileK{}, cute::Int<kStages>{})));
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<Columns, Tokens, TileK>,
                                 kWeightsMajor, cute::GMMA::Major::K>()));
  // wgmma instructions (32 of K each for e4m3) per k tile: promotion intervals count them.
  static constexpr int kWgmmaPerTile = kTileK / 32;

  // x's copy (WgmmaGemvX). The weights' descriptor is encoded by hand
  // (EncodeWgmmaGemvWeights) for its L2 promotion, which CuTe fixes at 128 bytes.
  using TmaX = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{}, WgmmaGemvX(static_cast<const Element*>(nullptr), 0, 0),
      SmemLayoutX{}(cute::_, cute::_, 0)));

  // Sums as [token][column], rows padded by 4 floats so the accumulators' stores (4 tokens
  // per quad, 8 columns per lane group) fall in distinct banks.
  static constexpr int kSumStride = kColumns + 4;

  struct SharedStorage {
    // The stages; after the mainloop the sums reuse the weights' part.
    alignas(1024) Element w[cute::cosize_v<SmemLayoutW>];
    alignas(1024) Element x[cute::cosize_v<SmemLayoutX>];
    alignas(8) uint64_t full[kStages];
    alignas(8) uint64_t empty[kStages];
  };
  static_assert(kTokens * kSumStride * sizeof(float) <=
                    sizeof(Element) * cute::cosize_v<SmemLayoutW>,
                "the sums fit in the weights' stages");
  static constexpr int kSharedBytes = static_cast<int>(sizeof(SharedStorage));
  static_assert(kSharedBytes <= kSharedBudget, "kCtasPerSm CTAs an SM");

  struct Params {
    cute::TmaDescriptor w;  // the weights as stored, in the stage's boxes (EncodeWgmmaGemvWeights)
    TmaX tma_x;
    GemvParams gemv;  // steps_per_split counts k tiles (kTileK rows)
  };
};

// The weights' TMA descriptor in the 128-byte swizzle, reads promoted to
// `l2_promotion_bytes` L2 lines: 16-bit (packed columns, K) with K's rows `columns` apart,
// boxes of 64 columns x 64 rows; e4m3 (K, packed columns) with the columns' rows K apart,
// boxes of 128 of K x `box_columns` columns.
template <class Element>
std::string EncodeWgmmaGemvWeights(cute::TmaDescriptor* desc, const Element* w, int columns,
                                   int k, int l2_promotion_bytes, int box_columns) {
  constexpr bool kKMajor = sizeof(Element) == 1;
  const cuuint64_t inner = static_cast<cuuint64_t>(kKMajor ? k : columns);
  const cuuint64_t outer = static_cast<cuuint64_t>(kKMajor ? columns : k);
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t row_bytes[1] = {inner * sizeof(Element)};
  const cuuint32_t box[2] = {kKMajor ? 128u : static_cast<cuuint32_t>(kWgmmaGemvBoxColumns),
                             kKMajor ? static_cast<cuuint32_t>(box_columns) : 64u};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUtensorMapL2promotion promotion = l2_promotion_bytes == 256
                                               ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                                               : CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
  const CUresult result = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      desc, cute::TMA::to_CUtensorMapDataType<Element>(), 2, const_cast<Element*>(w), dims,
      row_bytes, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    return "the tensor-core gemv's weight descriptor failed to encode (CUresult " +
           std::to_string(static_cast<int>(result)) + ")";
  }
  return {};
}

// `a` if kFirst, else `b` (two tensors of different types).
template <bool kFirst, class A, class B>
CUTLASS_DEVICE auto& FirstIf(A& a, B& b) {
  if constexpr (kFirst) {
    return a;
  } else {
    return b;
  }
}

// kCtasPerSm sizes the stages; kEvictFirst marks the weights' boxes evict-first in the L2
// (each is read once per call).
template <int kTokens, int kColumns, class Tag, bool kFp8, Activation kActivation,
          int kCtasPerSm, bool kEvictFirst, bool kGated>
__global__ void __launch_bounds__(kWgmmaGemvThreads, kCtasPerSm) WgmmaGemvKernel(
    const __grid_constant__ typename WgmmaGemv<kTokens, kColumns, Tag, kFp8, kCtasPerSm>::Params
        params) {
  using namespace cute;
  using G = WgmmaGemv<kTokens, kColumns, Tag, kFp8, kCtasPerSm>;
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  extern __shared__ __align__(1024) uint8_t wgmma_gemv_shared[];
  auto& shared = *reinterpret_cast<typename G::SharedStorage*>(wgmma_gemv_shared);

  const GemvParams& p = params.gemv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int split = blockIdx.x, splits = gridDim.x;
  const int k_tiles = (p.k + G::kTileK - 1) / G::kTileK;
  const int first = split * p.steps_per_split;
  const int count = max(0, min(k_tiles, first + p.steps_per_split) - first);

  if (threadIdx.x == 0) {
    for (int s = 0; s < G::kStages; ++s) {
      FullBarrier::init(&shared.full[s], 1);  // the load warp's arrival, then TMA's bytes
      EmptyBarrier::init(&shared.empty[s], kWgmmaGemvMathThreads / 32);  // one per math warp
    }
    cutlass::arch::fence_barrier_init();
  }
  if (warp == kWgmmaGemvMathThreads / 32 && lane == 0) {
    prefetch_tma_descriptor(&params.w);
    prefetch_tma_descriptor(params.tma_x.get_tma_descriptor());
  }
  __syncthreads();

  Tensor sW = make_tensor(make_smem_ptr(shared.w), typename G::SmemLayoutW{});  // (cols, k, stage)
  Tensor sX = make_tensor(make_smem_ptr(shared.x), typename G::SmemLayoutX{});  // (tok, k, stage)
  float* sums = reinterpret_cast<float*>(shared.w);

  if (warp == kWgmmaGemvMathThreads / 32) {
    // The load warp: one thread issues every box. Programmatic dependent launch: nothing
    // above touched global memory; x and the weights are read past this wait.
    if (lane == 0) {
      if constexpr (kFp8) {
        // An e4m3 call of 16-bit tokens quantizes them in a kernel that lets this one start
        // at once: until it ends, the ring's first stages of weights go to the L2, where
        // the loads past the wait find them. (A prefetch keeps nothing stale: every write
        // lands in the L2.)
        for (int i = 0; i < min(count, G::kStages); ++i) {
          SM90_TMA_LOAD_2D::PREFETCH::copy(&params.w, (first + i) * G::kTileK,
                                           int(blockIdx.y) * kColumns);
        }
      }
      asm volatile("griddepcontrol.wait;" ::: "memory");
      constexpr uint64_t kWeightHint =
          static_cast<uint64_t>(kEvictFirst ? TMA::CacheHintSm90::EVICT_FIRST
                                            : TMA::CacheHintSm90::EVICT_NORMAL);
      const int column0 = int(blockIdx.y) * kColumns;
      Tensor mX = params.tma_x.get_tma_tensor(make_shape(p.m, p.k));
      Tensor gX = local_tile(mX, make_shape(typename G::Tokens{}, typename G::TileK{}),
                             make_coord(0, _));  // (tok, k, k tiles)
      auto tma_x = params.tma_x.get_slice(0);
      Tensor tXgX = tma_x.partition_S(gX);
      Tensor tXsX = tma_x.partition_D(sX);
      int stage = 0;
      uint32_t phase = 0;
      for (int i = 0; i < count; ++i) {
        EmptyBarrier::wait(&shared.empty[stage], phase ^ 1);  // (a fresh stage passes)
        FullBarrier::arrive_and_expect_tx(&shared.full[stage], G::kStageBytes);
        auto* stage_w = shared.w + stage * kColumns * G::kTileK;
        if constexpr (kFp8) {
          SM90_TMA_LOAD_2D::copy(&params.w, &shared.full[stage], kWeightHint, stage_w,
                                 (first + i) * G::kTileK, column0);
        } else {
          CUTLASS_PRAGMA_UNROLL
          for (int box = 0; box < kColumns / kWgmmaGemvBoxColumns; ++box) {
            SM90_TMA_LOAD_2D::copy(&params.w, &shared.full[stage], kWeightHint,
                                   stage_w + box * kWgmmaGemvBoxColumns * G::kTileK,
                                   column0 + box * kWgmmaGemvBoxColumns,
                                   (first + i) * G::kTileK);
          }
        }
        copy(params.tma_x.with(shared.full[stage]), tXgX(_, _, _, first + i),
             tXsX(_, _, _, stage));
        if (++stage == G::kStages) stage = 0, phase ^= 1;
      }
    }
    __syncwarp();
  } else {
    typename G::TiledMma mma;
    auto thread_mma = mma.get_slice(threadIdx.x);
    Tensor tCrW = thread_mma.make_fragment_A(thread_mma.partition_A(sW));  // (V, M, K, stage)
    Tensor tCrX = thread_mma.make_fragment_B(thread_mma.partition_B(sX));  // (V, N, K, stage)
    Tensor accumulators = partition_fragment_C(mma, make_shape(typename G::Columns{},
                                                                typename G::Tokens{}));
    clear(accumulators);
    // e4m3: the tensor cores add into `partial` (at less than fp32 precision), which is added
    // into the fp32 accumulators after every `promotion` wgmma (whole k tiles) and after the
    // last k tile. 16-bit: the tensor cores add in fp32, into the accumulators directly.
    Tensor partial = make_fragment_like(accumulators);
    auto& sums_in_flight = FirstIf<kFp8>(partial, accumulators);
    const int tiles_per_promotion =
        !kFp8 || p.promotion == kFastAccumulation ? count : p.promotion / G::kWgmmaPerTile;
    int since_promotion = 0;
    mma.accumulate_ = GMMA::ScaleOut::One;
    int stage = 0;
    uint32_t phase = 0;
    for (int i = 0; i < count; ++i) {
      FullBarrier::wait(&shared.full[stage], phase);
      warpgroup_fence_operand(sums_in_flight);
      warpgroup_arrive();
      if constexpr (kFp8) {
        mma.accumulate_ = since_promotion == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrW); ++k_block) {
        cute::gemm(mma, tCrW(_, _, k_block, stage), tCrX(_, _, k_block, stage), sums_in_flight);
        mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      // The multiply is a few wgmma per stage against a stage's worth of loads: waiting
      // for it before releasing the stage costs nothing the stream would notice.
      warpgroup_wait<0>();
      warpgroup_fence_operand(sums_in_flight);
      if (lane == 0) EmptyBarrier::arrive(&shared.empty[stage]);
      if (++stage == G::kStages) stage = 0, phase ^= 1;
      if constexpr (kFp8) {
        if (++since_promotion == tiles_per_promotion || i == count - 1) {
          CUTLASS_PRAGMA_UNROLL
          for (int v = 0; v < size(accumulators); ++v) accumulators(v) += partial(v);
          since_promotion = 0;
        }
      }
    }
    // Every math warp is past its last wgmma before the sums overwrite the stages.
    asm volatile("bar.sync 1, %0;" ::"n"(kWgmmaGemvMathThreads) : "memory");
    Tensor sSums = make_tensor(make_smem_ptr(sums),
                               make_layout(make_shape(typename G::Columns{}, typename G::Tokens{}),
                                           make_stride(_1{}, Int<G::kSumStride>{})));
    Tensor tCsSums = thread_mma.partition_C(sSums);
    copy(accumulators, tCsSums);
  }
  // The weights are read: the next kernel of the stream may start its own prologue.
  asm volatile("griddepcontrol.launch_dependents;");

  ReduceSplitsAndStore<kTokens, kColumns, /*kWarps=*/1, kWgmmaGemvThreads, G::kSumStride, Tag,
                       kActivation, kFp8, kGated>(p, sums, split, splits);
}

// Launches the tensor-core form on `p` (shapes and split checked by CannotRun, buffers by
// the caller). The defaults of the stream's parameters (kCtasPerSm, kL2PromotionBytes,
// kEvictFirst) are the product's, at the declaration in gemv_kernel.cuh; the gemv probe
// (benchmarks/research/gemv_probe) times the others.
template <int kTokens, int kColumns, class Tag, bool kFp8, Activation kActivation,
          int kCtasPerSm, int kL2PromotionBytes, bool kEvictFirst, bool kGated, class Problem>
std::string LaunchWgmmaGemv(const Problem& p, const DeviceFacts& facts, cudaStream_t stream) {
  using G = WgmmaGemv<kTokens, kColumns, Tag, kFp8, kCtasPerSm>;
  using Element = typename G::Element;
  static_assert(kL2PromotionBytes == 128 || kL2PromotionBytes == 256, "an L2 promotion");
  if (p.m <= 0) return {};  // nothing to write (and no x for a TMA descriptor)
  if (kFp8 && (p.x_scale == nullptr || p.w_scale == nullptr)) {
    return "the fp8 gemv kernel was called without scales";
  }
  auto* kernel = WgmmaGemvKernel<kTokens, kColumns, Tag, kFp8, kActivation, kCtasPerSm,
                                 kEvictFirst, kGated>;
  if (std::string err = EnsureSharedMemoryLimit(reinterpret_cast<const void*>(kernel),
                                                G::kSharedBytes, facts.device);
      !err.empty()) {
    return err;
  }
  const int columns = static_cast<int>(StreamedColumns(p)), m = static_cast<int>(p.m),
            k = static_cast<int>(p.k);
  typename G::Params params{
      {},
      cute::make_tma_copy(cute::SM90_TMA_LOAD{},
                          WgmmaGemvX(static_cast<const Element*>(p.x), m, k),
                          typename G::SmemLayoutX{}(cute::_, cute::_, 0)),
      MakeGemvParams(p, G::kTileK)};
  const auto* weights = static_cast<const Element*>(StreamedWeights(p));
  if (std::string err =
          EncodeWgmmaGemvWeights(&params.w, weights, columns, k, kL2PromotionBytes, kColumns);
      !err.empty()) {
    return err;
  }
  return LaunchClusterSplitKGrid(kernel, params, kWgmmaGemvThreads, G::kSharedBytes, kColumns, p,
                                 facts, stream);
}

}  // namespace jax_swiglu
