// Splitting the last round of tiles of a persistent pingpong grid over the CTAs it leaves idle.
//
// A persistent grid of P CTAs runs T tiles in rounds of P. When T is not a multiple of P the
// last round has r tiles and P - r CTAs wait through it. Here, when r <= P/2, each tile of the
// last round runs as two units, one per 64-row half (one row of the warpgroup's m64 wgmma
// atoms), on two different clusters. Both halves run the whole K, so no partial sums meet
// anywhere: no workspace, no flags, and every output element is computed by one thread in the
// same order as in a whole tile (the result is bitwise that of the unsplit kernel). A half
// still loads its whole x box (TMA boxes are fixed), so it costs more than half a tile: the
// split pays where the last round is short, and the selection's measurements say where.
//
// Three parts agree on the plan below: SplitTailScheduler (which units a CTA gets; a half is
// marked in the unit's batch index L, which is 0 otherwise), SplitTailMainloop (its consumer
// counts its units to know which it runs, since CUTLASS's kernel hands the mainloop no tile;
// its producer loads a half's tile whole) and the epilogue (stores only the half's rows).
#pragma once

#include <cute/arch/cluster_sm90.hpp>
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/kernel/sm90_tile_scheduler.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>

#include <climits>
#include <cstdint>

namespace jax_swiglu {

// The last round of `tiles` CTA tiles on `ctas` CTAs in clusters of `cluster_size` (tiles and
// ctas are multiples of cluster_size: the scheduler pads tiles to whole clusters).
struct SplitTailPlan {
  int whole_rounds;    // rounds of whole tiles before the last one (or all of them)
  int split_clusters;  // clusters that run a half tile in round `whole_rounds`; 0: no split

  CUTLASS_HOST_DEVICE static SplitTailPlan Make(int tiles, int ctas, int cluster_size) {
    const int last = tiles % ctas;
    const bool split = last > 0 && 2 * last <= ctas;
    return {tiles / ctas, split ? 2 * (last / cluster_size) : 0};
  }

  // The 64-row half (0 or 1) that cluster `cluster` computes in `round`, or -1: a whole tile.
  // Clusters 2t and 2t + 1 share the last round's t-th cluster of tiles.
  CUTLASS_HOST_DEVICE int Half(int round, int cluster) const {
    return round == whole_rounds && cluster < split_clusters ? cluster % 2 : -1;
  }
};

// A unit's half as the scheduler marks it in the batch index L (-1: a whole tile).
CUTLASS_HOST_DEVICE constexpr int SplitTailHalfOfBatchIndex(int l) { return l - 1; }

CUTLASS_DEVICE int ClusterIndexInGrid() {
  const dim3 id = cute::cluster_id_in_grid();
  const dim3 clusters = cute::cluster_grid_dims();
  return static_cast<int>(id.x + clusters.x * (id.y + clusters.y * id.z));
}

CUTLASS_DEVICE int CtasInGrid() { return static_cast<int>(gridDim.x * gridDim.y * gridDim.z); }

// CUTLASS's persistent scheduler (its grid, tile order, raster and cluster layout), with the
// last round split as planned above. CTA s runs linear tiles s, s + P, ... of CUTLASS's order;
// in a split last round cluster c runs the (c / 2)-th cluster of the remaining tiles, half
// c % 2, each CTA at its own place in that cluster. Needs a swizzle of 1 (the mainloop counts
// tiles padded to clusters only; the launcher checks).
class SplitTailScheduler : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90 {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  CUTLASS_HOST_DEVICE SplitTailScheduler() {}

  // Everything but the next whole tile is worked out here, once: per-unit work sits on the
  // producer's path between two tiles' loads, where 64-bit divisions measured slower.
  CUTLASS_DEVICE explicit SplitTailScheduler(Params const& params) : Base(params) {
    // The CTA's first linear tile, as CUTLASS's scheduler numbers it.
    next_tile_ = params.raster_order_ == RasterOrder::AlongN
                     ? uint64_t(blockIdx.x) + uint64_t(blockIdx.y) * gridDim.x
                     : uint64_t(blockIdx.x) * gridDim.y + uint64_t(blockIdx.y);
    ctas_ = static_cast<uint32_t>(CtasInGrid());
    const int cluster_size = static_cast<int>(params.cluster_shape_m_ * params.cluster_shape_n_);
    const SplitTailPlan plan =
        SplitTailPlan::Make(static_cast<int>(params.blocks_per_problem_), ctas_, cluster_size);
    if (plan.split_clusters > 0) {
      whole_rounds_ = plan.whole_rounds;
      const int cluster = ClusterIndexInGrid();
      const int half = plan.Half(plan.whole_rounds, cluster);
      if (half >= 0) {
        const uint64_t tile = uint64_t(plan.whole_rounds) * ctas_ +
                              uint64_t(cluster / 2) * cluster_size + next_tile_ % cluster_size;
        last_ = get_current_work_for_linear_idx(tile);
        last_.L_idx = half + 1;
      }
    }
  }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return get_current_work();
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work() const {
    // CUTLASS's tile for the whole rounds (invalid past the last tile), then this CTA's half.
    if (round_ < whole_rounds_) return get_current_work_for_linear_idx(next_tile_);
    return round_ == whole_rounds_ ? last_ : WorkTileInfo::invalid_work_tile();
  }

  CUTLASS_DEVICE void advance_to_next_work(uint32_t advance_count = 1) {
    round_ += static_cast<int>(advance_count);
    next_tile_ += uint64_t(ctas_) * advance_count;
  }

  CUTLASS_DEVICE bool is_last_tile(WorkTileInfo&, uint32_t advance_count = 1) const {
    SplitTailScheduler next = *this;
    next.advance_to_next_work(advance_count);
    return !next.get_current_work().is_valid();
  }

 private:
  uint64_t next_tile_ = 0;
  uint32_t ctas_ = 1;
  int round_ = 0;
  int whole_rounds_ = INT_MAX;  // no split: every round's tiles are whole
  WorkTileInfo last_ = WorkTileInfo::invalid_work_tile();  // this CTA's half, if any
};

// Tag selecting SplitTailScheduler in CUTLASS's GemmUniversal (see the selector below).
struct SplitTailPersistentScheduler {};

// CUTLASS's SM90 pingpong TMA mainloop `Base` for SplitTailScheduler. The producer loads a
// half's tile whole (batch index 0); the consumer counts its units (warpgroup w of the two
// runs rounds w, w + 2, ...) to find whether a unit is a half, and then issues the wgmmas of
// that half's row of atoms only.
template <class Base>
struct SplitTailMainloop : Base {
  using typename Base::Arguments;
  using typename Base::DispatchPolicy;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using typename Base::TiledMma;
  using ClusterShape = typename DispatchPolicy::ClusterShape;

  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static_assert(cute::size(TiledMma{}) == 128, "one warpgroup per tile: the pingpong schedule");
  static_assert(Base::K_PIPE_MMAS == 1, "the consumer below keeps one k-tile of wgmma in flight");

  // Base's, plus the tile count the scheduler plans with.
  struct Params : Base::Params {
    int tiles;  // CTA tiles, padded to whole clusters
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args,
                                        void* workspace) {
    auto shape_mnkl = cute::append<4>(problem_shape, 1);
    const int m = static_cast<int>(cute::get<0>(shape_mnkl));
    const int n = static_cast<int>(cute::get<1>(shape_mnkl));
    const int l = static_cast<int>(cute::get<3>(shape_mnkl));
    constexpr int cm = cute::size<0>(ClusterShape{});
    constexpr int cn = cute::size<1>(ClusterShape{});
    const int tiles_m = (m + kTileM - 1) / kTileM;
    const int tiles_n = (n + kTileN - 1) / kTileN;
    const int tiles = (tiles_m + cm - 1) / cm * cm * ((tiles_n + cn - 1) / cn * cn) * l;
    return {Base::to_underlying_arguments(problem_shape, args, workspace), tiles};
  }

  CUTLASS_DEVICE SplitTailMainloop() {
    // Warpgroup 0 produces; consumers 1 and 2 take alternate units, starting at rounds 0, 1.
    round_ = cutlass::canonical_warp_group_idx() - 1;
  }

  template <class Inputs, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(typename Base::Params const& params, MainloopPipeline pipeline,
                           PipelineState smem_pipe_write, Inputs const& inputs,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count,
                           int thread_idx, uint32_t block_rank_in_cluster,
                           TensorStorage& shared_tensors) {
    auto [m, n, k, l] = blk_coord;
    Base::load(params, pipeline, smem_pipe_write, inputs, cute::make_coord(m, n, k, 0), k_tile_iter,
               k_tile_count, thread_idx, block_rank_in_cluster, shared_tensors);
  }

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read,
                          FrgTensorC& accum, int k_tile_count, int /*thread_idx*/,
                          TensorStorage& shared_tensors, Params const& params) {
    if (split_round_ == kUnplanned) {  // the first unit: plan once, off the later units' path
      const SplitTailPlan plan =
          SplitTailPlan::Make(params.tiles, CtasInGrid(), cute::size(ClusterShape{}));
      split_half_ = plan.Half(plan.whole_rounds, ClusterIndexInGrid());
      split_round_ = split_half_ >= 0 ? plan.whole_rounds : -1;
    }
    const int half = round_ == split_round_ ? split_half_ : -1;
    round_ += 2;
    if (half < 0) {
      MmaRows<-1>(pipeline, smem_pipe_read, accum, k_tile_count, shared_tensors);
    } else if (half == 0) {
      MmaRows<0>(pipeline, smem_pipe_read, accum, k_tile_count, shared_tensors);
    } else {
      MmaRows<1>(pipeline, smem_pipe_read, accum, k_tile_count, shared_tensors);
    }
  }

 private:
  // The consumer's k loop over atom row kRow of the tile (-1: both rows): waits for each
  // stage and releases the one before once a k-tile of wgmma is in flight (Base::mma_tail
  // releases the last).
  template <int kRow, class FrgTensorC>
  CUTLASS_DEVICE void MmaRows(MainloopPipeline pipeline, PipelineState smem_pipe_read,
                              FrgTensorC& accum, int k_tile_count, TensorStorage& shared_tensors) {
    using namespace cute;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});
    TiledMma tiled_mma;
    // Shared-memory operands: one descriptor for the whole warpgroup.
    auto thread_mma = tiled_mma.get_slice(0);
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (V,MMA_M,MMA_K,PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (V,MMA_N,MMA_K,PIPE)
    CUTE_STATIC_ASSERT_V(size<1>(tCrA) == Int<2>{});  // two rows of m64 atoms: the halves

    auto k_tile = [&](int stage) {
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        if constexpr (kRow < 0) {
          cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), accum);
        } else {
          CUTLASS_PRAGMA_UNROLL
          for (int n = 0; n < size<1>(tCrB); ++n) {
            cute::gemm(tiled_mma, tCrA(_, kRow, k_block, stage), tCrB(_, n, k_block, stage),
                       accum(_, kRow, n));
          }
        }
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
    };

    PipelineState smem_pipe_release = smem_pipe_read;
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(accum);
    pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
    warpgroup_arrive();
    if constexpr (kRow >= 0) {
      // The other row's accumulators, unused, are still written by one wgmma (1/56 of the
      // half's at K = 896): a register that only some paths' wgmmas write made ptxas
      // serialize every wgmma of the kernel.
      CUTLASS_PRAGMA_UNROLL
      for (int n = 0; n < size<1>(tCrB); ++n) {
        cute::gemm(tiled_mma, tCrA(_, 1 - kRow, 0, smem_pipe_read.index()),
                   tCrB(_, n, 0, smem_pipe_read.index()), accum(_, 1 - kRow, n));
      }
    }
    k_tile(smem_pipe_read.index());
    warpgroup_commit_batch();
    ++smem_pipe_read;
    warpgroup_fence_operand(accum);

    CUTLASS_PRAGMA_NO_UNROLL
    for (--k_tile_count; k_tile_count > 0; --k_tile_count) {
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
      warpgroup_fence_operand(accum);
      warpgroup_arrive();
      k_tile(smem_pipe_read.index());
      warpgroup_commit_batch();
      warpgroup_wait<1>();
      warpgroup_fence_operand(accum);
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_read;
      ++smem_pipe_release;
    }
    warpgroup_fence_operand(accum);
  }

  static constexpr int kUnplanned = -2;
  int round_ = 0;
  int split_round_ = kUnplanned;  // the round of this CTA's half, -1 if it has none
  int split_half_ = -1;
};

}  // namespace jax_swiglu

namespace cutlass::gemm::kernel::detail {

template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<jax_swiglu::SplitTailPersistentScheduler, ArchTag, TileShape,
                             ClusterShape, SchedulerPipelineStageCount> {
  using Scheduler = jax_swiglu::SplitTailScheduler;
};

}  // namespace cutlass::gemm::kernel::detail
