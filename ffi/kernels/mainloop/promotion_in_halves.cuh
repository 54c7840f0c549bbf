// The e4m3 math loop with its promotions hidden behind the tensor cores' work.
//
// SM90's fp8 wgmma adds its products at less than fp32, so the promoted e4m3 rows let the
// tensor cores sum a few k tiles into temporary accumulators and add those into fp32 ones
// (the promotion). CUTLASS's fp8 mainloop keeps one temporary as large as the tile: before
// each promotion it waits for every wgmma in flight, and the tensor cores sit idle from then
// until the next k tile's wgmma is issued, in both math warpgroups at once (the
// `promotion_drain_n` of the cost model).
//
// Here the warpgroup's columns are two halves with a temporary each (the same registers as
// CUTLASS's one: fp32 sums plus half of them twice). Each k tile issues the first half's
// wgmma and the second's as two committed batches, and each promotion waits only for the
// batch of its own half: one half's temporary is added while the tensor cores run the other
// half's batch. Each wgmma covers half the columns (a narrower instruction, each A fragment
// read twice from shared memory); the loads, the pipeline, the shared memory and the
// parameters are CUTLASS's.
// The sums are the promoted ones: the same intervals, the same fp32 adds in the same order.
#pragma once

#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/collective/builders/sm90_common.inl>

namespace jax_swiglu {

// CUTLASS's SM90 fp8 mainloop `Base` (MainloopSm90TmaGmmaWarpSpecializedFP8, K-major
// operands) with the math loop above. A math warpgroup's share of the tile must be one
// wgmma row (64 rows: a 128-row cooperative tile or a 64-row pingpong one), so that its
// accumulators are one fragment whose second half holds the second half of the columns.
template <class Base>
struct PromotionInHalvesMainloop : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using typename Base::TiledMma;

  static constexpr int kWarpGroups = cute::size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static_assert(kTileM == 64 * kWarpGroups, "a math warpgroup's share is one 64-row wgmma");
  static_assert(kTileN % 16 == 0, "each half is a whole 8-column wgmma N");
  // Base's wgmma over half the tile's columns, on the same warpgroups.
  using HalfTiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<typename Base::ElementA, typename Base::ElementB, float,
                                 cute::Shape<cute::Int<kTileM>, cute::Int<kTileN / 2>,
                                             cute::Int<kTileK>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::K>(),
      cute::Layout<cute::Shape<cute::Int<kWarpGroups>, cute::_1, cute::_1>>{}));

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read,
                          FrgTensorC& accum, int k_tile_count, int thread_idx,
                          TensorStorage& shared_tensors, Params const& params) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value);
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});
    const int warp_group =
        __shfl_sync(0xFFFFFFFF, (thread_idx / cutlass::NumThreadsPerWarpGroup) % kWarpGroups, 0);
    HalfTiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(warp_group * cutlass::NumThreadsPerWarpGroup);
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA,1,K,PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA,2,K,PIPE)
    static_assert(size<1>(tCrA) == 1 && size<1>(tCrB) == 2, "one row of wgmma, two halves");

    // The fp32 sums, laid out as the whole tile's wgmma leaves them: (2, 2, columns / 8)
    // values a thread, the 8-column groups outermost, so its first half is the first half
    // of the columns; and one temporary per half, laid out as a half's wgmma leaves it.
    static_assert(size(FrgTensorC{}) == size<0>(FrgTensorC{}), "one wgmma fragment");
    const auto half_tile = make_shape(Int<kTileM>{}, Int<kTileN / 2>{});
    Tensor first_sums = partition_fragment_C(tiled_mma, half_tile);  // (MMA, 1, 1)
    Tensor second_sums = partition_fragment_C(tiled_mma, half_tile);
    constexpr int kHalf = size(decltype(first_sums){});
    static_assert(2 * kHalf == size(FrgTensorC{}), "two halves of the sums");

    // Registers get their values before any wgmma is in flight (left undefined, the compiler
    // may initialize them between wgmma batches, and ptxas then serializes them).
    clear(accum);
    clear(first_sums);
    clear(second_sums);
    warpgroup_fence_operand(accum);
    warpgroup_fence_operand(first_sums);
    warpgroup_fence_operand(second_sums);

    // Issues k tile `stage`'s wgmma for half `half` into `sums` as one committed batch,
    // restarting the sums when `restart`.
    auto issue = [&](auto half, auto& sums, int stage, bool restart) {
      warpgroup_fence_operand(sums);
      warpgroup_arrive();
      tiled_mma.accumulate_ = restart ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        // (The half's B descriptors as (MMA, 1), the N mode cute::gemm wants.)
        Tensor b = tCrB(_, half, k_block, stage);
        cute::gemm(tiled_mma, tCrA(_, _, k_block, stage),
                   make_tensor(b.data(), append(b.layout(), Layout<_1, _0>{})), sums);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
    };
    // Adds half `half`'s temporary into its fp32 sums (its batch has completed).
    auto promote = [&](auto half, auto& sums) {
      warpgroup_fence_operand(sums);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kHalf; ++i) accum(decltype(half)::value * kHalf + i) += sums(i);
      warpgroup_fence_operand(sums);
    };

    // k tiles per promotion (the interval counts wgmma, a whole number of k tiles'; the fast
    // accumulation's interval is never reached, so its one promotion is the last).
    const uint32_t wgmma_per_k_tile = size<2>(tCrA);
    const uint32_t interval = params.mma_promotion_interval / wgmma_per_k_tile;
    // Each k tile issues the first half's batch, promotes the second half's previous sums
    // while it runs (when this k tile restarts them), issues the second half's batch, and
    // promotes the first half's sums while that one runs (when this k tile ends an
    // interval). Each k tile ends with no wgmma in flight and its waits are unconditional:
    // ptxas tracks which batches have completed only within one iteration of the loop and
    // through unconditional waits, and where it cannot tell that a promotion reads a
    // completed temporary it serializes every wgmma (C7514).
    uint32_t since_promotion = 0;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int k_tile = 0; k_tile < k_tile_count; ++k_tile) {
      pipeline.consumer_wait(smem_pipe_read);
      const int stage = smem_pipe_read.index();
      const bool restart = since_promotion == 0;
      since_promotion = since_promotion + 1 == interval ? 0 : since_promotion + 1;
      const bool ends_interval = since_promotion == 0 || k_tile + 1 == k_tile_count;
      issue(Int<0>{}, first_sums, stage, restart);
      warpgroup_wait<1>();  // (only this batch is in flight)
      if (restart && k_tile > 0) promote(Int<1>{}, second_sums);
      issue(Int<1>{}, second_sums, stage, restart);
      warpgroup_wait<1>();
      if (ends_interval) promote(Int<0>{}, first_sums);
      warpgroup_wait<0>();
      pipeline.consumer_release(smem_pipe_read);
      ++smem_pipe_read;
    }
    if (k_tile_count > 0) promote(Int<1>{}, second_sums);
    warpgroup_fence_operand(accum);
  }

  // mma has handed back every stage and waited for every wgmma.
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

}  // namespace jax_swiglu
